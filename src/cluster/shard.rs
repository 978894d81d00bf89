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
use redis::{Connection, RedisError, Value};

use super::command::{set_health, Command, ShardCtx};
use super::reply::{answer_slot, unavailable, Slot};
use super::script::{self, PublishArgs, Shas};
use super::v1;

/// Why a shard could not be (re)connected.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Redis did not answer, or answered an error.
    #[error("{0}")]
    Redis(#[from] RedisError),
    /// The shard holds another node's shard list.
    #[error("this shard was joined with another --redis list: it holds {theirs:?}, this node has {ours:?}; every node must list the same Redis servers in the same order")]
    Mismatch {
        /// This node's fingerprint.
        ours: String,
        /// The one found in the shard.
        theirs: String,
    },
    /// A reply of an unexpected shape during setup.
    #[error("unexpected reply during setup: {0}")]
    Setup(&'static str),
}

/// Connects, sets timeouts, loads the scripts and checks (or writes) the fingerprint.
pub(crate) fn connect(ctx: &ShardCtx) -> Result<(Connection, Shas), ConnectError> {
    let client = redis::Client::open(ctx.addr.info.clone())?;
    let mut con = client.get_connection_with_timeout(ctx.cfg.connect_timeout)?;
    con.set_read_timeout(Some(ctx.cfg.read_timeout))?;
    con.set_write_timeout(Some(ctx.cfg.read_timeout))?;
    let mut buf = Vec::new();
    for s in script::ALL {
        script::Packer::new(&mut buf)
            .cmd(3)
            .arg(b"SCRIPT")
            .arg(b"LOAD")
            .arg(s.as_bytes());
    }
    script::Packer::new(&mut buf)
        .cmd(4)
        .arg(b"SET")
        .arg(script::RING_KEY)
        .arg(ctx.fingerprint.as_bytes())
        .arg(b"NX");
    script::Packer::new(&mut buf)
        .cmd(2)
        .arg(b"GET")
        .arg(script::RING_KEY);
    // Alive at once: a restarted Redis holds no liveness key until the first heartbeat.
    v1::pack_alive(&mut buf, ctx.node);
    con.send_packed_command(&buf)?;
    let mut shas = Shas::default();
    for sha in shas.0.iter_mut() {
        match con.recv_response()? {
            Value::BulkString(b) => {
                *sha = String::from_utf8(b).map_err(|_| ConnectError::Setup("sha"))?
            }
            Value::ServerError(e) => return Err(RedisError::from(e).into()),
            _ => return Err(ConnectError::Setup("SCRIPT LOAD")),
        }
    }
    let _ = con.recv_response()?;
    let theirs = match con.recv_response()? {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::ServerError(e) => return Err(RedisError::from(e).into()),
        _ => return Err(ConnectError::Setup("GET ring")),
    };
    if let Value::ServerError(e) = con.recv_response()? {
        return Err(RedisError::from(e).into());
    }
    if theirs != ctx.fingerprint {
        return Err(ConnectError::Mismatch {
            ours: ctx.fingerprint.clone(),
            theirs,
        });
    }
    Ok((con, shas))
}

/// Starts the command thread on an established connection. It ends when `stop` is closed.
pub(crate) fn spawn(
    ctx: ShardCtx,
    conn: Connection,
    shas: Shas,
    rx: Receiver<Command>,
    stop: Receiver<()>,
) -> std::io::Result<JoinHandle<()>> {
    ctx.stats.command_up.set(1);
    let name = format!("redis-cmd-{}", ctx.idx);
    let runner = Runner {
        ctx,
        conn: Some(conn),
        shas,
        rx,
        stop,
        buf: Vec::new(),
        batch: Vec::new(),
        slots: Vec::new(),
        inflight: VecDeque::new(),
        retry: Vec::new(),
        alive_at: Instant::now(),
    };
    std::thread::Builder::new()
        .name(name)
        .spawn(move || runner.run())
}

struct Runner {
    ctx: ShardCtx,
    /// `None` while down.
    conn: Option<Connection>,
    shas: Shas,
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
}

fn not_connected() -> RedisError {
    RedisError::from(std::io::Error::from(std::io::ErrorKind::NotConnected))
}

/// Whether a thread should go on.
enum Flow {
    Go,
    Stop,
}

impl Runner {
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
            }
            if let Err(e) = self.step() {
                self.fail(&e);
            }
        }
    }

    /// Tops the pipeline up to [`DEPTH`] rounds with what is queued (not while commands
    /// wait for a NOSCRIPT retry), then reads the oldest round's replies.
    fn step(&mut self) -> Result<(), RedisError> {
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

    /// Packs the batch into `buf`: runs of publishes go as groups (one script call for up
    /// to `cfg.publish_group` messages), everything else one call each. Fills `slots`.
    fn pack_all(&mut self) {
        self.buf.clear();
        self.slots.clear();
        let cfg = Arc::clone(&self.ctx.cfg);
        let group_max = cfg.publish_group.max(1);
        let mut group: Vec<PublishArgs<'_>> = Vec::with_capacity(group_max);
        for c in &self.batch {
            if let Command::Publish { req, .. } = c {
                group.push(PublishArgs {
                    ns: req.ns,
                    topic: req.topic.as_bytes(),
                    body: &req.body,
                    // 1 ms to 2^40 ms (35 years): exact in Lua's doubles.
                    ttl_ms: u64::try_from(req.ttl.as_millis())
                        .unwrap_or(u64::MAX)
                        .clamp(1, 1 << 40),
                    origin: req.origin,
                    prompt: req.prompt,
                });
                if group.len() < group_max {
                    continue;
                }
            }
            if !group.is_empty() {
                let cap = cfg.max_cached_per_topic.max(1) as u64;
                script::pack_publish_group(
                    &mut self.buf,
                    &self.shas,
                    cap,
                    self.ctx.addr.db,
                    &group,
                );
                self.slots.push(Slot {
                    n: group.len(),
                    group: true,
                });
                group.clear();
            }
            let buf = &mut self.buf;
            match c {
                Command::Publish { .. } => continue,
                Command::Read {
                    ns,
                    topic,
                    epoch,
                    after,
                    ..
                } => script::pack_read(
                    buf,
                    &self.shas,
                    self.ctx.addr.db,
                    *ns,
                    topic.as_bytes(),
                    script::ReadArgs {
                        epoch: *epoch,
                        after: *after,
                        max_bytes: cfg.read_max_bytes as u64,
                        max_count: cfg.read_max_count.max(1) as u64,
                    },
                ),
                Command::WebhookAdd { topic, url, .. } => script::pack_webhook_add(
                    buf,
                    &self.shas,
                    topic.as_bytes(),
                    url.as_bytes(),
                    cfg.max_webhooks_per_topic as u64,
                    self.ctx.webhooks_per_shard,
                ),
                Command::WebhookRemove { topic, url } => {
                    script::pack_webhook_remove(buf, &self.shas, topic.as_bytes(), url.as_bytes())
                }
                Command::V1Publish { req, .. } => {
                    let lim = v1::PubLimits {
                        pending_ttl: cfg.v1_pending_ttl,
                        cap: cfg.max_cached_per_topic as u64,
                        alive: cfg.node_alive,
                        db: self.ctx.addr.db,
                    };
                    v1::pack_pub(buf, &self.shas.0[script::V1_PUB_IDX], req, &lim)
                }
                Command::V1Sub {
                    worker,
                    ticket,
                    topic,
                    count,
                } => v1::pack_sub(
                    buf,
                    &self.shas.0[script::V1_SUB_IDX],
                    topic.as_bytes(),
                    &v1::field(self.ctx.node, *worker),
                    *count,
                    ticket.is_some(),
                ),
                Command::Alive => v1::pack_alive(buf, self.ctx.node),
            }
            self.slots.push(Slot { n: 1, group: false });
        }
        if !group.is_empty() {
            let cap = cfg.max_cached_per_topic.max(1) as u64;
            script::pack_publish_group(&mut self.buf, &self.shas, cap, self.ctx.addr.db, &group);
            self.slots.push(Slot {
                n: group.len(),
                group: true,
            });
        }
    }

    /// Packs and writes `batch` as a new round.
    fn send(&mut self, retried: bool) -> Result<(), RedisError> {
        self.pack_all();
        let cmds = std::mem::take(&mut self.batch);
        // The liveness refresh is the node's own business: not a command in the metrics.
        let counted = cmds.iter().filter(|c| !matches!(c, Command::Alive)).count();
        self.ctx.stats.in_flight.add(counted as u64);
        // Queued before writing, so a failed write answers them too.
        self.inflight.push_back(Round {
            cmds,
            slots: std::mem::take(&mut self.slots),
            t0: Instant::now(),
            retried,
        });
        let conn = self.conn.as_mut().ok_or_else(not_connected)?;
        conn.send_packed_command(&self.buf)?;
        if self.buf.capacity() > 2 * self.ctx.cfg.batch_bytes {
            self.buf = Vec::new(); // one huge round must not pin its buffer for good
        }
        Ok(())
    }

    /// Reads the oldest round's replies and answers them. NOSCRIPT replies are run once
    /// more after the scripts are reloaded (once nothing else is in flight). On error the
    /// caller answers what is left.
    fn recv_oldest(&mut self) -> Result<(), RedisError> {
        let Some(Round {
            cmds,
            slots,
            t0,
            retried,
        }) = self.inflight.pop_front()
        else {
            return Ok(());
        };
        let conn = self.conn.as_mut().ok_or_else(not_connected)?;
        let mut cmds = cmds.into_iter().peekable();
        for slot in slots {
            let counted = if let Some(Command::Alive) = cmds.peek() {
                0
            } else {
                slot.n as u64
            };
            match conn.recv_response() {
                Ok(Value::ServerError(e)) if e.code() == "NOSCRIPT" && !retried => {
                    self.retry.extend(cmds.by_ref().take(slot.n))
                }
                Ok(v) => answer_slot(&self.ctx, cmds.by_ref().take(slot.n), slot, v),
                Err(e) => {
                    // Put the unanswered back so `fail` answers them.
                    self.batch.extend(cmds);
                    return Err(e);
                }
            }
            self.ctx.stats.in_flight.sub(counted);
        }
        self.ctx.stats.observe_rtt(t0.elapsed());
        if !self.retry.is_empty() && self.inflight.is_empty() {
            log::warn!(
                "redis shard {}: scripts missing (NOSCRIPT), reloading",
                self.ctx.addr
            );
            self.reload_scripts()?;
            self.batch = std::mem::take(&mut self.retry);
            self.send(true)?;
        }
        Ok(())
    }

    fn reload_scripts(&mut self) -> Result<(), RedisError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        for (i, s) in script::ALL.iter().enumerate() {
            let v = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(*s)
                .query::<String>(conn)?;
            self.shas.0[i] = v;
        }
        Ok(())
    }

    /// Marks the shard down and answers everything in flight and queued.
    fn fail(&mut self, e: &RedisError) {
        log::warn!(
            "redis shard {} ({}): {e}; reconnecting",
            self.ctx.idx,
            self.ctx.addr
        );
        self.conn = None;
        self.ctx.stats.command_up.set(0);
        self.ctx.stats.in_flight.set(0);
        set_health(&self.ctx.health.command, Some(e.to_string()));
        let inflight = self.inflight.drain(..).flat_map(|r| r.cmds);
        for c in inflight
            .chain(self.batch.drain(..))
            .chain(self.retry.drain(..))
        {
            unavailable(&self.ctx, c);
        }
        while let Ok(c) = self.rx.try_recv() {
            unavailable(&self.ctx, c);
        }
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
                Ok((conn, shas)) => {
                    log::info!(
                        "redis shard {} ({}): reconnected",
                        self.ctx.idx,
                        self.ctx.addr
                    );
                    self.conn = Some(conn);
                    self.shas = shas;
                    self.ctx.stats.reconnects_command.inc();
                    let _ = self.ctx.commands_back.0.try_send(());
                    self.ctx.stats.command_up.set(1);
                    set_health(&self.ctx.health.command, None);
                    return Flow::Go;
                }
                Err(e) => {
                    log::debug!("redis shard {}: reconnect failed: {e}", self.ctx.addr);
                    set_health(&self.ctx.health.command, Some(e.to_string()));
                }
            }
            delay = (delay * 2).min(cfg.backoff_max);
        }
    }

    /// Waits `d`, answering `Unavailable` to every command that arrives.
    fn drain_for(&mut self, d: Duration) -> Flow {
        let deadline = Instant::now() + d;
        loop {
            select! {
                recv(self.rx) -> c => match c {
                    Ok(c) => unavailable(&self.ctx, c),
                    Err(_) => return Flow::Stop,
                },
                recv(self.stop) -> _ => return Flow::Stop,
                default(deadline.saturating_duration_since(Instant::now())) => return Flow::Go,
            }
        }
    }
}
