//! The metrics vocabulary of the whole server, and the workers' own figures.
//!
//! The vocabulary, used by every module that counts (`store`, `webhook`, `cluster` render
//! their own families with it): [`Cell`] (one writer), [`Counter`] (any writer),
//! [`Histogram`] (latency buckets named by a [`Bounds`]), [`family`] (a family's `# HELP`
//! and `# TYPE` lines, of a [`Kind`]), and the labels of the families rendered here
//! ([`DropReason`], [`LimitKind`]), and the latency a user feels ([`latency`]: publish to
//! acknowledgement, to delivery, the store's write). A leaf: it imports nothing of the crate.
//!
//! The workers' figures: each worker owns one [`CoreMetrics`] and is its only writer, so a
//! counter update is a relaxed load and store (no locked instruction, no shared cache line
//! with other workers); any worker may read all of them to render `/metrics`.

mod counter;
mod family;
mod histogram;
pub mod latency;

use std::fmt::Write as _;
use std::sync::Arc;

pub use counter::{Cell, Counter};
pub use family::{family, labelled, single, Kind};
pub use histogram::{render_sum, Bounds, Histogram, Tally, MAX_BOUNDS};
pub use latency::{Latency, Pending, Stamp, StoreWrites};

/// Why a message was not delivered to a subscriber or not kept.
#[derive(Debug, Clone, Copy)]
pub enum DropReason {
    /// The subscriber's outbound buffer was full (it is closed).
    SlowConsumer,
    /// The queue to another worker was full.
    CoreQueueFull,
    /// Evicted from the cache by the per-topic cap.
    TopicCacheFull,
    /// Evicted from the cache by the global byte cap.
    CacheBytes,
    /// Expired from the cache.
    Expired,
    /// A duplicate of a cached message (not stored, not delivered).
    Duplicate,
}

impl DropReason {
    const ALL: [DropReason; 6] = [
        DropReason::SlowConsumer,
        DropReason::CoreQueueFull,
        DropReason::TopicCacheFull,
        DropReason::CacheBytes,
        DropReason::Expired,
        DropReason::Duplicate,
    ];
    fn label(self) -> &'static str {
        match self {
            DropReason::SlowConsumer => "slow_consumer",
            DropReason::CoreQueueFull => "core_queue_full",
            DropReason::TopicCacheFull => "topic_cache_full",
            DropReason::CacheBytes => "cache_bytes",
            DropReason::Expired => "expired",
            DropReason::Duplicate => "duplicate",
        }
    }
}

/// What a limit refused (DECISIONS §11; `limits::Kind`, and the `kind` label of
/// `walletrelay_limited_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// `--publish-rate`.
    Publish = 0,
    /// `--publish-bytes-rate`.
    Bytes = 1,
    /// `--subscribe-rate`.
    Subscribe = 2,
    /// `--accept-rate-per-ip`.
    AcceptRate = 3,
    /// `--max-connections-per-ip`.
    Connections = 4,
}

impl LimitKind {
    /// Every kind, in index order.
    pub const ALL: [LimitKind; 5] = [
        LimitKind::Publish,
        LimitKind::Bytes,
        LimitKind::Subscribe,
        LimitKind::AcceptRate,
        LimitKind::Connections,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            LimitKind::Publish => "publish",
            LimitKind::Bytes => "bytes",
            LimitKind::Subscribe => "subscribe",
            LimitKind::AcceptRate => "accept_rate",
            LimitKind::Connections => "connections",
        }
    }
}

/// The buckets of `walletrelay_loop_iteration_seconds` (µs): 10 µs to 1 s.
#[derive(Debug)]
pub struct IterationBounds;

impl Bounds for IterationBounds {
    const US: &'static [u64] = &[
        10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000,
    ];
}

/// One worker's figures. Padded so that two workers never share a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct CoreMetrics {
    /// Open connections (HTTP and WebSocket).
    pub connections_open: Cell,
    /// Connections accepted since start.
    pub connections_accepted: Cell,
    /// Connections refused at accept (over the connection limit).
    pub connections_refused: Cell,
    /// Open WebSocket connections.
    pub websockets_open: Cell,
    /// HTTP requests answered.
    pub http_requests: Cell,
    /// Subscriptions held by this worker's connections.
    pub subscriptions: Cell,
    /// Topics whose home is this worker.
    pub topics: Cell,
    /// `waku_publish` requests accepted on this worker.
    pub published: Cell,
    /// Publishes stored in this worker's caches (not duplicates).
    pub stored: Cell,
    /// WalletConnect 1.0 `pub` frames accepted on this worker.
    pub v1_published: Cell,
    /// WalletConnect 1.0 frames queued to this worker's v1 subscribers.
    pub v1_delivered: Cell,
    /// `waku_subscription` messages queued to this worker's subscribers.
    pub delivered: Cell,
    /// Messages dropped, by reason (indexed like `DropReason::ALL`).
    pub dropped: [Cell; 6],
    /// Messages currently cached on this worker.
    pub cached_messages: Cell,
    /// Bytes currently cached on this worker.
    pub cached_bytes: Cell,
    /// JSON-RPC error responses sent.
    pub rpc_errors: Cell,
    /// WebSocket upgrades refused by relay auth (a bad token, no token with
    /// `--require-auth`, a project not allowed).
    pub auth_refused: Cell,
    /// WebSocket upgrades that agreed on permessage-deflate (`--permessage-deflate`).
    pub deflate_upgrades: Cell,
    /// Connections closed for a protocol violation (bad frame, bad UTF-8, oversize).
    pub protocol_closes: Cell,
    /// Connections closed by the heartbeat (silent for two ping intervals).
    pub heartbeat_closes: Cell,
    /// Cross-worker messages received.
    pub core_messages_in: Cell,
    /// Times this worker's subscriptions of a topic read its history again (live messages
    /// were missing: a full queue on the way, a store that reconnected).
    pub resyncs: Cell,
    /// Receipts taken by `irn_batchReceive` (one per message acknowledged).
    pub receipts: Cell,
    /// Events handled, and loop iterations, for batching figures.
    pub loop_iterations: Cell,
    /// Deliveries carried out within a round, right after the input that queued them (a
    /// round past `relay::EARLY_DELIVERY_BYTES`: the core is saturated).
    pub early_deliveries: Cell,
    /// Ends of a round brought forward: the engine handed its work on and the sockets were
    /// written between two connections' events (past 384 KiB of pushes copied: a saturated
    /// core; `worker::Round::write_early`).
    pub round_flushes: Cell,
    /// Ends of a round brought forward because its output had waited the round's hold
    /// bound (200 µs): a long round does not hold a delivery for milliseconds.
    pub round_flushes_held: Cell,
    /// TLS handshakes completed (full or resumed).
    pub tls_handshakes: Cell,
    /// TLS connections closed for a TLS error (a bad or failed handshake, plaintext on the
    /// TLS port, a bad record).
    pub tls_failures: Cell,
    /// Requests and connections refused by a limit of DECISIONS §11, by kind (indexed like
    /// `LimitKind::ALL`).
    pub limited: [Cell; 5],
    /// WebSockets closed with 1013 after refusals in a row.
    pub limit_closes: Cell,
    /// Blocks at the listener begun since the start (an address refused at accept too
    /// often in a second).
    pub accept_blocks: Cell,
    /// Addresses blocked at the listener now.
    pub blocked_addresses: Cell,
    /// Connections counted against this worker's share of the per-address limits because
    /// the shared table of per-address counts had no room for their address.
    pub limit_split_accepts: Cell,
    /// Loop iterations that kept the worker busy for `worker::stall::LONG_ITERATION` or
    /// more (from `poll`'s return to the iteration's end).
    pub long_iterations: Cell,
    /// How long each loop iteration kept the worker busy (the wait in `poll` excluded).
    pub loop_iteration: Histogram<IterationBounds>,
    /// When the worker's loop last turned (`clock::now_ms`; one relaxed store per
    /// iteration): an idle worker still turns at every timer tick (`timer::TICK_MS`), so
    /// one that has not turned for seconds is wedged (`/live` on the admin address).
    pub last_turn_ms: Cell,
    /// Publish to acknowledgement and to delivery, as this worker wrote them.
    pub latency: Latency,
}

impl CoreMetrics {
    /// Counts a dropped message.
    #[inline]
    pub fn drop(&self, why: DropReason, n: u64) {
        self.dropped[why as usize].add(n);
    }
}

/// Reads one per-worker cell of a [`CoreMetrics`].
type Get = fn(&CoreMetrics) -> &Cell;

/// The per-worker families: name (after `walletrelay_`), kind, help (` (per worker).` is
/// appended), and the cell each worker counts it in. In exposition order.
const PER_CORE: [(&str, Kind, &str, Get); 31] = [
    ("connections_open", Kind::Gauge, "Open connections", |c| {
        &c.connections_open
    }),
    (
        "connections_accepted_total",
        Kind::Counter,
        "Connections accepted",
        |c| &c.connections_accepted,
    ),
    (
        "connections_refused_total",
        Kind::Counter,
        "Connections refused at the limit",
        |c| &c.connections_refused,
    ),
    (
        "websockets_open",
        Kind::Gauge,
        "Open WebSocket connections",
        |c| &c.websockets_open,
    ),
    (
        "http_requests_total",
        Kind::Counter,
        "HTTP requests answered",
        |c| &c.http_requests,
    ),
    ("subscriptions", Kind::Gauge, "Subscriptions held", |c| {
        &c.subscriptions
    }),
    (
        "topics",
        Kind::Gauge,
        "Topics with state on their home worker (cached messages, webhooks, v1 frames, \
         subscribers on another worker)",
        |c| &c.topics,
    ),
    (
        "messages_published_total",
        Kind::Counter,
        "waku_publish accepted",
        |c| &c.published,
    ),
    (
        "messages_stored_total",
        Kind::Counter,
        "Publishes stored (not duplicates)",
        |c| &c.stored,
    ),
    (
        "messages_delivered_total",
        Kind::Counter,
        "waku_subscription messages queued",
        |c| &c.delivered,
    ),
    ("cached_messages", Kind::Gauge, "Messages in the cache", |c| {
        &c.cached_messages
    }),
    ("cached_bytes", Kind::Gauge, "Bytes in the cache", |c| {
        &c.cached_bytes
    }),
    (
        "rpc_errors_total",
        Kind::Counter,
        "JSON-RPC error responses",
        |c| &c.rpc_errors,
    ),
    (
        "auth_refused_total",
        Kind::Counter,
        "WebSocket upgrades refused by relay auth",
        |c| &c.auth_refused,
    ),
    (
        "ws_deflate_upgrades_total",
        Kind::Counter,
        "WebSocket upgrades that agreed on permessage-deflate",
        |c| &c.deflate_upgrades,
    ),
    (
        "protocol_closes_total",
        Kind::Counter,
        "Connections closed for a protocol error",
        |c| &c.protocol_closes,
    ),
    (
        "heartbeat_closes_total",
        Kind::Counter,
        "Connections closed as dead peers",
        |c| &c.heartbeat_closes,
    ),
    (
        "core_messages_total",
        Kind::Counter,
        "Cross-worker messages received",
        |c| &c.core_messages_in,
    ),
    (
        "resyncs_total",
        Kind::Counter,
        "Topic histories read again after missing live messages",
        |c| &c.resyncs,
    ),
    (
        "receipts_total",
        Kind::Counter,
        "Message receipts taken by irn_batchReceive",
        |c| &c.receipts,
    ),
    (
        "loop_iterations_total",
        Kind::Counter,
        "Event loop iterations",
        |c| &c.loop_iterations,
    ),
    (
        "long_loop_iterations_total",
        Kind::Counter,
        "Event loop iterations that kept the worker busy 1 ms or more",
        |c| &c.long_iterations,
    ),
    (
        "early_deliveries_total",
        Kind::Counter,
        "Deliveries carried out within a loop iteration, its queued bodies past EARLY_DELIVERY_BYTES (a saturated core)",
        |c| &c.early_deliveries,
    ),
    (
        "round_flushes_total",
        Kind::Counter,
        "Sockets written between two connections' events of a loop iteration, its pushes past 384 KiB (a saturated core)",
        |c| &c.round_flushes,
    ),
    (
        "round_flushes_held_total",
        Kind::Counter,
        "Sockets written between two connections' events of a loop iteration, its output held 200 µs or more",
        |c| &c.round_flushes_held,
    ),
    (
        "tls_handshakes_total",
        Kind::Counter,
        "TLS handshakes completed",
        |c| &c.tls_handshakes,
    ),
    (
        "tls_failures_total",
        Kind::Counter,
        "TLS connections closed for a TLS error",
        |c| &c.tls_failures,
    ),
    (
        "limit_closes_total",
        Kind::Counter,
        "WebSockets closed with 1013 after 100 rate-limit refusals in a row",
        |c| &c.limit_closes,
    ),
    (
        "accept_blocks_total",
        Kind::Counter,
        "Addresses blocked at the listener after --accept-block-after refusals at accept in a second",
        |c| &c.accept_blocks,
    ),
    (
        "blocked_addresses",
        Kind::Gauge,
        "Addresses blocked at the listener now",
        |c| &c.blocked_addresses,
    ),
    (
        "limit_split_accepts_total",
        Kind::Counter,
        "Connections counted against the worker's split share of --max-connections-per-ip and the accept rate because the shared per-address table had no room for their address",
        |c| &c.limit_split_accepts,
    ),
];

/// All workers' metrics, shared by `Arc`.
#[derive(Debug)]
pub struct Metrics {
    /// One entry per worker, indexed by worker id.
    pub cores: Vec<CoreMetrics>,
    /// The engine this node runs (`memory`, `journal`, `redis`): the `engine` label of the
    /// latency families.
    pub engine: &'static str,
    /// The store's writes, timed by the engine's helper threads.
    pub store_writes: Arc<StoreWrites>,
}

impl Metrics {
    /// Metrics for `n` workers of the in-memory engine.
    pub fn new(n: usize) -> Arc<Metrics> {
        Metrics::of_engine(n, "memory")
    }

    /// Metrics for `n` workers of `engine` (`memory`, `journal`, `redis`).
    pub fn of_engine(n: usize, engine: &'static str) -> Arc<Metrics> {
        Arc::new(Metrics {
            cores: (0..n).map(|_| CoreMetrics::default()).collect(),
            engine,
            store_writes: Arc::default(),
        })
    }

    /// Renders everything in the Prometheus text exposition format (version 0.0.4): the
    /// per-worker families ([`PER_CORE`]), the loop-iteration histogram, the latency
    /// families, the summed ones by reason and kind, then `extra` (the engine's own).
    pub fn render(&self, extra: &dyn Fn(&mut String)) -> String {
        let mut s = String::with_capacity(4096);
        for (name, kind, help, get) in PER_CORE {
            self.per_core(&mut s, name, kind, help, get);
        }
        family(
            &mut s,
            "walletrelay_loop_iteration_seconds",
            Kind::Histogram,
            "How long each event loop iteration kept its worker busy, from poll's return to the iteration's end (per worker).",
        );
        for (i, c) in self.cores.iter().enumerate() {
            let core = format!("core=\"{i}\"");
            c.loop_iteration
                .render(&mut s, "walletrelay_loop_iteration_seconds", &core);
        }
        let cores = self.cores.iter().map(|c| &c.latency);
        latency::render(&mut s, self.engine, cores, &self.store_writes);
        let dropped = DropReason::ALL.map(DropReason::label);
        self.summed_by_label(
            &mut s,
            (
                "messages_dropped_total",
                "Messages dropped, by reason.",
                "reason",
            ),
            &dropped,
            |c| &c.dropped,
        );
        let limited = LimitKind::ALL.map(LimitKind::label);
        self.summed_by_label(
            &mut s,
            (
                "limited_total",
                "Requests and connections refused by a limit, by kind.",
                "kind",
            ),
            &limited,
            |c| &c.limited,
        );
        extra(&mut s);
        s
    }

    /// One per-worker family: a series per worker, and for the message counts the v1
    /// frames' series beside them (labelled `protocol="v1"`).
    fn per_core(&self, s: &mut String, name: &str, kind: Kind, help: &str, get: Get) {
        family(
            s,
            format_args!("walletrelay_{name}"),
            kind,
            format_args!("{help} (per worker)."),
        );
        for (i, c) in self.cores.iter().enumerate() {
            let _ = writeln!(s, "walletrelay_{name}{{core=\"{i}\"}} {}", get(c).get());
        }
        // WalletConnect 1.0 frames: the same families, labelled by protocol.
        let v1: Option<Get> = match name {
            "messages_published_total" => Some(|c| &c.v1_published),
            "messages_delivered_total" => Some(|c| &c.v1_delivered),
            _ => None,
        };
        if let Some(get) = v1 {
            for (i, c) in self.cores.iter().enumerate() {
                let v = get(c).get();
                let _ = writeln!(s, "walletrelay_{name}{{core=\"{i}\",protocol=\"v1\"}} {v}");
            }
        }
    }

    /// Appends a counter family summed over the workers, one series per label value
    /// (`values[i]` labels the `i`th cell of `cells`).
    fn summed_by_label(
        &self,
        s: &mut String,
        (name, help, label): (&str, &str, &str),
        values: &[&str],
        cells: fn(&CoreMetrics) -> &[Cell],
    ) {
        let totals = values.iter().enumerate().map(|(i, &v)| {
            let cores = self.cores.iter();
            (v, cores.map(|c| cells(c).get(i).map_or(0, Cell::get)).sum())
        });
        let head = (format_args!("walletrelay_{name}"), Kind::Counter, help);
        labelled(s, head, label, totals);
    }
}
