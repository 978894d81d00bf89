//! What the relay decided to deliver ([`Deliveries`]): the pushes, answers and frames for
//! this worker's connections, in the order they must reach them, returned by
//! [`Relay::deliver`](super::Relay::deliver) for the worker to apply (`worker/apply.rs`).
//! The relay names each connection by [`ConnRef`]; whether it is still there, and how the
//! bytes reach its socket, is the worker's part.

use std::sync::Arc;

use bytes::Bytes;

use super::{Body, ConnRef, Dialect, Position, PushKind, RelayError, SubId};
use crate::engine::History;

/// One thing for one connection (`conn`: a connection that is gone, or not in a state to
/// take it, is skipped).
#[derive(Debug)]
pub enum Delivery {
    /// A push to one subscription.
    Push {
        /// To whom.
        conn: ConnRef,
        /// The subscription.
        sub: SubId,
        /// The shape of the push (`waku_subscription`, `irn_subscription`).
        dialect: Dialect,
        /// The message: an index into [`Deliveries::messages`].
        msg: u32,
    },
    /// The push just before, made to a client id's subscription: kept by the connection
    /// until it acknowledges it (DECISIONS 13).
    Unacked {
        /// The connection of the push.
        conn: ConnRef,
        /// What it keeps.
        unacked: Unacked,
    },
    /// A WalletConnect 1.0 frame, sent as it is, as a text message.
    Text {
        /// To whom.
        conn: ConnRef,
        /// The frame.
        frame: Bytes,
        /// Live (counts against the outbound limit) or a replay.
        kind: PushKind,
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
    /// A fetch's answer.
    Fetched {
        /// To whom.
        conn: ConnRef,
        /// The pending answer's number.
        answer: u64,
        /// The topic read.
        topic: Arc<str>,
        /// Where the fetch reads after.
        after: Position,
        /// The topic's history after `after`, or the read's failure.
        result: Result<History, RelayError>,
    },
    /// The answer to the connection's `POST /subscribe`.
    Webhook {
        /// To whom.
        conn: ConnRef,
        /// Registered, or the refusal.
        result: Result<(), RelayError>,
    },
}

/// A message some pushes carry: its body, its JSON-RPC push id (one per message, the same
/// for every subscriber: `notice::message_id`), and how it is queued.
#[derive(Debug)]
pub struct Outgoing {
    /// The stored body.
    pub body: Body,
    /// The push's JSON-RPC id.
    pub push_id: u64,
    /// Live or a replay.
    pub kind: PushKind,
}

/// A push to a client id's subscription, to remember until acknowledged.
#[derive(Debug)]
pub struct Unacked {
    /// The push's JSON-RPC id.
    pub push_id: u64,
    /// The subscription's topic slot.
    pub slot: u32,
    /// The message's position.
    pub pos: Position,
    /// The topic and the body, kept for a watch's `delivered` event.
    pub watched: Option<(Arc<str>, Body)>,
}

/// A round's deliveries, in order; the messages their pushes carry, each once.
#[derive(Debug, Default)]
pub struct Deliveries {
    /// What each connection gets, in order.
    pub list: Vec<Delivery>,
    /// The messages of the pushes in `list`.
    pub messages: Vec<Outgoing>,
}

impl Deliveries {
    /// Nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The index of a message the next pushes carry: the last one when it is the same
    /// (its push id and its body's bytes), else a new entry.
    pub(super) fn message(&mut self, body: &Body, push_id: u64, kind: PushKind) -> u32 {
        match self.messages.last() {
            Some(m) if m.push_id == push_id && m.kind == kind && m.body.same_bytes(body) => {}
            _ => self.messages.push(Outgoing {
                body: body.clone(),
                push_id,
                kind,
            }),
        }
        (self.messages.len() - 1) as u32
    }

    /// Emptied, to be used again (a burst's room is not kept: `relay::recycle`).
    pub fn recycled(self) -> Deliveries {
        Deliveries {
            list: super::recycle(self.list),
            messages: super::recycle(self.messages),
        }
    }
}
