//! The abuser's side of `abuse`: one event loop whose sockets are all bound to
//! `--abuser-ip`, flooding publishes, subscribes or connections, counting what the server
//! answers (results, -32000 refusals, 1013 closes, 429s).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::{AbuseKind, AbuseOpts};
use crate::net::{self, CloseWhy, Handler, Io, Key, Proto};
use crate::proto::{self, Classifier, Incoming, PublishTemplate, Rpc, Stamp};
use crate::stats::Counts;

use super::super::{bump, Ctx, RunError};

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
    pub(super) fn refused_other(&self) -> u64 {
        self.conns_refused.values().sum()
    }
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
pub(super) fn abuser(
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
    if o.abuser_idle {
        if let Err(e) = crate::sys::idle_current_thread() {
            eprintln!("loadtest: could not put the abuser thread under SCHED_IDLE: {e}");
        }
    } else if o.abuser_nice != 0 || slice > 0 {
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
    io.set_max_write(o.abuser_max_write);
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
