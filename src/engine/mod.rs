//! The topic-store engine: *where a topic's shared state lives*. A topic's shared state is
//! its cached messages (each with a [`Position`], a ttl, a place in the dedup and eviction
//! order) and its webhook registrations. Whether that lives in one worker's memory, in a log
//! on local disk or in Redis is the engine's business; the rest of the relay talks to it
//! only through the [`Engine`] trait and hears back only through [`Event`]s.
//!
//! One engine instance runs on each worker thread and is called from that worker's event
//! loop only: every method must return at once (a blocking disk sync or network round trip
//! runs on a helper thread, whose answer comes back through the engine's own mailbox
//! (`crate::mailbox`), which the worker asks it to read with [`Engine::on_mail`]). A request
//! that cannot be answered at once returns [`Done::Later`]; its answer is an [`Event`]
//! carrying the caller's [`Ticket`], exactly once. What an engine reports is what the worker
//! delivers: between the in-memory engines of two workers an [`Event`] crosses under that
//! one name (`local::HomeMsg::Report`), and the Redis threads send it too (what the engine
//! must finish itself as [`Event::Engine`]); a journal's sync thread reports record
//! positions (`store::SyncEvent`), from which the home releases its waiting answers.
//! [`Event`] and what it carries live in the leaf `crate::event`, re-exported here.
//!
//! Each engine builds itself ([`Setup`] in, [`Built`] out: its mailboxes, helper threads,
//! recovery); `server/engines.rs` only picks one. Adding an engine is a folder here and one
//! line there.
//!
//! What an engine promises (docs/ARCHITECTURE.md has the flows of each engine):
//! - a publish is answered `Stored` only once it is stored (in memory, handed to the kernel,
//!   synced, or stored by Redis, depending on the engine), `Duplicate` when an identical
//!   message is still cached on the topic, or an error: never acknowledged and then lost;
//! - every stored message gets the next position of its topic, and every worker that
//!   [watches](Engine::watch) the topic receives it as [`Event::Live`], in position order;
//! - [`Engine::read`] returns the cached messages after a position and the topic's last
//!   position, so that a new subscription can merge history and live messages by position
//!   (`relay::feed`), whatever order the two arrive in;
//! - when an engine may have lost live messages on their way (a queue overflow, a Redis
//!   reconnect), it says [`Event::Resync`] so that subscribers re-read after their position.

pub mod clients;
pub mod memory;
pub mod redis;

use std::sync::Arc;

use bytes::Bytes;

use crate::config::Config;
pub use crate::event::{Event, Events, History, RelayError, Stored, Ticket};
use crate::health::Health;
use crate::mailbox::Doorbell;
use crate::metrics::Metrics;
use crate::webhook::WebhookPool;
pub use clients::{ClientOp, ClientRef};

pub use crate::message::{new_epoch, Body, Message, Origin, Position};

/// A publish to store.
#[derive(Debug, Clone)]
pub struct PublishReq {
    /// The topic.
    pub topic: Arc<str>,
    /// Its content, encoded once.
    pub body: Body,
    /// Seconds to keep it cached.
    pub ttl: u32,
    /// Push notifications wanted (`prompt` not `false`).
    pub prompt: bool,
    /// The publisher.
    pub origin: Origin,
    /// The content hash of `body`, when [`Engine::prepare_publish`] gave it (else the
    /// engine computes it).
    pub hash: Option<u64>,
    /// The publisher's client id, when its connection has one (its watches hear of the
    /// message as `publisher`; it gets no notice as a subscriber).
    pub publisher: Option<Arc<ClientRef>>,
}

/// A WalletConnect 1.0 `pub` (DECISIONS §8).
#[derive(Debug, Clone)]
pub struct V1Publish {
    /// The topic (v1 topics are apart from v2 topics of the same name).
    pub topic: Arc<str>,
    /// The frame the subscribers get: `{"topic":..,"type":"pub","payload":..,"silent":..}`.
    pub frame: Bytes,
    /// No push notification.
    pub silent: bool,
    /// The publisher.
    pub origin: Origin,
    /// The publishing connection is itself a v1 subscriber of the topic (it does not count
    /// as one to deliver to).
    pub self_subscribed: bool,
}

/// Whether an engine handed all of a round's work on ([`Engine::flush`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// Everything went on.
    Done,
    /// Some waits for room (a full queue to another worker): the worker polls again within
    /// a millisecond.
    Waiting,
}

impl Handoff {
    /// `Waiting` if either waits.
    pub fn and(self, other: Handoff) -> Handoff {
        match (self, other) {
            (Handoff::Done, Handoff::Done) => Handoff::Done,
            _ => Handoff::Waiting,
        }
    }
}

/// A request's answer: now, or later as an [`Event`] with the request's [`Ticket`].
#[derive(Debug, PartialEq, Eq)]
pub enum Done<T> {
    /// Answered now; no event follows.
    Now(T),
    /// An event with the ticket follows, exactly once.
    Later,
}

/// A topic-store engine, one instance per worker (see the module documentation).
pub trait Engine: Send {
    /// Stores a publish: dedup against the topic's cached messages, the next position, ttl,
    /// eviction past the limits, then every watching worker gets it as [`Event::Live`] and
    /// its webhooks are called (when `prompt`).
    fn publish(
        &mut self,
        req: PublishReq,
        ticket: Ticket,
        out: &mut Events,
    ) -> Done<Result<Stored, RelayError>>;

    /// Before a publish of `message` on `topic` is encoded: the engine may start loading
    /// what storing it will touch, so that those memory misses overlap the encoding
    /// (`crate::prefetch`). Returns the content hash of `message` as written verbatim
    /// (`Placement::message_hash`), when it computed one: the caller passes it on in
    /// [`PublishReq::hash`] if JSON wrote the message as it is. Changes no state.
    fn prepare_publish(&self, _topic: &Arc<str>, _message: &str) -> Option<u64> {
        None
    }

    /// Reads the topic's cached messages after `after`; answered with [`Event::History`]
    /// (already in `out` when the topic's state is at hand).
    fn read(&mut self, topic: &Arc<str>, after: Position, ticket: Ticket, out: &mut Events);

    /// This worker has subscribers on the topic now: send it the topic's live messages.
    fn watch(&mut self, topic: &Arc<str>, out: &mut Events);

    /// This worker has no subscriber left on the topic.
    fn unwatch(&mut self, topic: &Arc<str>, out: &mut Events);

    /// Registers a webhook (`POST /subscribe`); registering it again keeps one.
    fn add_webhook(
        &mut self,
        topic: &Arc<str>,
        url: Arc<str>,
        ticket: Ticket,
        out: &mut Events,
    ) -> Done<Result<(), RelayError>>;

    /// Forgets a webhook (it failed for too long).
    fn remove_webhook(&mut self, topic: &Arc<str>, url: &Arc<str>);

    /// A v1 `pub`: sent live to the topic's v1 subscribers on other connections (every
    /// worker, every node) as [`Event::V1Live`], or kept pending for
    /// `--v1-pending-ttl` (6 h) when there is none; webhooks called unless `silent`.
    fn v1_publish(&mut self, req: V1Publish, out: &mut Events);

    /// A v1 `sub`: takes the topic's pending frames (answered with [`Event::V1Pending`]).
    fn v1_take(&mut self, topic: &Arc<str>, ticket: Ticket, out: &mut Events);

    /// This worker gained (`delta` 1) or lost (-1) a v1 subscription of the topic.
    fn v1_watch(&mut self, topic: &Arc<str>, delta: i32, out: &mut Events);

    /// Reads the engine's mailbox (other workers' engines, its helper threads): at most
    /// `budget` batches this round. Returns how many messages it took.
    fn on_mail(&mut self, budget: usize, out: &mut Events) -> usize;

    /// Something waits in the engine's mailbox (asked before the worker may sleep).
    fn has_mail(&self) -> bool;

    /// Periodic work at `now` (the worker clock's milliseconds): expiry, heartbeats.
    fn tick(&mut self, now: u64, out: &mut Events);

    /// End of a loop iteration, before any socket is written: hand this iteration's work on
    /// (records to the kernel, batches to other workers or helper threads), or say what
    /// waits for room.
    fn flush(&mut self, out: &mut Events) -> Handoff;

    /// A client id's subscription of `topic` changed (DECISIONS 13): sent to the topic's
    /// home in the same queue as `watch` and `read`. A subscription past
    /// `--max-mailbox-topics` is refused here. Engines without client-id subscriptions
    /// take nothing (the subscription is its socket's alone).
    fn client(
        &mut self,
        _topic: &Arc<str>,
        _client: &Arc<ClientRef>,
        _op: ClientOp,
        _out: &mut Events,
    ) -> Result<(), RelayError> {
        Ok(())
    }

    /// [`Engine::read`] for a subscription or fetch of `client`: after what the client was
    /// given (and without what it received). With `fetch`, what the answer gives counts as
    /// given to the client (at most `fetch` messages).
    fn read_for(
        &mut self,
        topic: &Arc<str>,
        after: Position,
        _client: &Arc<ClientRef>,
        _fetch: Option<usize>,
        ticket: Ticket,
        out: &mut Events,
    ) {
        self.read(topic, after, ticket, out)
    }

    /// Who is told about client ids' messages (the relay reports acknowledgements there).
    fn notifier(&self) -> Arc<dyn crate::notice::Notify> {
        Arc::new(crate::notice::Silent)
    }
}

/// Renders an engine's own figures into `/metrics`.
pub type Exporter = Box<dyn Fn(&mut String) + Send + Sync>;

/// `POST /layout/switch` (the Redis engine's): moves the cluster to this build's newest
/// data layout; each shard's layout before, or why it could not. Blocks (an admin thread
/// calls it).
pub type LayoutSwitch = Arc<dyn Fn() -> Result<Vec<u32>, String> + Send + Sync>;

/// What an engine is built from.
pub struct Setup<'a> {
    /// The flags.
    pub config: &'a Config,
    /// Every worker's doorbell, in worker order (one engine per worker).
    pub bells: &'a [Arc<Doorbell>],
    /// All workers' metrics.
    pub metrics: &'a Arc<Metrics>,
    /// Random seeds of this process (topic placement, content hashes).
    pub seeds: [u64; 4],
    /// Who is told about client ids' messages (watch events, pushes; `notice::Silent`
    /// where nobody is).
    pub notify: Arc<dyn crate::notice::Notify>,
    /// The layouts the process writes now (the Redis engine notes its cluster's).
    pub layouts: &'a Arc<crate::layout::Current>,
}

impl Setup<'_> {
    /// The webhook delivery pool, calling `on_gone` for a webhook it gave up on.
    pub fn webhook_pool(&self, on_gone: crate::webhook::OnGone) -> WebhookPool {
        let limits = &self.config.limits;
        WebhookPool::start(
            crate::webhook::WebhookConfig {
                threads: limits.webhook_threads,
                queue: limits.webhook_queue,
                allow_private: self.config.webhook_allow_private,
                ..crate::webhook::WebhookConfig::default()
            },
            on_gone,
        )
    }
}

/// One engine per worker, and what goes with them.
pub struct Built {
    /// One engine per worker, in worker order.
    pub engines: Vec<Box<dyn Engine>>,
    /// The webhook delivery pool the engines submit to.
    pub webhooks: WebhookPool,
    /// What `/health` asks.
    pub health: Arc<Health>,
    /// What `/metrics` adds.
    pub exporters: Vec<Exporter>,
    /// Called at shutdown, after the workers stopped (the engine's helper threads).
    pub on_stop: Option<Box<dyn FnOnce() + Send>>,
    /// Held for the process lifetime (the data directory's lock).
    pub lock: Option<crate::store::DirLock>,
    /// The layout switch, where the engine's data is shared with nodes of other builds.
    pub layout_switch: Option<LayoutSwitch>,
}

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The data directory could not be used (locked by another process, unreadable...).
    #[error("data directory: {0}")]
    Store(#[from] crate::store::StoreError),
    /// The Redis servers of `--redis` could not be used.
    #[error("{0}")]
    Cluster(#[from] crate::engine::redis::cluster::ClusterError),
    /// A setting could not be used (the message names it).
    #[error("{0}")]
    Config(String),
    /// A file or thread could not be created.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}
