//! The store's figures: bytes written, syncs and their latency histogram, disk errors, and
//! what recovery found; rendered in the Prometheus text format for `GET /metrics`.
//!
//! Owns only counting and rendering. A log's counters are written by its worker (writes)
//! and by a sync thread (syncs), so they are atomic adds, not `metrics::Cell`'s single-writer
//! stores.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::recover::RecoveryStats;

/// A value any thread may add to (a counter) or set (a gauge).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Sets the value (gauges).
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Reads the value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Upper bounds of the sync latency buckets, microseconds (then `+Inf`).
pub const SYNC_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// A fixed-bucket latency histogram (Prometheus style: cumulative when rendered).
#[derive(Debug, Default)]
pub struct Histogram {
    /// Count per bucket of [`SYNC_BUCKETS_US`], the last one for `+Inf`.
    buckets: [Counter; 13],
    /// Observations.
    count: Counter,
    /// Sum of the observations, microseconds.
    sum_us: Counter,
}

impl Histogram {
    /// Records one observation of `us` microseconds.
    pub fn observe(&self, us: u64) {
        let i = SYNC_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(SYNC_BUCKETS_US.len());
        self.buckets[i].add(1);
        self.count.add(1);
        self.sum_us.add(us);
    }
    /// Sum of the observations, microseconds.
    pub fn sum_us(&self) -> u64 {
        self.sum_us.get()
    }
    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.get()
    }
    /// The smallest bucket bound (µs) at or under which a fraction `q` of the observations
    /// fall (`u64::MAX` for the `+Inf` bucket, 0 when empty).
    pub fn quantile_us(&self, q: f64) -> u64 {
        let n = self.count.get();
        if n == 0 {
            return 0;
        }
        let want = ((n as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.get();
            if seen >= want {
                return SYNC_BUCKETS_US.get(i).copied().unwrap_or(u64::MAX);
            }
        }
        u64::MAX
    }
}

/// One log's figures. Shared by `Arc` between its worker, its sync thread and `/metrics`.
#[derive(Debug, Default)]
pub struct StoreMetrics {
    /// Records appended.
    pub records_appended: Counter,
    /// Bytes handed to the kernel (`write` calls that succeeded).
    pub bytes_written: Counter,
    /// `write` calls (one per flush with something to write).
    pub writes: Counter,
    /// `fdatasync` rounds completed (one round covers every file of the log).
    pub syncs: Counter,
    /// Duration of each sync round.
    pub sync_latency: Histogram,
    /// Failed writes (the batch was dropped).
    pub write_errors: Counter,
    /// Failed syncs or deletes.
    pub sync_errors: Counter,
    /// Segment files deleted after compaction.
    pub segments_retired: Counter,
    /// Records kept in memory only because the disk was failing (written again once it
    /// works).
    pub records_deferred: Counter,
    /// Bytes of live records (what the cache still holds), as of the last round.
    pub live_bytes: Counter,
    /// Bytes of the log's segment files, as of the last round.
    pub disk_bytes: Counter,
}

/// Appends the store's metrics (one series per log, labelled `log="<owner>"`) and the
/// recovery figures of this start to `out`.
///
/// Long on purpose: a flat list of metric families in exposition order.
pub fn render(out: &mut String, logs: &[(&str, &StoreMetrics)], recovered: &RecoveryStats) {
    type Get = fn(&StoreMetrics) -> u64;
    let per_log: [(&str, &str, &str, Get); 10] = [
        (
            "records_appended_total",
            "counter",
            "Records appended",
            |m| m.records_appended.get(),
        ),
        (
            "bytes_written_total",
            "counter",
            "Bytes written to the log",
            |m| m.bytes_written.get(),
        ),
        ("writes_total", "counter", "write calls", |m| m.writes.get()),
        ("syncs_total", "counter", "fdatasync rounds", |m| {
            m.syncs.get()
        }),
        (
            "segments_retired_total",
            "counter",
            "Segments deleted",
            |m| m.segments_retired.get(),
        ),
        ("write_errors_total", "counter", "Failed writes", |m| {
            m.write_errors.get()
        }),
        (
            "sync_errors_total",
            "counter",
            "Failed syncs or deletes",
            |m| m.sync_errors.get(),
        ),
        (
            "records_deferred_total",
            "counter",
            "Records kept in memory only while the disk failed",
            |m| m.records_deferred.get(),
        ),
        ("live_bytes", "gauge", "Bytes of live records", |m| {
            m.live_bytes.get()
        }),
        ("disk_bytes", "gauge", "Bytes of segment files", |m| {
            m.disk_bytes.get()
        }),
    ];
    for (name, kind, help, get) in per_log {
        let _ = writeln!(out, "# HELP walletrelay_store_{name} {help} (per log).");
        let _ = writeln!(out, "# TYPE walletrelay_store_{name} {kind}");
        for (owner, m) in logs {
            let _ = writeln!(
                out,
                "walletrelay_store_{name}{{log=\"{owner}\"}} {}",
                get(m)
            );
        }
    }
    render_histograms(out, logs);
    let once: [(&str, &str, u64); 6] = [
        (
            "recovered_records",
            "Records read back at start",
            recovered.records,
        ),
        (
            "recovered_bytes",
            "Bytes read back at start",
            recovered.bytes,
        ),
        (
            "skipped_records",
            "Damaged regions skipped at start",
            recovered.skipped_regions,
        ),
        (
            "truncated_bytes",
            "Torn-tail bytes cut at start",
            recovered.truncated_bytes,
        ),
        (
            "foreign_files",
            "Files in the data directory that are not ours",
            recovered.foreign_files,
        ),
        (
            "recovery_ms",
            "Milliseconds spent reading the logs at start",
            recovered.millis,
        ),
    ];
    for (name, help, v) in once {
        let _ = writeln!(out, "# HELP walletrelay_store_{name} {help}.");
        let _ = writeln!(out, "# TYPE walletrelay_store_{name} gauge");
        let _ = writeln!(out, "walletrelay_store_{name} {v}");
    }
}

fn render_histograms(out: &mut String, logs: &[(&str, &StoreMetrics)]) {
    let name = "walletrelay_store_sync_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Duration of an fdatasync round (per log)."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (owner, m) in logs {
        let h = &m.sync_latency;
        let mut cum = 0;
        for (i, b) in h.buckets.iter().enumerate() {
            cum += b.get();
            match SYNC_BUCKETS_US.get(i) {
                Some(us) => {
                    let le = *us as f64 / 1e6;
                    let _ = writeln!(out, "{name}_bucket{{log=\"{owner}\",le=\"{le}\"}} {cum}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{log=\"{owner}\",le=\"+Inf\"}} {cum}");
                }
            }
        }
        let sum = h.sum_us.get() as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{log=\"{owner}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{log=\"{owner}\"}} {}", h.count.get());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_rendering() {
        let m = StoreMetrics::default();
        for us in [50, 100, 101, 3_000, 2_000_000] {
            m.sync_latency.observe(us);
        }
        assert_eq!(m.sync_latency.count(), 5);
        assert_eq!(m.sync_latency.quantile_us(0.4), 100);
        assert_eq!(m.sync_latency.quantile_us(0.6), 250);
        assert_eq!(m.sync_latency.quantile_us(1.0), u64::MAX);
        m.bytes_written.add(600);
        let mut s = String::new();
        render(&mut s, &[("w0", &m)], &RecoveryStats::default());
        assert!(s.contains("walletrelay_store_bytes_written_total{log=\"w0\"} 600\n"));
        assert!(s.contains("walletrelay_store_sync_seconds_bucket{log=\"w0\",le=\"0.0001\"} 2\n"));
        assert!(s.contains("walletrelay_store_sync_seconds_bucket{log=\"w0\",le=\"+Inf\"} 5\n"));
        assert!(s.contains("walletrelay_store_sync_seconds_count{log=\"w0\"} 5\n"));
        assert!(s.contains("walletrelay_store_skipped_records 0\n"));
    }
}
