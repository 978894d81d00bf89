//! What the relay decided to deliver ([`Deliveries`]): the pushes, answers and frames for
//! this worker's connections, in the order they must reach them, returned by
//! [`Relay::deliver`](super::Relay::deliver) for the worker to apply (`worker/apply.rs`).
//! The relay names each connection by [`ConnRef`]; whether it is still there, and how the
//! bytes reach its socket, is the worker's part.

use std::sync::Arc;

use bytes::Bytes;

use super::{Body, ConnRef, Position, PushKind, RelayError};
use crate::engine::History;

/// Where a subscription is in the relay (its topic's slot, its index among the topic's
/// subscriptions), until the deliveries that name it are applied: nothing subscribes or
/// unsubscribes in between. The worker reads the subscription's id and dialect there
/// ([`Relay::sub_at`](super::Relay::sub_at)), so a push is a few words in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubAt {
    /// The topic's slot.
    pub slot: u32,
    /// The subscription's index in the topic's list.
    pub index: u32,
}

/// One thing for one connection (`conn`: a connection that is gone, or not in a state to
/// take it, is skipped).
#[derive(Debug)]
pub enum Delivery {
    /// A push of a message to one subscription.
    Push {
        /// To whom.
        conn: ConnRef,
        /// The subscription.
        at: SubAt,
        /// The message: an index into [`Deliveries::messages`].
        msg: u32,
    },
    /// The push just before, made to a client id's subscription: kept by the connection
    /// until it acknowledges it (DECISIONS 13).
    Unacked {
        /// The connection of the push.
        conn: ConnRef,
        /// The subscription.
        at: SubAt,
        /// The message pushed.
        msg: u32,
        /// A watch wants its `delivered` event: the topic and the body are kept for it.
        watched: bool,
    },
    /// A WalletConnect 1.0 frame, sent as it is, as a text message.
    Text {
        /// To whom.
        conn: ConnRef,
        /// The frame: an index into [`Deliveries::frames`].
        frame: u32,
    },
    /// A result of the connection's pending answer (a publish, a blocking subscribe).
    Answer {
        /// To whom.
        conn: ConnRef,
        /// The pending answer's number.
        answer: u64,
        /// `true`, or the refusal.
        result: Result<(), RelayError>,
    },
    /// A fetch's answer (boxed: rare, and the list's entries stay small).
    Fetched(Box<Fetched>),
    /// The answer to the connection's `POST /subscribe`.
    Webhook {
        /// To whom.
        conn: ConnRef,
        /// Registered, or the refusal.
        result: Result<(), RelayError>,
    },
}

/// A fetch's answer: the topic's history after `after`, or the read's failure.
#[derive(Debug)]
pub struct Fetched {
    /// To whom.
    pub conn: ConnRef,
    /// The pending answer's number.
    pub answer: u64,
    /// The topic read.
    pub topic: Arc<str>,
    /// Where the fetch reads after.
    pub after: Position,
    /// The history, or why there is none.
    pub result: Result<History, RelayError>,
}

/// A message some pushes carry: its body and position, its JSON-RPC push id (one per
/// message, the same for every subscriber: `notice::message_id`), and how it is queued.
#[derive(Debug)]
pub struct Outgoing {
    /// The stored body.
    pub body: Body,
    /// Its position in its topic.
    pub pos: Position,
    /// The push's JSON-RPC id.
    pub push_id: u64,
    /// Live or a replay.
    pub kind: PushKind,
}

/// A round's deliveries, in order; the messages and frames they carry, each once.
#[derive(Debug, Default)]
pub struct Deliveries {
    /// What each connection gets, in order.
    pub list: Vec<Delivery>,
    /// The messages of the pushes in `list`.
    pub messages: Vec<Outgoing>,
    /// The v1 frames of the texts in `list`, each with how it is queued.
    pub frames: Vec<(Bytes, PushKind)>,
}

impl Deliveries {
    /// Nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The index of a message the next pushes carry: the last one when it is the same
    /// (its push id and its body's bytes), else a new entry.
    pub(super) fn message(&mut self, body: &Body, pos: Position, kind: PushKind) -> u32 {
        let push_id = body.message_id(pos.seq);
        match self.messages.last() {
            Some(m) if m.push_id == push_id && m.kind == kind && m.body.same_bytes(body) => {}
            _ => self.messages.push(Outgoing {
                body: body.clone(),
                pos,
                push_id,
                kind,
            }),
        }
        (self.messages.len() - 1) as u32
    }

    /// The index of a v1 frame the next texts carry.
    pub(super) fn frame(&mut self, frame: Bytes, kind: PushKind) -> u32 {
        self.frames.push((frame, kind));
        (self.frames.len() - 1) as u32
    }

    /// Emptied, to be used again (a burst's room is not kept: `relay::recycle`).
    pub fn recycled(self) -> Deliveries {
        Deliveries {
            list: super::recycle(self.list),
            messages: super::recycle(self.messages),
            frames: super::recycle(self.frames),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_small() {
        // A push is a few words: a fan-out of thousands writes and reads its list in cache.
        assert!(
            std::mem::size_of::<Delivery>() <= 48,
            "{}",
            std::mem::size_of::<Delivery>()
        );
    }
}
