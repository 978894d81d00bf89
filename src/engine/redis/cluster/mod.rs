//! The Redis side of the cluster engine (DECISIONS §7): topics spread over one or more Redis
//! servers ("shards"), each topic's cache, dedup state and webhooks stored there, and live
//! messages relayed between nodes through Redis pub/sub.
//!
//! Owns: the connections to Redis (per shard one command thread and one subscriber
//! connection, shared by all workers of the node), the scripts, placement ([`ring`]). Must not
//! touch worker, connection or relay state: every call from a worker is a `try_send` into a
//! bounded queue, and every answer comes back through the [`EventSink`] the node passes to
//! [`Cluster::start`] (typically: push into the worker's channel and wake its `mio::Waker`)
//! as the relay's own `crate::event::Event` (`Live`, `V1Live`, `WebhookAdded`), or, where the
//! worker's engine has to finish it, as `Event::Engine` with a [`Followup`].
//!
//! Positions: every stored message of a topic has `(epoch, seq)`; `seq` starts at 1 and grows
//! by one per stored message; `epoch` changes when the topic's history was lost (its keys
//! expired, Redis lost them), so positions of another epoch mean nothing. How a worker uses
//! this (the relay's `relay::feed` does it for every subscription of a topic):
//! 1. first local subscriber of a topic: [`ClusterHandle::watch`]; buffer `Live` messages;
//! 2. on [`Followup::Subscribed`] (the node's subscription is live, first time or after a
//!    reconnect; also when the shard's command connection is back after an outage):
//!    [`ClusterHandle::read`] after the last position delivered;
//! 3. on a `Page` (`more()`: read on after it): deliver its messages, then the buffered and
//!    later `Live` ones with greater seq, skipping seqs already delivered; a `Live` whose seq
//!    leaves a gap means a message went missing: read again;
//! 4. last local subscriber gone: [`ClusterHandle::unwatch`].
//!
//! Publishing: [`ClusterHandle::publish`] answers `Published` once Redis has stored it (or
//! found it a duplicate); a stored message also arrives as `Live` on every node watching the
//! topic, the publisher's node included (skip the publishing connection by `origin`). The
//! webhook URLs come back to the publishing node only, so each stored publish makes exactly
//! one set of POSTs in the cluster. `Published` and the node's own `Live` copy come from
//! different threads, in no set order. Deliver to local subscribers from `Live`/`Page`
//! only (never straight from the publish), so every node delivers in the store's order.

pub mod addr;
mod alive;
mod arrivals;
pub mod clients;
mod command;
mod handle;
mod keys;
mod link;
mod multi;
mod pack;
mod primary;
mod pubsub;
mod reply;
mod resp;
pub mod ring;
mod routes;
pub mod script;
mod setup;
mod shard;
mod sharded;
pub mod shared;
mod slots;
mod stats;
mod subconn;
pub mod tls;
mod types;
pub mod v1;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

pub use addr::{AddrError, ShardAddr};
pub use handle::ClusterHandle;
use handle::ShardPorts;
pub use ring::{fingerprint, shard_of};
pub use setup::ConnectError;
pub use shared::{shared_value, SharedLink, SharedSpec};
pub use types::{
    ClientRead, ClientSeen, ClusterConfig, EventSink, Followup, History, HistoryMessage, Origin,
    PublishOutcome, PublishReq, Secret, Unavailable, V1Published, WebhookAdd, NS_V1, NS_V2,
};
pub use v1::V1PublishReq;

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
    /// The TLS files of `rediss` shards could not be used.
    #[error("Redis TLS: {0}")]
    Tls(#[from] tls::RedisTlsError),
}

/// A shard connected at start: a primary's command connection (standalone, Sentinel), or
/// the slot map of a Redis Cluster.
enum Started {
    Primary(Box<setup::Conn>),
    Cluster(slots::SlotMap),
}

/// A shard's subscriber: one connection, or one per node of a Redis Cluster.
enum SubRun {
    One(pubsub::Subscriber),
    Sharded(sharded::ShardedSubscriber),
}

impl SubRun {
    fn shutdown(&self) {
        match self {
            SubRun::One(s) => s.shutdown(),
            SubRun::Sharded(s) => s.shutdown(),
        }
    }
}

/// One shard's running parts.
struct ShardRun {
    /// What its threads share (`switch_layout` connects with it).
    ctx: command::ShardCtx,
    addr: ShardAddr,
    health: Arc<command::Health>,
    subscriber: SubRun,
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
        let password = cfg.password.as_ref().map(|p| p.0.as_str());
        let addrs = ShardAddr::parse_list(&cfg.urls, password)?;
        let fp = fingerprint(&addrs);
        let tls = match addrs.iter().any(|a| a.tls) {
            true => Some(tls::client_config(&cfg.tls)?),
            false => None,
        };
        let cfg = Arc::new(cfg);
        let node = node_id();
        let per_shard = cfg.max_webhooks.div_ceil(addrs.len()) as u64;
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let arrivals = Arc::new(arrivals::Arrivals::default());
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
                tls: tls.clone(),
                map: Arc::default(),
                arrivals: Arc::clone(&arrivals),
            };
            let started = connect(&ctx)?;
            conns.push((ctx, started));
        }
        let mut shards = Vec::new();
        let mut ports = Vec::new();
        let mut threads = Vec::new();
        for (ctx, conn) in conns {
            let (tx, rx) = crossbeam_channel::bounded(cfg.queue.max(1));
            let (stats, health, addr) = (
                Arc::clone(&ctx.stats),
                Arc::clone(&ctx.health),
                ctx.addr.clone(),
            );
            let ctx_copy = ctx.clone();
            let (subscriber, watch) = match conn {
                Started::Cluster(_) => {
                    let (s, w) = sharded::ShardedSubscriber::start(ctx.clone())?;
                    (SubRun::Sharded(s), w)
                }
                Started::Primary(_) => {
                    let (s, w) = pubsub::Subscriber::start(ctx.clone())?;
                    (SubRun::One(s), w)
                }
            };
            threads.push(match conn {
                Started::Primary(conn) => shard::spawn(ctx, *conn, rx, stop_rx.clone())?,
                Started::Cluster(map) => multi::spawn(ctx, map, rx, stop_rx.clone())?,
            });
            ports.push(ShardPorts {
                commands: tx,
                watch,
                stats,
            });
            shards.push(ShardRun {
                ctx: ctx_copy,
                addr,
                health,
                subscriber,
            });
        }
        await_subscribers(&ports, cfg.connect_timeout);
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

    /// `walletrelay switch-layout`: moves every shard's fingerprint to this build's newest
    /// layout (`layout::REDIS`), in shard order, each on a connection of its own (this is
    /// an admin thread's call: it blocks). Returns each shard's layout before; the first
    /// shard that cannot be moved stops it (the ones before stay moved: running it again
    /// finishes the switch).
    pub fn switch_layout(&self) -> Result<Vec<u32>, ClusterError> {
        let to = crate::layout::REDIS;
        let mut before = Vec::with_capacity(self.shards.len());
        for (i, s) in self.shards.iter().enumerate() {
            let r = match s.addr.kind {
                addr::Kind::Cluster => multi::switch(&s.ctx, to),
                _ => setup::switch(&s.ctx, to),
            };
            before.push(r.map_err(|source| ClusterError::Shard {
                shard: i,
                addr: s.addr.to_string(),
                source,
            })?);
        }
        Ok(before)
    }

    /// `Ok` when every shard's command and subscriber connections are up; else the reasons
    /// (for `/health`: 503 with this text).
    pub fn healthy(&self) -> Result<(), String> {
        let mut why = Vec::new();
        for (i, s) in self.shards.iter().enumerate() {
            for (what, slot) in [
                ("commands", &s.health.command),
                ("pub/sub", &s.health.pubsub),
                ("layout", &s.health.ring),
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

/// Connects to shard `ctx.idx`: its primary (checked and its scripts loaded), or, for a
/// Redis Cluster, its slot map.
fn connect(ctx: &command::ShardCtx) -> Result<Started, ClusterError> {
    let (i, addr) = (ctx.idx, &ctx.addr);
    let started = match addr.kind {
        addr::Kind::Cluster => multi::check(ctx).map(Started::Cluster),
        _ => setup::connect(ctx).map(|c| Started::Primary(Box::new(c))),
    };
    let started = started.map_err(|source| ClusterError::Shard {
        shard: i,
        addr: addr.to_string(),
        source,
    })?;
    log::info!(shard = i, addr:% = addr, kind = addr.kind_name(), tls = addr.tls;
        "redis shard {i} ({addr}): connected");
    Ok(started)
}

/// Gives the subscriber connections up to `timeout` to come up, so a node that started is
/// healthy at once when Redis is (they keep trying in the background).
fn await_subscribers(ports: &[ShardPorts], timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while ports.iter().any(|p| p.stats.pubsub_up.get() == 0) && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(2));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
