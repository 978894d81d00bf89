//! `churn`: connection cycles as fast as possible, `--concurrency` at a time. One cycle:
//! connect, upgrade, subscribe to a fresh topic, publish to it, receive a message on it, close
//! (close handshake, then a RST unless `--no-rst`).
//!
//! The message received comes from a long-lived "feeder" connection per thread, which publishes
//! to the cycle's topic as soon as the subscription is confirmed (the relay never echoes a
//! publish back to its own connection).
//!
//! Connection attempts are counted apart (`connects`): refused (`ECONNREFUSED`, nothing
//! listens) and failed (anything else before the upgrade answer: reset, closed, timed out),
//! in total and per second of the run (`connect_failures_by_second`), which is what a
//! restart of the server under churn costs its clients (docs/DEPLOY.md, "Restarting a
//! node"). The feeder reconnects when the server closes it.
//!
//! With `--auth`, each cycle makes a fresh key pair and token just before it connects (the
//! signing is not in the cycle's time; the server's verifying is); `--auth-reuse` presents one
//! token, made at setup, on every connection (what the server's verified-token cache saves).

use ring::rand::SystemRandom;

use crate::cli::{ChurnOpts, RelayProtocol, Target};
use crate::jwt;
use crate::net::{self, CloseWhy, Handler, Io, Key, Proto};
use crate::proto::{self, Classifier, Incoming, PublishTemplate, ResultValue, Stamp, ID_BASE};
use crate::stats::{merge_counts, Counts, Lat, Report};

use super::{bump, split, Ctx, RunError};

const SUB_ID: u64 = 1;
const FEEDER: u32 = u32::MAX;
/// A cycle that takes longer than this is abandoned and counted as a timeout.
const CYCLE_TIMEOUT_NS: u64 = 10_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Waiting to start (after an immediate connect failure, retry at this time).
    Idle(u64),
    Connecting,
    Subscribing,
    /// Subscribed: waiting for the delivery and our publish's ack.
    Exchanging {
        delivered: bool,
        acked: bool,
    },
    Closing,
}

struct Slot {
    key: Option<Key>,
    stage: Stage,
    started: u64,
    cycle: u64,
    topic: String,
}

/// What a cycle's upgrade presents.
enum Auth {
    /// Nothing.
    Off,
    /// A fresh key pair and token per cycle, signed for this `aud`.
    Fresh(String),
    /// This upgrade query on every connection.
    Reuse(String),
}

impl Auth {
    fn label(&self) -> &'static str {
        match self {
            Auth::Off => "off",
            Auth::Fresh(_) => "jwt (fresh key pair and token per cycle, signed before its connect)",
            Auth::Reuse(_) => "jwt (one token for every connection)",
        }
    }
}

struct ChurnHandler<'a> {
    o: &'a ChurnOpts,
    rpc: proto::Rpc,
    auth: &'a Auth,
    rng: SystemRandom,
    nonce: u64,
    thread: usize,
    slots: Vec<Slot>,
    feeder: Option<Key>,
    feeder_ready: bool,
    feeder_seq: u64,
    /// When to connect the feeder again after the server closed it.
    feeder_retry: u64,
    /// The feeder's upgrade query (with `--auth`).
    feeder_query: Option<String>,
    cls: Classifier,
    measuring: bool,
    t_warm: u64,
    t_end: u64,
    budget: u64,
    last_sweep: u64,
    now: u64,
    cycles: Lat,
    upgrade: Lat,
    completed: u64,
    failures: Counts,
    errors: Counts,
    anomalies: Counts,
    connects: ConnectTally,
}

/// The cycles' connection attempts (from the end of the warm-up on).
#[derive(Default)]
struct ConnectTally {
    /// Attempted.
    attempts: u64,
    /// Refused (`ECONNREFUSED`).
    refused: u64,
    /// Failed otherwise before the upgrade answer.
    failed: u64,
    /// Refused and failed by second of the run: `0007s:refused`.
    by_second: Counts,
}

/// What became of a connection attempt that did not upgrade.
#[derive(Clone, Copy)]
enum Unconnected {
    Refused,
    Failed,
}

impl ChurnHandler<'_> {
    /// Counts a connection attempt that did not reach the upgrade.
    fn unconnected(&mut self, how: Unconnected, now: u64) {
        if now < self.t_warm {
            return;
        }
        let label = match how {
            Unconnected::Refused => {
                self.connects.refused += 1;
                "refused"
            }
            Unconnected::Failed => {
                self.connects.failed += 1;
                "failed"
            }
        };
        let sec = (now - self.t_warm) / 1_000_000_000;
        bump(&mut self.connects.by_second, &format!("{sec:04}s:{label}"));
    }

    /// Connects the feeder again (the server closed it), at most every 100 ms.
    fn reconnect_feeder(&mut self, io: &mut Io, now: u64) {
        if self.feeder.is_some() || now < self.feeder_retry {
            return;
        }
        self.feeder_retry = now + 100_000_000;
        if let Ok(k) = io.connect_with(FEEDER, Proto::Ws, self.feeder_query.as_deref()) {
            self.feeder = Some(k);
        }
    }

    fn start(&mut self, io: &mut Io, slot: usize, now: u64) {
        if now >= self.t_end || self.budget == 0 {
            self.slots[slot].stage = Stage::Idle(u64::MAX);
            return;
        }
        let fresh;
        let query = match self.auth {
            Auth::Off => None,
            Auth::Reuse(q) => Some(q.as_str()),
            Auth::Fresh(aud) => match jwt::fresh_query(&self.rng, aud) {
                Ok(q) => {
                    fresh = q;
                    Some(fresh.as_str())
                }
                Err(e) => {
                    self.slots[slot].stage = Stage::Idle(now + 1_000_000);
                    bump(&mut self.failures, &e.to_string());
                    return;
                }
            },
        };
        let s = &mut self.slots[slot];
        s.cycle += 1;
        s.topic = proto::topic(
            self.nonce,
            0xc4 << 56 | (self.thread as u64) << 32 | slot as u64,
            s.cycle,
        );
        // After the signing: a cycle's time is what the server makes it.
        s.started = if query.is_some() { io.now_ns() } else { now };
        if now >= self.t_warm {
            self.connects.attempts += 1;
        }
        match io.connect_with(slot as u32, Proto::Ws, query) {
            Ok(k) => {
                s.key = Some(k);
                s.stage = Stage::Connecting;
            }
            Err(e) => {
                s.stage = Stage::Idle(now + 1_000_000);
                if now >= self.t_warm {
                    bump(&mut self.failures, &format!("connect:{:?}", e.kind()));
                }
                let how = match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => Unconnected::Refused,
                    _ => Unconnected::Failed,
                };
                self.unconnected(how, now);
            }
        }
    }

    fn finish(&mut self, io: &mut Io, slot: usize, ok: Result<(), String>, now: u64) {
        let started = self.slots[slot].started;
        self.slots[slot].key = None;
        if started >= self.t_warm && started < self.t_end {
            match ok {
                Ok(()) => {
                    self.cycles.record(now - started, now);
                    self.completed += 1;
                    self.budget = self.budget.saturating_sub(1);
                }
                Err(why) => bump(&mut self.failures, &why),
            }
        }
        self.start(io, slot, now);
    }
}

impl Handler for ChurnHandler<'_> {
    fn on_open(&mut self, io: &mut Io, key: Key, tag: u32, now: u64) {
        if tag == FEEDER {
            self.feeder_ready = true;
            return;
        }
        let s = &mut self.slots[tag as usize];
        if s.started >= self.t_warm {
            self.upgrade.record(now - s.started, now);
        }
        s.stage = Stage::Subscribing;
        if let Some(out) = io.out(key) {
            proto::write_subscribe(out, self.rpc, SUB_ID, &s.topic);
        }
    }

    fn on_message(&mut self, io: &mut Io, key: Key, tag: u32, msg: &[u8], now: u64) {
        let inc = self.cls.classify(msg);
        if tag == FEEDER {
            match inc {
                Incoming::Result {
                    value: ResultValue::True,
                    ..
                } => {}
                Incoming::Error { code, .. } => {
                    bump(&mut self.errors, &format!("feeder:{}", code.unwrap_or(0)))
                }
                _ => bump(&mut self.anomalies, "feeder_unexpected_message"),
            }
            return;
        }
        let slot = tag as usize;
        let stage = self.slots[slot].stage;
        match (stage, inc) {
            (
                Stage::Subscribing,
                Incoming::Result {
                    id: Some(SUB_ID),
                    value: ResultValue::Str,
                },
            ) => {
                let tmpl = PublishTemplate::new(
                    self.rpc,
                    &self.slots[slot].topic,
                    self.o.size,
                    self.o.ttl,
                );
                if let Some(out) = io.out(key) {
                    tmpl.write(
                        out,
                        0,
                        &Stamp {
                            sched_ns: now,
                            sender: slot as u32,
                            seq: 0,
                        },
                    );
                }
                let feeder = self.feeder.filter(|_| self.feeder_ready);
                let fed = match feeder.and_then(|f| io.out(f)) {
                    Some(out) => {
                        self.feeder_seq += 1;
                        tmpl.write(
                            out,
                            self.feeder_seq,
                            &Stamp {
                                sched_ns: now,
                                sender: FEEDER,
                                seq: self.feeder_seq as u32,
                            },
                        );
                        true
                    }
                    None => false,
                };
                if fed {
                    self.slots[slot].stage = Stage::Exchanging {
                        delivered: false,
                        acked: false,
                    };
                } else {
                    io.abort(key, !self.o.no_rst);
                    self.slots[slot].stage = Stage::Closing;
                    bump(&mut self.anomalies, "feeder_gone");
                }
            }
            (Stage::Exchanging { delivered, acked }, inc) => {
                let (d, a) = match inc {
                    Incoming::Delivery {
                        stamp: Some(st), ..
                    } if st.sender == FEEDER => (true, acked),
                    Incoming::Result {
                        id: Some(ID_BASE),
                        value: ResultValue::True,
                    } => (delivered, true),
                    Incoming::Error { code, .. } => {
                        bump(&mut self.errors, &code.unwrap_or(0).to_string());
                        (delivered, true)
                    }
                    _ => {
                        bump(&mut self.anomalies, "unexpected_message");
                        (delivered, acked)
                    }
                };
                if d && a {
                    self.slots[slot].stage = Stage::Closing;
                    io.close(key, !self.o.no_rst);
                } else {
                    self.slots[slot].stage = Stage::Exchanging {
                        delivered: d,
                        acked: a,
                    };
                }
            }
            (_, Incoming::Error { code, .. }) => {
                bump(&mut self.errors, &code.unwrap_or(0).to_string())
            }
            _ => bump(&mut self.anomalies, "unexpected_message"),
        }
    }

    fn on_closed(&mut self, io: &mut Io, key: Key, tag: u32, why: &CloseWhy, now: u64) {
        if tag == FEEDER {
            self.feeder = None;
            self.feeder_ready = false;
            bump(&mut self.failures, &format!("feeder:{}", why.label()));
            return;
        }
        let slot = tag as usize;
        if self.slots[slot].key != Some(key) {
            // Abandoned by the timeout sweep, already counted.
            return;
        }
        if self.slots[slot].stage == Stage::Connecting {
            let how = match why {
                CloseWhy::ConnectFailed(std::io::ErrorKind::ConnectionRefused) => {
                    Unconnected::Refused
                }
                _ => Unconnected::Failed,
            };
            self.unconnected(how, self.slots[slot].started);
        }
        let ok = match (self.slots[slot].stage, why) {
            (Stage::Closing, CloseWhy::Normal | CloseWhy::ServerClose(1000) | CloseWhy::Eof) => {
                Ok(())
            }
            (stage, why) => Err(format!("{:?}:{}", stage_name(stage), why.label())),
        };
        if self.measuring {
            self.finish(io, slot, ok, now);
        }
    }

    fn tick(&mut self, io: &mut Io, now: u64) -> Option<u64> {
        self.now = now;
        if !self.measuring {
            return None;
        }
        if now >= self.last_sweep + 1_000_000 {
            self.last_sweep = now;
            self.reconnect_feeder(io, now);
            for slot in 0..self.slots.len() {
                match self.slots[slot].stage {
                    Stage::Idle(at) if at <= now => self.start(io, slot, now),
                    Stage::Idle(_) => {}
                    _ => {
                        if now - self.slots[slot].started > CYCLE_TIMEOUT_NS {
                            if let Some(k) = self.slots[slot].key {
                                // on_closed will not count it: mark the slot first.
                                let name = stage_name(self.slots[slot].stage);
                                if self.slots[slot].stage == Stage::Connecting {
                                    self.unconnected(Unconnected::Failed, self.slots[slot].started);
                                }
                                self.slots[slot].stage = Stage::Idle(now);
                                self.slots[slot].key = None;
                                io.abort(k, true);
                                bump(&mut self.failures, &format!("timeout:{name}"));
                            }
                        }
                    }
                }
            }
        }
        Some(now + 1_000_000)
    }

    fn done(&self) -> bool {
        if !self.measuring {
            return self.feeder_ready || self.feeder.is_none();
        }
        self.now >= self.t_end
            && self
                .slots
                .iter()
                .all(|s| matches!(s.stage, Stage::Idle(_)) && s.key.is_none())
    }
}

fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Idle(_) => "idle",
        Stage::Connecting => "connecting",
        Stage::Subscribing => "subscribing",
        Stage::Exchanging { .. } => "exchanging",
        Stage::Closing => "closing",
    }
}

struct ChurnOut {
    cycles: Lat,
    upgrade: Lat,
    completed: u64,
    failures: Counts,
    errors: Counts,
    anomalies: Counts,
    connects: ConnectTally,
}

/// Run `churn` and build its report.
pub fn run(target: &Target, o: &ChurnOpts) -> Result<Report, RunError> {
    if matches!(o.protocol, RelayProtocol::V1 | RelayProtocol::Sdk) {
        return Err(RunError::Options(
            "churn speaks --protocol waku or irn (sdk is for pairs and idle)".into(),
        ));
    }
    o.protocol.check_ttl(o.ttl).map_err(RunError::Options)?;
    let auth = if o.auth_reuse {
        let q = jwt::fresh_queries(1, &o.common.url).map_err(|e| RunError::Setup(e.to_string()))?;
        Auth::Reuse(q.into_iter().next().unwrap_or_default())
    } else if o.common.auth {
        Auth::Fresh(o.common.url.clone())
    } else {
        Auth::Off
    };
    let mut common = o.common.clone();
    if common.source_ips == 0 && target.addr.is_ipv4() {
        common.source_ips = 16;
    }
    let threads = common.threads.max(1);
    let ctx = Ctx::new(target, &common);
    let outs = ctx.run_threads(|t| {
        let r = split(o.concurrency, threads, t);
        let mut io = ctx.io(t)?;
        let mut h = ChurnHandler {
            o,
            rpc: o.protocol.rpc(),
            auth: &auth,
            rng: SystemRandom::new(),
            nonce: ctx.nonce,
            thread: t,
            slots: r
                .map(|_| Slot {
                    key: None,
                    stage: Stage::Idle(0),
                    started: 0,
                    cycle: 0,
                    topic: String::new(),
                })
                .collect(),
            feeder: None,
            feeder_ready: false,
            feeder_seq: 0,
            feeder_retry: 0,
            feeder_query: None,
            cls: Classifier::new(o.protocol.rpc()),
            measuring: false,
            t_warm: u64::MAX,
            t_end: u64::MAX,
            budget: u64::MAX,
            last_sweep: 0,
            now: 0,
            cycles: Lat::new(),
            upgrade: Lat::new(),
            completed: 0,
            failures: Counts::new(),
            errors: Counts::new(),
            anomalies: Counts::new(),
            connects: ConnectTally::default(),
        };
        let feeder_query = match &auth {
            Auth::Off => None,
            Auth::Reuse(q) => Some(q.clone()),
            Auth::Fresh(aud) => {
                Some(jwt::fresh_query(&h.rng, aud).map_err(|e| RunError::Setup(e.to_string()))?)
            }
        };
        h.feeder = Some(io.connect_with(FEEDER, Proto::Ws, feeder_query.as_deref())?);
        h.feeder_query = feeder_query;
        let start = io.now_ns();
        net::run(
            &mut io,
            &mut h,
            start + common.setup_timeout.as_nanos() as u64,
        )?;
        let Some(t0) = ctx.sync_setup(h.feeder_ready) else {
            return Err(RunError::Setup(
                "the feeder connection could not upgrade".into(),
            ));
        };
        h.measuring = true;
        h.t_warm = t0 + common.warmup.as_nanos() as u64;
        h.t_end = h.t_warm + common.duration.as_nanos() as u64;
        if o.count > 0 {
            h.budget = (o.count as usize).div_ceil(threads) as u64;
        }
        // Slots start on the first tick (Idle(0)); give late cycles a grace period to end.
        let until = h.t_end + CYCLE_TIMEOUT_NS;
        net::run(&mut io, &mut h, until)?;
        Ok(ChurnOut {
            cycles: h.cycles,
            upgrade: h.upgrade,
            completed: h.completed,
            failures: h.failures,
            errors: h.errors,
            anomalies: h.anomalies,
            connects: h.connects,
        })
    })?;
    let mut cycles = Lat::new();
    let mut upgrade = Lat::new();
    let mut completed = 0;
    let (mut failures, mut errors, mut anomalies) = (Counts::new(), Counts::new(), Counts::new());
    let mut connects = ConnectTally::default();
    for x in &outs {
        connects.attempts += x.connects.attempts;
        connects.refused += x.connects.refused;
        connects.failed += x.connects.failed;
        merge_counts(&mut connects.by_second, &x.connects.by_second);
        cycles.merge(&x.cycles);
        upgrade.merge(&x.upgrade);
        completed += x.completed;
        merge_counts(&mut failures, &x.failures);
        merge_counts(&mut errors, &x.errors);
        merge_counts(&mut anomalies, &x.anomalies);
    }
    let secs = common.duration.as_secs_f64();
    let mut r = Report::new("churn");
    r.int("concurrency", o.concurrency as u64)
        .text("protocol", o.protocol.label())
        .text("auth", auth.label())
        .int("threads", threads as u64)
        .int("source_ips", common.source_ips as u64)
        .text(
            "close",
            if o.no_rst {
                "close handshake + FIN"
            } else {
                "close handshake + RST"
            },
        )
        .float("duration_s", secs, 1)
        .int("cycles_completed", completed)
        .float("cycles_per_s", completed as f64 / secs, 0)
        .int("cycles_failed", failures.values().sum())
        .int("connects", connects.attempts)
        .int("connects_refused", connects.refused)
        .int("connects_failed", connects.failed)
        .lat("cycle", &cycles)
        .lat("connect_to_upgraded", &upgrade)
        .counts("failures", &failures)
        .counts("error_codes", &errors)
        .counts("anomalies", &anomalies)
        .counts("connect_failures_by_second", &connects.by_second);
    Ok(r)
}
