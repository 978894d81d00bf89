//! This node's publishes' arrival stamps across their trip through Redis. A live message
//! comes back on a channel as bytes, without the stamp its body carried here
//! (`message::Body::arrived`, for `walletrelay_publish_delivery_seconds`): the command
//! thread notes the stamp before the publish is sent, keyed by the publishing connection and
//! a hash of the body's bytes, and the subscriber thread takes it back for the message it
//! forwards. Both hashes are made on those helper threads, none on a worker.
//!
//! Lock-free and bounded: one atomic word per slot (32 bits of the key, 32 of the stamp). A
//! slot taken by a later publish before its message came back, or a message published by
//! another node (looked for all the same: the cluster's node id is not the relay's
//! `Origin::node`), just gets no stamp: no sample, never a wrong one (but for a 32-bit key
//! collision).
//!
//! Owns the table only; what a stamp is belongs to `metrics::latency`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::message::Origin;

/// Slots of the table: publishes whose message may be on its way back at once.
const SLOTS: usize = 4096;

/// The table (one per node, shared by its command and subscriber threads).
pub(crate) struct Arrivals {
    slots: Box<[AtomicU64]>,
    hasher: ahash::RandomState,
}

impl Default for Arrivals {
    fn default() -> Self {
        Arrivals {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            hasher: ahash::RandomState::with_seeds(0x5a17, 0x4e1a, 0x9b0d, 0x2c6f),
        }
    }
}

impl std::fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arrivals").finish_non_exhaustive()
    }
}

impl Arrivals {
    /// The slot and key of a message.
    fn place(&self, origin: Origin, body: &[u8]) -> (usize, u64) {
        let h = self.hasher.hash_one((origin.node, origin.conn, body));
        ((h as usize) % SLOTS, h >> 32)
    }

    /// `origin` publishes `body`, which arrived at `at` (0: not stamped, nothing noted).
    pub(crate) fn note(&self, origin: Origin, body: &[u8], at: u32) {
        if at == 0 {
            return;
        }
        let (i, key) = self.place(origin, body);
        if let Some(s) = self.slots.get(i) {
            s.store(key << 32 | u64::from(at), Ordering::Relaxed);
        }
    }

    /// The stamp of `body` published by `origin`, once (0 when not noted here).
    pub(crate) fn take(&self, origin: Origin, body: &[u8]) -> u32 {
        let (i, key) = self.place(origin, body);
        let Some(s) = self.slots.get(i) else {
            return 0;
        };
        let v = s.load(Ordering::Relaxed);
        if v >> 32 != key {
            return 0;
        }
        match s.compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => v as u32,
            Err(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_is_taken_back_once_for_the_same_publisher_and_bytes() {
        let a = Arrivals::default();
        let me = Origin { node: 1, conn: 7 };
        a.note(me, b"{\"m\":1}", 42);
        a.note(me, b"{\"m\":2}", 0);
        assert_eq!(a.take(Origin { node: 1, conn: 8 }, b"{\"m\":1}"), 0);
        assert_eq!(a.take(me, b"{\"m\":2}"), 0);
        assert_eq!(a.take(me, b"{\"m\":1}"), 42);
        assert_eq!(a.take(me, b"{\"m\":1}"), 0);
    }
}
