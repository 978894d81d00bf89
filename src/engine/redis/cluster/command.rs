//! What a shard's threads are asked and what they share: the [`Command`]s a shard's queue
//! carries (with who asked and the caller's ticket), and the [`ShardCtx`] its command thread,
//! its subscriber and the reply mapping all read (address, settings, counters, health, the
//! event sink).
//!
//! Owns these types only; no I/O. The command thread (`shard`) writes the commands to Redis,
//! `reply` answers them.

use std::sync::{Arc, Mutex};

use crossbeam_channel::Receiver;

use super::addr::ShardAddr;
use super::primary::Reach;
use super::stats::ShardStats;
use super::types::{ClusterConfig, EventSink, PublishReq};
use super::v1::V1PublishReq;

/// A request to a shard, with who asked (`worker`) and the caller's `ticket`.
#[derive(Debug)]
pub(crate) enum Command {
    /// Store and publish one message.
    Publish {
        worker: usize,
        ticket: u64,
        req: PublishReq,
    },
    /// Read a topic's history.
    Read {
        worker: usize,
        ticket: u64,
        ns: u8,
        topic: Arc<str>,
        epoch: u64,
        after: u64,
        /// A read for this client id (after what it was given).
        client: Option<Arc<str>>,
    },
    /// Register a webhook.
    WebhookAdd {
        worker: usize,
        ticket: u64,
        topic: Arc<str>,
        url: Arc<str>,
    },
    /// Drop a webhook (no answer).
    WebhookRemove { topic: Arc<str>, url: Arc<str> },
    /// A WalletConnect 1.0 `pub` (answered `V1Published`).
    V1Publish { worker: usize, req: V1PublishReq },
    /// A worker's v1 subscriber count of a topic, and its pending frames taken when
    /// `ticket` is set (answered `V1Taken`).
    V1Sub {
        worker: usize,
        ticket: Option<u64>,
        topic: Arc<str>,
        count: u32,
    },
    /// The node's liveness refresh (the heartbeat; no answer).
    Alive,
    /// `ROLE`: how many replicas the primary has now, for the automatic `WAIT` (sent with
    /// the heartbeat; no answer).
    Role,
    /// `GET wr:ring`: the layout the shard's cluster writes, which `walletrelay layout
    /// switch` moves while the node runs (sent with the heartbeat; no answer).
    Ring,
    /// The node's liveness refresh in one hash slot of a Redis Cluster, where it has v1
    /// subscribers (sent with the heartbeat; no answer).
    AliveIn(u16),
    /// A client id's op on its subscription of `topic` (no answer; one that carries a
    /// socket count and could not be sent is answered `ClientUnsent`).
    Client {
        worker: usize,
        topic: Arc<str>,
        client: Arc<str>,
        project: Arc<str>,
        op: super::clients::ClientCmd,
    },
    /// A client id's set of topics (`--max-mailbox-topics`; routed by the client id): a
    /// refused `Add` is answered `MailboxFull`.
    Mailbox {
        worker: usize,
        client: Arc<str>,
        topic: Arc<str>,
        op: super::clients::MailboxCmd,
    },
}

impl Command {
    /// Roughly the bytes it takes on the wire (bounds a round's buffer).
    pub(super) fn size(&self) -> usize {
        match self {
            Command::Publish { req, .. } => req.body.len() + 2 * req.topic.len() + 128,
            Command::Read { topic, client, .. } => {
                topic.len() + client.as_ref().map_or(0, |c| c.len() + topic.len()) + 96
            }
            Command::WebhookAdd { topic, url, .. } | Command::WebhookRemove { topic, url } => {
                topic.len() + url.len() + 96
            }
            Command::V1Publish { req, .. } => req.frame.len() + 3 * req.topic.len() + 192,
            Command::V1Sub { topic, .. } => 2 * topic.len() + 96,
            Command::Client {
                topic,
                client,
                project,
                ..
            } => 2 * topic.len() + client.len() + project.len() + 256,
            Command::Mailbox { topic, client, .. } => topic.len() + client.len() + 96,
            Command::Alive | Command::Role | Command::AliveIn(_) | Command::Ring => 64,
        }
    }
}

/// Up or down, with the reason, for `/health`.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Why the command connection is down (`None`: up).
    pub command: Mutex<Option<String>>,
    /// Why the subscriber connection is down (`None`: up).
    pub pubsub: Mutex<Option<String>>,
    /// Why the shard's fingerprint keeps this node out since it connected (another layout
    /// that this build does not read; `None`: it does not).
    pub ring: Mutex<Option<String>>,
}

/// Sets a health slot (a poisoned lock still holds a usable value).
pub(crate) fn set_health(slot: &Mutex<Option<String>>, v: Option<String>) {
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = v;
}

/// What a shard's threads need besides their connections.
#[derive(Clone)]
pub(crate) struct ShardCtx {
    /// Index in the `--redis` list.
    pub idx: usize,
    /// This node (random per process start): its v1 subscriber counts and liveness key.
    pub node: u64,
    /// Where the shard is.
    pub addr: ShardAddr,
    /// This node's shard-list fingerprint.
    pub fingerprint: String,
    /// Limits and timeouts.
    pub cfg: Arc<ClusterConfig>,
    /// Webhook registrations allowed on this shard (the global cap split over the shards).
    pub webhooks_per_shard: u64,
    /// Counters.
    pub stats: Arc<ShardStats>,
    /// Up or down.
    pub health: Arc<Health>,
    /// Where answers go.
    pub events: EventSink,
    /// Rung (`try_send`) when the command connection is back after an outage: the
    /// subscriber then sends `Subscribed` for every live topic, so reads that failed meanwhile
    /// are made again. Capacity 1; the subscriber's writer holds the receiver.
    pub commands_back: (crossbeam_channel::Sender<()>, Receiver<()>),
    /// TLS settings when the shard is `rediss`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// A Redis Cluster shard's slot map, as its command thread last read it (for its
    /// subscriber, `sharded`); unused on other shards.
    pub map: Arc<super::slots::MapCell>,
    /// This node's publishes' arrival stamps, noted as they are sent, taken back as their
    /// live messages come (`arrivals`).
    pub arrivals: Arc<super::arrivals::Arrivals>,
}

impl ShardCtx {
    /// The longest wait between two reconnects: `backoff_max`, but at most 250 ms on a
    /// shard that fails over, where the next try is a question to the Sentinels (cheap) and
    /// every moment spent waiting after the new primary is up refuses publishes.
    pub(crate) fn backoff_max(&self) -> std::time::Duration {
        match self.addr.fails_over() {
            true => self
                .cfg
                .backoff_max
                .min(std::time::Duration::from_millis(250)),
            false => self.cfg.backoff_max,
        }
    }

    /// How the shard names keys.
    pub(crate) fn keys(&self) -> super::script::Keys {
        super::script::Keys {
            db: self.addr.db,
            tagged: matches!(self.addr.kind, super::addr::Kind::Cluster),
        }
    }

    /// How to reach the shard's servers.
    pub(crate) fn reach(&self) -> Reach<'_> {
        Reach {
            addr: &self.addr,
            cfg: &self.cfg,
            tls: self.tls.as_ref().filter(|_| self.addr.tls),
        }
    }
}
