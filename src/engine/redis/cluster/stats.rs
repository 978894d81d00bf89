//! Per-shard counters of the Redis side and their Prometheus text.
//!
//! Owns: the numbers only, in `metrics`' vocabulary. Most counters have one writer thread
//! (the shard's command thread or its subscriber reader), so updates are plain relaxed stores
//! ([`Cell`]); those any thread writes are [`Counter`]s; `/metrics` reads them from any
//! thread. Must not touch connections.

use std::fmt::Write as _;
use std::time::Duration;

use crate::metrics::{family, Bounds, Cell, Counter, Histogram, Kind};

/// Upper bounds of the round-trip histogram buckets (100 µs to 2.5 s; `+Inf` is implied).
#[derive(Debug)]
pub struct RttBuckets;

impl Bounds for RttBuckets {
    const US: &'static [u64] = &[
        100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
        1_000_000, 2_500_000,
    ];
}

/// The numbers of one shard.
#[derive(Debug, Default)]
pub struct ShardStats {
    /// Round trips (one pipelined batch written, all its replies read). Written by the
    /// command thread.
    rtt: Histogram<RttBuckets>,
    /// Commands written and not yet answered (command thread).
    pub in_flight: Cell,
    /// Commands answered (command thread).
    pub commands: Cell,
    /// Reconnects of the command connection (after the first connect).
    pub reconnects_command: Cell,
    /// Reconnects of the subscriber connection (subscriber reader).
    pub reconnects_pubsub: Cell,
    /// Topics resynced after an outage (re-subscribed after a subscriber reconnect, or
    /// re-read after a command reconnect); two writers, hence atomic.
    pub resyncs: Counter,
    /// Publishes answered `Unavailable` by the command thread (connection down, timeout,
    /// server error); refusals at a full queue are counted by the handle in `refused`.
    pub unavailable: Cell,
    /// Client requests of this shard's topics answered "storage unavailable" (a publish's
    /// -32000, a webhook registration's 503), counted by the workers that answered them
    /// (any worker writes it, hence atomic; it only moves on failures).
    pub unavailable_answers: Counter,
    /// Commands refused at once because the shard's queue was full (any worker writes it,
    /// hence an atomic add; it only moves when the queue is full, never on the hot path).
    pub refused: Counter,
    /// Messages received on the subscriber connection (reader).
    pub live_received: Cell,
    /// 1 while the command connection is up (command thread).
    pub command_up: Cell,
    /// 1 while the subscriber connection is up (reader).
    pub pubsub_up: Cell,
    /// Times the command connection found the shard's primary somewhere else than before
    /// (a Sentinel failover, or a cluster slot's new owner).
    pub failovers: Counter,
    /// `MOVED` replies followed (Redis Cluster).
    pub moved: Counter,
    /// `ASK` replies followed (Redis Cluster).
    pub ask: Counter,
    /// Rounds whose `WAIT` came back short of `--redis-wait-replicas` (their writes were
    /// answered storage unavailable). Command thread.
    pub wait_timeouts: Cell,
    /// Publishes answered storage unavailable because the shard had no reachable primary
    /// (in flight when it was lost, or arriving while the node looked for it). Command
    /// thread.
    pub no_primary: Cell,
}

impl ShardStats {
    /// Records one round trip.
    pub fn observe_rtt(&self, d: Duration) {
        self.rtt.observe(d);
    }
}

/// The plain series: (name with its extra label, type, help). Values come from [`values`],
/// in the same order.
const SERIES: [(&str, Kind, &str); 16] = [
    (
        "redis_in_flight",
        Kind::Gauge,
        "Commands written to Redis and not yet answered",
    ),
    (
        "redis_commands_total",
        Kind::Counter,
        "Commands answered by the shard thread",
    ),
    (
        "redis_reconnects_total{conn=\"command\"",
        Kind::Counter,
        "Reconnects to Redis",
    ),
    (
        "redis_reconnects_total{conn=\"pubsub\"",
        Kind::Counter,
        "Reconnects to Redis",
    ),
    (
        "redis_resyncs_total",
        Kind::Counter,
        "Watched topics whose readers were told to read again (re-subscribed after a subscriber reconnect, or the command connection back)",
    ),
    (
        "redis_unavailable_total",
        Kind::Counter,
        "Commands answered storage unavailable",
    ),
    (
        "redis_storage_unavailable_answers_total",
        Kind::Counter,
        "Client requests answered storage unavailable (publish -32000, webhook 503)",
    ),
    (
        "redis_refused_total",
        Kind::Counter,
        "Commands refused at a full shard queue",
    ),
    (
        "redis_live_received_total",
        Kind::Counter,
        "Messages received by the subscriber",
    ),
    (
        "redis_up{conn=\"command\"",
        Kind::Gauge,
        "1 while the connection to Redis is up",
    ),
    (
        "redis_up{conn=\"pubsub\"",
        Kind::Gauge,
        "1 while the connection to Redis is up",
    ),
    (
        "redis_failovers_total",
        Kind::Counter,
        "Times the shard's primary was found at another address than before (failover)",
    ),
    (
        "redis_redirects_total{kind=\"moved\"",
        Kind::Counter,
        "Redis Cluster redirects followed",
    ),
    (
        "redis_redirects_total{kind=\"ask\"",
        Kind::Counter,
        "Redis Cluster redirects followed",
    ),
    (
        "redis_wait_timeouts_total",
        Kind::Counter,
        "Pipelined rounds whose WAIT came back short of --redis-wait-replicas (their writes answered storage unavailable)",
    ),
    (
        "redis_refused_no_primary_total",
        Kind::Counter,
        "Publishes answered storage unavailable while the shard had no reachable primary",
    ),
];

fn values(s: &ShardStats) -> [u64; 16] {
    [
        s.in_flight.get(),
        s.commands.get(),
        s.reconnects_command.get(),
        s.reconnects_pubsub.get(),
        s.resyncs.get(),
        s.unavailable.get(),
        s.unavailable_answers.get(),
        s.refused.get(),
        s.live_received.get(),
        s.command_up.get(),
        s.pubsub_up.get(),
        s.failovers.get(),
        s.moved.get(),
        s.ask.get(),
        s.wait_timeouts.get(),
        s.no_primary.get(),
    ]
}

/// Appends the Prometheus text of all shards (`shard` label = index in the `--redis` list).
pub fn render(shards: &[&ShardStats], queued: &[usize], out: &mut String) {
    let vals: Vec<[u64; 16]> = shards.iter().map(|s| values(s)).collect();
    let mut last_name = "";
    for (k, (name, kind, help)) in SERIES.into_iter().enumerate() {
        let (base, label) = match name.split_once('{') {
            Some((b, l)) => (b, format!("{l},")),
            None => (name, String::new()),
        };
        if base != last_name {
            family(
                out,
                format_args!("walletrelay_{base}"),
                kind,
                format_args!("{help}, per shard."),
            );
            last_name = base;
        }
        for (i, v) in vals.iter().enumerate() {
            let _ = writeln!(out, "walletrelay_{base}{{{label}shard=\"{i}\"}} {}", v[k]);
        }
    }
    family(
        out,
        "walletrelay_redis_queued",
        Kind::Gauge,
        "Commands waiting in the shard queue, per shard.",
    );
    for (i, q) in queued.iter().enumerate() {
        let _ = writeln!(out, "walletrelay_redis_queued{{shard=\"{i}\"}} {q}");
    }
    render_histogram(shards, out);
}

fn render_histogram(shards: &[&ShardStats], out: &mut String) {
    let n = "walletrelay_redis_roundtrip_seconds";
    family(
        out,
        n,
        Kind::Histogram,
        "Time to write one pipelined batch to Redis and read all its replies, per shard.",
    );
    for (i, s) in shards.iter().enumerate() {
        s.rtt.render(out, n, &format!("shard=\"{i}\""));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_labelled_per_shard() {
        let a = ShardStats::default();
        let b = ShardStats::default();
        a.observe_rtt(Duration::from_micros(50));
        a.observe_rtt(Duration::from_millis(3));
        a.observe_rtt(Duration::from_secs(10));
        b.refused.add(2);
        let mut s = String::new();
        render(&[&a, &b], &[5, 0], &mut s);
        assert!(
            s.contains("walletrelay_redis_roundtrip_seconds_bucket{shard=\"0\",le=\"0.0001\"} 1\n"),
            "{s}"
        );
        assert!(
            s.contains("walletrelay_redis_roundtrip_seconds_bucket{shard=\"0\",le=\"0.005\"} 2\n")
        );
        assert!(
            s.contains("walletrelay_redis_roundtrip_seconds_bucket{shard=\"0\",le=\"+Inf\"} 3\n")
        );
        assert!(s.contains("walletrelay_redis_roundtrip_seconds_count{shard=\"1\"} 0\n"));
        assert!(s.contains("walletrelay_redis_refused_total{shard=\"1\"} 2\n"));
        assert!(s.contains("walletrelay_redis_reconnects_total{conn=\"pubsub\",shard=\"0\"} 0\n"));
        assert!(s.contains("walletrelay_redis_queued{shard=\"0\"} 5\n"));
        assert_eq!(
            s.matches("# TYPE walletrelay_redis_reconnects_total")
                .count(),
            1
        );
    }
}
