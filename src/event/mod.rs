//! What an engine tells its worker: [`Event`], the one type every thread sends a worker's
//! engine (another worker's engine, the Redis threads of `cluster`) and every engine hands
//! its relay, with what it carries ([`Ticket`], [`Stored`], [`History`], [`RelayError`]).
//!
//! A leaf under `engine`, `relay` and `cluster` (it imports only `message`), so that the
//! helper threads of a floor below the engines build the very events the relay delivers;
//! `engine` re-exports everything here under its own paths. What a helper thread leaves
//! for its engine to finish on the worker (a publish's webhooks, a history's next page...)
//! rides in the same type as [`Event::Engine`], whose payload only that engine knows; the
//! relay's events ([`Events`]) have no such payload ([`Infallible`]).

mod error;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;

pub use crate::message::{Message, Origin, Position};
pub use error::RelayError;

/// The outcome of a publish that was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Stored at this position (and sent to every watching worker).
    New(Position),
    /// Identical to a message still cached on the topic: neither stored nor delivered.
    Duplicate,
}

/// What `Engine::read` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// The position of the topic's last stored message when the read was served (cached or
    /// not any more), [`Position::ZERO`] if it has none; its epoch is the topic's current one.
    pub last: Position,
    /// Cached, unexpired messages after the asked position, oldest first.
    pub messages: Vec<Message>,
}

/// The answer to a request that returned `Done::Later`: the caller's own number for it.
pub type Ticket = u64;

/// What an engine tells its worker's relay; `X` is what an engine's helper threads leave
/// for the engine itself to finish ([`Event::Engine`]), nothing in the relay's events.
#[derive(Debug, Clone)]
pub enum Event<X = Infallible> {
    /// The answer to a publish.
    Published {
        /// The request's ticket.
        ticket: Ticket,
        /// Its outcome.
        result: Result<Stored, RelayError>,
    },
    /// The answer to a read.
    History {
        /// The request's ticket.
        ticket: Ticket,
        /// The history after the asked position.
        result: Result<History, RelayError>,
    },
    /// The answer to a webhook registration.
    WebhookAdded {
        /// The request's ticket.
        ticket: Ticket,
        /// Its outcome.
        result: Result<(), RelayError>,
    },
    /// A message stored on a topic this worker watches.
    Live {
        /// The topic.
        topic: Arc<str>,
        /// The message.
        msg: Message,
    },
    /// Live messages of the topic may have been lost on their way here: whoever follows it
    /// must read again after its position.
    Resync {
        /// The topic.
        topic: Arc<str>,
    },
    /// A v1 `pub` for this worker's v1 subscribers of the topic.
    V1Live {
        /// The topic.
        topic: Arc<str>,
        /// The frame to send.
        frame: Bytes,
        /// Its publisher (not sent back to it).
        origin: Origin,
    },
    /// The answer to `Engine::v1_take`: the topic's pending frames, oldest first (now
    /// removed).
    V1Pending {
        /// The request's ticket.
        ticket: Ticket,
        /// The frames.
        frames: Vec<Bytes>,
    },
    /// Work a helper thread leaves for its engine, on the engine's own mailbox only: the
    /// engine finishes it as it reads the mailbox (it may give events then); never in the
    /// relay's [`Events`].
    Engine(X),
}

/// Where the events of engine calls go: the relay drains it after each call.
pub type Events = Vec<Event>;

impl<X> Event<X> {
    /// The event as the relay takes it, or the engine's own work. The same fields moved
    /// into the relay's type: no copy of what they point to.
    pub fn for_relay(self) -> Result<Event, X> {
        Ok(match self {
            Event::Published { ticket, result } => Event::Published { ticket, result },
            Event::History { ticket, result } => Event::History { ticket, result },
            Event::WebhookAdded { ticket, result } => Event::WebhookAdded { ticket, result },
            Event::Live { topic, msg } => Event::Live { topic, msg },
            Event::Resync { topic } => Event::Resync { topic },
            Event::V1Live {
                topic,
                frame,
                origin,
            } => Event::V1Live {
                topic,
                frame,
                origin,
            },
            Event::V1Pending { ticket, frames } => Event::V1Pending { ticket, frames },
            Event::Engine(x) => return Err(x),
        })
    }
}
