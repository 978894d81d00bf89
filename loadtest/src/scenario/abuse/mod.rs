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

use std::sync::atomic::{AtomicBool, Ordering};

use crate::cli::{AbuseKind, AbuseOpts, RelayProtocol, Target};
use crate::stats::{Lat, Report};

use super::topics::{self, Load, Shape};
use super::{Ctx, RunError};

/// Honest addresses when `--source-ips` is 0.
const DEFAULT_HONEST_IPS: u32 = 100;

mod abuser;

use abuser::abuser;
pub use abuser::AbuserFig;

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
    /// Honest publish->delivery latencies of the phase (for the pooled summary).
    pub delivery: Lat,
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
    if matches!(o.protocol, RelayProtocol::V1 | RelayProtocol::Sdk) {
        return Err(RunError::Options(
            "--protocol is waku or irn (sdk is for pairs and idle)".into(),
        ));
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
    let mut table = side_by_side(&rows);
    table.push_str(&pooled(&rows));
    Ok((reports, table))
}

/// Per abuser kind, over all rounds: the honest p99 of all "without" phases pooled, of all
/// "with" phases pooled, their ratio, and the median of the rounds' own ratios. Host noise
/// on a shared machine comes in bursts that hit one phase and not its neighbour; pooling and
/// the median keep one such burst from deciding the figure.
pub fn pooled(rows: &[PhaseFig]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let mut kinds: Vec<&str> = Vec::new();
    for r in rows {
        if !kinds.contains(&r.kind) {
            kinds.push(r.kind);
        }
    }
    let _ = writeln!(
        s,
        "{:<9} {:>6} {:>12} {:>12} {:>8} {:>14} {:>6}",
        "pooled", "rounds", "p99_without", "p99_with", "p99x", "median_round_x", "lost"
    );
    for kind in kinds {
        let (mut without, mut with) = (Lat::new(), Lat::new());
        let mut ratios = Vec::new();
        let mut lost = 0;
        let mut rounds = 0;
        for r in rows.iter().filter(|r| r.kind == kind) {
            lost += r.lost + r.unacked + r.honest_errors;
            if r.with {
                with.merge(&r.delivery);
                rounds += 1;
                if let Some(b) = rows
                    .iter()
                    .find(|b| !b.with && b.kind == kind && b.round == r.round && b.p99 > 0)
                {
                    ratios.push(r.p99 as f64 / b.p99 as f64);
                }
            } else {
                without.merge(&r.delivery);
            }
        }
        ratios.sort_by(f64::total_cmp);
        let median = match ratios.len() {
            0 => "?".to_string(),
            n if n % 2 == 1 => format!("{:.2}", ratios[n / 2]),
            n => format!("{:.2}", (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0),
        };
        let (a, b) = (without.summary().p99, with.summary().p99);
        let x = if a > 0 {
            format!("{:.2}", b as f64 / a as f64)
        } else {
            "?".into()
        };
        let _ = writeln!(
            s,
            "{kind:<9} {rounds:>6} {a:>12} {b:>12} {x:>8} {median:>14} {lost:>6}"
        );
    }
    s
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
        sdk: false,
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
        delivery: st.delivery.clone(),
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

#[cfg(test)]
mod tests;
