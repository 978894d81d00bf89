//! Pushes to a client id's subscriptions that wait for their acknowledgement (the SDK
//! acknowledges every push with `{"id":<push id>,"result":true}`). Two uses (DECISIONS 13):
//! when the socket closes, its subscription reports as given only what precedes its first
//! unacknowledged push (a push written to a socket that died is given again on the client's
//! next subscription or fetch, never lost); and a watched client's acknowledgement is its
//! `delivered` event (those entries keep the message). At most [`MAX_UNACKED`] entries: past
//! it the oldest is dropped and its position kept per subscription as a floor, so a close
//! still reports no further than it.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::message::{Body, Position};

/// Most pushes a connection remembers until acknowledged.
pub const MAX_UNACKED: usize = 256;

/// One push waiting for its acknowledgement.
#[derive(Debug)]
pub struct Pending {
    /// Its JSON-RPC id.
    pub id: u64,
    /// The subscription's topic slot.
    pub slot: u32,
    /// The message's position.
    pub pos: Position,
    /// The topic and message, for a watched client's `delivered` event.
    pub watched: Option<(Arc<str>, Body)>,
}

/// The pushes of one connection waiting for an acknowledgement, oldest first.
#[derive(Debug, Default)]
pub struct Unacked {
    pending: VecDeque<Pending>,
    /// Per slot, the earliest position dropped for room (never acknowledged as far as we
    /// know).
    floors: Vec<(u32, Position)>,
}

impl Unacked {
    /// Remembers a push.
    pub fn note(&mut self, p: Pending) {
        if self.pending.len() >= MAX_UNACKED {
            if let Some(old) = self.pending.pop_front() {
                match self.floors.iter_mut().find(|(s, _)| *s == old.slot) {
                    Some((_, at)) => *at = (*at).min(old.pos),
                    None => self.floors.push((old.slot, old.pos)),
                }
            }
        }
        self.pending.push_back(p);
    }

    /// Push `id` was acknowledged: what was remembered of it (acknowledgements come in
    /// order: found at the front, mostly).
    pub fn take(&mut self, id: u64) -> Option<Pending> {
        let i = self.pending.iter().position(|p| p.id == id)?;
        self.pending.remove(i)
    }

    /// The subscription on `slot` was given for sure only what comes before this position
    /// (its earliest push not acknowledged), if it has one.
    pub fn first_unacked(&self, slot: u32) -> Option<Position> {
        let floor = self.floors.iter().find(|(s, _)| *s == slot).map(|f| f.1);
        let pending = self
            .pending
            .iter()
            .filter(|p| p.slot == slot)
            .map(|p| p.pos)
            .min();
        match (floor, pending) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// How many wait.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// None waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: u64, slot: u32, seq: u64) -> Pending {
        Pending {
            id,
            slot,
            pos: Position { epoch: 1, seq },
            watched: None,
        }
    }

    #[test]
    fn acknowledged_pushes_are_taken_once_and_the_first_unacked_is_known() {
        let mut u = Unacked::default();
        u.note(p(10, 0, 1));
        u.note(p(11, 1, 7));
        u.note(p(12, 0, 2));
        assert_eq!(u.first_unacked(0), Some(Position { epoch: 1, seq: 1 }));
        assert!(u.take(10).is_some());
        assert!(u.take(10).is_none(), "once");
        assert_eq!(u.first_unacked(0), Some(Position { epoch: 1, seq: 2 }));
        assert!(u.take(12).is_some());
        assert_eq!(u.first_unacked(0), None);
        assert_eq!(u.first_unacked(1), Some(Position { epoch: 1, seq: 7 }));
    }

    #[test]
    fn past_the_bound_the_oldest_leaves_a_floor() {
        let mut u = Unacked::default();
        for i in 0..(MAX_UNACKED as u64 + 3) {
            u.note(p(i, 0, i + 1));
        }
        assert_eq!(u.len(), MAX_UNACKED);
        assert!(u.take(0).is_none(), "dropped for room");
        for i in 3..(MAX_UNACKED as u64 + 3) {
            assert!(u.take(i).is_some());
        }
        assert_eq!(u.first_unacked(0), Some(Position { epoch: 1, seq: 1 }));
    }
}
