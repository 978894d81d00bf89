//! One worker's message cache: every message cached on the topics this worker is home of,
//! with per-message expiry and oldest-first eviction under a byte budget.
//!
//! Messages live in a slab. Two indexes point into it, each O(1) or O(log n) per
//! operation, so nothing ever scans the whole cache:
//! - an intrusive doubly linked list in insertion order (oldest first) for byte eviction;
//! - a min-heap on expiry time, with lazy deletion and a rebuild when stale entries
//!   outnumber live ones, so its size stays within twice the cache.
//!
//! The per-topic order (a `VecDeque` of keys) and the per-topic dedup filter (content hash
//! -> count) are kept by the caller (`relay`), which also owns the topics themselves: a
//! filter per topic stays small (at most the per-topic cap), where one map for the whole
//! cache would be a table of millions of entries whose every growth stalls the worker and
//! whose random accesses, with transparent huge pages, make all of it resident.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use bytes::Bytes;
use slab::Slab;

const NIL: usize = usize::MAX;

/// Fixed bytes counted for each cached message besides its payload (slab entry, indexes).
pub const ENTRY_OVERHEAD: usize = 128;

/// Who published a message: (worker, connection uid). Used so a connection is never sent
/// its own message back.
pub type Origin = (u16, u64);

/// One cached message.
#[derive(Debug)]
pub struct Cached {
    /// The topic's slot in the worker's topic table.
    pub topic: u32,
    /// Worker-wide insertion sequence number (disambiguates reused slab keys).
    pub seq: u64,
    /// Content hash (dedup).
    pub hash: u64,
    /// The encoded `{"topic":..,"message":..}` object.
    pub data: Bytes,
    /// Expiry, in the worker clock's milliseconds.
    pub expires: u64,
    /// Who published it.
    pub origin: Origin,
    prev: usize,
    next: usize,
}

/// The cache of one worker.
#[derive(Debug, Default)]
pub struct Cache {
    msgs: Slab<Cached>,
    oldest: Option<usize>,
    newest: Option<usize>,
    heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    bytes: usize,
    next_seq: u64,
}

impl Cache {
    /// A cache with room for `n` messages before any of its tables grows. Growing one of
    /// them past a few hundred thousand entries copies it all at once, which stalled a
    /// worker for milliseconds (docs/PERFORMANCE.md). The memory is reserved, not touched:
    /// both tables fill from their start. The expiry heap gets room for twice `n`: it holds
    /// stale entries until they outnumber the live ones.
    pub fn with_capacity(n: usize) -> Cache {
        Cache {
            msgs: Slab::with_capacity(n),
            heap: BinaryHeap::with_capacity(2 * n + 1024),
            ..Cache::default()
        }
    }

    /// Messages cached.
    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    /// Nothing cached.
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Bytes counted against the budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The message at `key`.
    pub fn get(&self, key: usize) -> Option<&Cached> {
        self.msgs.get(key)
    }

    /// Stores a message and returns its key.
    pub fn insert(
        &mut self,
        topic: u32,
        hash: u64,
        data: Bytes,
        expires: u64,
        origin: Origin,
    ) -> usize {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += data.len() + ENTRY_OVERHEAD;
        let key = self.msgs.insert(Cached {
            topic,
            seq,
            hash,
            data,
            expires,
            origin,
            prev: self.newest.unwrap_or(NIL),
            next: NIL,
        });
        match self.newest {
            Some(n) => self.msgs[n].next = key,
            None => self.oldest = Some(key),
        }
        self.newest = Some(key);
        self.heap.push(Reverse((expires, seq, key)));
        key
    }

    /// Removes the message at `key`, returning it.
    pub fn remove(&mut self, key: usize) -> Option<Cached> {
        let m = self.msgs.try_remove(key)?;
        if m.prev == NIL {
            self.oldest = (m.next != NIL).then_some(m.next);
        } else {
            self.msgs[m.prev].next = m.next;
        }
        if m.next == NIL {
            self.newest = (m.prev != NIL).then_some(m.prev);
        } else {
            self.msgs[m.next].prev = m.prev;
        }
        self.bytes -= m.data.len() + ENTRY_OVERHEAD;
        self.maybe_rebuild_heap();
        Some(m)
    }

    /// Key of the oldest message.
    pub fn oldest(&self) -> Option<usize> {
        self.oldest
    }

    /// Key of the next message whose expiry is at or before `now`, if any (skipping stale
    /// heap entries). The caller removes it.
    pub fn next_expired(&mut self, now: u64) -> Option<usize> {
        while let Some(Reverse((exp, seq, key))) = self.heap.peek().copied() {
            if exp > now {
                return None;
            }
            self.heap.pop();
            if self.msgs.get(key).is_some_and(|m| m.seq == seq) {
                return Some(key);
            }
        }
        None
    }

    /// Rebuilds the expiry heap from the live messages once stale entries outnumber them,
    /// in its own allocation (so it never has to grow again).
    fn maybe_rebuild_heap(&mut self) {
        if self.heap.len() > 2 * self.msgs.len() + 1024 {
            let mut v = std::mem::take(&mut self.heap).into_vec();
            v.clear();
            v.extend(
                self.msgs
                    .iter()
                    .map(|(k, m)| Reverse((m.expires, m.seq, k))),
            );
            self.heap = BinaryHeap::from(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn evicts_oldest_and_expires_by_time() {
        let mut c = Cache::default();
        let a = c.insert(1, 10, b("a"), 500, (0, 1));
        let bb = c.insert(1, 11, b("b"), 100, (0, 1));
        let cc = c.insert(2, 12, b("c"), 300, (0, 1));
        assert_eq!(c.oldest(), Some(a));
        assert_eq!(c.next_expired(50), None);
        assert_eq!(c.next_expired(100), Some(bb));
        c.remove(bb);
        assert_eq!(c.next_expired(400), Some(cc));
        c.remove(cc);
        assert_eq!(c.oldest(), Some(a));
        c.remove(a);
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
        assert_eq!(c.oldest(), None);
        assert_eq!(c.next_expired(u64::MAX), None);
    }

    #[test]
    fn heap_stays_bounded_under_churn() {
        let mut c = Cache::default();
        for i in 0..100_000u64 {
            let k = c.insert(1, i, b("m"), 1_000_000 + i, (0, 1));
            c.remove(k);
        }
        assert!(c.heap.len() <= 1024 + 2, "heap {}", c.heap.len());
    }

    /// A cache made with room for `n` messages holds `n` of them, and churns through many
    /// more (removals leaving stale heap entries, heap rebuilds), without any of its tables
    /// growing: a growth is a stall of the whole worker (see `with_capacity`).
    #[test]
    fn tables_never_grow_within_the_presized_count() {
        const N: usize = 20_000;
        let mut c = Cache::with_capacity(N);
        let caps = |c: &Cache| (c.msgs.capacity(), c.heap.capacity());
        let grew = |now: (usize, usize), was: (usize, usize)| now.0 > was.0 || now.1 > was.1;
        let before = caps(&c);
        assert!(before.0 >= N && before.1 >= 2 * N, "{before:?}");
        let mut keys = std::collections::VecDeque::new();
        for i in 0..N as u64 {
            keys.push_back(c.insert((i % 97) as u32, i, b("m"), 1_000_000 - i, (0, 1)));
        }
        assert!(!grew(caps(&c), before), "filling to N grew a table");
        // Steady state at the budget: each insert evicts the oldest (a stale heap entry).
        for i in 0..(10 * N) as u64 {
            let old = keys.pop_front().expect("full");
            c.remove(old);
            keys.push_back(c.insert((i % 89) as u32, N as u64 + i, b("m"), 2_000_000 + i, (0, 1)));
            assert_eq!(c.len(), N);
        }
        assert!(
            !grew(caps(&c), before),
            "churning at N grew a table: {:?}",
            caps(&c)
        );
        assert!(c.heap.len() <= 2 * N + 1024 + 1, "heap {}", c.heap.len());
    }
}
