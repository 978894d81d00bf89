//! `idle`: N connections, each subscribed to its own topic, held open; reports the server's
//! resident memory per connection from `/proc/<pid>/status`.
//!
//! `--protocol sdk` holds what a 2.x SDK client holds: a JWT and the SDK's upgrade query, and
//! one `irn_batchSubscribe` of a pairing and a session topic (two subscriptions).
//!
//! Connections are spread over source addresses 127.0.0.2, ... (`--source-ips`, chosen
//! automatically when not given) so more than one ephemeral port range is available.

use crate::cli::{IdleOpts, RelayProtocol, Target};
use crate::net::{self, CloseWhy, Handler, Io, Key, Proto};
use crate::proto::{self, Classifier, Incoming, ResultValue};
use crate::stats::{merge_counts, Counts, Lat, Report};
use crate::sys;

use super::{bump, split, Connector, Ctx, RunError};

struct IdleHandler {
    rpc: proto::Rpc,
    /// The SDK's shape: a batch subscribe of two topics, a string id, an array answer.
    sdk: bool,
    /// The subscribe's id and the result that answers it ([`proto::subscribe_reply`]).
    reply: (u64, ResultValue),
    base: usize,
    nonce: u64,
    keys: Vec<Option<Key>>,
    ready: Vec<bool>,
    n_ready: usize,
    n_failed: usize,
    opened_at: Vec<u64>,
    connector: Connector,
    cls: Classifier,
    holding: bool,
    /// Connect -> subscribed, per connection.
    setup_lat: Lat,
    setup_errors: Counts,
    closes: Counts,
    anomalies: Counts,
}

impl Handler for IdleHandler {
    fn on_open(&mut self, io: &mut Io, key: Key, tag: u32, _now: u64) {
        let i = (self.base + tag as usize) as u64;
        let topic = proto::topic(self.nonce, 0x1d1e, i);
        if let Some(out) = io.out(key) {
            if self.sdk {
                let pairing = proto::topic(self.nonce, 0x1d1f, i);
                proto::write_sdk_batch_subscribe(out, &[pairing, topic]);
            } else {
                proto::write_subscribe(out, self.rpc, proto::SUB_ID, &topic);
            }
        }
    }

    fn on_message(&mut self, _io: &mut Io, _key: Key, tag: u32, msg: &[u8], now: u64) {
        let local = tag as usize;
        let (want_id, want_value) = self.reply;
        match self.cls.classify(msg) {
            Incoming::Result {
                id: Some(id),
                value,
            } if id == want_id && value == want_value && !self.ready[local] => {
                self.ready[local] = true;
                self.n_ready += 1;
                self.connector.in_progress = self.connector.in_progress.saturating_sub(1);
                self.setup_lat
                    .record(now.saturating_sub(self.opened_at[local]), now);
            }
            Incoming::Error { code, .. } if !self.ready[local] => {
                bump(&mut self.setup_errors, &format!("rpc_error:{code:?}"));
                self.n_failed += 1;
                self.connector.in_progress = self.connector.in_progress.saturating_sub(1);
            }
            _ => bump(&mut self.anomalies, "unexpected_message"),
        }
    }

    fn on_closed(&mut self, _io: &mut Io, _key: Key, tag: u32, why: &CloseWhy, _now: u64) {
        let local = tag as usize;
        self.keys[local] = None;
        if self.holding {
            bump(&mut self.closes, &why.label());
        } else {
            bump(&mut self.setup_errors, &why.label());
            if !self.ready[local] {
                self.n_failed += 1;
                self.connector.in_progress = self.connector.in_progress.saturating_sub(1);
            }
        }
    }

    fn tick(&mut self, io: &mut Io, now: u64) -> Option<u64> {
        if !self.holding {
            let (keys, opened) = (&mut self.keys, &mut self.opened_at);
            self.n_failed += self.connector.pump(io, Proto::Ws, |tag, key| {
                keys[tag as usize] = Some(key);
                opened[tag as usize] = now;
            });
        }
        None
    }

    fn done(&self) -> bool {
        !self.holding && self.n_ready + self.n_failed >= self.keys.len()
    }
}

struct IdleOut {
    ready: usize,
    alive_at_end: usize,
    setup_ns: u64,
    setup_lat: Lat,
    setup_errors: Counts,
    closes: Counts,
    anomalies: Counts,
    pings: u64,
    rss_held: Option<u64>,
}

/// Run `idle` and build its report.
pub fn run(target: &Target, o: &IdleOpts) -> Result<Report, RunError> {
    if o.protocol == RelayProtocol::V1 {
        return Err(RunError::Options(
            "idle speaks --protocol waku, irn or sdk".into(),
        ));
    }
    let mut common = super::sdk_common(&o.common, o.protocol);
    if common.source_ips == 0 && target.addr.is_ipv4() {
        // About 28k ephemeral ports per source address by default; keep well under.
        common.source_ips = (o.connections.div_ceil(20_000) as u32).max(1);
    }
    let threads = common.threads.max(1);
    let rss = |pid: Option<u32>| pid.and_then(|p| sys::vm_rss_kib(p).ok());
    if let Some(pid) = o.server_pid {
        if let Err(e) = sys::vm_rss_kib(pid) {
            return Err(RunError::Options(format!(
                "cannot read /proc/{pid}/status: {e}"
            )));
        }
    }
    let rss_before = rss(o.server_pid);
    let ctx = Ctx::new(target, &common).with_protocol(o.protocol);
    let outs = ctx.run_threads(|t| {
        let r = split(o.connections, threads, t);
        let n = r.len();
        let queries = ctx.auth_queries(n)?;
        let mut io = ctx.io(t)?;
        let mut h = IdleHandler {
            rpc: o.protocol.rpc(),
            sdk: o.protocol == RelayProtocol::Sdk,
            reply: {
                let (id, value, _) = proto::subscribe_reply(o.protocol == RelayProtocol::Sdk);
                (id, value)
            },
            base: r.start,
            nonce: ctx.nonce,
            keys: vec![None; n],
            ready: vec![false; n],
            n_ready: 0,
            n_failed: 0,
            opened_at: vec![0; n],
            connector: Connector::new(n, common.connect_concurrency).with_queries(queries),
            cls: Classifier::new(o.protocol.rpc()),
            holding: false,
            setup_lat: Lat::new(),
            setup_errors: Counts::new(),
            closes: Counts::new(),
            anomalies: Counts::new(),
        };
        let setup_ns = super::run_setup(&mut io, &mut h, &common)?;
        merge_counts(&mut h.setup_errors, &h.connector.failed_now.clone());
        // Partial setups still hold what they have: the figure per connection stays valid.
        let t0 = ctx.sync_setup(true).unwrap_or(0);
        h.holding = true;
        net::run(&mut io, &mut h, t0 + common.duration.as_nanos() as u64)?;
        ctx.barrier.wait();
        let rss_held = if t == 0 { rss(o.server_pid) } else { None };
        ctx.barrier.wait();
        let alive_at_end = h.keys.iter().filter(|k| k.is_some()).count();
        let pings = io.stats.pings;
        drop(io);
        Ok(IdleOut {
            ready: h.n_ready,
            alive_at_end,
            setup_ns,
            setup_lat: h.setup_lat,
            setup_errors: h.setup_errors,
            closes: h.closes,
            anomalies: h.anomalies,
            pings,
            rss_held,
        })
    })?;
    // Give the server a moment to free what the closed connections held.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let rss_after_close = rss(o.server_pid);

    let mut ready = 0;
    let mut alive = 0;
    let mut setup_ns = 0;
    let mut pings = 0;
    let mut setup_lat = Lat::new();
    let (mut setup_errors, mut closes, mut anomalies) =
        (Counts::new(), Counts::new(), Counts::new());
    let mut rss_held = None;
    for x in &outs {
        ready += x.ready;
        alive += x.alive_at_end;
        setup_ns = setup_ns.max(x.setup_ns);
        pings += x.pings;
        setup_lat.merge(&x.setup_lat);
        merge_counts(&mut setup_errors, &x.setup_errors);
        merge_counts(&mut closes, &x.closes);
        merge_counts(&mut anomalies, &x.anomalies);
        rss_held = rss_held.or(x.rss_held);
    }
    let mut r = Report::new("idle");
    r.int("connections_asked", o.connections as u64)
        .int("subscribed", ready as u64)
        .int("alive_at_end", alive as u64)
        .text("protocol", o.protocol.label())
        .text("auth", super::auth_label(&common))
        .int("threads", threads as u64)
        .int("source_ips", common.source_ips as u64)
        .float("setup_s", setup_ns as f64 / 1e9, 2)
        .float(
            "connects_per_s",
            ready as f64 / (setup_ns as f64 / 1e9).max(1e-9),
            0,
        )
        .float("hold_s", common.duration.as_secs_f64(), 1)
        .int("pings_answered", pings);
    if let (Some(b), Some(h)) = (rss_before, rss_held) {
        r.int("server_rss_before_kib", b)
            .int("server_rss_held_kib", h)
            .float(
                "server_rss_per_conn_bytes",
                (h as f64 - b as f64) * 1024.0 / (alive.max(1) as f64),
                0,
            );
        if let Some(a) = rss_after_close {
            r.int("server_rss_after_close_kib", a);
        }
    } else {
        r.note("no --server-pid: server RSS not measured".into());
    }
    r.lat("connect_to_subscribed", &setup_lat)
        .counts("setup_errors", &setup_errors)
        .counts("closes_while_held", &closes)
        .counts("anomalies", &anomalies);
    if ready < o.connections {
        r.note(format!(
            "only {ready} of {} connections subscribed (see setup_errors; ulimit -n of both sides?)",
            o.connections
        ));
    }
    Ok(r)
}
