//! One worker's message cache: every message cached on the topics this worker is home of,
//! with per-message expiry and oldest-first eviction under a byte budget.
//!
//! Messages live in a slab. Two indexes point into it, each O(1) or O(log n) per
//! operation, so nothing ever scans the whole cache:
//! - an intrusive doubly linked list in insertion order (oldest first) for byte eviction;
//! - a min-heap on expiry time, with lazy deletion, compacted once stale entries outnumber
//!   live ones so that its size stays within about twice the cache. The compaction never
//!   stops the worker: a fresh heap is built from the slab a few dozen slots per cache
//!   operation, while the old one still answers (see `Expiry`): rebuilding it at once stalled
//!   the worker (docs/PERFORMANCE.md, "The expiry heap compacts without stopping the worker").
//!
//! The per-topic order (a `VecDeque` of keys) and the per-topic dedup filter (content hash
//! -> count) are kept by the caller (`engine::home`), which also owns the topics themselves: a
//! filter per topic stays small (at most the per-topic cap), where one map for the whole
//! cache would be a table of millions of entries whose every growth stalls the worker and
//! whose random accesses, with transparent huge pages, make all of it resident.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::arcbuf::ArcBuf;

use super::slots::Slots;

const NIL: usize = usize::MAX;

/// Slab slots scanned per cache operation while the expiry heap is compacted: the scan of
/// a full default cache (1.47M messages) spreads over ~23k operations.
const COMPACT_STEP: usize = 64;

/// An expiry heap entry: (expires, seq, slab key), smallest first.
type Due = Reverse<(u64, u64, usize)>;

/// Fixed bytes counted for each cached message besides its payload (slab entry, indexes).
pub const ENTRY_OVERHEAD: usize = 128;

pub use super::Origin;

/// One cached message.
#[derive(Debug)]
pub struct Cached {
    /// The topic's slot in the home's topic table.
    pub topic: u32,
    /// The message's number on its topic (the `seq` of its `Position`).
    pub topic_seq: u64,
    /// Worker-wide insertion sequence number (disambiguates reused slab keys).
    pub seq: u64,
    /// Content hash (dedup).
    pub hash: u64,
    /// The stored bytes: a v2 message's [`Body`](crate::message::Body) (see
    /// [`Cached::body`]), or a v1 frame.
    pub data: ArcBuf,
    /// A v2 message's beta part (see `Body::beta`); 0 for a v1 frame.
    pub beta_len: u32,
    /// Expiry, in the worker clock's milliseconds.
    pub expires: u64,
    /// Who published it.
    pub origin: Origin,
    /// Its record in the durable log, when there is one.
    pub record: Option<crate::store::Loc>,
    /// A WalletConnect 1.0 pending frame (not a v2 message).
    pub v1: bool,
    prev: usize,
    next: usize,
}

impl Cached {
    /// A v2 message's content (`None` for a v1 frame, or bytes that are not a body).
    pub fn body(&self) -> Option<crate::message::Body> {
        crate::message::Body::from_parts(self.data.clone(), self.beta_len)
    }
}

/// The expiry index: a min-heap with lazy deletion (a removed message's entry stays until
/// it surfaces, and is recognised as stale by its slab key no longer holding its `seq`).
///
/// Compaction, once stale entries outnumber live ones: `heap` becomes `old` (still
/// consulted, never added to), and a fresh `heap` receives every new message plus, slot by
/// slot, every live message older than the compaction, as `scan` walks the slab. Every live
/// message is in at least one of the two heaps at all times (a duplicate is skipped as stale
/// once its message is gone), so expiry never misses one; when the walk ends, `old` is
/// emptied and keeps its allocation for the next compaction.
#[derive(Debug, Default)]
struct Expiry {
    heap: BinaryHeap<Due>,
    old: BinaryHeap<Due>,
    /// While compacting: the next slab slot to look at, and the first `seq` that went to
    /// `heap` directly.
    scan: Option<(usize, u64)>,
}

/// The cache of one worker.
#[derive(Debug, Default)]
pub struct Cache {
    msgs: Slots<Cached>,
    oldest: Option<usize>,
    newest: Option<usize>,
    expiry: Expiry,
    /// One past the highest slab key ever used (the compaction walks `0..high`).
    high: usize,
    /// Compactions of the expiry heap completed.
    compactions: u64,
    bytes: usize,
    next_seq: u64,
}

impl Cache {
    /// A cache with room for `n` messages before any of its tables grows. Growing one of
    /// them past a few hundred thousand entries copies it all at once, which stalled a
    /// worker for milliseconds (docs/PERFORMANCE.md). The memory is reserved, not touched:
    /// the tables fill from their start. Each of the two expiry heaps gets room for twice
    /// `n` (plus what a compaction adds while it runs): the heap holds stale entries until
    /// they outnumber the live ones.
    pub fn with_capacity(n: usize) -> Cache {
        let heap_room = 2 * n + n / COMPACT_STEP + 2048;
        Cache {
            msgs: Slots::with_capacity(n),
            expiry: Expiry {
                heap: BinaryHeap::with_capacity(heap_room),
                old: BinaryHeap::with_capacity(heap_room),
                scan: None,
            },
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

    /// Starts loading the lines of the message at `key` that removing it reads (see
    /// `crate::prefetch`).
    pub fn prefetch(&self, key: usize) {
        self.msgs.prefetch(key);
    }

    /// Starts loading the expiry heap's entry that the next insert's entry is compared with
    /// first (its parent in the heap). Messages of one ttl expire in the order they came, so
    /// that comparison is mostly the only one, and its line, in the middle of a heap of a
    /// million entries, is cold (2.2% of a saturated core).
    pub fn prefetch_expiry(&self) {
        let heap = self.expiry.heap.as_slice();
        if let Some(parent) = heap.get(heap.len().saturating_sub(1) / 2) {
            crate::prefetch::line(parent);
        }
    }

    /// Starts loading the entries that removing the message at `key` relinks (its neighbours
    /// in insertion order), once its own entry has arrived (see `crate::prefetch`).
    pub fn prefetch_links(&self, key: usize) {
        if let Some(m) = self.msgs.get(key) {
            for k in [m.prev, m.next] {
                self.msgs.prefetch(k);
            }
        }
    }

    /// Records where the message at `key` lives in the durable log.
    pub fn set_record(&mut self, key: usize, loc: crate::store::Loc) {
        if let Some(m) = self.msgs.get_mut(key) {
            m.record = Some(loc);
        }
    }

    /// Marks the message at `key` as a v1 pending frame.
    pub fn mark_v1(&mut self, key: usize) {
        if let Some(m) = self.msgs.get_mut(key) {
            m.v1 = true;
        }
    }

    /// One past the highest key ever used: keys `0..key_bound()` cover every message.
    pub fn key_bound(&self) -> usize {
        self.high
    }

    /// Stores message number `topic_seq` of the topic in slot `topic`; returns its key.
    #[allow(
        clippy::too_many_arguments,
        reason = "the fields of one entry, named at the call"
    )]
    pub fn insert(
        &mut self,
        topic: u32,
        topic_seq: u64,
        hash: u64,
        data: ArcBuf,
        beta_len: u32,
        expires: u64,
        origin: Origin,
    ) -> usize {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += data.len() + ENTRY_OVERHEAD;
        let key = self.msgs.insert(Cached {
            topic,
            topic_seq,
            seq,
            hash,
            data,
            beta_len,
            expires,
            origin,
            record: None,
            v1: false,
            prev: self.newest.unwrap_or(NIL),
            next: NIL,
        });
        match self.newest {
            Some(n) => {
                if let Some(m) = self.msgs.get_mut(n) {
                    m.next = key;
                }
            }
            None => self.oldest = Some(key),
        }
        self.newest = Some(key);
        self.high = self.high.max(key + 1);
        self.expiry.heap.push(Reverse((expires, seq, key)));
        self.compact_step();
        key
    }

    /// Removes the message at `key`, returning it.
    pub fn remove(&mut self, key: usize) -> Option<Cached> {
        let m = self.msgs.try_remove(key)?;
        if m.prev == NIL {
            self.oldest = (m.next != NIL).then_some(m.next);
        } else if let Some(p) = self.msgs.get_mut(m.prev) {
            p.next = m.next;
        }
        if m.next == NIL {
            self.newest = (m.prev != NIL).then_some(m.prev);
        } else if let Some(n) = self.msgs.get_mut(m.next) {
            n.prev = m.prev;
        }
        self.bytes -= m.data.len() + ENTRY_OVERHEAD;
        self.maybe_start_compaction();
        self.compact_step();
        Some(m)
    }

    /// Compactions of the expiry heap completed so far.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Key of the oldest message.
    pub fn oldest(&self) -> Option<usize> {
        self.oldest
    }

    /// Key of the next message whose expiry is at or before `now`, if any (skipping stale
    /// heap entries). The caller removes it.
    pub fn next_expired(&mut self, now: u64) -> Option<usize> {
        loop {
            let e = &mut self.expiry;
            // The smaller root of the two heaps (`old` is empty unless compacting).
            let from_old = match (e.heap.peek(), e.old.peek()) {
                (None, None) => return None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some(h), Some(o)) => o > h,
            };
            let top = if from_old { &mut e.old } else { &mut e.heap };
            let &Reverse((exp, seq, key)) = top.peek()?;
            if exp > now {
                return None;
            }
            top.pop();
            if self.msgs.get(key).is_some_and(|m| m.seq == seq) {
                return Some(key);
            }
        }
    }

    /// Starts a compaction of the expiry heap once its stale entries outnumber the live
    /// messages (and none is running).
    fn maybe_start_compaction(&mut self) {
        let e = &mut self.expiry;
        if e.scan.is_none() && e.heap.len() > 2 * self.msgs.len() + 1024 {
            // `old` is empty here: its allocation becomes the fresh heap.
            std::mem::swap(&mut e.heap, &mut e.old);
            e.scan = Some((0, self.next_seq));
        }
    }

    /// Moves the live messages of the next `COMPACT_STEP` slab slots that are older than
    /// the running compaction into the fresh heap; ends the compaction after the last slot.
    fn compact_step(&mut self) {
        let Some((from, start_seq)) = self.expiry.scan else {
            return;
        };
        let to = (from + COMPACT_STEP).min(self.high);
        for key in from..to {
            if let Some(m) = self.msgs.get(key) {
                if m.seq < start_seq {
                    self.expiry.heap.push(Reverse((m.expires, m.seq, key)));
                }
            }
        }
        if to >= self.high {
            self.expiry.old.clear();
            self.expiry.scan = None;
            self.compactions += 1;
        } else {
            self.expiry.scan = Some((to, start_seq));
        }
    }
}

/// Messages a worker's cache makes room for at start, for a budget of `bytes`: as many as
/// the budget can ever hold, so that no table of the cache grows while serving (a growth
/// past a million entries copies or rehashes it all at once: a stall of tens of ms,
/// docs/PERFORMANCE.md "The cache's tables never grow while serving"). The cost is address
/// space, not memory. Under strict overcommit (`vm.overcommit_memory=2`) reserved address
/// space counts against the commit limit: there the room is one message per KiB of budget,
/// at most a million, and the tables may grow beyond it.
pub fn cache_presize(bytes: usize, strict_overcommit: bool) -> usize {
    if strict_overcommit {
        (bytes / 1024).min(1 << 20)
    } else {
        bytes / (ENTRY_OVERHEAD + MIN_CACHED_DATA)
    }
}

/// A floor on the bytes of a cached message's data: `{"topic":"","message":""}` is 26.
const MIN_CACHED_DATA: usize = 16;

/// The kernel refuses to overcommit memory (`vm.overcommit_memory` is 2).
pub fn strict_overcommit() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() == "2")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> ArcBuf {
        ArcBuf::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn evicts_oldest_and_expires_by_time() {
        let mut c = Cache::default();
        let a = c.insert(1, 0, 10, b("a"), 0, 500, Origin::NONE);
        let bb = c.insert(1, 0, 11, b("b"), 0, 100, Origin::NONE);
        let cc = c.insert(2, 0, 12, b("c"), 0, 300, Origin::NONE);
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
            let k = c.insert(1, 0, i, b("m"), 0, 1_000_000 + i, Origin::NONE);
            c.remove(k);
        }
        let e = &c.expiry;
        assert!(
            e.heap.len() + e.old.len() <= 1024 + 2,
            "heap {} + {}",
            e.heap.len(),
            e.old.len()
        );
    }

    /// A cache made with room for `n` messages holds `n` of them, and churns through many
    /// more (removals leaving stale heap entries, heap rebuilds), without any of its tables
    /// growing: a growth is a stall of the whole worker (see `with_capacity`).
    #[test]
    fn tables_never_grow_within_the_presized_count() {
        const N: usize = 20_000;
        let mut c = Cache::with_capacity(N);
        let caps = |c: &Cache| {
            let e = &c.expiry;
            (
                c.msgs.capacity(),
                e.heap.capacity().min(e.old.capacity()),
                e.heap.capacity().max(e.old.capacity()),
            )
        };
        let grew = |now: (usize, usize, usize), was: (usize, usize, usize)| {
            now.0 > was.0 || now.1 > was.1 || now.2 > was.2
        };
        let before = caps(&c);
        assert!(before.0 >= N && before.1 >= 2 * N, "{before:?}");
        let mut keys = std::collections::VecDeque::new();
        for i in 0..N as u64 {
            keys.push_back(c.insert(
                (i % 97) as u32,
                0,
                i,
                b("m"),
                0,
                1_000_000 - i,
                Origin::NONE,
            ));
        }
        assert!(!grew(caps(&c), before), "filling to N grew a table");
        // Steady state at the budget: each insert evicts the oldest (a stale heap entry).
        for i in 0..(10 * N) as u64 {
            let old = keys.pop_front().expect("full");
            c.remove(old);
            keys.push_back(c.insert(
                (i % 89) as u32,
                0,
                N as u64 + i,
                b("m"),
                0,
                2_000_000 + i,
                Origin::NONE,
            ));
            assert_eq!(c.len(), N);
        }
        assert!(
            c.compactions() >= 4,
            "only {} compactions ran",
            c.compactions()
        );
        assert!(
            !grew(caps(&c), before),
            "churning at N grew a table: {:?}",
            caps(&c)
        );
        let e = &c.expiry;
        assert!(e.heap.len() <= 2 * N + 1024 + 1, "heap {}", e.heap.len());
    }

    /// The expiry index against a model (a sorted map of every live message), through
    /// random inserts, removals and expiry sweeps, with compactions running in between:
    /// every sweep returns exactly the live messages due, earliest first, and never one
    /// that is gone. Also: no single operation scans more than `COMPACT_STEP` slots.
    #[test]
    fn expiry_matches_a_model_through_incremental_compactions() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut c = Cache::with_capacity(1024);
        let mut model = std::collections::BTreeMap::new(); // (expires, seq) -> key
        let mut live: Vec<usize> = Vec::new();
        let mut now = 0u64;
        let mut during = 0; // sweeps that ran while a compaction was under way
        for step in 0..300_000u64 {
            let was = c.expiry.scan;
            let mut calls = 1; // cache calls made by this step, each allowed one scan step
            match next() % 10 {
                // Insert, expiring within the next 0..1000 s (so removed messages leave
                // stale entries that build up and force compactions).
                0..=4 if live.len() < 1000 => {
                    let exp = now + next() % 1_000_000;
                    let k = c.insert(1, 0, step, b("m"), 0, exp, Origin::NONE);
                    model.insert((exp, c.get(k).unwrap().seq), k);
                    live.push(k);
                }
                // Remove a random live message (eviction, topic cap).
                0..=8 if !live.is_empty() => {
                    let i = (next() as usize) % live.len();
                    let k = live.swap_remove(i);
                    let m = c.remove(k).expect("live");
                    assert!(model.remove(&(m.expires, m.seq)).is_some());
                }
                // Time passes; sweep.
                _ => {
                    during += usize::from(c.expiry.scan.is_some());
                    now += next() % 2000;
                    while let Some(k) = c.next_expired(now) {
                        let m = c.get(k).expect("returned key is live");
                        let first = model.first_key_value().map(|(&(e, s), &k)| (e, s, k));
                        assert_eq!(first, Some((m.expires, m.seq, k)), "not the earliest due");
                        assert!(m.expires <= now);
                        model.pop_first();
                        live.retain(|&x| x != k);
                        c.remove(k);
                        calls += 1;
                    }
                    if let Some((&(e, _), _)) = model.first_key_value() {
                        assert!(e > now, "a due message was not returned");
                    }
                }
            }
            if let (Some((a, _)), Some((b, _))) = (was, c.expiry.scan) {
                assert!(
                    b >= a && b - a <= calls * COMPACT_STEP,
                    "{calls} calls scanned {a}..{b}"
                );
            }
            assert_eq!(c.len(), model.len());
        }
        assert!(
            c.compactions() >= 10,
            "only {} compactions ran",
            c.compactions()
        );
        assert!(during >= 10, "only {during} sweeps ran during a compaction");
    }
    #[test]
    fn the_cache_is_presized_for_its_budget_unless_overcommit_is_strict() {
        let gib = 1 << 30;
        // Room for the most messages a GiB can hold: each costs at least 144 bytes.
        assert_eq!(cache_presize(gib, false), gib / 144);
        assert!(cache_presize(gib, false) * (ENTRY_OVERHEAD + 26) > gib);
        // Under strict overcommit: one per KiB, at most a million.
        assert_eq!(cache_presize(gib, true), 1 << 20);
        assert_eq!(cache_presize(64 << 20, true), 64 << 10);
    }
}
