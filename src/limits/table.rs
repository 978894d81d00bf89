//! A worker's bounded table of shared limit state (one per IP address, one per
//! authenticated client id): a slab of entries of fixed maximum size, an index by key used
//! only when a connection starts, and a [`Handle`] (slot and generation) that the connection
//! keeps, so that a publish reaches its IP's and client's buckets without hashing.
//!
//! Bounded: at most `cap` entries; when full, an idle entry (no open connection) is taken
//! over, and when none is found close by the newcomer goes untracked (only its own
//! connection's buckets apply), so many addresses cannot grow it. Entries with no open
//! connection whose buckets have filled up again are dropped by [`Table::sweep`]: forgetting
//! them loses nothing.

use std::collections::HashMap;
use std::hash::Hash;

use super::bucket::{Bucket, Rate};

/// How many buckets an entry holds (publishes, bytes, subscriptions, accepts).
pub const BUCKETS: usize = 4;

/// A connection's reference to a table entry; stale once the entry is reused. Four bytes
/// (every connection keeps two): a table holds at most `u16::MAX` entries, and a 16-bit
/// generation is enough because an entry with a connection counted under it is never
/// reused (neither swept nor taken over), so a live connection's handle never goes stale;
/// the generation only guards handles used after their connection let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    slot: u16,
    gen: u16,
}

impl Handle {
    /// No entry.
    pub const NONE: Handle = Handle {
        slot: u16::MAX,
        gen: 0,
    };

    /// Whether it names an entry.
    pub fn is_some(&self) -> bool {
        self.slot != u16::MAX
    }
}

impl Default for Handle {
    fn default() -> Self {
        Handle::NONE
    }
}

/// One key's state.
#[derive(Debug)]
pub struct Entry<K> {
    /// The key (`None`: a free slot).
    key: Option<K>,
    /// Bumped whenever the slot changes hands: older handles no longer match.
    gen: u16,
    /// Open connections counted under it (never dropped while > 0).
    pub conns: u32,
    /// Last use (ms), for choosing whom to evict.
    pub last: u64,
    /// Its buckets, indexed like `Kind`.
    pub buckets: [Bucket; BUCKETS],
    /// Connections refused at accept since `refused_since` (addresses only; see
    /// `block`).
    pub refused: u32,
    /// When the current second of `refused` began (ms): at its first refusal.
    pub refused_since: u64,
    /// Blocks at the listener in a row (each doubles the next one's length).
    pub strikes: u8,
    /// Until when (ms) a new block counts as one more in the row (kept while it lasts).
    pub strike_until: u64,
    /// The address's slot in the shared table of counts (`limits::counts`), while `held`
    /// is above 0 (addresses only).
    pub slot: u32,
    /// Of `conns`, those counted in the shared table (the others are counted on this
    /// worker alone: the table had no room).
    pub held: u32,
}

/// A bounded table of entries keyed by `K`.
#[derive(Debug)]
pub struct Table<K> {
    entries: Vec<Entry<K>>,
    index: HashMap<K, u16>,
    free: Vec<u16>,
    cap: usize,
    /// Where the next eviction search and sweep start.
    hand: usize,
}

/// Entries looked at for an idle one when the table is full.
const EVICT_SCAN: usize = 64;

impl<K: Hash + Eq + Clone> Table<K> {
    /// An empty table of at most `cap` entries (allocated as they come; `u16::MAX` at most,
    /// so that a slot fits a [`Handle`]).
    pub fn new(cap: usize) -> Table<K> {
        Table {
            entries: Vec::new(),
            index: HashMap::new(),
            free: Vec::new(),
            cap: cap.min(u16::MAX as usize),
            hand: 0,
        }
    }

    /// Entries in use.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no entry is in use.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The entry of `key`, made (with full buckets of `rates`) if needed; `None` when the
    /// table is full of entries with open connections.
    pub fn find_or_add(&mut self, key: &K, rates: &[Rate; BUCKETS], now: u64) -> Option<Handle> {
        if let Some(&slot) = self.index.get(key) {
            let e = self.entries.get_mut(slot as usize)?;
            e.last = now;
            return Some(Handle { slot, gen: e.gen });
        }
        let slot = self.free_slot()?;
        let owned = key.clone();
        let buckets = rates.map(|r| Bucket::full(r, now));
        let e = self.entries.get_mut(slot as usize)?;
        e.key = Some(owned.clone());
        e.conns = 0;
        e.last = now;
        e.buckets = buckets;
        e.refused = 0;
        e.refused_since = now;
        e.strikes = 0;
        e.strike_until = 0;
        e.slot = 0;
        e.held = 0;
        self.index.insert(owned, slot);
        Some(Handle { slot, gen: e.gen })
    }

    /// A slot for a new entry: a free one, a new one under the cap, or an idle one taken
    /// over.
    fn free_slot(&mut self) -> Option<u16> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if self.entries.len() < self.cap {
            self.entries.push(Entry {
                key: None,
                gen: 0,
                conns: 0,
                last: 0,
                buckets: [Bucket::default(); BUCKETS],
                refused: 0,
                refused_since: 0,
                strikes: 0,
                strike_until: 0,
                slot: 0,
                held: 0,
            });
            return u16::try_from(self.entries.len() - 1).ok();
        }
        let n = self.entries.len();
        let mut best: Option<(usize, u64)> = None;
        for i in 0..EVICT_SCAN.min(n) {
            let at = (self.hand + i) % n;
            let e = &self.entries[at];
            if e.conns == 0 && best.is_none_or(|(_, last)| e.last < last) {
                best = Some((at, e.last));
            }
        }
        self.hand = (self.hand + EVICT_SCAN) % n.max(1);
        let (at, _) = best?;
        self.vacate(at);
        self.free.pop()
    }

    /// Frees slot `at` (its handles go stale).
    fn vacate(&mut self, at: usize) {
        let Some(e) = self.entries.get_mut(at) else {
            return;
        };
        if let Some(k) = e.key.take() {
            self.index.remove(&k);
            e.gen = e.gen.wrapping_add(1);
            if let Ok(at) = u16::try_from(at) {
                self.free.push(at);
            }
        }
    }

    /// The handle of `key`'s entry, if it has one.
    pub fn handle_of(&self, key: &K) -> Option<Handle> {
        let &slot = self.index.get(key)?;
        let e = self.entries.get(slot as usize)?;
        Some(Handle { slot, gen: e.gen })
    }

    /// The entry `h` names, if it still does.
    #[inline]
    pub fn get(&mut self, h: Handle) -> Option<&mut Entry<K>> {
        self.entries
            .get_mut(h.slot as usize)
            .filter(|e| e.gen == h.gen && e.key.is_some())
    }

    /// Calls `f` on every entry in use.
    pub fn for_each(&mut self, f: impl FnMut(&mut Entry<K>)) {
        self.entries
            .iter_mut()
            .filter(|e| e.key.is_some())
            .for_each(f);
    }

    /// Looks at up to `budget` entries from where the last sweep stopped and drops those
    /// with no open connection whose buckets are full again (and whose row of blocks at
    /// the listener is over).
    pub fn sweep(&mut self, rates: &[Rate; BUCKETS], now: u64, budget: usize) {
        let n = self.entries.len();
        if n == 0 {
            return;
        }
        for i in 0..budget.min(n) {
            let at = (self.hand + i) % n;
            let e = &mut self.entries[at];
            let idle = e.key.is_some()
                && e.conns == 0
                && e.strike_until <= now
                && e.buckets
                    .iter_mut()
                    .zip(rates)
                    .all(|(b, r)| b.is_full(*r, now));
            if idle {
                self.vacate(at);
            }
        }
        self.hand = (self.hand + budget) % n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: [Rate; BUCKETS] = [Rate::OFF; BUCKETS];

    #[test]
    fn finds_the_same_entry_and_handles_go_stale_when_dropped() {
        let mut t: Table<u128> = Table::new(4);
        let a = t.find_or_add(&1, &R, 0).unwrap();
        assert_eq!(t.find_or_add(&1, &R, 5), Some(a));
        let b = t.find_or_add(&2, &R, 0).unwrap();
        assert_ne!(a, b);
        t.get(a).unwrap().conns = 1;
        t.sweep(&R, 10, 100);
        // Idle `2` dropped, `1` (one connection) kept.
        assert!(t.get(b).is_none() && t.get(a).is_some());
        assert_eq!(t.len(), 1);
        let c = t.find_or_add(&3, &R, 0).unwrap();
        assert!(
            t.get(b).is_none(),
            "a reused slot does not answer an old handle"
        );
        assert!(t.get(c).is_some());
    }

    #[test]
    fn full_table_takes_over_an_idle_entry_or_says_none() {
        let mut t: Table<u128> = Table::new(3);
        for k in 0..3u128 {
            let h = t.find_or_add(&k, &R, k as u64).unwrap();
            t.get(h).unwrap().conns = u32::from(k != 1);
        }
        // Only `1` is idle: it is taken over.
        let h = t.find_or_add(&10, &R, 9).unwrap();
        assert_eq!(t.len(), 3);
        t.get(h).unwrap().conns = 1;
        assert!(t.find_or_add(&11, &R, 9).is_none(), "all busy: untracked");
        assert_eq!(t.len(), 3);
        // Many addresses never grow it.
        for k in 100..10_000u128 {
            let _ = t.find_or_add(&k, &R, 10);
        }
        assert!(t.len() <= 3 && t.entries.len() <= 3);
    }

    #[test]
    fn sweep_keeps_an_idle_entry_while_its_row_of_blocks_can_go_on() {
        let mut t: Table<u128> = Table::new(4);
        let h = t.find_or_add(&1, &R, 0).unwrap();
        t.get(h).unwrap().strike_until = 500;
        t.sweep(&R, 499, 4);
        assert!(t.get(h).is_some(), "row still open: kept");
        t.sweep(&R, 500, 4);
        assert!(t.get(h).is_none(), "row over: dropped");
    }

    #[test]
    fn sweep_keeps_entries_whose_buckets_are_not_full() {
        let rates = [Rate::new(1.0, 2.0), Rate::OFF, Rate::OFF, Rate::OFF];
        let mut t: Table<std::sync::Arc<str>> = Table::new(8);
        let h = t.find_or_add(&"client".into(), &rates, 0).unwrap();
        let e = t.get(h).unwrap();
        e.buckets[0].take(rates[0], 2.0);
        t.sweep(&rates, 1000, 8);
        assert!(t.get(h).is_some(), "one token short: kept");
        t.sweep(&rates, 2000, 8);
        assert!(t.get(h).is_none(), "full again: dropped");
        assert!(t.is_empty());
    }
}
