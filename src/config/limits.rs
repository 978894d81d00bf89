//! The one [`Limits`] struct that bounds every buffer, queue and table in the server: each
//! bound with its flag (and environment variable) and its production default, or a fixed
//! value with the reason for it.

use std::time::Duration;

use clap::Parser;

use super::Config;

/// The default of `--round-hold-us` (`worker::round::HOLD_BOUND`).
pub const DEFAULT_ROUND_HOLD_US: u64 = 200;

/// Every bound of the server, in one place. Each has a flag and a production default
/// (DECISIONS §3/§4); nothing in the server grows without one of these limits.
#[derive(Debug, Clone, clap::Args)]
pub struct Limits {
    /// Largest WebSocket message (after reassembling fragments), bytes; larger -> close 1009.
    #[arg(long, env = "WALLETRELAY_MAX_MESSAGE", default_value_t = 1 << 20)]
    pub max_message: usize,

    /// Outbound buffer per connection, bytes; a reader that falls further behind is closed
    /// with 1008 (its messages stay cached for its return).
    #[arg(long, env = "WALLETRELAY_MAX_OUTBOUND", default_value_t = 4 << 20)]
    pub max_outbound: usize,

    /// Subscriptions one connection may hold; more -> JSON-RPC error -32000.
    #[arg(long, env = "WALLETRELAY_MAX_SUBSCRIPTIONS", default_value_t = 1000)]
    pub max_subscriptions: usize,

    /// Cached messages per topic; the oldest is evicted past it.
    #[arg(long, env = "WALLETRELAY_MAX_CACHED_PER_TOPIC", default_value_t = 1000)]
    pub max_cached_per_topic: usize,

    /// Seconds a WalletConnect 1.0 `pub` with no subscriber is kept pending for the next
    /// `sub` of its topic (DECISIONS §8: 6 hours; shorter for tests).
    #[arg(
        long,
        env = "WALLETRELAY_V1_PENDING_TTL",
        default_value_t = 6 * 3600,
        value_parser = clap::value_parser!(u32).range(1..=2_592_000)
    )]
    pub v1_pending_ttl: u32,

    /// Seconds a client id's subscription is kept after its last socket on the topic closed
    /// (its mailbox: messages are queued, pushed and fetched meanwhile; DECISIONS 13).
    #[arg(
        long,
        env = "WALLETRELAY_MAILBOX_TTL",
        default_value_t = 7 * 24 * 3600,
        value_parser = clap::value_parser!(u64).range(1..=31_536_000)
    )]
    pub mailbox_ttl: u64,

    /// Topics one client id's subscriptions may keep (in the whole process); one more ->
    /// JSON-RPC error -32000 `SubscriberLimitExceeded`.
    #[arg(long, env = "WALLETRELAY_MAX_MAILBOX_TOPICS", default_value_t = 1000)]
    pub max_mailbox_topics: usize,

    /// Bytes of cached messages in all (split evenly over the workers); oldest evicted first.
    #[arg(long, env = "WALLETRELAY_MAX_CACHE_BYTES", default_value_t = 1 << 30)]
    pub max_cache_bytes: usize,

    /// Bytes of assembled registry answers (every page and search) each worker keeps to
    /// answer repeated queries without building them again (0 = off).
    #[arg(long, env = "WALLETRELAY_ANSWER_CACHE", default_value_t = 8 << 20)]
    pub answer_cache: usize,

    /// Largest topic, bytes.
    #[arg(long, env = "WALLETRELAY_MAX_TOPIC", default_value_t = 256)]
    pub max_topic: usize,

    /// Largest HTTP request head, bytes; larger -> 431.
    #[arg(long, env = "WALLETRELAY_MAX_HEAD", default_value_t = 16 << 10)]
    pub max_head: usize,

    /// Largest HTTP request body, bytes; larger -> 413.
    #[arg(long, env = "WALLETRELAY_MAX_BODY", default_value_t = 64 << 10)]
    pub max_body: usize,

    /// Seconds a client has to send a complete request head (slowloris guard) -> 408.
    #[arg(long, env = "WALLETRELAY_HEAD_TIMEOUT", default_value_t = 10.0)]
    pub head_timeout: f64,

    /// Seconds an idle keep-alive HTTP connection is kept open between requests.
    #[arg(long, env = "WALLETRELAY_KEEPALIVE_TIMEOUT", default_value_t = 60.0)]
    pub keepalive_timeout: f64,

    /// Seconds between server pings; a connection silent for two intervals is closed.
    #[arg(long, env = "WALLETRELAY_PING_INTERVAL", default_value_t = 30.0)]
    pub ping_interval: f64,

    /// Open connections per worker; past it new connections are closed at accept.
    #[arg(
        long = "max-connections",
        env = "WALLETRELAY_MAX_CONNECTIONS",
        default_value_t = 1_000_000
    )]
    pub max_connections_per_worker: usize,

    /// Messages queued from one worker to another before the sender drops (and counts) them.
    #[arg(long, env = "WALLETRELAY_CORE_QUEUE", default_value_t = 65536)]
    pub core_queue: usize,

    /// Webhooks per topic.
    #[arg(long, env = "WALLETRELAY_MAX_WEBHOOKS_PER_TOPIC", default_value_t = 16)]
    pub max_webhooks_per_topic: usize,

    /// Webhook registrations in all.
    #[arg(long, env = "WALLETRELAY_MAX_WEBHOOKS", default_value_t = 100_000)]
    pub max_webhooks: usize,

    /// Webhook calls waiting for the delivery pool; a full queue drops (and counts) calls.
    #[arg(long, env = "WALLETRELAY_WEBHOOK_QUEUE", default_value_t = 10_000)]
    pub webhook_queue: usize,

    /// Webhook delivery threads.
    #[arg(long, env = "WALLETRELAY_WEBHOOK_THREADS", default_value_t = 4)]
    pub webhook_threads: usize,

    /// Seconds a closing connection (after a 1008/1009 close, an HTTP error, ...) is given
    /// to take what is still queued for it before it is dropped.
    #[arg(long, env = "WALLETRELAY_CLOSE_TIMEOUT", default_value_t = 10.0)]
    pub close_timeout: f64,

    /// Seconds the server waits at shutdown for clients to take their last bytes.
    #[arg(long, env = "WALLETRELAY_SHUTDOWN_GRACE", default_value_t = 3.0)]
    pub shutdown_grace: f64,

    /// Open connections (WebSocket and HTTP) from one IP address (IPv6: one /64); past it
    /// new ones are closed at accept with a reset, before a byte is read (behind
    /// `--trusted-proxies`, where the address comes from a request: answered 429). Counted
    /// for all the workers together (DECISIONS §11; docs/TUNING.md, "Limits per client").
    /// 0 = off.
    #[arg(
        long,
        env = "WALLETRELAY_MAX_CONNECTIONS_PER_IP",
        default_value_t = 1000
    )]
    pub max_connections_per_ip: u32,

    /// New connections a second from one IP address (one bucket for all the workers); past
    /// it they are closed at accept. 0 = off.
    #[arg(long, env = "WALLETRELAY_ACCEPT_RATE_PER_IP", default_value_t = 50.0)]
    pub accept_rate_per_ip: f64,

    /// Burst of `--accept-rate-per-ip`.
    #[arg(long, env = "WALLETRELAY_ACCEPT_BURST_PER_IP", default_value_t = 500)]
    pub accept_burst_per_ip: u64,

    /// An address refused at accept (by the two limits above) this many times within one
    /// second is blocked at the listener for `--accept-block-ms`: its SYNs are dropped
    /// by a socket filter, so a connection storm costs the workers nothing (split over the
    /// workers; docs/TUNING.md, "Blocking a storm at the listener"). 0 = never.
    #[arg(long, env = "WALLETRELAY_ACCEPT_BLOCK_AFTER", default_value_t = 1000)]
    pub accept_block_after: u32,

    /// How long such a block lasts, in milliseconds; a block that begins within the last
    /// one's length after it ended lasts twice as long, up to 64 times this. 0 = never
    /// block.
    #[arg(long, env = "WALLETRELAY_ACCEPT_BLOCK_MS", default_value_t = 1000)]
    pub accept_block_ms: u64,

    /// Publishes a second per connection, per authenticated client id and per IP address
    /// (token buckets; the last two split over the workers); past it JSON-RPC -32000
    /// `rate limited`. 0 = off.
    #[arg(long, env = "WALLETRELAY_PUBLISH_RATE", default_value_t = 100.0)]
    pub publish_rate: f64,

    /// Burst of `--publish-rate`.
    #[arg(long, env = "WALLETRELAY_PUBLISH_BURST", default_value_t = 1000)]
    pub publish_burst: u64,

    /// Published message bytes a second, per connection, client id and IP address (as
    /// `--publish-rate`). 0 = off.
    #[arg(
        long,
        env = "WALLETRELAY_PUBLISH_BYTES_RATE",
        default_value_t = 1048576.0
    )]
    pub publish_bytes_rate: f64,

    /// Burst of `--publish-bytes-rate`, bytes.
    #[arg(long, env = "WALLETRELAY_PUBLISH_BYTES_BURST", default_value_t = 16 << 20)]
    pub publish_bytes_burst: u64,

    /// Subscriptions a second (a batch counts each topic), per connection, client id and IP
    /// address (as `--publish-rate`). 0 = off.
    #[arg(long, env = "WALLETRELAY_SUBSCRIBE_RATE", default_value_t = 100.0)]
    pub subscribe_rate: f64,

    /// Burst of `--subscribe-rate`.
    #[arg(long, env = "WALLETRELAY_SUBSCRIBE_BURST", default_value_t = 1000)]
    pub subscribe_burst: u64,

    /// Address ranges (`CIDR,...`) no limit of DECISIONS §11 applies to.
    #[arg(
        long,
        env = "WALLETRELAY_LIMIT_EXEMPT",
        value_delimiter = ',',
        value_parser = parse_cidr
    )]
    pub limit_exempt: Vec<crate::ip::Cidr>,

    /// Proxies (`CIDR,...`) whose connections are counted under the client address of their
    /// requests' `X-Forwarded-For` (the last address in it that is not a trusted proxy);
    /// from anyone else the header is ignored.
    #[arg(
        long,
        env = "WALLETRELAY_TRUSTED_PROXIES",
        value_delimiter = ',',
        value_parser = parse_cidr
    )]
    pub trusted_proxies: Vec<crate::ip::Cidr>,

    // -------------------------------------------------------------------------------------
    // Fixed bounds (no flag): tuned once, each with the reason for its value.
    /// Pushes a worker lets its input queue up in one round before it stops reading,
    /// delivers and flushes, at least: one publish to 10,000 subscribers is 10,000 pushes.
    /// Unbounded, one read of a few hundred publishes to a big topic meant millions of
    /// queued pushes and seconds without a write; too small, and every round writes one push
    /// per connection (docs/PERFORMANCE.md, "Fan-out budget").
    #[arg(skip = (64 * 1024) as usize)]
    pub fanout_min: usize,

    /// ... and this many per open connection, when that is more: the more pushes a round
    /// gives each connection, the fewer writes per delivery (docs/PERFORMANCE.md, "Big
    /// fan-outs").
    #[arg(skip = (64) as usize)]
    pub fanout_per_conn: usize,

    /// Batches each worker's mailbox holds (a batch is one loop iteration's messages from
    /// one sender); a sender finding it full keeps its batch for the next iteration.
    #[arg(skip = (4096) as usize)]
    pub mailbox_batches: usize,

    /// Batches a worker takes from its mailbox per loop iteration, so that a flood from
    /// other workers cannot starve its own connections.
    #[arg(skip = (256) as usize)]
    pub inbox_budget: usize,

    /// Bytes read from one connection per readiness event before the others get their
    /// turn (a fast sender cannot monopolise a worker).
    #[arg(skip = (256 << 10) as usize)]
    pub read_budget: usize,

    /// WebSocket messages one connection has handled in a turn before the others get
    /// theirs: a pipelining flood's 256 KiB read is hundreds of requests (each refused one
    /// still parsed and answered), which without it all ran before the next honest
    /// connection's one publish (docs/RELIABILITY-abuse.md). As many as a `pairs --inflight
    /// 32` publisher has in flight, so that a saturating benchmark's reads are not split.
    #[arg(skip = (32) as usize)]
    pub messages_per_turn: usize,

    /// Microseconds a loop round may hold output (answers, pushes) before it writes it out
    /// early: the time bound of a saturated round's batch (0: bounded by bytes only; larger:
    /// fewer, bigger writes at saturation, a longer wait for whoever shares the core)
    #[arg(long, env = "WALLETRELAY_ROUND_HOLD_US", default_value_t = DEFAULT_ROUND_HOLD_US)]
    pub round_hold_us: u64,

    /// Publishes one WebSocket may have waiting for their store's answer (answers are sent
    /// in request order); past it the connection's input waits until answers come back.
    #[arg(skip = (1024) as usize)]
    pub max_pending_answers: usize,

    /// Milliseconds a half-closed connection is given to hang up after its last bytes.
    #[arg(skip = (2000) as u64)]
    pub linger_ms: u64,

    /// Milliseconds after SIGTERM (after the drain, `--drain`) by which the process exits
    /// whatever happens (the workers' own grace is `--shutdown-grace`; this is the backstop).
    #[arg(skip = (4800) as u64)]
    pub exit_deadline_ms: u64,

    /// Milliseconds the webhook pool is given at shutdown to finish the calls in flight.
    #[arg(skip = (2000) as u64)]
    pub webhook_shutdown_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        // The defaults live in the clap attributes; parse an empty command line to get them.
        Config::parse_from(["walletrelay"]).limits
    }
}

impl Limits {
    /// The slowloris deadline as a duration.
    pub fn head_timeout(&self) -> Duration {
        secs(self.head_timeout)
    }
    /// The keep-alive idle deadline as a duration.
    pub fn keepalive_timeout(&self) -> Duration {
        secs(self.keepalive_timeout)
    }
    /// The ping interval as a duration.
    pub fn ping_interval(&self) -> Duration {
        secs(self.ping_interval)
    }
    /// The close timeout in milliseconds.
    pub fn close_ms(&self) -> u64 {
        secs(self.close_timeout).as_millis() as u64
    }
    /// The shutdown grace period as a duration.
    pub fn shutdown_grace(&self) -> Duration {
        secs(self.shutdown_grace)
    }
}

fn secs(s: f64) -> Duration {
    // NaN (accepted by the f64 parser) would make `from_secs_f64` panic: treat it as 1 s.
    let s = if s.is_nan() { 1.0 } else { s };
    Duration::from_secs_f64(s.clamp(0.001, 1e9))
}

/// `--limit-exempt`, `--trusted-proxies`: one address range.
fn parse_cidr(s: &str) -> Result<crate::ip::Cidr, String> {
    s.parse().map_err(|e: crate::ip::BadCidr| e.to_string())
}
