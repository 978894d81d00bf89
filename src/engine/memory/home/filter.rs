//! A home topic's dedup filter: which content hashes its cached messages have, as a
//! multiset of 32-bit fingerprints in one flat array (open addressing, linear probing,
//! backward-shift deletion). An answer of "absent" is certain; "present" may rarely be
//! another hash with the same fingerprint, and the caller then compares bytes, as it would
//! for a 64-bit hash collision.
//!
//! Why not a `HashMap<u64, u32>`: at saturation every publish checks and adds its hash and
//! the evicted message removes its own, in tables that are cold by then (a thousand topics of
//! a thousand messages each). A SwissTable keeps its control bytes and its entries in
//! different cache lines, so each of those steps misses the cache twice (about a tenth of a
//! saturated core in all). Here a probe, the insert after it and a removal each stay within
//! one line most of the time, and the array is a quarter of the size.
//!
//! Pure data structure of `engine::home`, with no clock, no I/O and no `unsafe`.

/// Fewest slots of a non-empty filter: 16 fingerprints, one cache line.
const MIN_SLOTS: usize = 16;

/// The fingerprints of a topic's cached content hashes, with repeats (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Filter {
    /// Fingerprints (never 0) or 0 for an empty slot; a power of two long, or empty.
    slots: Box<[u32]>,
    /// Fingerprints held.
    len: usize,
}

/// The fingerprint of a content hash: its high half, never 0 (0 marks an empty slot).
fn fingerprint(hash: u64) -> u32 {
    ((hash >> 32) as u32).max(1)
}

impl Filter {
    /// Fingerprints held (one per noted hash not yet forgotten).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Slots allocated (0 when empty: an empty filter holds no memory).
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The home slot of fingerprint `fp` in a table of `mask + 1` slots: the fingerprint
    /// alone decides it, so entries can move during a deletion without their hash.
    fn home(fp: u32, mask: usize) -> usize {
        fp.wrapping_mul(0x9E37_79B9).rotate_left(16) as usize & mask
    }

    /// Whether a hash with `hash`'s fingerprint was noted and not forgotten since: `false`
    /// means `hash` certainly was not.
    pub(super) fn may_contain(&self, hash: u64) -> bool {
        if self.len == 0 {
            return false;
        }
        let fp = fingerprint(hash);
        let mask = self.slots.len() - 1;
        let mut i = Self::home(fp, mask);
        loop {
            match self.slots.get(i).copied() {
                Some(0) | None => return false,
                Some(s) if s == fp => return true,
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    /// Starts loading the line where a probe for `hash` begins (see `crate::prefetch`).
    pub(super) fn prefetch(&self, hash: u64) {
        if self.len == 0 {
            return;
        }
        let i = Self::home(fingerprint(hash), self.slots.len() - 1);
        if let Some(s) = self.slots.get(i) {
            crate::prefetch::line(s);
        }
    }

    /// Notes one more cached message with `hash`.
    pub(super) fn note(&mut self, hash: u64) {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let fp = fingerprint(hash);
        Self::put(&mut self.slots, fp);
        self.len += 1;
    }

    /// Puts `fp` in the first empty slot from its home (the table has one: load <= 1/2).
    fn put(slots: &mut [u32], fp: u32) {
        let mask = slots.len() - 1;
        let mut i = Self::home(fp, mask);
        while let Some(s) = slots.get_mut(i) {
            if *s == 0 {
                *s = fp;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Twice the slots (at least [`MIN_SLOTS`]), every fingerprint put again.
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(MIN_SLOTS);
        let mut slots = vec![0u32; n].into_boxed_slice();
        for &fp in self.slots.iter().filter(|&&fp| fp != 0) {
            Self::put(&mut slots, fp);
        }
        self.slots = slots;
    }

    /// Forgets one cached message with `hash` (nothing if none was noted). The memory goes
    /// with the last one.
    pub(super) fn forget(&mut self, hash: u64) {
        if self.len == 0 {
            return;
        }
        let fp = fingerprint(hash);
        let mask = self.slots.len() - 1;
        let mut i = Self::home(fp, mask);
        loop {
            match self.slots.get(i).copied() {
                Some(0) | None => return,
                Some(s) if s == fp => break,
                Some(_) => i = (i + 1) & mask,
            }
        }
        self.len -= 1;
        if self.len == 0 {
            *self = Filter::default();
            return;
        }
        // Backward shift: each following entry of the run moves into the hole when its
        // home does not lie after the hole (so every entry stays reachable from its home).
        // Without a branch on that: it depends on a random home, and a branch on it was
        // mispredicted about every other entry (most of this function's time at
        // saturation). Each entry is written either into the hole or over itself.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while let Some(&s) = self.slots.get(j) {
            if s == 0 {
                break;
            }
            let from_home = j.wrapping_sub(Self::home(s, mask)) & mask;
            let from_hole = j.wrapping_sub(hole) & mask;
            let moves = from_home >= from_hole;
            let to = std::hint::select_unpredictable(moves, hole, j);
            if let Some(x) = self.slots.get_mut(to) {
                *x = s;
            }
            hole = std::hint::select_unpredictable(moves, j, hole);
            j = (j + 1) & mask;
        }
        self.slots[hole] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn counts_copies_and_lets_its_memory_go_when_empty() {
        let mut f = Filter::default();
        assert_eq!(f.capacity(), 0);
        f.note(1 << 32);
        f.note(1 << 32);
        f.note(2 << 32);
        f.forget(1 << 32);
        assert!(f.may_contain(1 << 32), "one copy is still cached");
        f.forget(1 << 32);
        assert!(!f.may_contain(1 << 32));
        f.forget(7 << 32); // never noted: nothing happens
        assert_eq!(f.len(), 1);
        f.forget(2 << 32);
        assert_eq!(f.len(), 0);
        assert_eq!(f.capacity(), 0, "an empty filter keeps no table");
    }

    #[test]
    fn stays_at_most_half_full() {
        let mut f = Filter::default();
        for h in 0..1000u64 {
            f.note(h.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        assert_eq!(f.len(), 1000);
        assert_eq!(f.capacity(), 2048);
    }

    /// Hashes whose fingerprints collide often (few distinct high halves), so runs are long
    /// and deletions shift entries across the end of the table.
    fn hashes() -> impl Strategy<Value = u64> {
        (0u64..24, any::<u32>()).prop_map(|(hi, lo)| (hi << 32) | u64::from(lo))
    }

    proptest! {
        /// Against a map of fingerprint -> count: never a false "absent", and exact counts.
        #[test]
        fn agrees_with_a_counting_map(ops in proptest::collection::vec((any::<bool>(), hashes()), 0..400)) {
            let mut f = Filter::default();
            let mut model: HashMap<u32, usize> = HashMap::new();
            for (add, h) in ops {
                let fp = fingerprint(h);
                if add {
                    f.note(h);
                    *model.entry(fp).or_default() += 1;
                } else {
                    f.forget(h);
                    if let Some(c) = model.get_mut(&fp) {
                        *c -= 1;
                        if *c == 0 {
                            model.remove(&fp);
                        }
                    }
                }
                prop_assert_eq!(f.len(), model.values().sum::<usize>());
                for hi in 0u64..24 {
                    let h = hi << 32;
                    prop_assert_eq!(f.may_contain(h), model.contains_key(&fingerprint(h)));
                }
                let held = f.slots.iter().filter(|&&s| s != 0).count();
                prop_assert_eq!(held, f.len());
            }
        }
    }
}
