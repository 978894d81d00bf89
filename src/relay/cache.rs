//! One worker's message cache: every message cached on the topics this worker is home of,
//! with per-message expiry, oldest-first eviction under a byte budget, and content dedup.
//!
//! Messages live in a slab. Three indexes point into it, each O(1) or O(log n) per
//! operation, so nothing ever scans the whole cache:
//! - an intrusive doubly linked list in insertion order (oldest first) for byte eviction;
//! - a min-heap on expiry time, with lazy deletion and a rebuild when stale entries
//!   outnumber live ones, so its size stays within twice the cache;
//! - a `(topic, hash)` count map for dedup (bytes are compared on a hash hit).
//!
//! The per-topic order (a `VecDeque` of keys) is kept by the caller (`relay`), which also
//! owns the topics themselves.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

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
    dedup: HashMap<(u32, u64), u32, ahash::RandomState>,
    bytes: usize,
    next_seq: u64,
}

impl Cache {
    /// A cache with room for `n` messages before any of its tables grows. Growing one of
    /// them past a few hundred thousand entries copies or rehashes it all at once, which
    /// stalled a worker for milliseconds: `pairs` at 30,000/s had a p99 of 2.0-3.5 ms on a
    /// fresh server against 0.37-0.58 ms once the tables had grown (docs/PERFORMANCE.md).
    /// The memory is reserved, not touched, except the hash table's control bytes (one
    /// byte per bucket).
    pub fn with_capacity(n: usize) -> Cache {
        Cache {
            msgs: Slab::with_capacity(n),
            heap: BinaryHeap::with_capacity(n),
            dedup: HashMap::with_capacity_and_hasher(n, ahash::RandomState::default()),
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

    /// A cached message of `topic` may have this hash (then compare bytes to be sure).
    pub fn may_contain(&self, topic: u32, hash: u64) -> bool {
        self.dedup.contains_key(&(topic, hash))
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
        *self.dedup.entry((topic, hash)).or_insert(0) += 1;
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
        if let Some(c) = self.dedup.get_mut(&(m.topic, m.hash)) {
            *c -= 1;
            if *c == 0 {
                self.dedup.remove(&(m.topic, m.hash));
            }
        }
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

    fn maybe_rebuild_heap(&mut self) {
        if self.heap.len() > 2 * self.msgs.len() + 1024 {
            self.heap = self
                .msgs
                .iter()
                .map(|(k, m)| Reverse((m.expires, m.seq, k)))
                .collect();
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
    fn dedup_counts_follow_removals() {
        let mut c = Cache::default();
        let k = c.insert(3, 99, b("x"), 10, (0, 1));
        assert!(c.may_contain(3, 99));
        assert!(!c.may_contain(4, 99));
        c.remove(k);
        assert!(!c.may_contain(3, 99));
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
}
