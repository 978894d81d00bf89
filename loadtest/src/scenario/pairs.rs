//! `pairs`: P topics, each with a dApp and a wallet connection, both subscribed and both
//! publishing, the way a WalletConnect session talks. Turns the engine's figures into a report.

use crate::cli::{PairsOpts, RelayProtocol, Target};
use crate::stats::Report;

use super::topics::{self, Load, Shape};
use super::{Ctx, RunError};

/// Run `pairs` and build its report.
pub fn run(target: &Target, o: &PairsOpts) -> Result<Report, RunError> {
    let pairs = match o.connections {
        Some(c) if c % 2 == 1 || c == 0 => {
            return Err(RunError::Options(
                "--connections must be even and > 0".into(),
            ))
        }
        Some(c) => c / 2,
        None => o.pairs,
    };
    if pairs == 0 {
        return Err(RunError::Options("--pairs must be > 0".into()));
    }
    if o.protocol == RelayProtocol::V1 && (o.stalled > 0 || o.ack) {
        return Err(RunError::Options(
            "--stalled and --ack are for --protocol waku or irn (v1 frames have no acknowledgements)"
                .into(),
        ));
    }
    o.protocol.check_ttl(o.ttl).map_err(RunError::Options)?;
    let shape = Shape::Pairs { pairs };
    let load = Load {
        rate: o.rate,
        inflight: o.inflight,
        size: o.size,
        ttl: o.ttl,
        drain_ns: o.drain.as_nanos() as u64,
        ack: o.ack,
        count: o.count,
        v1: o.protocol == RelayProtocol::V1,
        rpc: o.protocol.rpc(),
    };
    let ctx = Ctx::new(target, &o.common);
    let topic_names: Vec<String> = (0..pairs).map(|i| topics::topic_name(&ctx, i)).collect();
    // Held (never read) until the report is built.
    let stalled_queries = ctx.auth_queries(o.stalled)?;
    let stalled = super::stalled::open(
        target,
        &topic_names,
        o.stalled,
        o.protocol.rpc(),
        &stalled_queries,
    )?;
    let outs = topics::run(&ctx, &o.common, shape, &load)?;
    let setup_s = outs.iter().map(|t| t.setup_ns).max().unwrap_or(0) as f64 / 1e9;
    let (st, lost, _lost_msgs, unacked) = topics::merge(outs, shape);
    let secs = o.common.duration.as_secs_f64();
    let mut r = Report::new("pairs");
    r.text(
        "mode",
        &if o.rate > 0 {
            "open".to_string()
        } else {
            format!("closed (inflight {} per pair)", o.inflight)
        },
    )
    .int("pairs", pairs as u64)
    .int("connections", 2 * pairs as u64)
    .int("stalled", stalled.len() as u64)
    .text("protocol", o.protocol.label())
    .text("auth", super::auth_label(&o.common))
    .int("threads", o.common.threads as u64)
    .int("target_rate", o.rate)
    .int("size", o.size.max(proto_min()) as u64)
    .int("ttl", o.ttl)
    .float("duration_s", secs, 1)
    .float("setup_s", setup_s, 2)
    .int("publishes_sent", st.sent)
    .float("publishes_acked_per_s", st.acked_in_window as f64 / secs, 0)
    .float("deliveries_per_s", st.delivered_in_window as f64 / secs, 0)
    .int("errors", st.errors.values().sum())
    .int("lost", lost)
    .int("unacked", unacked)
    .int("send_refused", st.send_refused)
    .float("mib_in_per_s", st.bytes_in as f64 / secs / 1048576.0, 1)
    .float("mib_out_per_s", st.bytes_out as f64 / secs / 1048576.0, 1);
    super::fanout::figures(
        &mut r,
        &st,
        o.rate,
        o.common.permessage_deflate,
        secs,
        lost,
        unacked,
    );
    drop(stalled);
    Ok(r)
}

fn proto_min() -> usize {
    crate::proto::STAMP_LEN
}
