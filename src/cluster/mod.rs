//! The Redis side of the cluster engine (DECISIONS §7): topics spread over one or more Redis
//! servers ("shards"), each topic's cache, dedup state and webhooks stored there, and live
//! messages relayed between nodes through Redis pub/sub.
//!
//! Owns: the connections to Redis (per shard one command thread and one subscriber
//! connection, shared by all workers of the node), the scripts, placement ([`ring`]). Must not
//! touch worker, connection or relay state: every call from a worker is a `try_send` into a
//! bounded queue, and every answer comes back through the [`EventSink`] the node passes to
//! [`Cluster::start`] (typically: push into the worker's channel and wake its `mio::Waker`).
//!
//! Positions: every stored message of a topic has `(epoch, seq)`; `seq` starts at 1 and grows
//! by one per stored message; `epoch` changes when the topic's history was lost (its keys
//! expired, Redis lost them), so positions of another epoch mean nothing. How a worker uses
//! this (the relay's `relay::feed` does it for every subscription of a topic):
//! 1. first local subscriber of a topic: [`ClusterHandle::watch`]; buffer `Live` messages;
//! 2. on [`ClusterEvent::Resync`] (the node's subscription is live, first time or after a
//!    reconnect; also when the shard's command connection is back after an outage):
//!    [`ClusterHandle::read`] after the last position delivered;
//! 3. on `History`: deliver its messages, then the buffered and later `Live` ones with
//!    greater seq, skipping seqs already delivered; a `Live` whose seq leaves a gap means a
//!    message went missing: read again;
//! 4. last local subscriber gone: [`ClusterHandle::unwatch`].
//!
//! Publishing: [`ClusterHandle::publish`] answers `Published` once Redis has stored it (or
//! found it a duplicate); a stored message also arrives as `Live` on every node watching the
//! topic, the publisher's node included (skip the publishing connection by `origin`). The
//! webhook URLs come back to the publishing node only, so each stored publish makes exactly
//! one set of POSTs in the cluster. `Published` and the node's own `Live` copy come from
//! different threads, in no set order. Deliver to local subscribers from `Live`/`History`
//! only (never straight from the publish), so every node delivers in the store's order.

mod command;
mod handle;
mod pubsub;
mod reply;
pub mod ring;
pub mod script;
mod shard;
mod stats;
pub mod v1;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::Sender;

pub use handle::ClusterHandle;
pub use ring::{fingerprint, shard_of, AddrError, ShardAddr};
pub use shard::ConnectError;
pub use v1::{V1PublishReq, V1Published};

/// Where a cluster answer or a live message goes: `(worker index, event)`. Called on the
/// cluster's own threads; it must not block (a `try_send` + wake).
pub type EventSink = Arc<dyn Fn(usize, ClusterEvent) + Send + Sync>;

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
        }
    }
}

/// Who published a message: the node (random per process) and its connection (the relay's
/// own [`crate::relay::Origin`]; stored and published as 16 bytes).
pub use crate::message::Origin;
use crate::message::{Body, Message};

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

/// An answer or a message for one worker.
#[derive(Debug, Clone)]
pub enum ClusterEvent {
    /// A publish's outcome.
    Published {
        /// The caller's ticket.
        ticket: u64,
        /// Stored, duplicate, or unavailable.
        result: Result<PublishOutcome, Unavailable>,
    },
    /// A history read's answer.
    History {
        /// The caller's ticket.
        ticket: u64,
        /// The messages, or unavailable.
        result: Result<History, Unavailable>,
    },
    /// A message stored on a watched v2 topic (on any node, this one included), in
    /// position order per topic.
    Live {
        /// Topic.
        topic: Arc<str>,
        /// The message.
        msg: Message,
    },
    /// A v1 frame published on a watched v1 topic.
    V1Live {
        /// Topic.
        topic: Arc<str>,
        /// The frame.
        frame: Bytes,
        /// Who published it.
        origin: Origin,
    },
    /// The node's subscription to a watched topic is live (first time, or again after a
    /// reconnect): read the history after the last position delivered.
    Resync {
        /// Namespace.
        ns: u8,
        /// Topic.
        topic: Arc<str>,
    },
    /// A webhook registration's outcome.
    WebhookAdded {
        /// The caller's ticket.
        ticket: u64,
        /// Added, exists, refused by a cap, or unavailable.
        result: Result<WebhookAdd, Unavailable>,
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
}

/// Why the cluster side could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A `--redis` URL was refused.
    #[error(transparent)]
    Addr(#[from] AddrError),
    /// A shard could not be reached or set up, or holds another shard list.
    #[error("Redis shard {shard} ({addr}): {source}")]
    Shard {
        /// Index in the list.
        shard: usize,
        /// `host:port/db`.
        addr: String,
        /// What went wrong.
        source: ConnectError,
    },
    /// A thread could not be started.
    #[error("cannot start a Redis thread: {0}")]
    Spawn(#[from] std::io::Error),
}

/// What a worker's handle needs of one shard.
struct ShardPorts {
    commands: Sender<command::Command>,
    watch: Sender<pubsub::Ctl>,
    stats: Arc<stats::ShardStats>,
}

/// One shard's running parts.
struct ShardRun {
    addr: ShardAddr,
    health: Arc<command::Health>,
    subscriber: pubsub::Subscriber,
}

/// The Redis side of one node; started once per process.
pub struct Cluster {
    shards: Vec<ShardRun>,
    ports: Arc<[ShardPorts]>,
    stop: Mutex<Option<Sender<()>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    node: u64,
}

/// A random node id (never 0); the clock and pid when the OS has no randomness to give.
fn node_id() -> u64 {
    let r = getrandom::u64().unwrap_or_else(|_| {
        crate::clock::unix_ms().rotate_left(20) ^ u64::from(std::process::id())
    });
    r | 1
}

impl Cluster {
    /// Connects to every shard (refusing to start when one is unreachable or was joined with
    /// another shard list), loads the scripts and starts the threads.
    pub fn start(cfg: ClusterConfig, events: EventSink) -> Result<Cluster, ClusterError> {
        let addrs = ShardAddr::parse_list(&cfg.urls)?;
        let fp = fingerprint(&addrs);
        let cfg = Arc::new(cfg);
        let node = node_id();
        let per_shard = cfg.max_webhooks.div_ceil(addrs.len()) as u64;
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let mut conns = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let ctx = command::ShardCtx {
                idx: i,
                node,
                addr: addr.clone(),
                fingerprint: fp.clone(),
                cfg: Arc::clone(&cfg),
                webhooks_per_shard: per_shard,
                stats: Arc::new(stats::ShardStats::default()),
                health: Arc::new(command::Health::default()),
                events: Arc::clone(&events),
                commands_back: crossbeam_channel::bounded(1),
            };
            let (conn, shas) = shard::connect(&ctx).map_err(|source| ClusterError::Shard {
                shard: i,
                addr: addr.to_string(),
                source,
            })?;
            conns.push((ctx, conn, shas));
        }
        let mut shards = Vec::new();
        let mut ports = Vec::new();
        let mut threads = Vec::new();
        for (ctx, conn, shas) in conns {
            let (tx, rx) = crossbeam_channel::bounded(cfg.queue.max(1));
            let (stats, health, addr) = (
                Arc::clone(&ctx.stats),
                Arc::clone(&ctx.health),
                ctx.addr.clone(),
            );
            let (subscriber, watch) = pubsub::Subscriber::start(ctx.clone())?;
            threads.push(shard::spawn(ctx, conn, shas, rx, stop_rx.clone())?);
            ports.push(ShardPorts {
                commands: tx,
                watch,
                stats,
            });
            shards.push(ShardRun {
                addr,
                health,
                subscriber,
            });
        }
        // Give the subscriber connections the connect timeout to come up, so a node that
        // started is healthy at once when Redis is (they keep trying in the background).
        let deadline = std::time::Instant::now() + cfg.connect_timeout;
        while ports.iter().any(|p| p.stats.pubsub_up.get() == 0)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(Cluster {
            shards,
            ports: ports.into(),
            stop: Mutex::new(Some(stop_tx)),
            threads: Mutex::new(threads),
            node,
        })
    }

    /// This node's id among the cluster's nodes (random per start; its v1 subscriber
    /// counts and liveness key carry it).
    pub fn node(&self) -> u64 {
        self.node
    }

    /// The handle a worker calls (one per worker; `worker` is the index events carry).
    pub fn handle(&self, worker: usize) -> ClusterHandle {
        ClusterHandle {
            worker,
            ports: Arc::clone(&self.ports),
        }
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// `Ok` when every shard's command and subscriber connections are up; else the reasons
    /// (for `/health`: 503 with this text).
    pub fn healthy(&self) -> Result<(), String> {
        let mut why = Vec::new();
        for (i, s) in self.shards.iter().enumerate() {
            for (what, slot) in [
                ("commands", &s.health.command),
                ("pub/sub", &s.health.pubsub),
            ] {
                if let Some(e) = slot.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    why.push(format!("redis shard {i} ({}) {what}: {e}", s.addr));
                }
            }
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("; "))
        }
    }

    /// Appends the Prometheus text of every shard's metrics.
    pub fn render_metrics(&self, out: &mut String) {
        let stats: Vec<&stats::ShardStats> = self.ports.iter().map(|p| &*p.stats).collect();
        let queued: Vec<usize> = self.ports.iter().map(|p| p.commands.len()).collect();
        stats::render(&stats, &queued, out);
    }

    /// Stops every thread (commands still queued are answered `Unavailable` or dropped) and
    /// waits for them. Idempotent.
    pub fn shutdown(&self) {
        drop(self.stop.lock().unwrap_or_else(|e| e.into_inner()).take());
        for s in &self.shards {
            s.subscriber.shutdown();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
