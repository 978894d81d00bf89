//! One shard's command thread: takes commands from the shard's bounded queue, writes them to
//! Redis pipelined, reads the replies with a timeout and answers each through the event sink.
//!
//! Owns: the shard's command connection, its scripts' digests, reconnects with backoff, the
//! heartbeat (the node's liveness key, `cluster::v1`, refreshed every `heartbeat`; while idle
//! its reply is also the check that the connection is alive), the `command` half of the shard's health
//! (the commands and the context it shares with `pubsub` and `reply` are `command`'s). Must not touch the
//! subscriber connection (`pubsub`) or any worker state: it only calls the event sink.
//!
//! Failure rule: on any I/O error or timeout, every command in flight and every command
//! queued is answered `Unavailable`, the shard is marked down, and the thread reconnects
//! with exponential backoff (answering `Unavailable` at once to whatever arrives meanwhile).
//! A publish answered `Unavailable` may still have been stored (Redis ran it, the reply was
//! lost); it is never the other way round.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};
use redis::Value;

use super::addr::Endpoint;
use super::command::{set_health, Command, ShardCtx};
use super::link::{Link, LinkError};
use super::pack;
use super::primary;
use super::reply::{answer_slot, unavailable, Slot};
use super::resp::int;
use super::script::{self, Shas};
use super::setup::{connect, Conn};

/// Starts the command thread on an established connection. It ends when `stop` is closed.
pub(crate) fn spawn(
    ctx: ShardCtx,
    conn: Conn,
    rx: Receiver<Command>,
    stop: Receiver<()>,
) -> std::io::Result<JoinHandle<()>> {
    ctx.stats.command_up.set(1);
    let name = format!("redis-cmd-{}", ctx.idx);
    let ctx_heartbeat = ctx.cfg.heartbeat;
    let mut runner = Runner {
        ctx,
        conn: None,
        shas: Shas::default(),
        at: None,
        wait: 0,
        replid: Vec::new(),
        checked_at: Instant::now(),
        rx,
        stop,
        buf: Vec::new(),
        batch: Vec::new(),
        slots: Vec::new(),
        inflight: VecDeque::new(),
        retry: Vec::new(),
        replies: Vec::new(),
        // The first round refreshes the node's liveness key: a client id's socket counted
        // by this node's first ops counts on the other nodes at once (`clients.lua`).
        alive_at: Instant::now()
            .checked_sub(ctx_heartbeat)
            .unwrap_or_else(Instant::now),
    };
    runner.install(conn);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || runner.run())
}

struct Runner {
    ctx: ShardCtx,
    /// `None` while down.
    conn: Option<Link>,
    shas: Shas,
    /// Where the primary was last found (a new address on a reconnect is a failover).
    at: Option<Endpoint>,
    /// Replicas each round's writes wait for (`WAIT`; 0: none).
    wait: u32,
    /// The primary's replication id, handed to the publish script.
    replid: Vec<u8>,
    /// When the Sentinels were last asked whether the primary moved (after a short `WAIT`).
    checked_at: Instant,
    rx: Receiver<Command>,
    /// Closed at shutdown.
    stop: Receiver<()>,
    /// The packed pipeline of the current round (reused).
    buf: Vec<u8>,
    /// Commands taken from the queue for the next round, in order.
    batch: Vec<Command>,
    /// The script calls of the round being packed (one reply each).
    slots: Vec<Slot>,
    /// Rounds written and not yet read, oldest first (at most [`DEPTH`]).
    inflight: VecDeque<Round>,
    /// Commands that met NOSCRIPT, run again after the scripts are reloaded.
    retry: Vec<Command>,
    /// The replies of the round being read, held until its `WAIT` answers (reused).
    replies: Vec<(Slot, Value)>,
    /// When the node's liveness key was last refreshed (queued).
    alive_at: Instant,
}

/// Rounds written ahead of the replies: while Redis works through one, the next is already
/// in its socket buffer, so it never waits for this thread between rounds.
const DEPTH: usize = 2;

/// A written batch whose replies are not read yet.
struct Round {
    cmds: Vec<Command>,
    slots: Vec<Slot>,
    t0: Instant,
    /// Already a retry after NOSCRIPT (a second NOSCRIPT answers unavailable).
    retried: bool,
    /// A `WAIT` follows the round's replies.
    waits: bool,
}

/// Whether a round's writes may be answered "stored": confirmed by its `WAIT` (or none
/// asked) on a server still the primary, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    Confirmed,
    Unconfirmed,
}

fn not_connected() -> LinkError {
    LinkError::Io(std::io::Error::from(std::io::ErrorKind::NotConnected))
}

/// Whether a command writes (its answer then waits for `WAIT`).
pub(crate) fn writes(c: &Command) -> bool {
    !matches!(
        c,
        Command::Read { .. } | Command::Alive | Command::Role | Command::AliveIn(_) | Command::Ring
    )
}

/// Whether a command's answer says it was stored (and so must not come before `WAIT`
/// confirmed it): publishes and webhook registrations.
pub(crate) fn acknowledged(c: &Command) -> bool {
    matches!(c, Command::Publish { .. } | Command::WebhookAdd { .. })
}

/// Whether a thread should go on.
enum Flow {
    Go,
    Stop,
}

impl Runner {
    /// Takes a new connection: counts a failover when the primary moved.
    fn install(&mut self, c: Conn) {
        if let Some(old) = &self.at {
            if *old != c.at {
                self.ctx.stats.failovers.inc();
                log::warn!(shard = self.ctx.idx, addr:% = self.ctx.addr;
                    "redis shard {} ({}): the primary moved from {old} to {} (failover)",
                    self.ctx.idx,
                    self.ctx.addr,
                    c.at
                );
            }
        }
        self.conn = Some(c.link);
        self.shas = c.shas;
        self.at = Some(c.at);
        self.wait = c.wait;
        self.replid = c.replid;
    }

    fn run(mut self) {
        loop {
            if self.conn.is_none() {
                if let Flow::Stop = self.reconnect() {
                    return;
                }
            }
            if self.inflight.is_empty() {
                select! {
                    recv(self.rx) -> c => match c {
                        Ok(c) => self.batch.push(c),
                        Err(_) => return,
                    },
                    recv(self.stop) -> _ => return,
                    // Idle: the liveness refresh is the heartbeat (its reply checks the
                    // connection as a PING would).
                    default(self.ctx.cfg.heartbeat) => {}
                }
            }
            if self.alive_at.elapsed() >= self.ctx.cfg.heartbeat {
                self.alive_at = Instant::now();
                self.batch.push(Command::Alive);
                self.batch.push(Command::Ring);
                if self.ctx.cfg.wait_replicas.is_none() && self.ctx.addr.fails_over() {
                    self.batch.push(Command::Role);
                }
            }
            if let Err(e) = self.step() {
                self.fail(&e);
            }
        }
    }

    /// Tops the pipeline up to [`DEPTH`] rounds with what is queued (not while commands
    /// wait for a NOSCRIPT retry), then reads the oldest round's replies.
    fn step(&mut self) -> Result<(), LinkError> {
        while self.inflight.len() < DEPTH && self.retry.is_empty() {
            let mut bytes: usize = self.batch.iter().map(Command::size).sum();
            while self.batch.len() < self.ctx.cfg.batch.max(1) && bytes < self.ctx.cfg.batch_bytes {
                match self.rx.try_recv() {
                    Ok(c) => {
                        bytes += c.size();
                        self.batch.push(c);
                    }
                    Err(_) => break,
                }
            }
            if self.batch.is_empty() {
                break;
            }
            self.send(false)?;
        }
        self.recv_oldest()
    }

    /// Packs the batch into `buf` and its replies' slots into `slots`.
    fn pack_all(&mut self) {
        self.buf.clear();
        self.slots.clear();
        pack::pack_batch(
            &self.ctx,
            &self.shas,
            &self.replid,
            &self.batch,
            &mut self.buf,
            &mut self.slots,
        );
    }

    /// Packs and writes `batch` as a new round; a round that writes ends with one `WAIT`
    /// when the shard waits for replicas (one per round, never one per message).
    fn send(&mut self, retried: bool) -> Result<(), LinkError> {
        self.pack_all();
        let cmds = std::mem::take(&mut self.batch);
        let waits = self.wait > 0 && cmds.iter().any(writes);
        if waits {
            let (mut n, mut ms) = (itoa::Buffer::new(), itoa::Buffer::new());
            let timeout = u64::try_from(self.ctx.cfg.wait_timeout.as_millis()).unwrap_or(u64::MAX);
            script::Packer::new(&mut self.buf)
                .cmd(3)
                .arg(b"WAIT")
                .arg(n.format(self.wait).as_bytes())
                .arg(ms.format(timeout.max(1)).as_bytes());
        }
        // The liveness refresh is the node's own business: not a command in the metrics.
        let counted = cmds
            .iter()
            .filter(|c| {
                !matches!(
                    c,
                    Command::Alive | Command::Role | Command::AliveIn(_) | Command::Ring
                )
            })
            .count();
        self.ctx.stats.in_flight.add(counted as u64);
        // Queued before writing, so a failed write answers them too.
        self.inflight.push_back(Round {
            cmds,
            slots: std::mem::take(&mut self.slots),
            t0: Instant::now(),
            retried,
            waits,
        });
        let conn = self.conn.as_mut().ok_or_else(not_connected)?;
        conn.send(&self.buf)?;
        if self.buf.capacity() > 2 * self.ctx.cfg.batch_bytes {
            self.buf = Vec::new(); // one huge round must not pin its buffer for good
        }
        Ok(())
    }

    /// Reads the oldest round's replies (and its `WAIT`'s), then answers them. NOSCRIPT
    /// replies are run once more after the scripts are reloaded (once nothing else is in
    /// flight). A `READONLY` reply means the server is no primary any more: the connection
    /// is dropped and the primary looked for again. On error the caller answers what is
    /// left.
    fn recv_oldest(&mut self) -> Result<(), LinkError> {
        let Some(round) = self.inflight.pop_front() else {
            return Ok(());
        };
        let conn = self.conn.as_mut().ok_or_else(not_connected)?;
        let mut replies = std::mem::take(&mut self.replies);
        replies.clear();
        let mut failed = None;
        for &slot in &round.slots {
            match conn.recv() {
                Ok(v) => replies.push((slot, v)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let mut confirmed = true;
        if round.waits && failed.is_none() {
            match conn.recv() {
                Ok(v) => confirmed = int(&v).is_some_and(|n| n >= i64::from(self.wait)),
                Err(e) => failed = Some(e),
            }
        }
        let readonly = replies
            .iter()
            .any(|(_, v)| matches!(v, Value::ServerError(e) if e.code() == "READONLY"));
        if let Some(e) = failed {
            // Put the unanswered back so `fail` answers them.
            self.batch.extend(round.cmds);
            self.replies = replies;
            return Err(e);
        }
        if !confirmed {
            self.ctx.stats.wait_timeouts.inc();
        }
        // The store's write as this engine does it: a round of publishes (and its `WAIT`).
        if round
            .cmds
            .iter()
            .any(|c| matches!(c, Command::Publish { .. }))
        {
            self.ctx.cfg.writes.observe(round.t0.elapsed());
        }
        let trust = match (confirmed, readonly) {
            (true, false) => Trust::Confirmed,
            _ => Trust::Unconfirmed,
        };
        self.answer_round(&mut replies, round.cmds, trust, round.retried);
        self.replies = replies;
        self.ctx.stats.observe_rtt(round.t0.elapsed());
        if readonly {
            return Err(LinkError::NoPrimary(format!(
                "{} answered READONLY: no longer the primary",
                self.at.as_ref().map_or(String::new(), ToString::to_string)
            )));
        }
        if !confirmed {
            self.check_primary()?;
        }
        if !self.retry.is_empty() && self.inflight.is_empty() {
            log::warn!(shard = self.ctx.idx, addr:% = self.ctx.addr;
                "redis shard {}: scripts missing (NOSCRIPT), reloading",
                self.ctx.addr
            );
            self.reload_scripts()?;
            self.batch = std::mem::take(&mut self.retry);
            self.send(true)?;
        }
        Ok(())
    }

    /// Answers a round's commands from its `replies`, in order: each slot's commands from
    /// its reply; a NOSCRIPT's put aside to run again (unless `retried` already); what says
    /// "stored" answered unavailable unless the round's writes are `Confirmed`.
    fn answer_round(
        &mut self,
        replies: &mut Vec<(Slot, Value)>,
        cmds: Vec<Command>,
        trust: Trust,
        retried: bool,
    ) {
        let mut cmds = cmds.into_iter().peekable();
        for (slot, v) in replies.drain(..) {
            let counted = match cmds.peek() {
                Some(Command::Alive | Command::Ring) => 0,
                Some(Command::Role) => {
                    cmds.next();
                    self.follow_replicas(&v);
                    continue;
                }
                _ => slot.n as u64,
            };
            match v {
                Value::ServerError(e) if e.code() == "NOSCRIPT" && !retried => {
                    self.retry.extend(cmds.by_ref().take(slot.n))
                }
                v if trust == Trust::Confirmed => {
                    answer_slot(&self.ctx, cmds.by_ref().take(slot.n), slot, v)
                }
                v => {
                    // Not confirmed by WAIT (or the server turned replica): what says
                    // "stored" is answered unavailable, reads as they came.
                    let mine: Vec<Command> = cmds.by_ref().take(slot.n).collect();
                    if mine.iter().any(acknowledged) {
                        mine.into_iter().for_each(|c| unavailable(&self.ctx, c));
                    } else {
                        answer_slot(&self.ctx, mine.into_iter(), slot, v);
                    }
                }
            }
            self.ctx.stats.in_flight.sub(counted);
        }
    }

    /// The automatic `WAIT` follows the primary's replicas (`ROLE`, every heartbeat): 1
    /// while it has one, 0 (said in the log) while it has none, as after a failover whose
    /// old primary has not come back as a replica yet.
    fn follow_replicas(&mut self, v: &Value) {
        let Value::Array(role) = v else {
            return;
        };
        let replicas = match role.get(2) {
            Some(Value::Array(r)) => r.len(),
            _ => 0,
        };
        let wait = u32::from(replicas > 0);
        if wait != self.wait {
            match wait {
                0 => log::warn!(shard = self.ctx.idx, addr:% = self.ctx.addr;
                    "redis shard {} ({}): the primary has no replica any more; publishes are acknowledged without WAIT",
                    self.ctx.idx,
                    self.ctx.addr
                ),
                _ => log::info!(shard = self.ctx.idx, addr:% = self.ctx.addr;
                    "redis shard {} ({}): the primary has a replica again; publishes wait for it",
                    self.ctx.idx,
                    self.ctx.addr
                ),
            }
            self.wait = wait;
        }
    }

    /// After a short `WAIT` on a Sentinel shard, at most once a second: asks the Sentinels
    /// whether the primary moved (a partition can leave this node on an old primary that
    /// the others have replaced); if so the connection is dropped to follow it.
    fn check_primary(&mut self) -> Result<(), LinkError> {
        if !matches!(self.ctx.addr.kind, super::addr::Kind::Sentinel { .. })
            || self.checked_at.elapsed() < Duration::from_secs(1)
        {
            return Ok(());
        }
        self.checked_at = Instant::now();
        match primary::ask_sentinels(&self.ctx.reach()) {
            Ok(at) if Some(&at) != self.at.as_ref() => Err(LinkError::NoPrimary(format!(
                "the Sentinels name {at} as the primary now"
            ))),
            _ => Ok(()),
        }
    }

    fn reload_scripts(&mut self) -> Result<(), LinkError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        for (i, s) in script::ALL.iter().enumerate() {
            let v = conn.query(&[b"SCRIPT", b"LOAD", s.as_bytes()])?;
            self.shas.0[i] =
                super::resp::text(&v).ok_or(LinkError::Protocol("SCRIPT LOAD".into()))?;
        }
        Ok(())
    }

    /// Marks the shard down and answers everything in flight and queued.
    fn fail(&mut self, e: &LinkError) {
        log::warn!(shard = self.ctx.idx, addr:% = self.ctx.addr;
            "redis shard {} ({}): {e}; reconnecting",
            self.ctx.idx,
            self.ctx.addr
        );
        if let Some(c) = self.conn.take() {
            c.shutdown();
        }
        self.ctx.stats.command_up.set(0);
        self.ctx.stats.in_flight.set(0);
        set_health(&self.ctx.health.command, Some(e.to_string()));
        let mut all: Vec<Command> = self.inflight.drain(..).flat_map(|r| r.cmds).collect();
        all.append(&mut self.batch);
        all.append(&mut self.retry);
        all.extend(self.rx.try_iter());
        for c in all {
            self.refuse(c);
        }
    }

    /// Answers `Unavailable` while the shard has no primary (counted).
    fn refuse(&self, c: Command) {
        if let Command::Publish { .. } = c {
            self.ctx.stats.no_primary.inc();
        }
        unavailable(&self.ctx, c);
    }

    /// Reconnects with exponential backoff, answering whatever arrives meanwhile.
    fn reconnect(&mut self) -> Flow {
        let cfg = Arc::clone(&self.ctx.cfg);
        let mut delay = cfg.backoff_min;
        loop {
            if let Flow::Stop = self.drain_for(delay) {
                return Flow::Stop;
            }
            match connect(&self.ctx) {
                Ok(conn) => {
                    log::info!(shard = self.ctx.idx, addr:% = self.ctx.addr;
                        "redis shard {} ({}): reconnected to {}",
                        self.ctx.idx,
                        self.ctx.addr,
                        conn.at
                    );
                    self.install(conn);
                    self.ctx.stats.reconnects_command.inc();
                    let _ = self.ctx.commands_back.0.try_send(());
                    self.ctx.stats.command_up.set(1);
                    set_health(&self.ctx.health.command, None);
                    return Flow::Go;
                }
                Err(e) => {
                    log::debug!(
                        shard = self.ctx.idx, addr:% = self.ctx.addr;
                        "redis shard {}: reconnect failed: {e}", self.ctx.addr
                    );
                    set_health(&self.ctx.health.command, Some(e.to_string()));
                }
            }
            delay = (delay * 2).min(self.ctx.backoff_max());
        }
    }

    /// Waits `d`, answering `Unavailable` to every command that arrives.
    fn drain_for(&mut self, d: Duration) -> Flow {
        let deadline = Instant::now() + d;
        loop {
            select! {
                recv(self.rx) -> c => match c {
                    Ok(c) => self.refuse(c),
                    Err(_) => return Flow::Stop,
                },
                recv(self.stop) -> _ => return Flow::Stop,
                default(deadline.saturating_duration_since(Instant::now())) => return Flow::Go,
            }
        }
    }
}
