//! One worker's message cache: every message cached on the topics this worker is home of,
//! with per-message expiry and oldest-first eviction under a byte budget.
//!
//! Messages live in a slab. Indexes point into it, each O(1) or O(log n) per operation, so
//! nothing ever scans the whole cache:
//! - an intrusive doubly linked list in insertion order (oldest first) for byte eviction;
//! - the expiry index, in two parts. Messages of one ttl expire in the order they came, so
//!   most messages go to one of a few *lanes*: intrusive doubly linked lists, each in
//!   expiry order, which a removal leaves in O(1) and which cost nothing to keep. A message
//!   that fits no lane (its expiry earlier than every busy lane's last) goes to a min-heap
//!   with lazy deletion, compacted once its stale entries outnumber its live ones so that
//!   its size stays within about twice what it holds. The compaction never stops the
//!   worker: a fresh heap is built from the slab a few dozen slots per cache operation,
//!   while the old one still answers (see `Expiry`): rebuilding it at once would stall the
//!   worker for milliseconds.
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

/// The end of a list. Keys are below it: see [`MAX_LEN`].
const NIL: u32 = u32::MAX;

/// Most messages a cache holds (`HomeTopics::bound` evicts beyond it). A key never exceeds
/// the most messages the cache ever held (the slab reuses freed keys), and an insert adds
/// one before the bound evicts, so every key is at most `MAX_LEN` and fits the 32-bit links
/// below [`NIL`] (which keep an entry in two cache lines). Reaching it would take hundreds
/// of GB of cache on one worker.
pub const MAX_LEN: usize = u32::MAX as usize - 2;

/// Expiry lanes (see the module doc): one per ttl in steady use, as many as the usual
/// clients use at once (the SDK's session and pairing ttls).
const LANES: usize = 4;

/// `Cached::lane` of a message in no lane: its expiry is in the heap.
const IN_HEAP: u8 = u8::MAX;

/// Slab slots scanned per cache operation while the expiry heap is compacted: the scan of
/// a full default cache (1.47M messages) spreads over ~23k operations.
const COMPACT_STEP: usize = 64;

/// An expiry heap entry: (expires, seq, slab key), smallest first.
type Due = Reverse<(u64, u64, usize)>;

/// Fixed bytes counted for each cached message besides its payload (slab entry, indexes).
pub const ENTRY_OVERHEAD: usize = 128;

pub use crate::engine::Origin;

/// A message to cache ([`Cache::insert`]).
#[derive(Debug)]
pub struct Entry {
    /// The slot of its topic.
    pub topic: u32,
    /// Its number in the topic (its position's `seq`).
    pub topic_seq: u64,
    /// Its content hash (dedup).
    pub hash: u64,
    /// Its stored body.
    pub data: ArcBuf,
    /// How much of `data` a beta push sends.
    pub beta_len: u32,
    /// When it expires, ms.
    pub expires: u64,
    /// Its publisher.
    pub origin: Origin,
}

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
    /// Its expiry lane, or [`IN_HEAP`].
    lane: u8,
    /// Neighbours in insertion order.
    prev: u32,
    next: u32,
    /// Neighbours in its lane (expiry order).
    lane_prev: u32,
    lane_next: u32,
}

impl Cached {
    /// A v2 message's content (`None` for a v1 frame, or bytes that are not a body).
    pub fn body(&self) -> Option<crate::message::Body> {
        crate::message::Body::from_parts(self.data.clone(), self.beta_len)
    }
}

/// One expiry lane: a list through its messages in expiry order.
#[derive(Debug, Clone, Copy)]
struct Lane {
    head: u32,
    tail: u32,
    /// At or above its tail's expiry (not lowered when the tail leaves): a message whose
    /// expiry is at least this one may join at the tail.
    last: u64,
}

impl Default for Lane {
    fn default() -> Self {
        Lane {
            head: NIL,
            tail: NIL,
            last: 0,
        }
    }
}

/// The expiry index: lanes (see the module doc), and for the rest a min-heap with lazy
/// deletion (a removed message's entry stays until it surfaces, and is recognised as stale
/// by its slab key no longer holding its `seq`).
///
/// Compaction, once stale entries outnumber live ones: `heap` becomes `old` (still
/// consulted, never added to), and a fresh `heap` receives every new message plus, slot by
/// slot, every live message older than the compaction, as `scan` walks the slab. Every live
/// message is in at least one of the two heaps at all times (a duplicate is skipped as stale
/// once its message is gone), so expiry never misses one; when the walk ends, `old` is
/// emptied and keeps its allocation for the next compaction.
#[derive(Debug, Default)]
struct Expiry {
    lanes: [Lane; LANES],
    /// Live messages whose expiry is in the heap.
    heap_live: usize,
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
    /// them past a few hundred thousand entries copies it all at once, which stalls a
    /// worker for milliseconds. The memory is reserved, not touched: the tables fill from
    /// their start. Each of the two expiry heaps gets room for twice `n` (plus what a
    /// compaction adds while it runs): the heap holds stale entries until they outnumber the
    /// live ones.
    pub fn with_capacity(n: usize) -> Cache {
        let heap_room = 2 * n + n / COMPACT_STEP + 2048;
        Cache {
            msgs: Slots::with_capacity(n),
            expiry: Expiry {
                heap: BinaryHeap::with_capacity(heap_room),
                old: BinaryHeap::with_capacity(heap_room),
                ..Expiry::default()
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
    /// million entries, is cold at saturation.
    pub fn prefetch_expiry(&self) {
        let heap = self.expiry.heap.as_slice();
        if let Some(parent) = heap.get(heap.len().saturating_sub(1) / 2) {
            crate::prefetch::line(parent);
        }
    }

    /// Starts loading the entries that removing the message at `key` relinks (its neighbours
    /// in insertion order and in its lane, mostly the same ones), once its own entry has
    /// arrived (see `crate::prefetch`).
    pub fn prefetch_links(&self, key: usize) {
        if let Some(m) = self.msgs.get(key) {
            for k in [m.prev, m.next] {
                self.msgs.prefetch(k as usize);
            }
            for k in [m.lane_prev, m.lane_next] {
                if k != m.prev && k != m.next {
                    self.msgs.prefetch(k as usize);
                }
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

    /// Stores `e`; returns its key.
    pub fn insert(&mut self, e: Entry) -> usize {
        let Entry {
            topic,
            topic_seq,
            hash,
            data,
            beta_len,
            expires,
            origin,
        } = e;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += data.len() + ENTRY_OVERHEAD;
        let lane = self.expiry.lane_for(expires);
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
            lane: lane.map_or(IN_HEAP, |l| l as u8),
            prev: self.newest.map_or(NIL, |k| k as u32),
            next: NIL,
            lane_prev: lane.map_or(NIL, |l| self.expiry.lanes[l].tail),
            lane_next: NIL,
        });
        // Below `NIL`: see `MAX_LEN`.
        let k = key as u32;
        match self.newest {
            Some(n) => {
                if let Some(m) = self.msgs.get_mut(n) {
                    m.next = k;
                }
            }
            None => self.oldest = Some(key),
        }
        self.newest = Some(key);
        self.high = self.high.max(key + 1);
        match lane {
            Some(l) => {
                let lane = &mut self.expiry.lanes[l];
                match self.msgs.get_mut(lane.tail as usize) {
                    Some(t) => t.lane_next = k,
                    None => lane.head = k,
                }
                lane.tail = k;
                lane.last = expires;
            }
            None => {
                self.expiry.heap.push(Reverse((expires, seq, key)));
                self.expiry.heap_live += 1;
            }
        }
        self.compact_step();
        key
    }

    /// Removes the message at `key`, returning it.
    pub fn remove(&mut self, key: usize) -> Option<Cached> {
        let m = self.msgs.try_remove(key)?;
        if m.prev == NIL {
            self.oldest = (m.next != NIL).then_some(m.next as usize);
        } else if let Some(p) = self.msgs.get_mut(m.prev as usize) {
            p.next = m.next;
        }
        if m.next == NIL {
            self.newest = (m.prev != NIL).then_some(m.prev as usize);
        } else if let Some(n) = self.msgs.get_mut(m.next as usize) {
            n.prev = m.prev;
        }
        match self.expiry.lanes.get_mut(usize::from(m.lane)) {
            Some(lane) => {
                match self.msgs.get_mut(m.lane_prev as usize) {
                    Some(p) => p.lane_next = m.lane_next,
                    None => lane.head = m.lane_next,
                }
                match self.msgs.get_mut(m.lane_next as usize) {
                    Some(n) => n.lane_prev = m.lane_prev,
                    None => lane.tail = m.lane_prev,
                }
                if lane.head == NIL {
                    *lane = Lane::default();
                }
            }
            None => self.expiry.heap_live -= 1,
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

    /// Key of the next message whose expiry is at or before `now`, if any, earliest first
    /// (skipping stale heap entries). The caller removes it.
    pub fn next_expired(&mut self, now: u64) -> Option<usize> {
        // The earliest lane head (a lane's head is its earliest).
        let lane = self
            .expiry
            .lanes
            .iter()
            .filter_map(|l| {
                let m = self.msgs.get(l.head as usize)?;
                Some((m.expires, m.seq, l.head as usize))
            })
            .min();
        let e = &mut self.expiry;
        let heap = loop {
            // The smaller root of the two heaps (`old` is empty unless compacting).
            let from_old = match (e.heap.peek(), e.old.peek()) {
                (None, None) => break None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some(h), Some(o)) => o > h,
            };
            let top = if from_old { &mut e.old } else { &mut e.heap };
            let &Reverse((exp, seq, key)) = top.peek()?;
            if self.msgs.get(key).is_some_and(|m| m.seq == seq) {
                break Some((exp, seq, key, from_old));
            }
            top.pop();
        };
        match (lane, heap) {
            (Some((exp, seq, key)), h) if h.is_none_or(|(he, hs, ..)| (exp, seq) < (he, hs)) => {
                (exp <= now).then_some(key)
            }
            (_, Some((exp, _, key, from_old))) if exp <= now => {
                if from_old { &mut e.old } else { &mut e.heap }.pop();
                Some(key)
            }
            _ => None,
        }
    }

    /// Starts a compaction of the expiry heap once its stale entries outnumber the live
    /// messages it holds (and none is running).
    fn maybe_start_compaction(&mut self) {
        let e = &mut self.expiry;
        if e.scan.is_none() && e.heap.len() > 2 * e.heap_live + 1024 {
            // `old` is empty here: its allocation becomes the fresh heap.
            std::mem::swap(&mut e.heap, &mut e.old);
            e.scan = Some((0, self.next_seq));
        }
    }

    /// Moves the live heap messages of the next `COMPACT_STEP` slab slots that are older than
    /// the running compaction into the fresh heap; ends the compaction after the last slot.
    fn compact_step(&mut self) {
        let Some((from, start_seq)) = self.expiry.scan else {
            return;
        };
        let to = (from + COMPACT_STEP).min(self.high);
        for key in from..to {
            if let Some(m) = self.msgs.get(key) {
                if m.seq < start_seq && m.lane == IN_HEAP {
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

impl Expiry {
    /// The lane a message expiring at `expires` joins: of the lanes it may join (their last
    /// at or before it), the one with the latest last, so that each ttl keeps to its own
    /// lane; else an empty lane; else none (the heap).
    fn lane_for(&self, expires: u64) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        let mut empty = None;
        for (i, l) in self.lanes.iter().enumerate() {
            if l.head == NIL {
                empty = empty.or(Some(i));
            } else if l.last <= expires && best.is_none_or(|(_, b)| l.last > b) {
                best = Some((i, l.last));
            }
        }
        best.map(|(i, _)| i).or(empty)
    }
}

/// Messages a worker's cache makes room for at start, for a budget of `bytes`: as many as
/// the budget can ever hold, so that no table of the cache grows while serving (a growth
/// past a million entries copies or rehashes it all at once: a stall of tens of ms). The
/// cost is address space, not memory. Under strict overcommit (`vm.overcommit_memory=2`)
/// reserved address space counts against the commit limit: there the room is one message
/// per KiB of budget, at most a million, and the tables may grow beyond it.
pub fn cache_presize(bytes: usize, strict_overcommit: bool) -> usize {
    if strict_overcommit {
        (bytes / 1024).min(1 << 20)
    } else {
        (bytes / (ENTRY_OVERHEAD + MIN_CACHED_DATA)).min(MAX_LEN)
    }
}

/// A floor on the bytes of a cached message's data: `{"topic":"","message":""}` is 26.
const MIN_CACHED_DATA: usize = 16;

/// The kernel refuses to overcommit memory (`vm.overcommit_memory` is 2).
pub fn strict_overcommit() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() == "2")
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
