//! `pairs`: P topics, each with a dApp and a wallet connection, both subscribed and both
//! publishing, the way a WalletConnect session talks. Turns the engine's figures into a report.

use crate::cli::{PairsOpts, RelayProtocol, Target};
use crate::proto;
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
    let sdk = o.protocol == RelayProtocol::Sdk;
    if sdk && o.stalled > 0 {
        return Err(RunError::Options(
            "--protocol sdk has no --stalled readers (use waku or irn)".into(),
        ));
    }
    let ttl = o.ttl.unwrap_or(if sdk { proto::SDK_TTL_S } else { 21_600 });
    o.protocol.check_ttl(ttl).map_err(RunError::Options)?;
    let shape = Shape::Pairs { pairs };
    let load = Load {
        rate: o.rate,
        inflight: o.inflight,
        size: o.size,
        ttl,
        drain_ns: o.drain.as_nanos() as u64,
        // The SDK acknowledges every push.
        ack: o.ack || sdk,
        count: o.count,
        v1: o.protocol == RelayProtocol::V1,
        sdk,
        rpc: o.protocol.rpc(),
    };
    let common = super::sdk_common(&o.common, o.protocol);
    let ctx = Ctx::new(target, &common).with_protocol(o.protocol);
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
    let outs = topics::run(&ctx, &common, shape, &load)?;
    let setup_s = outs.iter().map(|t| t.setup_ns).max().unwrap_or(0) as f64 / 1e9;
    let (st, lost, _lost_msgs, unacked) = topics::merge(outs, shape);
    let secs = o.common.duration.as_secs_f64();
    let mut r = Report::new("pairs");
    r.text(
        "mode",
        &if o.rate > 0 && sdk {
            "open (the rate is the dApps' requests; each answer follows its request)".to_string()
        } else if o.rate > 0 {
            "open".to_string()
        } else {
            format!("closed (inflight {} per pair)", o.inflight)
        },
    )
    .int("pairs", pairs as u64)
    .int("connections", 2 * pairs as u64)
    .int("stalled", stalled.len() as u64)
    .text("protocol", o.protocol.label())
    .text("auth", super::auth_label(&common))
    .int("threads", o.common.threads as u64)
    .int("target_rate", o.rate)
    .int("size", o.size.max(proto_min()) as u64)
    .int("ttl", ttl)
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
    if sdk {
        r.int("requests_sent", st.sent - st.answers_sent)
            .int("answers_sent", st.answers_sent);
    }
    drop(stalled);
    Ok(r)
}

fn proto_min() -> usize {
    crate::proto::STAMP_LEN
}
