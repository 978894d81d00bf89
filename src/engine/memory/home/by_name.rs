//! A home's shortcut from a topic's name, as an `Arc` it already holds, to the topic's slot,
//! without hashing the name: the relay hands the same `Arc` in with every publish on a topic
//! its worker has subscriptions on, and a topic created by such a publish keeps it as its
//! name. A fixed table indexed by the name's address; an entry is only a candidate, proven
//! by the slot's own name being that very allocation (two live allocations never share an
//! address), so a stale or overwritten entry is a miss, never a wrong topic.
//!
//! Pure lookup state of `engine::home`, which alone fills and checks it.

use std::sync::Arc;

/// Entries, a power of two (16 KiB a worker). A miss costs the hash lookup it replaces.
const BITS: u32 = 12;

/// Candidate slots by name address.
#[derive(Debug)]
pub(super) struct ByName {
    slots: Box<[u32]>,
}

impl ByName {
    pub(super) fn new() -> ByName {
        ByName {
            slots: vec![u32::MAX; 1 << BITS].into_boxed_slice(),
        }
    }

    fn index(name: &Arc<str>) -> usize {
        let addr = Arc::as_ptr(name).cast::<u8>() as usize as u64;
        (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BITS)) as usize
    }

    /// The slot last recorded for `name`'s allocation (to be checked by the caller).
    pub(super) fn candidate(&self, name: &Arc<str>) -> u32 {
        self.slots
            .get(Self::index(name))
            .copied()
            .unwrap_or(u32::MAX)
    }

    /// Records that the topic in `slot` has `name`'s allocation as its name.
    pub(super) fn set(&mut self, name: &Arc<str>, slot: u32) {
        if let Some(s) = self.slots.get_mut(Self::index(name)) {
            *s = slot;
        }
    }
}
