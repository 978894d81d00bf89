//! One thread's side of `pairs` and `fanout`: its connections' handler (subscribe, then
//! publish on the schedule or in a closed loop, count deliveries and answers), and `run`,
//! which starts one per thread.

use crate::cli::Common;
use crate::net::{self, CloseWhy, Handler, Io, Key, Proto};
use crate::proto::{self, Classifier, Incoming, PublishTemplate, ResultValue, Stamp, SUB_ID};

use super::super::{bump, Connector, Ctx, MsgStats, RunError, Schedule, Sender, WindowMark};
use super::{pairing_topic_name, topic_name, Load, Shape, ThreadOut};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Setup,
    Measure,
}

impl Load {
    /// Whether global connection `g` sends on the schedule (or starts the closed loop): in
    /// the SDK's shape only the dApps do, the wallets answer.
    fn scheduled(&self, shape: &Shape, g: usize) -> bool {
        shape.publishes(g) && !(self.sdk && g % 2 == 1)
    }
}

struct TopicsHandler<'a> {
    shape: Shape,
    load: &'a Load,
    /// The subscribe's id, the result that answers it, the publishes' id base
    /// ([`proto::subscribe_reply`]).
    reply: (u64, ResultValue, u64),
    /// Global index of local connection 0.
    base: usize,
    keys: Vec<Option<Key>>,
    ready: Vec<bool>,
    n_ready: usize,
    n_failed: usize,
    connector: Connector,
    topics: Vec<String>,
    /// SDK shape: each local topic's pairing topic (empty otherwise).
    pairing: Vec<String>,
    templates: Vec<PublishTemplate>,
    /// SDK shape: the wallet's answer (tag 1109) per local topic (empty otherwise).
    answers: Vec<PublishTemplate>,
    /// Local publishing connections, in schedule order.
    publishers: Vec<usize>,
    senders: Vec<Sender>,
    recv: Vec<Vec<u32>>,
    cls: Classifier,
    phase: Phase,
    t_warm: u64,
    t_end: u64,
    t_stop: u64,
    now: u64,
    schedule: Option<Schedule>,
    closed_started: bool,
    budget: u64,
    /// Window messages sent and deliveries owed to this thread (when it can know).
    owed: Option<u64>,
    got: u64,
    window_acked: u64,
    /// Byte counters as the window opened and closed.
    mark: WindowMark,
    stats: MsgStats,
    setup_errors: crate::stats::Counts,
}

impl<'a> TopicsHandler<'a> {
    /// Local connection `local` is subscribed (or needs no subscription).
    fn set_ready(&mut self, local: usize) {
        if !self.ready[local] {
            self.ready[local] = true;
            self.n_ready += 1;
            self.connector.in_progress = self.connector.in_progress.saturating_sub(1);
        }
    }

    fn local_topic(&self, local: usize) -> usize {
        self.shape.topic_index(self.base + local) - self.shape.topic_index(self.base)
    }

    /// Whether local connection `local` is a wallet answering in the SDK's shape.
    fn answers(&self, local: usize) -> bool {
        self.load.sdk && (self.base + local) % 2 == 1
    }

    fn publish(&mut self, io: &mut Io, local: usize, sched: u64, now: u64) {
        // An answer is owed to a request already counted: --count bounds the requests.
        let answer = self.answers(local);
        if self.budget == 0 && sched >= self.t_warm && !answer {
            return;
        }
        let in_window = sched >= self.t_warm && sched < self.t_end;
        let Some(key) = self.keys[local] else {
            self.stats.send_refused += 1;
            return;
        };
        let tmpl = match answer {
            true => &self.answers[self.local_topic(local)],
            false => &self.templates[self.local_topic(local)],
        };
        let Some(out) = io.out(key) else {
            self.stats.send_refused += 1;
            return;
        };
        let sender = &mut self.senders[local];
        let seq = sender.next(sched, in_window, sched >= self.t_end);
        if self.load.v1 {
            // No answer comes: the pub is as acknowledged as it will ever be.
            sender.pending.clear();
            sender.acked.set(seq);
        }
        tmpl.write(
            out,
            seq as u64,
            &Stamp {
                sched_ns: sched,
                sender: (self.base + local) as u32,
                seq,
            },
        );
        if in_window {
            self.stats.sent += 1;
            match answer {
                true => self.stats.answers_sent += 1,
                false => self.budget = self.budget.saturating_sub(1),
            }
            if let Some(o) = self.owed.as_mut() {
                *o += self.shape.expected() as u64;
            }
            if self.load.rate > 0 {
                self.stats.send_lag.record(now.saturating_sub(sched), now);
            }
        }
    }

    fn on_delivery(
        &mut self,
        io: &mut Io,
        local: usize,
        rpc_id: Option<&[u8]>,
        stamp: Option<Stamp>,
        now: u64,
    ) {
        if self.load.ack {
            if let (Some(id), Some(key)) = (rpc_id, self.keys[local]) {
                if let Some(out) = io.out(key) {
                    proto::write_ack(out, id);
                }
            }
        }
        let Some(st) = stamp else {
            self.stats.anomaly("delivery_without_stamp");
            return;
        };
        let me = self.base + local;
        let from = st.sender as usize;
        if from == me {
            self.stats.anomaly("echo_to_publisher");
            return;
        }
        if from >= self.recv.len() || !self.shape.publishes(from) {
            self.stats.anomaly("delivery_from_unknown_sender");
            return;
        }
        if self.shape.topic_index(from) != self.shape.topic_index(me) {
            self.stats.anomaly("delivery_to_wrong_topic");
            return;
        }
        let counts = &mut self.recv[from];
        let seq = st.seq as usize;
        if seq >= counts.len() {
            counts.resize((seq + 1).max(counts.len() * 2), 0);
        }
        counts[seq] += 1;
        if counts[seq] > self.shape.expected() {
            self.stats.anomaly("duplicate_delivery");
            return;
        }
        if now >= self.t_warm && now < self.t_end {
            self.stats.delivered_in_window += 1;
        }
        if st.sched_ns >= self.t_warm && st.sched_ns < self.t_end {
            self.stats
                .delivery
                .record(now.saturating_sub(st.sched_ns), now);
            self.got += 1;
        }
        // The SDK's wallet answers every request at once, in open loop as in closed.
        if self.phase == Phase::Measure && self.answers(local) && now < self.t_end {
            self.publish(io, local, now, now);
            return;
        }
        // Closed loop, pairs: the receiver answers (SDK: the dApp's next request).
        if self.phase == Phase::Measure && self.schedule.is_none() && now < self.t_end {
            match self.shape {
                Shape::Pairs { .. } => self.publish(io, local, now, now),
                // v1 has no acks: the next pub follows the first subscriber's delivery
                // (connection 1, on thread 0 with the publisher).
                Shape::Fanout { .. } if self.load.v1 && me == 1 && self.base == 0 => {
                    self.publish(io, 0, now, now)
                }
                Shape::Fanout { .. } => {}
            }
        }
    }

    fn on_result(
        &mut self,
        io: &mut Io,
        local: usize,
        id: Option<u64>,
        value: ResultValue,
        now: u64,
    ) {
        let (sub_id, sub_value, id_base) = self.reply;
        match id {
            Some(n) if n == sub_id => {
                if value == sub_value && !self.ready[local] {
                    self.set_ready(local);
                } else {
                    self.stats.anomaly("subscribe_result_not_a_string");
                }
            }
            Some(n) if n >= id_base => {
                if value != ResultValue::True {
                    self.stats.anomaly("publish_result_not_true");
                }
                match self.senders[local].answer(n - id_base) {
                    Some((p, in_order)) => {
                        if !in_order {
                            self.stats.anomaly("ack_out_of_order");
                        }
                        self.senders[local].acked.set(p.seq);
                        if p.in_window {
                            self.stats.ack.record(now.saturating_sub(p.sched_ns), now);
                            self.window_acked += 1;
                        }
                        if now >= self.t_warm && now < self.t_end {
                            self.stats.acked_in_window += 1;
                        }
                        // Closed loop, fanout: the next publish follows the ack.
                        if self.phase == Phase::Measure
                            && self.schedule.is_none()
                            && matches!(self.shape, Shape::Fanout { .. })
                            && now < self.t_end
                        {
                            self.publish(io, local, now, now);
                        }
                    }
                    None => self.stats.anomaly("ack_for_unknown_id"),
                }
            }
            _ => self.stats.anomaly("result_for_unknown_id"),
        }
    }
}

impl Handler for TopicsHandler<'_> {
    fn on_open(&mut self, io: &mut Io, key: Key, tag: u32, _now: u64) {
        let local = tag as usize;
        if self.shape.subscribes(self.base + local) {
            let topic = &self.topics[self.local_topic(local)];
            if let Some(out) = io.out(key) {
                if self.load.sdk {
                    // What the SDK holds after pairing: the pairing and the session topic.
                    let both = [self.pairing[self.local_topic(local)].clone(), topic.clone()];
                    proto::write_sdk_batch_subscribe(out, &both);
                } else if self.load.v1 {
                    proto::write_v1_sub(out, topic);
                } else {
                    proto::write_subscribe(out, self.load.rpc, SUB_ID, topic);
                }
            }
        } else {
            self.set_ready(local);
        }
    }

    fn on_pong(&mut self, _io: &mut Io, _key: Key, tag: u32, _now: u64) {
        // v1: the pong of the ping sent behind the `sub` says the `sub` was processed.
        let local = tag as usize;
        if self.load.v1 && self.phase == Phase::Setup {
            self.set_ready(local);
        }
    }

    fn on_message(&mut self, io: &mut Io, _key: Key, tag: u32, msg: &[u8], now: u64) {
        let local = tag as usize;
        match self.cls.classify(msg) {
            Incoming::Delivery { rpc_id, stamp } => self.on_delivery(io, local, rpc_id, stamp, now),
            Incoming::Result { id, value } => self.on_result(io, local, id, value, now),
            Incoming::Error { id, code } => {
                bump(
                    &mut self.stats.errors,
                    &code.map_or("none".into(), |c| c.to_string()),
                );
                let (sub_id, _, id_base) = self.reply;
                match id {
                    Some(n) if n == sub_id && self.phase == Phase::Setup && !self.ready[local] => {
                        bump(&mut self.setup_errors, "subscribe_error");
                        self.n_failed += 1;
                        self.connector.in_progress = self.connector.in_progress.saturating_sub(1);
                    }
                    Some(n) if n >= id_base => {
                        let _ = self.senders[local].answer(n - id_base);
                    }
                    _ => {}
                }
            }
            Incoming::Other => self.stats.anomaly("unrecognised_message"),
        }
    }

    fn on_closed(&mut self, _io: &mut Io, _key: Key, tag: u32, why: &CloseWhy, _now: u64) {
        let local = tag as usize;
        self.keys[local] = None;
        match self.phase {
            Phase::Setup => {
                bump(&mut self.setup_errors, &why.label());
                if !self.ready[local] {
                    self.n_failed += 1;
                    self.connector.in_progress = self.connector.in_progress.saturating_sub(1);
                }
            }
            Phase::Measure => bump(&mut self.stats.closes, &why.label()),
        }
    }

    fn tick(&mut self, io: &mut Io, now: u64) -> Option<u64> {
        self.now = now;
        if self.phase == Phase::Measure {
            self.mark.observe(&io.stats, now, self.t_warm, self.t_end);
        }
        match self.phase {
            Phase::Setup => {
                let keys = &mut self.keys;
                self.n_failed += self.connector.pump(io, Proto::Ws, |tag, key| {
                    keys[tag as usize] = Some(key);
                });
                None
            }
            Phase::Measure => {
                if let Some(mut s) = self.schedule.take() {
                    while now < self.t_end {
                        let Some((i, at)) = s.take_due(now) else {
                            break;
                        };
                        if at >= self.t_end {
                            break;
                        }
                        let local = self.publishers[(i % self.publishers.len() as u64) as usize];
                        self.publish(io, local, at, now);
                    }
                    let next = s.at(s.next);
                    self.schedule = Some(s);
                    Some(if now < self.t_end { next } else { self.t_stop })
                } else {
                    if !self.closed_started {
                        self.closed_started = true;
                        let w = self.load.inflight.max(1);
                        match self.shape {
                            Shape::Pairs { .. } => {
                                // Both sides start half the window; in the SDK's shape the
                                // dApp sends every request.
                                let sides = if self.load.sdk { 1 } else { 2 };
                                for pair in 0..self.keys.len() / 2 {
                                    for k in 0..w {
                                        self.publish(io, 2 * pair + k % sides, now, now);
                                    }
                                }
                            }
                            Shape::Fanout { .. } => {
                                for &p in &self.publishers.clone() {
                                    for _ in 0..w {
                                        self.publish(io, p, now, now);
                                    }
                                }
                            }
                        }
                    }
                    Some(self.t_end.max(now + 1_000_000).min(self.t_stop))
                }
            }
        }
    }

    fn done(&self) -> bool {
        match self.phase {
            Phase::Setup => self.n_ready + self.n_failed >= self.keys.len(),
            Phase::Measure => {
                if self.now >= self.t_stop {
                    return true;
                }
                if self.now < self.t_end {
                    return false;
                }
                let acked = self.senders.iter().all(|s| s.pending.is_empty());
                match self.owed {
                    Some(o) => acked && self.got >= o,
                    None => false,
                }
            }
        }
    }
}

/// Run `shape` under `load` on every thread; returns each thread's figures.
pub fn run(
    ctx: &Ctx,
    common: &Common,
    shape: Shape,
    load: &Load,
) -> Result<Vec<ThreadOut>, RunError> {
    let threads = common.threads.max(1);
    let total_publishers: usize = (0..shape.conns())
        .filter(|&g| load.scheduled(&shape, g))
        .count();
    if total_publishers == 0 {
        return Err(RunError::Options("no publishers".into()));
    }
    ctx.run_threads(|t| {
        let range = shape.range(threads, t);
        let n = range.len();
        let mut io = ctx.io(t)?;
        let first_topic = shape.topic_index(range.start);
        let n_topics = if n == 0 {
            0
        } else {
            shape.topic_index(range.end - 1) - first_topic + 1
        };
        let topics: Vec<String> = (0..n_topics)
            .map(|i| topic_name(ctx, first_topic + i))
            .collect();
        let templates = topics
            .iter()
            .map(|tp| match (load.v1, load.sdk) {
                (true, _) => PublishTemplate::new_v1(tp, load.size),
                (false, true) => PublishTemplate::new_sdk(tp, load.size, load.ttl, false),
                (false, false) => PublishTemplate::new(load.rpc, tp, load.size, load.ttl),
            })
            .collect();
        let (pairing, answers) = match load.sdk {
            true => (
                (0..n_topics)
                    .map(|i| pairing_topic_name(ctx, first_topic + i))
                    .collect(),
                topics
                    .iter()
                    .map(|tp| PublishTemplate::new_sdk(tp, load.size, load.ttl, true))
                    .collect(),
            ),
            false => (Vec::new(), Vec::new()),
        };
        let publishers: Vec<usize> = (0..n)
            .filter(|&l| load.scheduled(&shape, range.start + l))
            .collect();
        let queries = ctx.auth_queries(n)?;
        let owed_known = matches!(shape, Shape::Pairs { .. }) || threads == 1;
        let mut h = TopicsHandler {
            shape,
            load,
            reply: proto::subscribe_reply(load.sdk),
            base: range.start,
            keys: vec![None; n],
            ready: vec![false; n],
            n_ready: 0,
            n_failed: 0,
            connector: Connector::new(n, common.connect_concurrency).with_queries(queries),
            topics,
            pairing,
            templates,
            answers,
            senders: (0..n).map(|_| Sender::default()).collect(),
            recv: vec![Vec::new(); shape.conns()],
            publishers,
            cls: Classifier::new(load.rpc),
            phase: Phase::Setup,
            t_warm: u64::MAX,
            t_end: u64::MAX,
            t_stop: u64::MAX,
            now: 0,
            schedule: None,
            closed_started: false,
            budget: u64::MAX,
            owed: owed_known.then_some(0),
            got: 0,
            window_acked: 0,
            mark: WindowMark::default(),
            stats: MsgStats::default(),
            setup_errors: Default::default(),
        };
        let setup_start = io.now_ns();
        net::run(
            &mut io,
            &mut h,
            setup_start + common.setup_timeout.as_nanos() as u64,
        )?;
        let setup_ns = io.now_ns() - setup_start;
        let ok = h.n_ready == n;
        if !ok {
            eprintln!(
                "thread {t}: {} of {n} connections ready after {:.1}s; failures: {:?} {:?}",
                h.n_ready,
                setup_ns as f64 / 1e9,
                h.setup_errors,
                h.connector.failed_now
            );
        }
        let Some(t0) = ctx.sync_setup(ok) else {
            return Err(RunError::Setup(format!(
                "not every connection could connect and subscribe (thread {t}: {}/{n} ready)",
                h.n_ready
            )));
        };
        h.phase = Phase::Measure;
        h.t_warm = t0 + common.warmup.as_nanos() as u64;
        h.t_end = h.t_warm + common.duration.as_nanos() as u64;
        h.t_stop = h.t_end + load.drain_ns;
        if load.count > 0 {
            h.budget = (load.count * h.publishers.len() as u64).div_ceil(total_publishers as u64);
        }
        if load.rate > 0 && !h.publishers.is_empty() {
            let rate = load.rate as f64 * h.publishers.len() as f64 / total_publishers as f64;
            h.schedule = Some(Schedule { t0, rate, next: 0 });
        }
        io.stats = Default::default();
        io.time_turns(h.t_warm, h.t_end);
        let until = h.t_stop;
        let sched_before = crate::sys::thread_schedstat();
        net::run(&mut io, &mut h, until)?;
        let sched = crate::sys::thread_schedstat()
            .zip(sched_before)
            .map(|(b, a)| (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)));
        let mut stats = h.stats;
        stats.bytes_in = io.stats.wire.bytes_in;
        stats.bytes_out = io.stats.wire.bytes_out;
        stats.wire = h.mark.wire(&io.stats);
        stats.loop_turn = std::mem::take(&mut io.turns);
        stats.sched = sched.unwrap_or_default();
        let senders = h
            .senders
            .into_iter()
            .enumerate()
            .filter(|(l, _)| shape.publishes(range.start + l))
            .map(|(l, s)| ((range.start + l) as u32, s))
            .collect();
        Ok(ThreadOut {
            stats,
            senders,
            recv: h.recv,
            setup_ns,
        })
    })
}
