//! What a user feels, as three histograms of `/metrics` (label `engine`): a publish's arrival
//! to its acknowledgement written to the publisher's socket
//! (`walletrelay_publish_ack_seconds`), its arrival to each push written to a subscriber's
//! socket (`walletrelay_publish_delivery_seconds`, one sample per delivery), and the store's
//! write as the engine does it (`walletrelay_store_write_seconds`: the journal's `fdatasync`
//! round, the round trip of a batch of Redis writes; none in memory).
//!
//! Kept off the hot path by reading the time once per worker round, not per message. A
//! publish is stamped with its round's start (a [`Stamp`]: when `poll` returned with its
//! frame, the reading the round takes anyway), carried in its `message::Body` to the topic's
//! home and to every worker that delivers it. Acks and pushes made during a round are only
//! noted against their stamp ([`Pending`]: one entry per run of equal stamps, no allocation
//! once its vectors have grown); once the round's output is written to the sockets, the worker
//! reads the clock (the reading its iteration's end takes anyway) and [`Pending::written`]
//! puts each run into the worker's own histograms ([`Latency`], one writer: plain loads and
//! stores), one bucket search per run. So a sample starts at or before its frame was read and
//! ends at or after its bytes reached the socket: it over-states by at most one loop
//! iteration (`walletrelay_loop_iteration_seconds`), and is never shorter than the truth.
//!
//! Owns the bounds, the stamps' arithmetic, the round's notes and the three families' lines;
//! what is stamped and when belongs to `relay` and `worker`, the store's timing to `store`
//! and `cluster`.

use super::counter::Cell;
use super::family::{family, Kind};
use super::histogram::{render_sum, Bounds, Histogram};

/// The buckets of the three histograms (µs; Prometheus `le` in seconds): 50 µs to 5 s.
#[derive(Debug)]
pub struct LatencyBounds;

impl Bounds for LatencyBounds {
    const US: &'static [u64] = &[
        50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
        1_000_000, 2_500_000, 5_000_000,
    ];
}

/// A moment on the server's monotonic clock, microseconds modulo 2^32 (`clock::stamp`): a
/// difference of two is right for anything shorter than 71 minutes. 0 means "not stamped"
/// (a message read back from the store, or from Redis): it gives no sample.
pub type Stamp = u32;

/// The store's writes: written by the engine's helper threads (atomic adds), one per process.
pub type StoreWrites = Histogram<LatencyBounds>;

/// One worker's publish latencies (its only writer is the worker).
#[derive(Debug, Default)]
pub struct Latency {
    /// Arrival to acknowledgement written.
    pub ack: Histogram<LatencyBounds, Cell>,
    /// Arrival to a push written, per delivery.
    pub delivery: Histogram<LatencyBounds, Cell>,
}

/// Most runs of stamps one kind of note keeps in a round: past it, a note joins the last run
/// (its start then is that run's, a little later than its own at worst by one round).
const MAX_RUNS: usize = 4096;

/// A worker's round as the latencies see it: its stamp, and the acks and pushes it made, by
/// stamp, until its output is written.
#[derive(Debug, Default)]
pub struct Pending {
    /// The round's start: the stamp of every publish read in it.
    round: Stamp,
    /// (stamp, acks) runs.
    acks: Vec<(Stamp, u32)>,
    /// (stamp, pushes) runs.
    deliveries: Vec<(Stamp, u32)>,
}

impl Pending {
    /// A round begins at `at` (`clock::stamp` of the time `poll` returned).
    #[inline]
    pub fn begin(&mut self, at: Stamp) {
        self.round = at;
    }

    /// The stamp of a publish read now: the round's start.
    #[inline]
    pub fn round(&self) -> Stamp {
        self.round
    }

    /// A publish stamped `at` was acknowledged.
    #[inline]
    pub fn ack(&mut self, at: Stamp) {
        note(&mut self.acks, at, 1);
    }

    /// `n` pushes of a publish stamped `at` were queued to subscribers.
    #[inline]
    pub fn delivered(&mut self, at: Stamp, n: u32) {
        note(&mut self.deliveries, at, n);
    }

    /// Nothing noted since the last write.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.acks.is_empty() && self.deliveries.is_empty()
    }

    /// The round's output is on the sockets at `now`: every note becomes a sample of `into`.
    pub fn written(&mut self, now: Stamp, into: &Latency) {
        for (runs, h) in [
            (&mut self.acks, &into.ack),
            (&mut self.deliveries, &into.delivery),
        ] {
            for (at, n) in runs.drain(..) {
                h.observe_n_us(u64::from(now.wrapping_sub(at)), u64::from(n));
            }
        }
    }
}

#[inline]
fn note(runs: &mut Vec<(Stamp, u32)>, at: Stamp, n: u32) {
    if at == 0 || n == 0 {
        return;
    }
    let full = runs.len() >= MAX_RUNS;
    match runs.last_mut() {
        Some((s, k)) if *s == at || full => *k = k.saturating_add(n),
        _ => runs.push((at, n)),
    }
}

/// Appends the three families: the workers' `cores` summed into one series each, labelled
/// `engine="{engine}"`, and the store's writes.
pub fn render<'a>(
    out: &mut String,
    engine: &str,
    cores: impl Iterator<Item = &'a Latency> + Clone,
    store: &StoreWrites,
) {
    let label = format!("engine=\"{engine}\"");
    let name = "walletrelay_publish_ack_seconds";
    let help = "From a publish's frame read (its loop iteration's start) to its acknowledgement written to the publisher's socket.";
    family(out, name, Kind::Histogram, help);
    render_sum(out, name, &label, cores.clone().map(|c| &c.ack));
    let name = "walletrelay_publish_delivery_seconds";
    let help = "From a publish's frame read (its loop iteration's start) to its push written to a subscriber's socket, per delivery (inside this server).";
    family(out, name, Kind::Histogram, help);
    render_sum(out, name, &label, cores.map(|c| &c.delivery));
    let name = "walletrelay_store_write_seconds";
    let help = "The store's write as the engine does it: the journal's fdatasync round, the round trip of a batch of Redis writes (none in memory).";
    family(out, name, Kind::Histogram, help);
    store.render(out, name, &label);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_become_samples_by_run_when_written() {
        let l = Latency::default();
        let mut p = Pending::default();
        p.ack(10);
        p.ack(10);
        p.ack(0);
        p.delivered(10, 3);
        p.delivered(u32::MAX - 99, 1);
        assert!(!p.is_empty());
        p.written(10 + 300, &l);
        assert!(p.is_empty());
        assert_eq!(l.ack.count(), 2);
        assert_eq!(l.ack.quantile_us(1.0), 500);
        assert_eq!(l.delivery.count(), 4);
        // Across the wrap of the stamps: 100 + 310 µs.
        assert_eq!(l.delivery.sum_us(), 3 * 300 + 410);
    }

    #[test]
    fn the_families_are_summed_over_the_workers() {
        let cores = [Latency::default(), Latency::default()];
        cores[0].ack.observe_us(40);
        cores[1].ack.observe_us(6_000_000);
        cores[1].delivery.observe_n_us(200, 2);
        let store = StoreWrites::default();
        let mut s = String::new();
        render(&mut s, "journal", cores.iter(), &store);
        assert!(s.contains("# TYPE walletrelay_publish_ack_seconds histogram\n"));
        assert!(s.contains(
            "walletrelay_publish_ack_seconds_bucket{engine=\"journal\",le=\"0.00005\"} 1\n"
        ));
        assert!(
            s.contains("walletrelay_publish_ack_seconds_bucket{engine=\"journal\",le=\"5\"} 1\n")
        );
        assert!(s.contains(
            "walletrelay_publish_ack_seconds_bucket{engine=\"journal\",le=\"+Inf\"} 2\n"
        ));
        assert!(s.contains("walletrelay_publish_delivery_seconds_count{engine=\"journal\"} 2\n"));
        assert!(s.contains("walletrelay_store_write_seconds_count{engine=\"journal\"} 0\n"));
    }
}
