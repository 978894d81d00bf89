//! How long each loop iteration of a worker kept it busy, and what a long one did.
//!
//! An iteration runs from the return of `poll` to the end of its `reap` (the wait in `poll`
//! is not counted). Every iteration goes into `walletrelay_loop_iteration_seconds`; one of
//! [`LONG_ITERATION`] or more is counted (`walletrelay_long_loop_iterations_total`) and
//! described: the longest of them since the last line is logged, at most once per
//! [`LOG_EVERY_MS`], with what it did (events, bytes read, timers fired, deliveries, mailbox
//! messages, connections written). The cost per iteration is one more clock read (the first
//! is the one the round's clock already takes), a few integer adds and the histogram's two
//! relaxed atomic adds; nothing is allocated.

use std::time::{Duration, Instant};

use crate::metrics::CoreMetrics;

/// An iteration this long or longer is counted and described.
pub const LONG_ITERATION: Duration = Duration::from_millis(1);
/// At most one line about long iterations per this many milliseconds, per worker.
pub const LOG_EVERY_MS: u64 = 10_000;

/// What one iteration did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    /// Readiness events handled.
    pub events: u32,
    /// Bytes read from sockets.
    pub bytes_in: u64,
    /// Connection deadlines that fell due.
    pub timers: u32,
    /// Pushes queued to subscribers (v2 and v1).
    pub deliveries: u64,
    /// Messages taken from the engine's mailbox.
    pub mail: u64,
    /// Connections with output when the sockets were written.
    pub writes: u32,
}

/// A long iteration, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Long {
    /// Its duration.
    pub took: Duration,
    /// What it did.
    pub work: Work,
}

/// A worker's view of its iterations: the one in progress and the long ones not yet logged.
#[derive(Debug)]
pub struct Iterations {
    started: Instant,
    /// The current iteration's work so far (its deliveries and mail are taken from the
    /// worker's counters at the end, by difference).
    pub work: Work,
    delivered_at_start: u64,
    mail_at_start: u64,
    /// Long iterations since the last line, and the longest of them.
    unlogged: u64,
    worst: Option<Long>,
    /// When the last line was written (worker clock, ms; 0: never).
    logged_at: u64,
    /// The thread's run delay when the last line was written, ns.
    run_delay_at_log: Option<u64>,
}

impl Iterations {
    /// No iteration begun yet.
    pub fn new(now: Instant) -> Iterations {
        Iterations {
            started: now,
            work: Work::default(),
            delivered_at_start: 0,
            mail_at_start: 0,
            unlogged: 0,
            worst: None,
            logged_at: 0,
            run_delay_at_log: None,
        }
    }

    /// An iteration begins at `now` (just after `poll` returned).
    pub fn begin(&mut self, now: Instant, m: &CoreMetrics) {
        self.started = now;
        self.work = Work::default();
        self.delivered_at_start = delivered(m);
        self.mail_at_start = m.core_messages_in.get();
    }

    /// [`Iterations::end_after`] at `now`.
    #[cfg(test)]
    pub fn end(&mut self, now: Instant, now_ms: u64, m: &CoreMetrics) -> Option<String> {
        self.end_after(self.since_start(now), now_ms, m)
    }

    /// How long the iteration has lasted at `now`.
    pub fn since_start(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// The iteration ends, having lasted `took` ([`Iterations::since_start`]): recorded in
    /// `m`; a long one is counted and kept to be described. Returns the line to log, if one
    /// is due at `now_ms` (worker clock).
    pub fn end_after(&mut self, took: Duration, now_ms: u64, m: &CoreMetrics) -> Option<String> {
        m.loop_iteration.observe(took);
        if took < LONG_ITERATION {
            return None;
        }
        self.work.deliveries = delivered(m).wrapping_sub(self.delivered_at_start);
        self.work.mail = m.core_messages_in.get().wrapping_sub(self.mail_at_start);
        m.long_iterations.inc();
        self.note(Long {
            took,
            work: self.work,
        });
        self.due(now_ms)
    }

    /// Keeps `l` as the longest since the last line if it is.
    fn note(&mut self, l: Long) {
        self.unlogged += 1;
        if self.worst.is_none_or(|w| l.took > w.took) {
            self.worst = Some(l);
        }
    }

    /// The line describing the long iterations since the last one, if [`LOG_EVERY_MS`] has
    /// passed since it (or none was written yet).
    fn due(&mut self, now_ms: u64) -> Option<String> {
        if self.logged_at != 0 && now_ms < self.logged_at + LOG_EVERY_MS {
            return None;
        }
        let w = self.worst.take()?;
        let n = std::mem::take(&mut self.unlogged);
        self.logged_at = now_ms.max(1);
        Some(describe(n, &w))
    }
}

impl Iterations {
    /// The time this thread spent runnable but not running (waiting for its CPU) since the
    /// last call, ns (`None` the first time, or without `/proc/thread-self/schedstat`):
    /// read when a line is written, so that it says how much of the stall was off the CPU.
    pub fn run_delay_since_last(&mut self) -> Option<u64> {
        let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let now: u64 = s.split_ascii_whitespace().nth(1)?.parse().ok()?;
        let before = self.run_delay_at_log.replace(now)?;
        Some(now.saturating_sub(before))
    }
}

fn delivered(m: &CoreMetrics) -> u64 {
    m.delivered.get().wrapping_add(m.v1_delivered.get())
}

/// The line for `n` long iterations whose longest was `w`.
fn describe(n: u64, w: &Long) -> String {
    let Work {
        events,
        bytes_in,
        timers,
        deliveries,
        mail,
        writes,
    } = w.work;
    format!(
        "{n} loop iteration(s) of {} µs or more; the longest took {} µs: {events} events, \
         {bytes_in} bytes read, {timers} timers, {deliveries} deliveries, {mail} mailbox \
         messages, {writes} connections written",
        LONG_ITERATION.as_micros(),
        w.took.as_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, us: u64) -> Instant {
        base + Duration::from_micros(us)
    }

    #[test]
    fn short_iterations_are_only_observed() {
        let m = CoreMetrics::default();
        let t = Instant::now();
        let mut it = Iterations::new(t);
        it.begin(t, &m);
        assert_eq!(it.end(at(t, 999), 5, &m), None);
        assert_eq!(m.long_iterations.get(), 0);
        assert_eq!(m.loop_iteration.count(), 1);
    }

    #[test]
    fn long_iterations_are_counted_described_and_logged_at_most_every_interval() {
        let m = CoreMetrics::default();
        let t = Instant::now();
        let mut it = Iterations::new(t);
        // The first long one is logged at once, with what it did.
        it.begin(t, &m);
        it.work.events = 3;
        it.work.bytes_in = 4096;
        it.work.timers = 2;
        it.work.writes = 7;
        m.delivered.add(5);
        m.v1_delivered.add(1);
        m.core_messages_in.add(4);
        let line = it
            .end(at(t, 1_500), 100, &m)
            .expect("first long one logged");
        assert!(
            line.starts_with("1 loop iteration(s) of 1000 µs or more"),
            "{line}"
        );
        assert!(
            line.contains(
                "took 1500 µs: 3 events, 4096 bytes read, 2 timers, 6 deliveries, 4 mailbox messages, 7 connections written"
            ),
            "{line}"
        );
        // Two more within the interval: counted, the longer kept, nothing logged.
        for (i, us) in [(0u64, 2_000u64), (1, 9_000)] {
            let s = at(t, 10_000 * (i + 1));
            it.begin(s, &m);
            it.work.events = i as u32;
            assert_eq!(it.end(at(s, us), 100 + LOG_EVERY_MS - 1, &m), None);
        }
        // A short one at the interval's end logs nothing either.
        it.begin(t, &m);
        assert_eq!(it.end(t, 100 + LOG_EVERY_MS, &m), None);
        // The next long one after the interval: all three, the longest described.
        let s = at(t, 50_000);
        it.begin(s, &m);
        let line = it
            .end(at(s, 1_000), 100 + LOG_EVERY_MS, &m)
            .expect("due again");
        assert!(line.starts_with("3 loop iteration(s)"), "{line}");
        assert!(line.contains("took 9000 µs: 1 events"), "{line}");
        assert_eq!(m.long_iterations.get(), 4);
        assert_eq!(m.loop_iteration.count(), 5);
        assert_eq!(m.loop_iteration.quantile_us(1.0), 10_000);
    }
}
