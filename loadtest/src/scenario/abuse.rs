//! `abuse`: honest pairs at a steady open-loop rate, from many loopback addresses, beside one
//! abuser from its own address (DECISIONS §11, issue 24 §3). For each abuser kind the honest
//! load runs once without the abuser and once with it (same flags, same server), and the
//! figures are set side by side: honest deliveries, loss, publish->delivery p50/p99, and what
//! the abuser sent and had refused.
//!
//! The honest side is the `pairs` engine ([`super::topics`]) on `--threads` loops; the
//! abuser is one more thread with its own loop, its connections bound to `--abuser-ip`,
//! started when the honest setup is done (the honest measurement's time zero) and stopped at
//! the end of the measured window. It never passes anything to the server: the server runs
//! with whatever limits it was started with (the defaults, for the point of this scenario).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::{AbuseKind, AbuseOpts, RelayProtocol, Target};
use crate::net::{self, CloseWhy, Handler, Io, Key, Proto};
use crate::proto::{self, Classifier, Incoming, PublishTemplate, Rpc, Stamp};
use crate::stats::{Counts, Report};

use super::topics::{self, Load, Shape};
use super::{bump, Ctx, RunError};

/// Honest addresses when `--source-ips` is 0.
const DEFAULT_HONEST_IPS: u32 = 100;
/// Tag of the publish flood's subscriber.
const SUBSCRIBER: u32 = 0;
/// Tag of every storm connection.
const STORM: u32 = u32::MAX;

/// What the abuser did and what it was answered, over its whole run (the honest warm-up and
/// measured window).
#[derive(Debug, Default, Clone)]
pub struct AbuserFig {
    /// Requests sent (publishes, subscribes and batch subscribes).
    pub sent: u64,
    /// Topics asked for by the subscribe flood (a batch counts each).
    pub topics: u64,
    /// Requests answered with a result.
    pub accepted: u64,
    /// Requests refused with -32000 `rate limited` and `data.retryAfterMs`.
    pub refused: u64,
    /// The largest `retryAfterMs` seen.
    pub retry_max_ms: u64,
    /// Other error answers, by code.
    pub other_errors: Counts,
    /// Connections the server closed with 1013 (refusals in a row).
    pub closes_1013: u64,
    /// Connections that ended otherwise after opening, by reason.
    pub closes_other: Counts,
    /// Connections started.
    pub conns_started: u64,
    /// Connections upgraded.
    pub conns_opened: u64,
    /// Connections that ended before the upgrade: answered 429.
    pub conns_429: u64,
    /// ... or closed at accept without an answer (EOF, reset) or failed otherwise, by reason.
    pub conns_refused: Counts,
    /// Publishes delivered to the abuser's own subscriber.
    pub delivered: u64,
}

impl AbuserFig {
    fn refused_other(&self) -> u64 {
        self.conns_refused.values().sum()
    }
}

/// One phase's figures, for the side-by-side table.
#[derive(Debug, Clone, Default)]
pub struct PhaseFig {
    /// Abuser kind of this pair of phases.
    pub kind: &'static str,
    /// Round (0-based).
    pub round: usize,
    /// The abuser ran.
    pub with: bool,
    /// Honest deliveries in the window.
    pub deliveries: u64,
    /// Honest acknowledged publishes never delivered.
    pub lost: u64,
    /// Honest publishes never answered.
    pub unacked: u64,
    /// Honest error answers (a refusal of an honest client is a failure of the limits).
    pub honest_errors: u64,
    /// Honest publish->delivery, µs.
    pub p50: u64,
    /// Honest publish->delivery p99, µs.
    pub p99: u64,
    /// How late the honest generator sent, p99, µs (its core is shared with the abuser).
    pub lag99: u64,
    /// The abuser (zeros without it).
    pub abuser: AbuserFig,
    /// 1-minute load average as the phase started.
    pub load1: f64,
    /// The server's CPU use over the phase (CPU seconds per second; NaN if unknown).
    pub server_cpu: f64,
}

/// The side-by-side table: one line per phase, the "with" line carrying the ratio of its
/// p99 to the "without" line of the same kind and round.
pub fn side_by_side(rows: &[PhaseFig]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<9} {:>2} {:<7} {:>10} {:>5} {:>7} {:>8} {:>8} {:>6} {:>7} {:>10} {:>9} {:>10} {:>6} {:>9} {:>7} {:>9} {:>5} {:>5}",
        "abuser", "r", "phase", "deliveries", "lost", "unack+e", "p50_us", "p99_us", "p99x", "lag99",
        "ab_sent", "ab_ok", "ab_refused", "1013", "ab_conns", "429", "refused", "load1", "srv"
    );
    for r in rows {
        let ratio = if r.with {
            rows.iter()
                .find(|b| !b.with && b.kind == r.kind && b.round == r.round)
                .filter(|b| b.p99 > 0)
                .map(|b| format!("{:.2}", r.p99 as f64 / b.p99 as f64))
                .unwrap_or_else(|| "?".into())
        } else {
            "-".into()
        };
        let a = &r.abuser;
        let dash = |v: u64| if r.with { v.to_string() } else { "-".into() };
        let _ = writeln!(
            s,
            "{:<9} {:>2} {:<7} {:>10} {:>5} {:>7} {:>8} {:>8} {:>6} {:>7} {:>10} {:>9} {:>10} {:>6} {:>9} {:>7} {:>9} {:>5.2} {:>5.2}",
            r.kind,
            r.round + 1,
            if r.with { "with" } else { "without" },
            r.deliveries,
            r.lost,
            r.unacked + r.honest_errors,
            r.p50,
            r.p99,
            ratio,
            r.lag99,
            dash(a.sent),
            dash(a.accepted),
            dash(a.refused),
            dash(a.closes_1013),
            dash(a.conns_started),
            dash(a.conns_429),
            dash(a.refused_other()),
            r.load1,
            r.server_cpu,
        );
    }
    s
}

/// Run every phase; returns the phase reports (one JSON line each) and the table.
pub fn run(target: &Target, o: &AbuseOpts) -> Result<(Vec<Report>, String), RunError> {
    if o.pairs == 0 || o.rate == 0 {
        return Err(RunError::Options("--pairs and --rate must be > 0".into()));
    }
    if o.protocol == RelayProtocol::V1 {
        return Err(RunError::Options("--protocol is waku or irn".into()));
    }
    if o.kinds.is_empty() || o.rounds == 0 {
        return Err(RunError::Options(
            "--kinds and --rounds must not be empty".into(),
        ));
    }
    if !(1..=500).contains(&o.batch) || o.abuser_conns == 0 || o.pipeline == 0 {
        return Err(RunError::Options(
            "--batch is 1 to 500; --abuser-conns and --pipeline > 0".into(),
        ));
    }
    o.protocol.check_ttl(o.ttl).map_err(RunError::Options)?;
    let mut common = o.common.clone();
    if common.source_ips == 0 {
        common.source_ips = DEFAULT_HONEST_IPS;
    }
    let ab = o.abuser_ip;
    let top = 1 + common.source_ips as u64; // last honest address's low 24 bits
    let ab_low = u32::from(ab) as u64 & 0x00ff_ffff;
    if ab.octets()[0] != 127 || (2..=top).contains(&ab_low) {
        return Err(RunError::Options(format!(
            "--abuser-ip {ab}: must be in 127.0.0.0/8 and outside the honest 127.0.0.2 .. +{}",
            common.source_ips
        )));
    }
    if !target.addr.is_ipv4() {
        return Err(RunError::Options(
            "abuse binds source addresses: use an IPv4 loopback --url".into(),
        ));
    }
    let mut reports = Vec::new();
    let mut rows = Vec::new();
    for round in 0..o.rounds {
        for &kind in &o.kinds {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for with in order {
                let (row, rep) = phase(target, o, &common, kind, with, round)?;
                println!("{}", rep.json());
                reports.push(rep);
                rows.push(row);
            }
        }
    }
    Ok((reports, side_by_side(&rows)))
}

fn phase(
    target: &Target,
    o: &AbuseOpts,
    common: &crate::cli::Common,
    kind: AbuseKind,
    with: bool,
    round: usize,
) -> Result<(PhaseFig, Report), RunError> {
    let load1 = crate::sys::loadavg1().unwrap_or(f64::NAN);
    let cpu = || {
        o.server_pid
            .and_then(|p| crate::sys::cpu_seconds(p).ok())
            .map(|c| (c, std::time::Instant::now()))
    };
    let cpu0 = cpu();
    let shape = Shape::Pairs { pairs: o.pairs };
    let load = Load {
        rate: o.rate,
        inflight: 1,
        size: o.size,
        ttl: o.ttl,
        drain_ns: o.drain.as_nanos() as u64,
        ack: false,
        count: 0,
        v1: false,
        rpc: o.protocol.rpc(),
    };
    let ctx = Ctx::new(target, common);
    let stop = AtomicBool::new(false);
    let (outs, abuser) = std::thread::scope(|s| {
        let h = with.then(|| s.spawn(|| abuser(&ctx, o, kind, &stop)));
        let outs = topics::run(&ctx, common, shape, &load);
        stop.store(true, Ordering::SeqCst);
        let ab = h.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(RunError::Setup("the abuser panicked".into())))
        });
        (outs, ab)
    });
    let server_cpu = match (cpu0, cpu()) {
        (Some((c0, t0)), Some((c1, t1))) => (c1 - c0) / (t1 - t0).as_secs_f64().max(1e-3),
        _ => f64::NAN,
    };
    let outs = outs?;
    let abuser = abuser.transpose()?.unwrap_or_default();
    let (st, lost, _, unacked) = topics::merge(outs, shape);
    let secs = common.duration.as_secs_f64();
    let d = st.delivery.summary();
    let honest_errors: u64 = st.errors.values().sum();
    let row = PhaseFig {
        kind: kind.label(),
        round,
        with,
        deliveries: st.delivered_in_window,
        lost,
        unacked,
        honest_errors,
        p50: d.p50,
        p99: d.p99,
        lag99: st.send_lag.summary().p99,
        abuser: abuser.clone(),
        load1,
        server_cpu,
    };
    let mut r = Report::new("abuse");
    r.text("abuser", kind.label())
        .text("phase", if with { "with" } else { "without" })
        .int("round", round as u64 + 1)
        .text("protocol", o.protocol.label())
        .int("pairs", o.pairs as u64)
        .int("honest_connections", 2 * o.pairs as u64)
        .int("honest_source_ips", common.source_ips as u64)
        .text("abuser_ip", &o.abuser_ip.to_string())
        .int("target_rate", o.rate)
        .int("size", o.size as u64)
        .float("duration_s", secs, 1)
        .float("load1_at_start", load1, 2)
        .float("server_cpu_share", server_cpu, 3)
        .int("honest_publishes_sent", st.sent)
        .int("honest_deliveries", st.delivered_in_window)
        .float(
            "honest_deliveries_per_s",
            st.delivered_in_window as f64 / secs,
            0,
        )
        .int("honest_lost", lost)
        .int("honest_unacked", unacked)
        .int("honest_errors", honest_errors)
        .int("honest_send_refused", st.send_refused)
        .lat("honest_publish_delivery", &st.delivery)
        .lat("honest_publish_ack", &st.ack)
        .lat("honest_send_lag", &st.send_lag)
        .counts("honest_error_codes", &st.errors)
        .counts("honest_closes", &st.closes)
        .counts("honest_anomalies", &st.anomalies);
    if with {
        let a = &abuser;
        r.int("abuser_requests_sent", a.sent)
            .int("abuser_topics_requested", a.topics)
            .int("abuser_accepted", a.accepted)
            .int("abuser_refused_rate_limited", a.refused)
            .int("abuser_retry_after_max_ms", a.retry_max_ms)
            .int("abuser_closes_1013", a.closes_1013)
            .int("abuser_conns_started", a.conns_started)
            .int("abuser_conns_opened", a.conns_opened)
            .int("abuser_conns_429", a.conns_429)
            .int("abuser_conns_refused_other", a.refused_other())
            .int("abuser_delivered", a.delivered)
            .counts("abuser_other_errors", &a.other_errors)
            .counts("abuser_closes_other", &a.closes_other)
            .counts("abuser_conns_refused", &a.conns_refused);
    }
    if lost > 0 || unacked > 0 || honest_errors > 0 {
        r.note(format!(
            "honest clients lost {lost}, unanswered {unacked}, errors {honest_errors}"
        ));
    }
    if st.send_lag.summary().p99 > 1000 {
        r.note("honest send_lag p99 > 1 ms: the generator's core was busy".into());
    }
    Ok((row, r))
}

/// One flood connection.
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    key: Option<Key>,
    open: bool,
    inflight: usize,
    seq: u64,
}

struct Abuser<'a> {
    kind: AbuseKind,
    o: &'a AbuseOpts,
    rpc: Rpc,
    nonce: u64,
    cls: Classifier,
    t_end: u64,
    now: u64,
    stopped: bool,
    sub_key: Option<Key>,
    sub_started: bool,
    sub_waiting: usize,
    sub_ready: bool,
    topics: Vec<String>,
    templates: Vec<PublishTemplate>,
    slots: Vec<Slot>,
    /// Storm connections started and not yet ended, and those that opened.
    storm: usize,
    storm_open: Vec<Key>,
    next_topic: u64,
    fig: AbuserFig,
}

impl Abuser<'_> {
    fn fresh_topic(&mut self) -> String {
        self.next_topic += 1;
        proto::topic(self.nonce, 0xab, self.next_topic)
    }

    fn fill(&mut self, io: &mut Io, i: usize) {
        let s = self.slots[i];
        let Some(key) = s.key.filter(|_| s.open) else {
            return;
        };
        let mut slot = s;
        while slot.inflight < self.o.pipeline && self.now < self.t_end {
            let id_n = slot.seq;
            match self.kind {
                AbuseKind::Publish => {
                    let Some(out) = io.out(key) else { break };
                    self.templates[i % self.templates.len()].write(
                        out,
                        id_n,
                        &Stamp {
                            sched_ns: self.now,
                            sender: i as u32,
                            seq: id_n as u32,
                        },
                    );
                }
                AbuseKind::Subscribe => {
                    let n = if id_n.is_multiple_of(2) {
                        1
                    } else {
                        self.o.batch
                    };
                    let topics: Vec<String> = (0..n).map(|_| self.fresh_topic()).collect();
                    let Some(out) = io.out(key) else { break };
                    let id = proto::ID_BASE + id_n;
                    if n == 1 {
                        proto::write_subscribe(out, self.rpc, id, &topics[0]);
                    } else {
                        proto::write_batch_subscribe(out, self.rpc, id, &topics);
                    }
                    self.fig.topics += n as u64;
                }
                AbuseKind::Connect => return,
            }
            slot.seq += 1;
            slot.inflight += 1;
            self.fig.sent += 1;
        }
        self.slots[i] = slot;
    }

    fn refused_before_open(&mut self, why: &CloseWhy) {
        let label = why.label();
        if label.contains("status 429") {
            self.fig.conns_429 += 1;
        } else {
            bump(&mut self.fig.conns_refused, &label);
        }
    }

    fn connect(&mut self, io: &mut Io, tag: u32) -> Option<Key> {
        self.fig.conns_started += 1;
        match io.connect(tag, Proto::Ws) {
            Ok(k) => Some(k),
            Err(e) => {
                bump(
                    &mut self.fig.conns_refused,
                    &format!("connect:{:?}", e.kind()),
                );
                None
            }
        }
    }
}

impl Handler for Abuser<'_> {
    fn on_open(&mut self, io: &mut Io, key: Key, tag: u32, _now: u64) {
        self.fig.conns_opened += 1;
        match tag {
            STORM => {
                self.storm_open.push(key);
                io.abort(key, true);
            }
            SUBSCRIBER => {
                if let Some(out) = io.out(key) {
                    for (i, t) in self.topics.iter().enumerate() {
                        proto::write_subscribe(out, self.rpc, 1 + i as u64, t);
                    }
                    self.sub_waiting = self.topics.len();
                }
            }
            t => {
                let i = t as usize - 1;
                self.slots[i].open = true;
                self.fill(io, i);
            }
        }
    }

    fn on_message(&mut self, io: &mut Io, _key: Key, tag: u32, msg: &[u8], _now: u64) {
        if tag == SUBSCRIBER {
            match self.cls.classify(msg) {
                Incoming::Delivery { .. } => self.fig.delivered += 1,
                Incoming::Result { .. } => {
                    self.sub_waiting = self.sub_waiting.saturating_sub(1);
                    if self.sub_waiting == 0 {
                        self.sub_ready = true;
                    }
                }
                _ => {}
            }
            return;
        }
        if tag == STORM {
            return;
        }
        let i = tag as usize - 1;
        if let Some(ms) = proto::rate_limited(msg) {
            self.fig.refused += 1;
            self.fig.retry_max_ms = self.fig.retry_max_ms.max(ms);
        } else {
            match self.cls.classify(msg) {
                Incoming::Result { .. } => self.fig.accepted += 1,
                Incoming::Error { code, .. } => bump(
                    &mut self.fig.other_errors,
                    &code.map_or("none".into(), |c| c.to_string()),
                ),
                _ => return,
            }
        }
        self.slots[i].inflight = self.slots[i].inflight.saturating_sub(1);
        self.fill(io, i);
    }

    fn on_closed(&mut self, _io: &mut Io, key: Key, tag: u32, why: &CloseWhy, _now: u64) {
        match tag {
            STORM => {
                self.storm = self.storm.saturating_sub(1);
                if let Some(p) = self.storm_open.iter().position(|&k| k == key) {
                    self.storm_open.swap_remove(p);
                } else if !self.stopped {
                    self.refused_before_open(why);
                }
            }
            SUBSCRIBER => {
                self.sub_key = None;
                if !self.stopped {
                    bump(
                        &mut self.fig.closes_other,
                        &format!("subscriber:{}", why.label()),
                    );
                }
            }
            t => {
                let i = t as usize - 1;
                let was_open = self.slots[i].open;
                self.slots[i] = Slot {
                    seq: self.slots[i].seq,
                    ..Slot::default()
                };
                if self.stopped {
                    return;
                }
                match (was_open, why) {
                    (true, CloseWhy::ServerClose(1013)) => self.fig.closes_1013 += 1,
                    (true, w) => bump(&mut self.fig.closes_other, &w.label()),
                    (false, w) => self.refused_before_open(w),
                }
            }
        }
    }

    fn tick(&mut self, io: &mut Io, now: u64) -> Option<u64> {
        self.now = now;
        if now >= self.t_end {
            if !self.stopped {
                self.stopped = true;
                let keys: Vec<Key> = self
                    .slots
                    .iter()
                    .filter_map(|s| s.key)
                    .chain(self.sub_key)
                    .chain(self.storm_open.iter().copied())
                    .collect();
                for k in keys {
                    io.abort(k, true);
                }
            }
            return None;
        }
        let mut waiting = false;
        match self.kind {
            AbuseKind::Connect => {
                while self.storm < self.o.storm_concurrency {
                    if self.connect(io, STORM).is_none() {
                        waiting = true;
                        break;
                    }
                    self.storm += 1;
                }
            }
            AbuseKind::Publish if !self.sub_started => {
                self.sub_started = true;
                self.sub_key = self.connect(io, SUBSCRIBER);
            }
            AbuseKind::Publish | AbuseKind::Subscribe => {
                if self.kind == AbuseKind::Subscribe || self.sub_ready {
                    for i in 0..self.slots.len() {
                        if self.slots[i].key.is_none() {
                            let k = self.connect(io, 1 + i as u32);
                            self.slots[i].key = k;
                            waiting |= k.is_none();
                        }
                    }
                }
            }
        }
        // Retry failed connects soon (a poll without sleeping); else wake at the end.
        Some(if waiting { now + 1_000_000 } else { self.t_end })
    }

    fn done(&self) -> bool {
        self.stopped
    }
}

/// The abuser's thread: waits for the honest measurement's time zero, then abuses until the
/// end of the measured window.
fn abuser(
    ctx: &Ctx,
    o: &AbuseOpts,
    kind: AbuseKind,
    stop: &AtomicBool,
) -> Result<AbuserFig, RunError> {
    if let Some(cpu) = o.abuser_cpu {
        if let Err(e) = crate::sys::pin_current_thread(cpu) {
            eprintln!("loadtest: could not pin the abuser thread to CPU {cpu}: {e}");
        }
    }
    let slice = o.abuser_slice.as_nanos() as u64;
    if o.abuser_nice != 0 || slice > 0 {
        if let Err(e) = crate::sys::nice_current_thread(o.abuser_nice, slice) {
            eprintln!("loadtest: could not renice the abuser thread: {e}");
        }
    }
    let t0 = loop {
        let t = ctx.start_ns.load(Ordering::SeqCst);
        if t != 0 && !ctx.setup_failed.load(Ordering::SeqCst) {
            break t;
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(AbuserFig::default());
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let t_end = t0 + (ctx.common.warmup + ctx.common.duration).as_nanos() as u64;
    let mut io = ctx.io(0)?;
    io.set_source(IpAddr::V4(o.abuser_ip));
    io.set_rst_always();
    let rpc = o.protocol.rpc();
    let n = o.abuser_conns;
    let topics: Vec<String> = (0..n)
        .map(|i| proto::topic(ctx.nonce, 0xab00, i as u64))
        .collect();
    let templates = topics
        .iter()
        .map(|t| PublishTemplate::new(rpc, t, o.size, o.ttl))
        .collect();
    let mut h = Abuser {
        kind,
        o,
        rpc,
        nonce: ctx.nonce,
        cls: Classifier::new(rpc),
        t_end,
        now: 0,
        stopped: false,
        sub_key: None,
        sub_started: false,
        sub_waiting: 0,
        sub_ready: false,
        topics,
        templates,
        slots: vec![Slot::default(); n],
        storm: 0,
        storm_open: Vec::new(),
        next_topic: 0,
        fig: AbuserFig::default(),
    };
    net::run(&mut io, &mut h, t_end + 100_000_000)?;
    Ok(h.fig)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kind: &'static str, round: usize, with: bool, p99: u64) -> PhaseFig {
        PhaseFig {
            kind,
            round,
            with,
            deliveries: 10_000,
            p50: 100,
            p99,
            load1: 1.5,
            server_cpu: 0.25,
            abuser: AbuserFig {
                sent: 5000,
                accepted: 1000,
                refused: 4000,
                closes_1013: 3,
                conns_started: 7,
                conns_429: 2,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn table_sets_with_beside_without() {
        let t = side_by_side(&[
            row("publish", 0, false, 400),
            row("publish", 0, true, 500),
            // Round 2 runs "with" first; the ratio still finds its own round's baseline.
            row("publish", 1, true, 300),
            row("publish", 1, false, 600),
            row("connect", 0, true, 100),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 6, "{t}");
        assert!(lines[0].starts_with("abuser"));
        let cols = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        let without = cols(lines[1]);
        assert_eq!(
            &without[..9],
            ["publish", "1", "without", "10000", "0", "0", "100", "400", "-"]
        );
        assert_eq!(without[10], "-"); // no abuser figures without the abuser
        let with = cols(lines[2]);
        assert_eq!(
            &with[7..19],
            ["500", "1.25", "0", "5000", "1000", "4000", "3", "7", "2", "0", "1.50", "0.25"]
        );
        assert_eq!(cols(lines[3])[8], "0.50");
        assert_eq!(cols(lines[5])[8], "?"); // no baseline
    }
}
