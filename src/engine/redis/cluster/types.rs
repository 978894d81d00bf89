//! The words of the cluster's interface: what a worker asks ([`PublishReq`], and the
//! settings, [`ClusterConfig`]), what comes back through the [`EventSink`] (the relay's
//! own `crate::event::Event`, or as its `Engine` payload a [`Followup`] with its
//! [`History`] page, [`PublishOutcome`], [`V1Published`] or [`Unavailable`]), and the topic
//! namespaces.
//!
//! Owns these types only; a leaf under every other file of `cluster`, which re-exports them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::event::Event;
use crate::message::Body;
use crate::metrics::StoreWrites;

/// Where a cluster answer or a live message goes: `(worker index, event)`. Called on the
/// cluster's own threads; it must not block (a `try_send` + wake).
pub type EventSink = Arc<dyn Fn(usize, Event<Followup>) + Send + Sync>;

/// Namespace of WalletConnect v2 (waku) topics.
pub const NS_V2: u8 = 2;
/// Namespace of WalletConnect 1.0 bridge topics.
pub const NS_V1: u8 = 1;

/// Settings of the Redis side; every limit and timeout is here.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// `redis://[user:password@]host:port/db` URLs, one per shard (each entry may hold a
    /// comma-separated list). Order matters: it decides where topics live.
    pub urls: Vec<String>,
    /// Messages cached per topic; the oldest is evicted past it.
    pub max_cached_per_topic: usize,
    /// Webhook registrations per topic.
    pub max_webhooks_per_topic: usize,
    /// Webhook registrations in the cluster; each shard allows its share (rounded up).
    pub max_webhooks: usize,
    /// Commands waiting per shard; a full queue refuses at once (`Unavailable`).
    pub queue: usize,
    /// Most commands written in one round trip.
    pub batch: usize,
    /// A round stops taking commands once they add up to about this many bytes (a round
    /// may exceed it by one command: a single message can be bigger).
    pub batch_bytes: usize,
    /// Most publishes in one script call (a run of publishes in a round goes as groups:
    /// Redis's per-call cost is paid once per group).
    pub publish_group: usize,
    /// Time to open a TCP connection to Redis.
    pub connect_timeout: Duration,
    /// Time to wait for a reply (or to write) before the connection counts as dead.
    pub read_timeout: Duration,
    /// Idle time after which a PING checks the connection.
    pub heartbeat: Duration,
    /// First reconnect delay; doubled per failure up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// A history read returns once its messages reach this many data bytes (more follow
    /// in the next read).
    pub read_max_bytes: usize,
    /// Most stream entries one history read scans.
    pub read_max_count: usize,
    /// `watch`/`unwatch` requests waiting per shard.
    pub watch_queue: usize,
    /// How long a WalletConnect 1.0 frame nobody was subscribed to is kept pending
    /// (`--v1-pending-ttl`).
    pub v1_pending_ttl: Duration,
    /// A node's v1 subscribers count for `pub`s while its liveness key (refreshed every
    /// `heartbeat`) was refreshed within this time: after a crash, frames still go live to
    /// its subscribers (and are lost) for at most this long. Keep it a few heartbeats.
    pub node_alive: Duration,
    /// TLS files for `rediss` shards (`--redis-tls-ca`, `--redis-tls-cert`, `--redis-tls-key`).
    pub tls: super::tls::RedisTlsFiles,
    /// The password of every shard whose URL has none (`--redis-password-file`).
    pub password: Option<Secret>,
    /// Replicas that must hold a round's writes before they are answered
    /// (`--redis-wait-replicas`); `None`: 1 on Sentinel and Cluster shards whose primary has
    /// a replica, else 0.
    pub wait_replicas: Option<u32>,
    /// How long a `WAIT` may take (`--redis-wait-timeout-ms`); short of it the round's writes
    /// are answered storage unavailable.
    pub wait_timeout: Duration,
    /// `--mailbox-ttl`: how long a client id's subscription stays without a socket.
    pub mailbox_ttl: Duration,
    /// `--max-mailbox-topics`: the topics one client id keeps, in the whole cluster.
    pub max_mailbox_topics: usize,
    /// Where the command threads time each round trip of publishes
    /// (`walletrelay_store_write_seconds`).
    pub writes: Arc<StoreWrites>,
    /// The Redis layout the cluster writes now (read from the shards' fingerprints).
    pub layouts: Arc<crate::layout::Current>,
}

/// A password: shown as `***` by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            urls: Vec::new(),
            max_cached_per_topic: 1000,
            max_webhooks_per_topic: 16,
            max_webhooks: 100_000,
            queue: 65_536,
            batch: 512,
            batch_bytes: 4 << 20,
            publish_group: 64,
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(2),
            heartbeat: Duration::from_secs(1),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            read_max_bytes: 4 << 20,
            read_max_count: 1000,
            watch_queue: 65_536,
            v1_pending_ttl: Duration::from_secs(6 * 3600),
            node_alive: Duration::from_secs(3),
            tls: super::tls::RedisTlsFiles::default(),
            password: None,
            wait_replicas: None,
            wait_timeout: Duration::from_millis(1000),
            mailbox_ttl: Duration::from_secs(7 * 24 * 3600),
            max_mailbox_topics: 1000,
            writes: Arc::default(),
            layouts: Arc::default(),
        }
    }
}

/// Who published a message: the node (random per process) and its connection (the relay's
/// own [`crate::relay::Origin`]; stored and published as 16 bytes).
pub use crate::message::Origin;

/// A message to store and publish.
#[derive(Debug, Clone)]
pub struct PublishReq {
    /// Namespace ([`NS_V2`], [`NS_V1`]).
    pub ns: u8,
    /// Topic.
    pub topic: Arc<str>,
    /// The message's content; dedup compares its beta part.
    pub body: Body,
    /// Time to live (at least 1 ms is stored).
    pub ttl: Duration,
    /// Who publishes it.
    pub origin: Origin,
    /// Whether the topic's webhooks should be returned (when stored).
    pub prompt: bool,
    /// The publisher's client id, if any (left out of the topic's client ids returned).
    pub publisher: Option<Arc<str>>,
}

/// One of a topic's client ids as a publish found it (DECISIONS 13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSeen {
    /// `did:key:z...`.
    pub id: String,
    /// The project it subscribed under.
    pub project: String,
    /// A socket on a live node follows the topic for it.
    pub socket: bool,
}

/// The store could not be reached, did not answer in time, or refused (a full queue, Redis
/// down, a server error): answer -32000 `storage unavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("storage unavailable")]
pub struct Unavailable;

/// What became of a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// Stored at `(epoch, seq)`; `webhooks` are the topic's registrations when `prompt` was
    /// set (this node alone POSTs to them).
    Stored {
        /// The topic's epoch.
        epoch: u64,
        /// The message's sequence number.
        seq: u64,
        /// Webhook URLs to call.
        webhooks: Vec<String>,
        /// The topic's client ids other than the publisher's (DECISIONS 13).
        clients: Vec<ClientSeen>,
    },
    /// Identical to a message still cached (at `seq`): neither stored nor published.
    Duplicate {
        /// The topic's epoch.
        epoch: u64,
        /// The cached copy's sequence number.
        seq: u64,
    },
}

/// One cached message in a history read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryMessage {
    /// Its sequence number.
    pub seq: u64,
    /// Its content.
    pub body: Body,
    /// Who published it.
    pub origin: Origin,
    /// When it expires, ms since the Unix epoch (Redis's clock).
    pub expires_ms: u64,
}

/// The answer to a history read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// The topic's epoch (0: the topic has no history at all).
    pub epoch: u64,
    /// The topic's last sequence number.
    pub last_seq: u64,
    /// Entries were examined up to this seq: below `last_seq` means more to read after it.
    pub scanned_to: u64,
    /// Unexpired messages after the requested position (from the start when the requested
    /// epoch was not the topic's), oldest first.
    pub messages: Vec<HistoryMessage>,
    /// For a read for a client id: what it says about the client.
    pub client: Option<ClientRead>,
}

impl History {
    /// Whether another read after `scanned_to` is needed.
    pub fn more(&self) -> bool {
        self.scanned_to < self.last_seq
    }
}

/// What became of a webhook registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookAdd {
    /// Registered.
    Added,
    /// Was already registered (kept once).
    Exists,
    /// The topic has its maximum of registrations.
    TopicFull,
    /// The cluster (this shard's share) has its maximum of registrations.
    GlobalFull,
}

/// What the cluster's threads leave for the worker's Redis engine to finish, sent as
/// [`Event::Engine`]: answers that need the engine's own state (the publish's waiting
/// notices, a paged read, held reads and v1 frames, this worker's socket counts). Live
/// messages and answers the engine would only pass on are sent as the relay's own
/// [`Event`]s.
#[derive(Debug, Clone)]
pub enum Followup {
    /// A publish's outcome (the engine calls its webhooks and sends its notices).
    Published {
        /// The caller's ticket.
        ticket: u64,
        /// Stored, duplicate, or unavailable.
        result: Result<PublishOutcome, Unavailable>,
    },
    /// One page of a history read (the engine reads the next one, or answers).
    Page {
        /// The caller's ticket.
        ticket: u64,
        /// The messages, or unavailable.
        result: Result<History, Unavailable>,
    },
    /// The node's subscription to a watched topic is live (first time, or again after a
    /// reconnect): the engine sends its held reads, or says `Resync`.
    Subscribed {
        /// Namespace.
        ns: u8,
        /// Topic.
        topic: Arc<str>,
    },
    /// A v1 `pub`'s outcome (to the publishing worker only).
    V1Published {
        /// The topic.
        topic: Arc<str>,
        /// Live or pending, with the webhooks to call; or unavailable.
        result: Result<V1Published, Unavailable>,
    },
    /// The frames a [`ClusterHandle::v1_sub`] with a ticket took.
    V1Taken {
        /// The caller's ticket.
        ticket: u64,
        /// The pending frames, oldest first (now removed); or unavailable.
        result: Result<Vec<Bytes>, Unavailable>,
    },
    /// An op carrying this worker's socket count of `client` on `topic` did not reach
    /// Redis: the count is to be sent again.
    ClientUnsent {
        /// The topic.
        topic: Arc<str>,
        /// The client id.
        client: Arc<str>,
    },
    /// A client id's subscription of `topic` was refused for the whole cluster
    /// (`--max-mailbox-topics`).
    MailboxFull {
        /// The topic.
        topic: Arc<str>,
        /// The client id.
        client: Arc<str>,
        /// The topics it keeps in the cluster.
        kept: Vec<String>,
    },
}

/// What a read for a client id says about the client (DECISIONS 13).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientRead {
    /// It has a subscription of the topic (the read started after what it was given).
    pub subscribed: bool,
    /// Message ids it received above that (left out of what it is given).
    pub received: Vec<u64>,
}

/// What became of a v1 `pub`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1Published {
    /// Sent live (some node has another subscriber) rather than kept pending.
    pub live: bool,
    /// Webhook URLs to call (empty unless prompt).
    pub webhooks: Vec<String>,
}
