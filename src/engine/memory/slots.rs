//! A slab (values in one `Vec`, keyed by index, vacant entries chained into a free list,
//! the last freed reused first) whose entries can be asked for ahead of use without being
//! read: [`Slots::prefetch`] computes an entry's address from its key alone.
//!
//! Why not the `slab` crate: its only way to an entry checks the entry's tag first, which
//! is a load of the very line a prefetch is meant to ask for, so "prefetching" a cold
//! message would wait for it (docs/PERFORMANCE.md, "The publish path at saturation").
//!
//! Pure data structure of the engines, with no `unsafe`.

/// One entry: a value, or the key of the next vacant entry.
#[derive(Debug)]
enum Entry<T> {
    Occupied(T),
    Vacant(usize),
}

/// Values keyed by `usize`, keys reused (see the module doc).
#[derive(Debug)]
pub struct Slots<T> {
    entries: Vec<Entry<T>>,
    /// The first vacant entry, or `entries.len()` when none is.
    next_free: usize,
    len: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots::with_capacity(0)
    }
}

impl<T> Slots<T> {
    /// Room for `n` values before the table grows (reserved, not touched).
    pub fn with_capacity(n: usize) -> Slots<T> {
        Slots {
            entries: Vec::with_capacity(n),
            next_free: 0,
            len: 0,
        }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries the table holds before it grows.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// Stores `value`; returns its key (the last one freed, else a new one).
    pub fn insert(&mut self, value: T) -> usize {
        self.len += 1;
        let key = self.next_free;
        if let Some(e @ Entry::Vacant(_)) = self.entries.get_mut(key) {
            if let Entry::Vacant(next) = std::mem::replace(e, Entry::Occupied(value)) {
                self.next_free = next;
            }
            return key;
        }
        // No vacant entry (`next_free` is one past the end): a new one.
        self.entries.push(Entry::Occupied(value));
        self.next_free = self.entries.len();
        self.entries.len() - 1
    }

    /// The value at `key`.
    #[inline]
    pub fn get(&self, key: usize) -> Option<&T> {
        match self.entries.get(key) {
            Some(Entry::Occupied(v)) => Some(v),
            _ => None,
        }
    }

    /// The value at `key`, to change.
    #[inline]
    pub fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        match self.entries.get_mut(key) {
            Some(Entry::Occupied(v)) => Some(v),
            _ => None,
        }
    }

    /// Takes the value at `key` out; its key is free for the next insert.
    pub fn try_remove(&mut self, key: usize) -> Option<T> {
        let e = self.entries.get_mut(key)?;
        if !matches!(e, Entry::Occupied(_)) {
            return None;
        }
        let Entry::Occupied(v) = std::mem::replace(e, Entry::Vacant(self.next_free)) else {
            return None;
        };
        self.next_free = key;
        self.len -= 1;
        Some(v)
    }

    /// Starts loading the lines of the entry at `key` (any key: nothing is read, and a key
    /// past the end asks for nothing).
    #[inline]
    pub fn prefetch(&self, key: usize) {
        if key < self.entries.len() {
            let size = std::mem::size_of::<Entry<T>>();
            let at = self.entries.as_ptr().wrapping_add(key).cast::<u8>();
            crate::prefetch::range(at, size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a map from key to value: every operation gives the same answers, keys are
    /// reused last freed first, and the table does not grow while a freed key is available.
    #[test]
    fn behaves_as_a_map_and_reuses_the_last_freed_key() {
        let mut s = Slots::with_capacity(4);
        let mut model = std::collections::BTreeMap::new();
        let mut freed = Vec::new();
        let mut x: u64 = 1;
        for i in 0..10_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(3) && !model.is_empty() {
                let nth = (x as usize / 3) % model.len();
                let k = *model.keys().nth(nth).unwrap();
                assert_eq!(s.try_remove(k), model.remove(&k));
                assert_eq!(s.try_remove(k), None);
                freed.push(k);
            } else {
                let k = s.insert(i);
                if let Some(f) = freed.pop() {
                    assert_eq!(k, f, "the last freed key is reused first");
                }
                assert_eq!(model.insert(k, i), None, "key {k} was in use");
            }
            assert_eq!(s.len(), model.len());
            assert_eq!(s.is_empty(), model.is_empty());
        }
        for k in 0..s.entries.len() + 2 {
            assert_eq!(s.get(k), model.get(&k));
            s.prefetch(k);
        }
        if let Some((&k, _)) = model.iter().next() {
            *s.get_mut(k).unwrap() = 7;
            assert_eq!(s.get(k), Some(&7));
        }
    }
}
