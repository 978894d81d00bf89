//! `storm`: the reconnect storm after a restart. N connections, each (with `--auth`) with its
//! own Ed25519 key and relay-auth token, subscribe to `--topics` topics in one
//! `*_batchSubscribe` (and with `--fetch` then `*_batchFetchMessages` them), and are held until
//! the server closes them (a restart: close 1001/1012, or EOF). Each then reconnects
//! (`--reconnect now|sdk`), with a fresh token signed by the same key as the SDK does, and
//! subscribes again; the run ends when every connection is back or `--storm-timeout` passes.
//!
//! The restart is the caller's (`scripts/reconnect-storm`): `--ready-file` says when setup
//! is over, `--server-pid-file` names the new server whose CPU time is reported.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ring::rand::SystemRandom;

use crate::cli::{Reconnect, RelayProtocol, StormOpts, Target};
use crate::jwt;
use crate::net::{self, CloseWhy, Handler, Io, Key, Proto};
use crate::proto::{self, Classifier, Incoming};
use crate::stats::{merge_counts, Counts, Lat, Report};
use crate::sys;

use super::{bump, split, Ctx, RunError};

const SUB_ID: u64 = 1;
const FETCH_ID: u64 = 2;
const MS: u64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Not connected: queued to (re)connect.
    Waiting,
    Connecting,
    Subscribing,
    Fetching,
    /// Subscribed (and fetched): held.
    Held,
    /// Setup failed: not part of the storm.
    Gone,
}

fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Waiting => "waiting",
        Stage::Connecting => "connect",
        Stage::Subscribing => "subscribe",
        Stage::Fetching => "fetch",
        Stage::Held => "held",
        Stage::Gone => "gone",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Setup,
    /// Everything held: waiting for the server to close them.
    Hold,
    /// At least one was cut.
    Storm,
}

struct Slot {
    key: Option<Key>,
    stage: Stage,
    /// Failed attempts since the last success (or the cut).
    failed: u32,
    /// When the current attempt began.
    attempt_at: u64,
    /// When its close was seen (the cut); 0 before it.
    cut_at: u64,
    client: Option<jwt::Client>,
    /// Pre-signed upgrade queries of the next connects, the next one last.
    queries: Vec<String>,
    /// The first connect's query, kept for `--reuse-token`.
    first_query: Option<String>,
}

struct StormHandler<'a> {
    o: &'a StormOpts,
    rpc: proto::Rpc,
    rng: SystemRandom,
    nonce: u64,
    base: usize,
    slots: Vec<Slot>,
    /// (due time, slot) of the connects to start.
    due: BinaryHeap<Reverse<(u64, u32)>>,
    in_progress: usize,
    limit: usize,
    phase: Phase,
    cls: Classifier,
    /// The batch of topics being written (reused).
    topics: Vec<String>,
    t: Tally,
}

/// What one thread counted; merged over the threads for the report.
#[derive(Default)]
struct Tally {
    held: usize,
    gone: usize,
    cut: usize,
    back: usize,
    /// Times, ns since the epoch (0: not yet).
    first_cut: u64,
    /// The first upgrade after the cut: the new server is serving.
    first_open: u64,
    last_back: u64,
    setup_lat: Lat,
    /// The cut (its close seen) -> subscribed again.
    cut_to_back: Lat,
    /// Start of the attempt that succeeded -> subscribed again.
    attempt_to_back: Lat,
    /// Connects started since the hold began.
    attempts: u64,
    setup_failures: Counts,
    failures: Counts,
    cut_closes: Counts,
    anomalies: Counts,
}

impl Tally {
    fn merge(&mut self, o: &Tally) {
        self.held += o.held;
        self.gone += o.gone;
        self.cut += o.cut;
        self.back += o.back;
        let earliest = |a: u64, b: u64| match (a, b) {
            (0, x) | (x, 0) => x,
            (a, b) => a.min(b),
        };
        self.first_cut = earliest(self.first_cut, o.first_cut);
        self.first_open = earliest(self.first_open, o.first_open);
        self.last_back = self.last_back.max(o.last_back);
        self.setup_lat.merge(&o.setup_lat);
        self.cut_to_back.merge(&o.cut_to_back);
        self.attempt_to_back.merge(&o.attempt_to_back);
        self.attempts += o.attempts;
        merge_counts(&mut self.setup_failures, &o.setup_failures);
        merge_counts(&mut self.failures, &o.failures);
        merge_counts(&mut self.cut_closes, &o.cut_closes);
        merge_counts(&mut self.anomalies, &o.anomalies);
    }
}

impl StormHandler<'_> {
    fn topics_of(&mut self, slot: usize) {
        self.topics.clear();
        for k in 0..self.o.topics {
            self.topics.push(proto::topic(
                self.nonce,
                0x5707 << 32 | k as u64,
                (self.base + slot) as u64,
            ));
        }
    }

    fn queue(&mut self, slot: usize, at: u64) {
        self.slots[slot].stage = Stage::Waiting;
        self.due.push(Reverse((at, slot as u32)));
    }

    /// The query of the slot's next connect: pre-signed, or the first one again
    /// (`--reuse-token`), or signed now (a retry), as the SDK signs one per connect.
    fn take_query(&mut self, slot: usize) -> Result<Option<String>, String> {
        let s = &mut self.slots[slot];
        if let Some(q) = s.queries.pop() {
            return Ok(Some(q));
        }
        if self.o.reuse_token {
            return Ok(s.first_query.clone());
        }
        match &s.client {
            None => Ok(None),
            Some(c) => c
                .token(&self.rng, &self.o.common.url, jwt::now_s())
                .map(|t| Some(jwt::query(&t)))
                .map_err(|e| e.to_string()),
        }
    }

    fn start(&mut self, io: &mut Io, slot: usize, now: u64) {
        let query = match self.take_query(slot) {
            Ok(q) => q,
            Err(e) => {
                bump(&mut self.t.failures, &e);
                self.failed(slot, now);
                return;
            }
        };
        self.t.attempts += 1;
        self.slots[slot].attempt_at = now;
        match io.connect_with(slot as u32, Proto::Ws, query.as_deref()) {
            Ok(k) => {
                let s = &mut self.slots[slot];
                s.key = Some(k);
                s.stage = Stage::Connecting;
                self.in_progress += 1;
            }
            Err(e) => {
                let label = format!("connect:{:?}", e.kind());
                self.count_failure(&label);
                self.after_failure(slot, now);
            }
        }
    }

    fn count_failure(&mut self, label: &str) {
        match self.phase {
            Phase::Setup => bump(&mut self.t.setup_failures, label),
            _ => bump(&mut self.t.failures, label),
        }
    }

    /// An attempt that had started failed (its socket is already gone or going).
    fn failed(&mut self, slot: usize, now: u64) {
        self.in_progress = self.in_progress.saturating_sub(1);
        self.after_failure(slot, now);
    }

    fn after_failure(&mut self, slot: usize, now: u64) {
        self.slots[slot].key = None;
        let s = &mut self.slots[slot];
        s.failed += 1;
        let wait = match (self.phase, self.o.reconnect) {
            // Setup retries each second until `--setup-timeout` (the limits per address may
            // hold some back).
            (Phase::Setup, _) => 1000 * MS,
            (_, Reconnect::Now) => 100 * MS,
            (_, Reconnect::Sdk) => u64::from(s.failed.min(5)) * 1000 * MS,
        };
        self.queue(slot, now + wait);
    }

    fn subscribed(&mut self, slot: usize, now: u64) {
        self.in_progress = self.in_progress.saturating_sub(1);
        let s = &mut self.slots[slot];
        s.stage = Stage::Held;
        s.failed = 0;
        if self.phase == Phase::Setup {
            self.t.held += 1;
            self.t
                .setup_lat
                .record(now.saturating_sub(s.attempt_at), now);
        } else if s.cut_at > 0 {
            self.t.back += 1;
            self.t.last_back = now;
            self.t.cut_to_back.record(now.saturating_sub(s.cut_at), now);
            self.t
                .attempt_to_back
                .record(now.saturating_sub(s.attempt_at), now);
        }
    }
}

impl Handler for StormHandler<'_> {
    fn on_open(&mut self, io: &mut Io, key: Key, tag: u32, now: u64) {
        let slot = tag as usize;
        if self.phase == Phase::Storm && self.t.first_open == 0 {
            self.t.first_open = now;
        }
        self.slots[slot].stage = Stage::Subscribing;
        self.topics_of(slot);
        if let Some(out) = io.out(key) {
            proto::write_batch_subscribe(out, self.rpc, SUB_ID, &self.topics);
        }
    }

    fn on_message(&mut self, io: &mut Io, key: Key, tag: u32, msg: &[u8], now: u64) {
        let slot = tag as usize;
        let stage = self.slots[slot].stage;
        match (stage, self.cls.classify(msg)) {
            (
                Stage::Subscribing,
                Incoming::Result {
                    id: Some(SUB_ID), ..
                },
            ) => {
                if self.o.fetch {
                    self.slots[slot].stage = Stage::Fetching;
                    self.topics_of(slot);
                    if let Some(out) = io.out(key) {
                        proto::write_batch_fetch(out, self.rpc, FETCH_ID, &self.topics);
                    }
                } else {
                    self.subscribed(slot, now);
                }
            }
            (
                Stage::Fetching,
                Incoming::Result {
                    id: Some(FETCH_ID), ..
                },
            ) => self.subscribed(slot, now),
            (Stage::Subscribing | Stage::Fetching, Incoming::Error { code, .. }) => {
                // The SDK restarts its transport when a batch subscribe fails: close, reconnect.
                let what = if proto::rate_limited(msg).is_some() {
                    "rate_limited".to_string()
                } else {
                    format!("rpc_error:{}", code.unwrap_or(0))
                };
                self.count_failure(&format!("{}:{what}", stage_name(stage)));
                io.abort(key, true);
                self.in_progress = self.in_progress.saturating_sub(1);
                self.slots[slot].key = None;
                if self.phase == Phase::Setup {
                    self.queue(slot, now + 1000 * MS);
                } else {
                    self.slots[slot].failed = 0;
                    self.queue(slot, now);
                }
            }
            (Stage::Held, Incoming::Delivery { .. }) => {}
            _ => bump(&mut self.t.anomalies, "unexpected_message"),
        }
    }

    fn on_closed(&mut self, _io: &mut Io, key: Key, tag: u32, why: &CloseWhy, now: u64) {
        let slot = tag as usize;
        if self.slots[slot].key != Some(key) {
            return; // already handled (aborted by us)
        }
        self.slots[slot].key = None;
        match self.slots[slot].stage {
            Stage::Held if self.phase != Phase::Setup => {
                if self.phase == Phase::Hold {
                    self.phase = Phase::Storm;
                    self.t.first_cut = now;
                }
                bump(&mut self.t.cut_closes, &why.label());
                self.slots[slot].cut_at = now;
                self.t.cut += 1;
                let at = match self.o.reconnect {
                    Reconnect::Now => now,
                    Reconnect::Sdk => now + 100 * MS,
                };
                self.queue(slot, at);
            }
            Stage::Held => {
                // Closed during setup after it was held: it is not held any more.
                bump(&mut self.t.setup_failures, &format!("held:{}", why.label()));
                self.t.held -= 1;
                self.slots[slot].stage = Stage::Gone;
                self.t.gone += 1;
            }
            stage => {
                self.count_failure(&format!("{}:{}", stage_name(stage), why.label()));
                self.failed(slot, now);
            }
        }
    }

    fn tick(&mut self, io: &mut Io, now: u64) -> Option<u64> {
        while self.in_progress < self.limit {
            match self.due.peek() {
                Some(Reverse((at, slot))) if *at <= now => {
                    let slot = *slot as usize;
                    self.due.pop();
                    self.start(io, slot, now);
                }
                _ => break,
            }
        }
        match self.due.peek() {
            Some(Reverse((at, _))) if self.in_progress < self.limit => Some(*at),
            _ => None,
        }
    }

    fn done(&self) -> bool {
        match self.phase {
            Phase::Setup => self.t.held + self.t.gone >= self.slots.len(),
            Phase::Hold => false,
            Phase::Storm => self.t.cut >= self.t.held && self.t.back >= self.t.cut,
        }
    }
}

struct StormOut {
    t: Tally,
    setup_ns: u64,
    /// This process's CPU seconds when the hold began.
    cpu_at_hold: f64,
}

fn read_pid(path: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Run `storm` and build its report.
pub fn run(target: &Target, o: &StormOpts) -> Result<Report, RunError> {
    if matches!(o.protocol, RelayProtocol::V1 | RelayProtocol::Sdk) {
        return Err(RunError::Options(
            "storm speaks --protocol waku or irn (sdk is for pairs and idle; storm's --reconnect sdk is the SDK's reconnect)".into(),
        ));
    }
    if !(1..=500).contains(&o.topics) {
        return Err(RunError::Options("--topics is 1 to 500".into()));
    }
    if o.reuse_token && !o.common.auth {
        return Err(RunError::Options("--reuse-token needs --auth".into()));
    }
    let mut common = o.common.clone();
    if common.source_ips == 0 && target.addr.is_ipv4() {
        // Under the server's default limits per address (1,000 open, a burst of 500 new).
        common.source_ips = (o.connections.div_ceil(250) as u32).max(1);
    }
    let threads = common.threads.max(1);
    let ctx = Ctx::new(target, &common);
    let self_pid = std::process::id();
    let cpu_self = || sys::cpu_seconds(self_pid).unwrap_or(0.0);
    let outs = ctx.run_threads(|t| {
        let r = split(o.connections, threads, t);
        let n = r.len();
        let rng = SystemRandom::new();
        let mut slots = Vec::with_capacity(n);
        for _ in 0..n {
            let (client, first, next) = if common.auth {
                let c = jwt::Client::generate(&rng).map_err(|e| RunError::Setup(e.to_string()))?;
                let tok = |c: &jwt::Client| {
                    c.token(&rng, &common.url, jwt::now_s())
                        .map(|t| jwt::query(&t))
                        .map_err(|e| RunError::Setup(e.to_string()))
                };
                let first = tok(&c)?;
                let next = if o.reuse_token { None } else { Some(tok(&c)?) };
                (Some(c), Some(first), next)
            } else {
                (None, None, None)
            };
            // The reconnect's token is made now too: signing is not in the storm's time.
            let queries = match (first.clone(), next) {
                (Some(f), Some(n)) => vec![n, f],
                (Some(f), None) => vec![f],
                _ => Vec::new(),
            };
            slots.push(Slot {
                key: None,
                stage: Stage::Waiting,
                failed: 0,
                attempt_at: 0,
                cut_at: 0,
                client,
                queries,
                first_query: first,
            });
        }
        let mut io = ctx.io(t)?;
        let mut h = StormHandler {
            o,
            rpc: o.protocol.rpc(),
            rng,
            nonce: ctx.nonce,
            base: r.start,
            slots,
            due: (0..n as u32).map(|i| Reverse((0, i))).collect(),
            in_progress: 0,
            limit: common.connect_concurrency.max(1),
            phase: Phase::Setup,
            cls: Classifier::new(o.protocol.rpc()),
            t: Tally::default(),
            topics: Vec::with_capacity(o.topics),
        };
        let setup_ns = super::run_setup(&mut io, &mut h, &common)?;
        // What did not finish in time is not part of the storm.
        for s in h.slots.iter_mut() {
            if !matches!(s.stage, Stage::Held | Stage::Gone) {
                if let Some(k) = s.key.take() {
                    io.abort(k, true);
                }
                s.stage = Stage::Gone;
            }
        }
        h.due.clear();
        h.in_progress = 0;
        let _ = ctx.sync_setup(true);
        let cpu_at_hold = cpu_self();
        if t == 0 {
            if let Some(p) = &o.ready_file {
                let total = h.t.held; // this thread's; the file only signals the moment
                std::fs::write(p, format!("held {total}\n"))?;
            }
        }
        // Every reconnect goes at once: the storm is not paced by the client.
        h.limit = usize::MAX;
        h.phase = Phase::Hold;
        h.t.attempts = 0;
        let t_hold = io.now_ns();
        net::run(&mut io, &mut h, t_hold + o.cut_timeout.as_nanos() as u64)?;
        if h.phase == Phase::Storm {
            let until = h.t.first_cut + o.storm_timeout.as_nanos() as u64;
            net::run(&mut io, &mut h, until)?;
        }
        Ok(StormOut {
            t: h.t,
            setup_ns,
            cpu_at_hold,
        })
    });
    let cpu_end = cpu_self();
    let outs = outs?;
    let server_cpu = o
        .server_pid_file
        .as_deref()
        .and_then(read_pid)
        .and_then(|p| sys::cpu_seconds(p).ok());
    let client_cpu = cpu_end - outs.first().map_or(cpu_end, |x| x.cpu_at_hold);

    let mut t = Tally::default();
    let mut setup_ns = 0;
    for x in &outs {
        t.merge(&x.t);
        setup_ns = setup_ns.max(x.setup_ns);
    }
    let Tally {
        held,
        cut,
        back,
        first_cut,
        first_open,
        last_back,
        attempts,
        setup_lat,
        cut_to_back,
        attempt_to_back,
        setup_failures,
        failures,
        cut_closes,
        anomalies,
        ..
    } = t;
    // Refused with no listener: the restart's own gap, not the new server refusing.
    let no_listener: u64 = failures
        .iter()
        .filter(|(k, _)| k.contains("ConnectionRefused"))
        .map(|(_, v)| *v)
        .sum();
    let secs = |a: u64, b: u64| {
        if back > 0 && a < b {
            (b - a) as f64 / 1e9
        } else {
            0.0
        }
    };
    let mut r = Report::new("storm");
    r.int("connections_asked", o.connections as u64)
        .int("held", held as u64)
        .int("topics_per_connection", o.topics as u64)
        .text("protocol", o.protocol.label())
        .text("auth", super::auth_label(&common))
        .text(
            "reconnect",
            match o.reconnect {
                Reconnect::Now => "now (at once; 100 ms after a failure)",
                Reconnect::Sdk => "sdk (100 ms after the close; k s after failed attempt k)",
            },
        )
        .text(
            "reconnect_token",
            match (common.auth, o.reuse_token) {
                (false, _) => "none",
                (true, false) => "fresh (same key, new token)",
                (true, true) => "the first one again",
            },
        )
        .text("fetch", if o.fetch { "batchFetchMessages" } else { "off" })
        .int("threads", threads as u64)
        .int("source_ips", common.source_ips as u64)
        .float("setup_s", setup_ns as f64 / 1e9, 2)
        .int("cut", cut as u64)
        .int("back", back as u64)
        .int("not_back", cut.saturating_sub(back) as u64)
        .float("storm_s", secs(first_cut, last_back), 3)
        .float("first_open_to_all_back_s", secs(first_open, last_back), 3)
        .int("attempts", attempts)
        .int("failed_no_listener", no_listener)
        .int(
            "failed_other",
            failures.values().sum::<u64>().saturating_sub(no_listener),
        );
    match server_cpu {
        Some(s) => {
            r.float("server_cpu_ms", s * 1e3, 0);
        }
        None => {
            r.note("no --server-pid-file: server CPU not measured".into());
        }
    }
    r.float("client_cpu_ms_hold_and_storm", client_cpu * 1e3, 0)
        .lat("setup_connect_to_subscribed", &setup_lat)
        .lat("cut_to_subscribed", &cut_to_back)
        .lat("last_attempt_to_subscribed", &attempt_to_back)
        .counts("setup_failures", &setup_failures)
        .counts("cut_closes", &cut_closes)
        .counts("failures", &failures)
        .counts("anomalies", &anomalies);
    if cut == 0 {
        r.note("no connection was cut: the server was not restarted within --cut-timeout".into());
    } else if back < cut {
        r.note(format!(
            "{} of {cut} connections not subscribed again within --storm-timeout",
            cut - back
        ));
    }
    Ok(r)
}
