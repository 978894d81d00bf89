//! The store's figures: bytes written, syncs and their latency histogram, disk errors, and
//! what recovery found; rendered in the Prometheus text format for `GET /metrics`.
//!
//! Owns only what is counted and its names; the counters and the histogram are the
//! vocabulary of `metrics`. A log's counters are written by its worker (writes) and by a sync
//! thread (syncs), so they are [`Counter`]s (atomic adds), not single-writer `Cell`s.

use std::fmt::Write as _;

use super::recover::RecoveryStats;
use crate::metrics::{family, single, Bounds, Counter, Histogram, Kind};

/// Upper bounds of the sync latency buckets, microseconds (then `+Inf`).
#[derive(Debug)]
pub struct SyncBuckets;

impl Bounds for SyncBuckets {
    const US: &'static [u64] = &[
        100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
    ];
}

/// One log's figures. Shared by `Arc` between its worker, its sync thread and `/metrics`.
#[derive(Debug, Default)]
pub struct StoreMetrics {
    /// Records appended, as of the last write of a batch (set from the log's LSN there, not
    /// added to per record).
    pub records_appended: Counter,
    /// Bytes handed to the kernel (`write` calls that succeeded).
    pub bytes_written: Counter,
    /// `write` calls (one per flush with something to write).
    pub writes: Counter,
    /// `fdatasync` rounds completed (one round covers every file of the log).
    pub syncs: Counter,
    /// Duration of each sync round.
    pub sync_latency: Histogram<SyncBuckets>,
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
    let per_log: [(&str, Kind, &str, Get); 10] = [
        (
            "records_appended_total",
            Kind::Counter,
            "Records appended",
            |m| m.records_appended.get(),
        ),
        (
            "bytes_written_total",
            Kind::Counter,
            "Bytes written to the log",
            |m| m.bytes_written.get(),
        ),
        ("writes_total", Kind::Counter, "write calls", |m| {
            m.writes.get()
        }),
        ("syncs_total", Kind::Counter, "fdatasync rounds", |m| {
            m.syncs.get()
        }),
        (
            "segments_retired_total",
            Kind::Counter,
            "Segments deleted",
            |m| m.segments_retired.get(),
        ),
        ("write_errors_total", Kind::Counter, "Failed writes", |m| {
            m.write_errors.get()
        }),
        (
            "sync_errors_total",
            Kind::Counter,
            "Failed syncs or deletes",
            |m| m.sync_errors.get(),
        ),
        (
            "records_deferred_total",
            Kind::Counter,
            "Records kept in memory only while the disk failed",
            |m| m.records_deferred.get(),
        ),
        ("live_bytes", Kind::Gauge, "Bytes of live records", |m| {
            m.live_bytes.get()
        }),
        ("disk_bytes", Kind::Gauge, "Bytes of segment files", |m| {
            m.disk_bytes.get()
        }),
    ];
    for (name, kind, help, get) in per_log {
        family(
            out,
            format_args!("walletrelay_store_{name}"),
            kind,
            format_args!("{help} (per log)."),
        );
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
            "undecodable_records",
            "Whole records at start whose entry did not decode (not replayed)",
            recovered.undecodable_records,
        ),
    ];
    for (name, help, v) in once {
        let name = format_args!("walletrelay_store_{name}");
        single(out, name, Kind::Gauge, format_args!("{help}."), v);
    }
    // Seconds, as Prometheus wants durations (the millisecond count shown as a fraction).
    let secs = recovered.millis as f64 / 1000.0;
    single(
        out,
        "walletrelay_store_recovery_seconds",
        Kind::Gauge,
        "Seconds spent reading the logs at start.",
        secs,
    );
}

fn render_histograms(out: &mut String, logs: &[(&str, &StoreMetrics)]) {
    let name = "walletrelay_store_sync_seconds";
    let help = "Duration of an fdatasync round (per log).";
    family(out, name, Kind::Histogram, help);
    for (owner, m) in logs {
        m.sync_latency
            .render(out, name, &format!("log=\"{owner}\""));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_rendering() {
        let m = StoreMetrics::default();
        for us in [50, 100, 101, 3_000, 2_000_000] {
            m.sync_latency.observe_us(us);
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
        assert!(s.contains("walletrelay_store_recovery_seconds 0\n"));
    }
}
