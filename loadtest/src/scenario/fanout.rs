//! `fanout`: one publisher, N subscribers of one topic. Turns the engine's figures into a
//! report, and holds the warnings both message scenarios print.

use crate::cli::{FanoutOpts, RelayProtocol, Target};
use crate::stats::{Lat, Report};

use super::topics::{self, Load, Shape};
use super::{Ctx, RunError};

/// Run `fanout` and build its report.
pub fn run(target: &Target, o: &FanoutOpts) -> Result<Report, RunError> {
    if o.subscribers == 0 {
        return Err(RunError::Options("--subscribers must be > 0".into()));
    }
    if o.protocol == RelayProtocol::Sdk {
        return Err(RunError::Options(
            "fanout speaks --protocol waku, irn or v1 (sdk is for pairs and idle)".into(),
        ));
    }
    o.protocol.check_ttl(o.ttl).map_err(RunError::Options)?;
    let shape = Shape::Fanout {
        subs: o.subscribers,
    };
    let load = Load {
        rate: o.rate,
        inflight: o.inflight,
        size: o.size,
        ttl: o.ttl,
        drain_ns: o.drain.as_nanos() as u64,
        ack: false,
        count: o.count,
        v1: o.protocol == RelayProtocol::V1,
        sdk: false,
        rpc: o.protocol.rpc(),
    };
    let ctx = Ctx::new(target, &o.common);
    let outs = topics::run(&ctx, &o.common, shape, &load)?;
    let setup_s = outs.iter().map(|t| t.setup_ns).max().unwrap_or(0) as f64 / 1e9;
    let (st, lost, lost_msgs, unacked) = topics::merge(outs, shape);
    let secs = o.common.duration.as_secs_f64();
    let mut r = Report::new("fanout");
    r.text(
        "mode",
        &if o.rate > 0 {
            "open".to_string()
        } else if o.protocol == RelayProtocol::V1 {
            format!(
                "closed (inflight {}, next pub on the first subscriber's delivery)",
                o.inflight
            )
        } else {
            format!("closed (inflight {} acks)", o.inflight)
        },
    )
    .int("subscribers", o.subscribers as u64)
    .text("protocol", o.protocol.label())
    .text("auth", super::auth_label(&o.common))
    .int("threads", o.common.threads as u64)
    .int("target_rate", o.rate)
    .int("size", o.size.max(crate::proto::STAMP_LEN) as u64)
    .float("duration_s", secs, 1)
    .float("setup_s", setup_s, 2)
    .int("publishes_sent", st.sent)
    .float("publishes_acked_per_s", st.acked_in_window as f64 / secs, 0)
    .float("deliveries_per_s", st.delivered_in_window as f64 / secs, 0)
    .int("errors", st.errors.values().sum())
    .int("lost", lost)
    .int("messages_with_loss", lost_msgs)
    .int("unacked", unacked)
    .int("send_refused", st.send_refused)
    .float("mib_in_per_s", st.bytes_in as f64 / secs / 1048576.0, 1);
    figures(
        &mut r,
        &st,
        o.rate,
        o.common.permessage_deflate,
        secs,
        lost,
        unacked,
    );
    Ok(r)
}

/// The figures `pairs` and `fanout` share after their own: wire bytes, latencies, error
/// and close counts, then [`notes`].
pub fn figures(
    r: &mut Report,
    st: &super::MsgStats,
    rate: u64,
    deflate: bool,
    secs: f64,
    lost: u64,
    unacked: u64,
) {
    st.wire.report(r, st.delivered_in_window, st.sent, deflate);
    r.lat("publish_delivery", &st.delivery)
        .lat("publish_ack", &st.ack);
    if rate > 0 {
        r.lat("send_lag", &st.send_lag);
    }
    r.lat("generator_loop_turn", &st.loop_turn)
        .float("generator_cpu_ms", st.sched.0 as f64 / 1e6, 1)
        .float("generator_run_delay_ms", st.sched.1 as f64 / 1e6, 1);
    r.counts("error_codes", &st.errors)
        .counts("anomalies", &st.anomalies)
        .counts("closes", &st.closes);
    notes(r, rate, st.sent, secs, &st.send_lag, lost, unacked);
}

/// Warnings that make a figure untrustworthy, printed under the table.
fn notes(r: &mut Report, rate: u64, sent: u64, secs: f64, lag: &Lat, lost: u64, unacked: u64) {
    if rate > 0 {
        let achieved = sent as f64 / secs;
        if achieved < rate as f64 * 0.97 {
            r.note(format!(
                "sent {achieved:.0}/s of the {rate}/s asked: sends were refused or the run stopped early"
            ));
        }
        let s = lag.summary();
        if s.p99 > 1000 {
            r.note(format!(
                "send lag p99 {} µs: the generator (or its core) fell behind the schedule; latencies include it",
                s.p99
            ));
        }
    }
    if lost > 0 {
        r.note(format!(
            "{lost} acked deliveries never arrived (after the drain period)"
        ));
    }
    if unacked > 0 {
        r.note(format!("{unacked} publishes were never answered"));
    }
}
