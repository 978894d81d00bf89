//! The messages the in-memory engines of two workers exchange (over the mailboxes), and
//! where an answer goes.

use std::sync::Arc;

use crate::engine::{ClientOp, ClientRef, Event, Position, PublishReq, Ticket, V1Publish};

/// Where an answer goes: the asking worker and its ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The asking worker.
    pub core: u16,
    /// Its ticket.
    pub ticket: Ticket,
}

/// A message between the in-memory engines of two workers.
#[derive(Debug)]
pub enum HomeMsg {
    /// To the home: store a publish (`hash` is its content hash).
    Publish {
        /// The publish.
        req: PublishReq,
        /// Content hash of the beta part of `req.body` (what dedup compares).
        hash: u64,
        /// The publishing worker.
        reply: Reply,
    },
    /// To the home: read the topic after a position.
    Read {
        /// Topic.
        topic: Arc<str>,
        /// Read after this position.
        after: Position,
        /// The reading worker.
        reply: Reply,
    },
    /// To the home: a client id's subscription of the topic changed.
    Client {
        /// Topic.
        topic: Arc<str>,
        /// The client.
        client: Arc<ClientRef>,
        /// What happened.
        op: ClientOp,
    },
    /// To the home: read the topic for a client id (see `Engine::read_for`).
    ReadFor {
        /// Topic.
        topic: Arc<str>,
        /// Read after this position (or after what the client was given).
        after: Position,
        /// The client.
        client: Arc<ClientRef>,
        /// A fetch of at most this many messages.
        fetch: Option<usize>,
        /// The reading worker.
        reply: Reply,
    },
    /// To the home: worker `core` watches the topic.
    Watch {
        /// Topic.
        topic: Arc<str>,
        /// The watching worker.
        core: u16,
    },
    /// To the home: worker `core` no longer watches the topic.
    Unwatch {
        /// Topic.
        topic: Arc<str>,
        /// The worker.
        core: u16,
    },
    /// To the home: register a webhook.
    AddWebhook {
        /// Topic.
        topic: Arc<str>,
        /// Address.
        url: Arc<str>,
        /// The registering worker.
        reply: Reply,
    },
    /// To the home: forget a webhook.
    RemoveWebhook {
        /// Topic.
        topic: Arc<str>,
        /// Address.
        url: Arc<str>,
    },
    /// From the home to another worker, what it reports there as it is: a stored message
    /// of a topic that worker watches (`Live`, `V1Live`), a topic whose live messages were
    /// dropped on the way (`Resync`), or the answer to one of its tickets.
    Report(Event),
    /// From the home's log sync thread to the home: what became of its records.
    Sync(crate::store::SyncEvent),
    /// To the home: a WalletConnect 1.0 `pub`.
    V1Publish(V1Publish),
    /// To the home: take the topic's pending v1 frames.
    V1Take {
        /// Topic.
        topic: Arc<str>,
        /// The asking worker.
        reply: Reply,
    },
    /// To the home: worker `core` gained or lost a v1 subscription.
    V1Watch {
        /// Topic.
        topic: Arc<str>,
        /// The worker.
        core: u16,
        /// +1 or -1.
        delta: i32,
    },
}
