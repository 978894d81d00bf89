//! What every scenario shares: the run context, threads, setup pacing, the send schedule, and
//! per-sender bookkeeping for acknowledgement latency and loss.
//!
//! Owns no sockets itself; each scenario module drives [`crate::net::Io`] through a handler.

pub mod abuse;
pub mod churn;
pub mod fanout;
pub mod http;
pub mod idle;
pub mod loopback;
pub mod pairs;
pub mod stalled;
pub mod storm;
pub mod topics;

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use thiserror::Error;

use crate::cli::{Common, Target};
pub use crate::net::Wire;
use crate::net::{Io, IoStats, Key, Proto};
use crate::stats::{Counts, Lat, Report};

/// Why a scenario could not run.
#[derive(Debug, Error)]
pub enum RunError {
    /// A socket or poll call failed outside any one connection.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Connecting and subscribing did not finish.
    #[error("setup failed: {0}")]
    Setup(String),
    /// Bad flag combination.
    #[error("bad options: {0}")]
    Options(String),
}

/// What every thread of a run shares.
pub struct Ctx<'a> {
    /// Validated target.
    pub target: &'a Target,
    /// Common flags.
    pub common: &'a Common,
    /// Time zero for stamps (shared by threads: `Instant` is one clock per machine).
    pub epoch: Instant,
    /// Makes this run's topics unique.
    pub nonce: u64,
    /// Threads meet here between setup and measurement.
    pub barrier: Barrier,
    /// Set when any thread's setup failed.
    pub setup_failed: AtomicBool,
    /// The measurement's time zero, ns since epoch, agreed at the barrier.
    pub start_ns: AtomicU64,
    /// Appended to every upgrade query ([`Ctx::with_protocol`]).
    query_tail: &'static str,
}

/// `common` as `protocol` needs it: the SDK's shape always authenticates.
pub fn sdk_common(common: &Common, protocol: crate::cli::RelayProtocol) -> Common {
    let mut c = common.clone();
    if protocol == crate::cli::RelayProtocol::Sdk {
        c.auth = true;
    }
    c
}

impl<'a> Ctx<'a> {
    /// A context for `common.threads` threads.
    pub fn new(target: &'a Target, common: &'a Common) -> Self {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Ctx {
            target,
            common,
            epoch: crate::clock::epoch(),
            nonce: t ^ ((std::process::id() as u64) << 40),
            barrier: Barrier::new(common.threads.max(1)),
            setup_failed: AtomicBool::new(false),
            start_ns: AtomicU64::new(0),
            query_tail: "",
        }
    }

    /// Upgrade queries as `protocol`'s client writes them: the SDK adds its `ua` and
    /// `useOnCloseEvent` after `auth` and `projectId`.
    pub fn with_protocol(mut self, protocol: crate::cli::RelayProtocol) -> Self {
        if protocol == crate::cli::RelayProtocol::Sdk {
            self.query_tail = crate::proto::SDK_QUERY_TAIL;
        }
        self
    }

    /// A fresh event loop for thread `t`.
    pub fn io(&self, t: usize) -> std::io::Result<Io> {
        let mut io = Io::new(
            self.target,
            self.common.tls.clone(),
            self.common.permessage_deflate,
            self.common.source_ips,
            self.epoch,
            t,
            self.common.threads.max(1),
        )?;
        if self.common.wait == crate::cli::Wait::Sleep {
            io.sleep_on_timer()?;
        }
        Ok(io)
    }

    /// With `--auth`, `n` upgrade queries `auth=<jwt>&projectId=loadtest` (and the SDK's tail,
    /// [`Ctx::with_protocol`]), one fresh key pair
    /// and token each (aud = `--url`); without, none. Made before the connections open, so
    /// signing counts in no measured time.
    pub fn auth_queries(&self, n: usize) -> Result<Vec<String>, RunError> {
        if !self.common.auth {
            return Ok(Vec::new());
        }
        let mut q = crate::jwt::fresh_queries(n, &self.common.url)
            .map_err(|e| RunError::Setup(e.to_string()))?;
        for one in &mut q {
            one.push_str(self.query_tail);
        }
        Ok(q)
    }

    /// Run `f` on each of the `threads` threads and collect the results in thread order.
    pub fn run_threads<T, F>(&self, f: F) -> Result<Vec<T>, RunError>
    where
        T: Send,
        F: Fn(usize) -> Result<T, RunError> + Sync,
    {
        let n = self.common.threads.max(1);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|t| {
                    let f = &f;
                    s.spawn(move || f(t))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(RunError::Setup("a thread panicked".into())))
                })
                .collect()
        })
    }

    /// Wait for every thread's setup, then agree on the measurement's time zero.
    /// `None` if any thread's setup failed (every thread then stops).
    pub fn sync_setup(&self, ok: bool) -> Option<u64> {
        if !ok {
            self.setup_failed.store(true, Ordering::SeqCst);
        }
        if self.barrier.wait().is_leader() {
            let now = self.epoch.elapsed().as_nanos() as u64;
            let mut start = now + 1_000_000;
            if let Some(at) = self.common.start_at {
                let at = crate::clock::since_epoch(at);
                if at >= start {
                    start = at;
                } else {
                    eprintln!(
                        "loadtest: setup ended {:.1} ms after --start-at: starting now, out of \
                         step with the other generators",
                        (start - at) as f64 / 1e6
                    );
                }
            }
            self.start_ns.store(start, Ordering::SeqCst);
        }
        self.barrier.wait();
        if self.setup_failed.load(Ordering::SeqCst) {
            None
        } else {
            Some(self.start_ns.load(Ordering::SeqCst))
        }
    }
}

/// Runs `h`'s setup phase on `io` for at most `--setup-timeout`; returns how long it took (ns).
pub fn run_setup<H: crate::net::Handler>(
    io: &mut Io,
    h: &mut H,
    common: &Common,
) -> std::io::Result<u64> {
    let start = io.now_ns();
    crate::net::run(io, h, start + common.setup_timeout.as_nanos() as u64)?;
    Ok(io.now_ns() - start)
}

/// The part of `0..n` that thread `t` of `threads` owns.
pub fn split(n: usize, threads: usize, t: usize) -> Range<usize> {
    let threads = threads.max(1);
    let base = n / threads;
    let extra = n % threads;
    let start = t * base + t.min(extra);
    let len = base + usize::from(t < extra);
    start..start + len
}

/// Opens connections during setup, at most `limit` connecting or upgrading at once.
pub struct Connector {
    /// Tags still to open, in order.
    next: usize,
    total: usize,
    /// Connected but not yet counted as ready by the scenario.
    pub in_progress: usize,
    limit: usize,
    /// Connect calls that failed at once (EMFILE, EADDRNOTAVAIL, ...).
    pub failed_now: Counts,
    /// Upgrade query per tag (`--auth`), taken when its connection starts; empty: none.
    queries: Vec<String>,
}

impl Connector {
    /// Open tags `0..total`.
    pub fn new(total: usize, limit: usize) -> Self {
        Connector {
            next: 0,
            total,
            in_progress: 0,
            limit: limit.max(1),
            failed_now: Counts::new(),
            queries: Vec::new(),
        }
    }

    /// Give connection `tag` the upgrade query `queries[tag]` ([`Ctx::auth_queries`]).
    pub fn with_queries(mut self, queries: Vec<String>) -> Self {
        self.queries = queries;
        self
    }

    /// Start as many connects as allowed; `on_key(tag, key)` records each started one.
    /// Returns the number that failed at once.
    pub fn pump(&mut self, io: &mut Io, proto: Proto, mut on_key: impl FnMut(u32, Key)) -> usize {
        let mut failed = 0;
        while self.in_progress < self.limit && self.next < self.total {
            let tag = self.next as u32;
            self.next += 1;
            let query = self.queries.get_mut(tag as usize).map(std::mem::take);
            match io.connect_with(tag, proto, query.as_deref()) {
                Ok(key) => {
                    self.in_progress += 1;
                    on_key(tag, key);
                }
                Err(e) => {
                    failed += 1;
                    *self
                        .failed_now
                        .entry(format!("connect:{:?}", e.kind()))
                        .or_insert(0) += 1;
                }
            }
        }
        failed
    }
}

/// Open-loop schedule: event `i` is due at `t0 + i / rate`.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Time of event 0, ns since epoch.
    pub t0: u64,
    /// Events per second (> 0).
    pub rate: f64,
    /// Next event index.
    pub next: u64,
}

impl Schedule {
    /// When event `i` is due.
    pub fn at(&self, i: u64) -> u64 {
        self.t0 + (i as f64 * 1e9 / self.rate) as u64
    }

    /// The next event's index and due time if it is due by `now`, advancing past it.
    pub fn take_due(&mut self, now: u64) -> Option<(u64, u64)> {
        let at = self.at(self.next);
        if at <= now {
            let i = self.next;
            self.next += 1;
            Some((i, at))
        } else {
            None
        }
    }
}

/// A growable bit set over message sequence numbers.
#[derive(Debug, Default, Clone)]
pub struct Bits(Vec<u64>);

impl Bits {
    /// Set bit `i`; returns whether it was already set.
    pub fn set(&mut self, i: u32) -> bool {
        let w = (i / 64) as usize;
        if w >= self.0.len() {
            self.0.resize(w + 1, 0);
        }
        let m = 1u64 << (i % 64);
        let was = self.0[w] & m != 0;
        self.0[w] |= m;
        was
    }

    /// Is bit `i` set?
    pub fn get(&self, i: u32) -> bool {
        self.0
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }
}

/// One request awaiting its response.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    /// Request id number (id = ID_BASE + n).
    pub n: u64,
    /// Scheduled send time.
    pub sched_ns: u64,
    /// Message sequence number.
    pub seq: u32,
    /// Counted in the measured window.
    pub in_window: bool,
}

/// A publishing connection's bookkeeping: ids awaiting acks, what was acked and delivered.
#[derive(Debug, Default)]
pub struct Sender {
    /// Next message sequence number (also the next request id number).
    pub next_seq: u32,
    /// Requests in order of sending (the server answers in order on one connection).
    pub pending: VecDeque<Pending>,
    /// Acked sequence numbers.
    pub acked: Bits,
    /// First sequence number sent in the measured window.
    pub win_first: Option<u32>,
    /// First sequence number sent after the measured window.
    pub win_end: Option<u32>,
}

impl Sender {
    /// Take the next sequence number for a message scheduled at `sched_ns`.
    pub fn next(&mut self, sched_ns: u64, in_window: bool, after_window: bool) -> u32 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if in_window && self.win_first.is_none() {
            self.win_first = Some(seq);
        }
        if after_window && self.win_end.is_none() {
            self.win_end = Some(seq);
        }
        self.pending.push_back(Pending {
            n: seq as u64,
            sched_ns,
            seq,
            in_window,
        });
        seq
    }

    /// Match a response to request number `n`; mismatches skip ahead (counted by the caller).
    pub fn answer(&mut self, n: u64) -> Option<(Pending, bool)> {
        let front = self.pending.front()?;
        if front.n == n {
            return self.pending.pop_front().map(|p| (p, true));
        }
        let pos = self.pending.iter().position(|p| p.n == n)?;
        self.pending.remove(pos).map(|p| (p, false))
    }
}

/// Latency and counters of a publish/deliver scenario, mergeable across threads.
#[derive(Default)]
pub struct MsgStats {
    /// Publishes sent in the window.
    pub sent: u64,
    /// Of `sent`, the wallets' answers (SDK shape; the rest are requests).
    pub answers_sent: u64,
    /// Publish acks received during the window.
    pub acked_in_window: u64,
    /// Deliveries received during the window.
    pub delivered_in_window: u64,
    /// Publish -> delivery, from the scheduled send time.
    pub delivery: Lat,
    /// Publish -> ack, from the scheduled send time.
    pub ack: Lat,
    /// How late we sent relative to the schedule (open loop only).
    pub send_lag: Lat,
    /// Busy time of the generator's own loop turns in the window (its stalls).
    pub loop_turn: Lat,
    /// The generator's threads' time on a CPU and waiting for one (run delay), ns, from the
    /// start of the warm-up to the end of the drain (`/proc/thread-self/schedstat`).
    pub sched: (u64, u64),
    /// JSON-RPC errors by code.
    pub errors: Counts,
    /// Oddities: echoes, duplicates, unmatched ids, unknown messages.
    pub anomalies: Counts,
    /// Connections that ended during the run, by reason.
    pub closes: Counts,
    /// Sends refused because a connection's backlog was full or it was gone.
    pub send_refused: u64,
    /// Acked in the window but never delivered.
    pub lost: u64,
    /// Sent in the window but never acked.
    pub unacked: u64,
    /// Bytes read and written.
    pub bytes_in: u64,
    /// Bytes written.
    pub bytes_out: u64,
    /// WebSocket traffic of the measured window.
    pub wire: Wire,
}

impl Wire {
    /// The traffic between two readings of a loop's counters.
    pub fn between(a: &IoStats, b: &IoStats) -> Wire {
        let (a, b) = (&a.wire, &b.wire);
        Wire {
            bytes_in: b.bytes_in.saturating_sub(a.bytes_in),
            bytes_out: b.bytes_out.saturating_sub(a.bytes_out),
            messages_in: b.messages_in.saturating_sub(a.messages_in),
            compressed_in: b.compressed_in.saturating_sub(a.compressed_in),
            compressed_out: b.compressed_out.saturating_sub(a.compressed_out),
            uncompressed_out: b.uncompressed_out.saturating_sub(a.uncompressed_out),
        }
    }

    /// Add another thread's figures.
    pub fn merge(&mut self, o: &Wire) {
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.messages_in += o.messages_in;
        self.compressed_in += o.compressed_in;
        self.compressed_out += o.compressed_out;
        self.uncompressed_out += o.uncompressed_out;
    }

    /// Adds `ws_bytes_in_per_delivery` (all bytes read / deliveries: pushes, and the acks
    /// of the publishes that caused them), `ws_bytes_out_per_publish`, and, with
    /// `--permessage-deflate`, the share of messages that travelled compressed.
    pub fn report(&self, r: &mut Report, deliveries: u64, publishes: u64, deflate: bool) {
        let per = |bytes: u64, n: u64| if n == 0 { 0.0 } else { bytes as f64 / n as f64 };
        r.text("permessage_deflate", if deflate { "on" } else { "off" })
            .float(
                "ws_bytes_in_per_delivery",
                per(self.bytes_in, deliveries),
                1,
            )
            .float(
                "ws_bytes_out_per_publish",
                per(self.bytes_out, publishes),
                1,
            );
        if deflate {
            let sent = self.compressed_out + self.uncompressed_out;
            r.float(
                "compressed_in_pct",
                100.0 * per(self.compressed_in, self.messages_in),
                1,
            )
            .float(
                "compressed_out_pct",
                100.0 * per(self.compressed_out, sent),
                1,
            );
        }
    }
}

/// Reads a loop's counters as the measured window opens and closes (from a handler's
/// `tick`, so to within a loop turn).
#[derive(Debug, Default, Clone, Copy)]
pub struct WindowMark {
    start: Option<IoStats>,
    end: Option<IoStats>,
}

impl WindowMark {
    /// Take the readings whose time has come.
    pub fn observe(&mut self, s: &IoStats, now: u64, t_warm: u64, t_end: u64) {
        if now >= t_warm && self.start.is_none() {
            self.start = Some(*s);
        }
        if now >= t_end && self.end.is_none() {
            self.end = Some(*s);
        }
    }

    /// The window's traffic; `last` stands in for a reading not taken (a run cut short).
    pub fn wire(&self, last: &IoStats) -> Wire {
        let start = self.start.unwrap_or(*last);
        Wire::between(&start, self.end.as_ref().unwrap_or(last))
    }
}

impl MsgStats {
    /// Add another thread's figures.
    pub fn merge(&mut self, o: &MsgStats) {
        self.sent += o.sent;
        self.answers_sent += o.answers_sent;
        self.acked_in_window += o.acked_in_window;
        self.delivered_in_window += o.delivered_in_window;
        self.delivery.merge(&o.delivery);
        self.ack.merge(&o.ack);
        self.send_lag.merge(&o.send_lag);
        self.loop_turn.merge(&o.loop_turn);
        self.sched.0 += o.sched.0;
        self.sched.1 += o.sched.1;
        crate::stats::merge_counts(&mut self.errors, &o.errors);
        crate::stats::merge_counts(&mut self.anomalies, &o.anomalies);
        crate::stats::merge_counts(&mut self.closes, &o.closes);
        self.send_refused += o.send_refused;
        self.lost += o.lost;
        self.unacked += o.unacked;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.wire.merge(&o.wire);
    }

    /// Count one oddity.
    pub fn anomaly(&mut self, what: &str) {
        *self.anomalies.entry(what.to_string()).or_insert(0) += 1;
    }
}

/// The report's `auth` value for the scenarios that sign before they connect.
pub fn auth_label(common: &Common) -> &'static str {
    if common.auth {
        "jwt (own key pair and token per connection)"
    } else {
        "off"
    }
}

/// Increment a label in a [`Counts`].
pub fn bump(c: &mut Counts, label: &str) {
    if let Some(v) = c.get_mut(label) {
        *v += 1;
    } else {
        c.insert(label.to_string(), 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything_once() {
        for n in [0, 1, 5, 100, 101] {
            for threads in 1..5 {
                let mut all = Vec::new();
                for t in 0..threads {
                    all.extend(split(n, threads, t));
                }
                assert_eq!(all, (0..n).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn window_mark_counts_only_the_window() {
        let at = |bytes: u64| IoStats {
            wire: Wire {
                bytes_in: bytes,
                bytes_out: 2 * bytes,
                messages_in: bytes / 100,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut m = WindowMark::default();
        m.observe(&at(100), 5, 10, 20); // warm-up: nothing read
        m.observe(&at(300), 10, 10, 20); // window opens
        m.observe(&at(800), 15, 10, 20);
        m.observe(&at(1000), 21, 10, 20); // window closed
        m.observe(&at(5000), 30, 10, 20); // drain: ignored
        let w = m.wire(&at(9999));
        assert_eq!((w.bytes_in, w.bytes_out, w.messages_in), (700, 1400, 7));
        // A run cut short before the window closed ends at the last reading.
        let mut short = WindowMark::default();
        short.observe(&at(300), 10, 10, 20);
        assert_eq!(short.wire(&at(500)).bytes_in, 200);
        let mut r = Report::new("x");
        w.report(&mut r, 7, 0, true);
        let json = r.json();
        assert!(
            json.contains("\"ws_bytes_in_per_delivery\":100.0"),
            "{json}"
        );
        assert!(json.contains("\"ws_bytes_out_per_publish\":0.0"), "{json}");
    }

    #[test]
    fn schedule_is_exact() {
        let mut s = Schedule {
            t0: 1000,
            rate: 1000.0,
            next: 0,
        };
        assert_eq!(s.take_due(999), None);
        assert_eq!(s.take_due(1000), Some((0, 1000)));
        assert_eq!(s.take_due(1000), None);
        assert_eq!(s.take_due(3_000_000), Some((1, 1_001_000)));
        assert_eq!(s.take_due(3_000_000), Some((2, 2_001_000)));
        assert_eq!(s.take_due(3_000_000), None);
    }

    #[test]
    fn sender_window_and_answers() {
        let mut s = Sender::default();
        s.next(1, false, false); // 0, warmup
        s.next(2, true, false); // 1
        s.next(3, true, false); // 2
        s.next(4, true, false); // 3
        s.next(5, false, true); // 4, after the window
        assert_eq!(s.answer(0).map(|p| p.1), Some(true));
        assert_eq!(s.answer(2).map(|p| p.1), Some(false)); // 1 skipped
        assert_eq!(s.answer(1).map(|p| p.1), Some(true));
        assert!(s.answer(9).is_none());
        assert_eq!((s.win_first, s.win_end), (Some(1), Some(4)));
        let mut b = Bits::default();
        assert!(!b.set(130));
        assert!(b.set(130));
        assert!(b.get(130) && !b.get(129) && !b.get(100_000));
    }
}
