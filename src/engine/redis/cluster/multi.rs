//! A Redis Cluster shard's command thread (DECISIONS §12): the same commands as a
//! standalone shard's (`shard`), spread over the cluster's primaries by hash slot.
//!
//! Owns: the slot map ([`SlotMap`], from `CLUSTER SLOTS` at start, after a `MOVED`, after a
//! node failed, and every [`REFRESH`]), one connection per primary (opened on first use,
//! scripts loaded on each), and the redirects: a `MOVED` reply moves the slot in the map and
//! sends its commands again to the new owner; an `ASK` sends them once to the named node
//! after `ASKING` (a slot being migrated). Must not touch the subscriber or worker state: it
//! answers through the event sink, as `shard` does.
//!
//! A round: the batch is split by owner; each node gets its commands packed (publishes of
//! one slot grouped, `pack`) followed by one `WAIT` when it waits for replicas; every node's
//! part is written before any reply is read, then each node's replies are read and answered.
//! A node that fails answers its own commands `Unavailable` and the map is read again; the
//! other nodes' commands are not affected. While a slot has no reachable primary (its
//! primary died and no replica took over yet), its commands are refused at once and the map
//! is read again every [`STALE_REFRESH`].

use std::collections::HashMap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};
use redis::Value;

use super::addr::Endpoint;
use super::alive::AliveSlots;
use super::command::{set_health, Command, ShardCtx};
use super::link::{Link, LinkError};
use super::pack::{command_slot, pack_batch};
use super::primary;
use super::reply::{answer_slot, unavailable, Slot};
use super::resp::{int, text};
use super::script::{self, Shas};
use super::setup::ConnectError;
use super::slots::{redirect, SlotMap};

/// The map is read again this often even when nothing moved.
const REFRESH: Duration = Duration::from_secs(1);
/// ... and at most this often while it is known to be stale.
const STALE_REFRESH: Duration = Duration::from_millis(100);
/// Redirects one command may follow before it is answered `Unavailable`.
const MAX_HOPS: u8 = 5;
/// Wait after a failed connect to a node before trying it again.
const NODE_BACKOFF: Duration = Duration::from_millis(200);

/// A command on its way, with its redirects so far.
struct Routed {
    cmd: Command,
    /// Send it to this node after `ASKING` (an `ASK` redirect).
    ask: Option<Endpoint>,
    hops: u8,
}

/// One primary's connection.
struct Node {
    link: Option<Link>,
    shas: Shas,
    replid: Vec<u8>,
    /// No connect before this (after a failed one).
    retry_at: Instant,
}

/// One node's part of a round.
#[derive(Default)]
struct Part {
    cmds: Vec<Routed>,
    slots: Vec<Slot>,
    waits: bool,
}

fn login<'a>(ctx: &'a ShardCtx) -> super::link::Login<'a> {
    super::link::Login {
        tls: ctx.tls.as_ref().filter(|_| ctx.addr.tls),
        user: ctx.addr.username.as_deref(),
        password: ctx.addr.password.as_deref(),
        db: 0,
        connect_timeout: ctx.cfg.connect_timeout,
        read_timeout: ctx.cfg.read_timeout + ctx.cfg.wait_timeout,
        write_timeout: ctx.cfg.read_timeout,
    }
}

/// Reads the slot map from the first seed or known node that answers.
fn read_map(ctx: &ShardCtx, known: &[Endpoint]) -> Result<SlotMap, LinkError> {
    let mut why = Vec::new();
    for at in known.iter().chain(ctx.addr.endpoints.iter()) {
        match Link::open(at, &login(ctx)).and_then(|mut l| l.query(&[b"CLUSTER", b"SLOTS"])) {
            Ok(v) => match SlotMap::parse(&v, at) {
                Some(m) if !m.nodes.is_empty() => return Ok(m),
                _ => why.push(format!("{at}: no usable slot map")),
            },
            Err(e) => why.push(format!("{at}: {e}")),
        }
    }
    Err(LinkError::NoPrimary(format!(
        "no node of the cluster answered CLUSTER SLOTS ({})",
        why.join("; ")
    )))
}

/// A connection to the node serving the fingerprint's key, with the slot map it was found
/// in.
fn ring_link(ctx: &ShardCtx) -> Result<(SlotMap, Link), ConnectError> {
    let map = read_map(ctx, &[])?;
    let slot = super::slots::key_slot(script::RING_KEY);
    let owner = map
        .owner(slot)
        .ok_or(ConnectError::Setup("no node serves the fingerprint's slot"))?;
    let link = Link::open(&map.nodes[owner], &login(ctx))?;
    Ok((map, link))
}

/// Checks (or writes) the shard-list fingerprint on the node serving its key; returns the
/// map. Called once at start, so a wrong list refuses the start as on other shards.
pub(crate) fn check(ctx: &ShardCtx) -> Result<SlotMap, ConnectError> {
    let (map, mut link) = ring_link(ctx)?;
    let offer = super::setup::ring_offer(ctx);
    link.query(&[b"SET", script::RING_KEY, offer.as_bytes(), b"NX"])?;
    let theirs = link
        .query(&[b"GET", script::RING_KEY])
        .map(|v| text(&v).unwrap_or_default())?;
    super::setup::check_ring(ctx, theirs)?;
    Ok(map)
}

/// Moves the fingerprint of a Redis Cluster shard to layout `to` (`setup::switch_ring`).
pub(crate) fn switch(ctx: &ShardCtx, to: u32) -> Result<u32, ConnectError> {
    let (_, mut link) = ring_link(ctx)?;
    super::setup::switch_ring(ctx, &mut link, to)
}

/// Starts the command thread of a Redis Cluster shard. It ends when `stop` is closed.
pub(crate) fn spawn(
    ctx: ShardCtx,
    map: SlotMap,
    rx: Receiver<Command>,
    stop: Receiver<()>,
) -> std::io::Result<JoinHandle<()>> {
    ctx.stats.command_up.set(1);
    ctx.map.set(map.clone());
    let name = format!("redis-cmd-{}", ctx.idx);
    let m = Multi {
        ctx,
        rx,
        stop,
        map,
        nodes: HashMap::new(),
        stale: false,
        read_at: Instant::now(),
        batch: Vec::new(),
        buf: Vec::new(),
        alive_at: Instant::now(),
        alive: AliveSlots::default(),
    };
    std::thread::Builder::new()
        .name(name)
        .spawn(move || m.run())
}

struct Multi {
    ctx: ShardCtx,
    rx: Receiver<Command>,
    stop: Receiver<()>,
    map: SlotMap,
    nodes: HashMap<Endpoint, Node>,
    /// The map is known to be out of date (a redirect, a node failed).
    stale: bool,
    /// When the map was last read.
    read_at: Instant,
    /// Commands of the next round (redirected ones first).
    batch: Vec<Routed>,
    buf: Vec<u8>,
    alive_at: Instant,
    /// Slots where the node keeps its liveness key (`alive`).
    alive: AliveSlots,
}

impl Multi {
    fn run(mut self) {
        loop {
            if self.batch.is_empty() {
                let wait = if self.stale {
                    STALE_REFRESH
                } else {
                    self.ctx.cfg.heartbeat
                };
                select! {
                    recv(self.rx) -> c => match c {
                        Ok(c) => self.take(c),
                        Err(_) => return,
                    },
                    recv(self.stop) -> _ => return,
                    default(wait) => {}
                }
            }
            if self.alive_at.elapsed() >= self.ctx.cfg.heartbeat {
                self.alive_at = Instant::now();
                self.take(Command::Alive);
                self.take(Command::Ring);
                for slot in self.alive.slots() {
                    self.take(Command::AliveIn(slot));
                }
            }
            while self.batch.len() < self.ctx.cfg.batch.max(1) {
                match self.rx.try_recv() {
                    Ok(c) => self.take(c),
                    Err(_) => break,
                }
            }
            self.refresh();
            self.round();
        }
    }

    fn take(&mut self, cmd: Command) {
        if let Some(slot) = self.alive.follow(&cmd) {
            self.batch.push(Routed {
                cmd: Command::AliveIn(slot),
                ask: None,
                hops: 0,
            });
        }
        self.batch.push(Routed {
            cmd,
            ask: None,
            hops: 0,
        });
    }

    /// Reads the map again when it is stale (at most every [`STALE_REFRESH`]) or old.
    fn refresh(&mut self) {
        let due = if self.stale { STALE_REFRESH } else { REFRESH };
        if self.read_at.elapsed() < due {
            return;
        }
        self.read_at = Instant::now();
        let read = match self.map_from_links() {
            Some(m) => Ok(m),
            None => read_map(&self.ctx, &self.map.nodes),
        };
        match read {
            Ok(m) => {
                let moved = m.nodes.iter().any(|n| !self.map.nodes.contains(n));
                if moved && !self.map.nodes.is_empty() {
                    self.ctx.stats.failovers.inc();
                    log::warn!(shard = self.ctx.idx, addr:% = self.ctx.addr;
                        "redis shard {} ({}): the slot map changed: primaries {:?}",
                        self.ctx.idx,
                        self.ctx.addr,
                        m.nodes
                    );
                }
                self.stale = !m.complete();
                self.nodes.retain(|at, _| m.nodes.contains(at));
                self.ctx.map.set(m.clone());
                self.map = m;
                self.health(None);
            }
            Err(e) => {
                self.stale = true;
                self.health(Some(e.to_string()));
            }
        }
    }

    /// The slot map asked of a node this thread is connected to already (no connect, no
    /// login: one round trip); a link that fails the question is dropped.
    fn map_from_links(&mut self) -> Option<SlotMap> {
        for (at, n) in self.nodes.iter_mut() {
            let Some(link) = n.link.as_mut() else {
                continue;
            };
            match link.query(&[b"CLUSTER", b"SLOTS"]) {
                Ok(v) => {
                    if let Some(m) = SlotMap::parse(&v, at).filter(|m| !m.nodes.is_empty()) {
                        return Some(m);
                    }
                }
                Err(_) => {
                    if let Some(l) = n.link.take() {
                        l.shutdown();
                    }
                }
            }
        }
        None
    }

    fn health(&self, why: Option<String>) {
        let up = why.is_none();
        self.ctx.stats.command_up.set(u64::from(up));
        set_health(&self.ctx.health.command, why);
    }

    /// Answers `Unavailable` because no primary serves the command now (counted).
    fn refuse(&self, c: Command) {
        if let Command::Publish { .. } = c {
            self.ctx.stats.no_primary.inc();
        }
        unavailable(&self.ctx, c);
    }

    /// Where a command goes now: its `ASK` target, else its slot's owner.
    fn target(&self, r: &Routed) -> Option<Endpoint> {
        if let Some(a) = &r.ask {
            return Some(a.clone());
        }
        let slot = command_slot(&r.cmd, self.ctx.node)?;
        self.map.owner(slot).map(|i| self.map.nodes[i].clone())
    }

    /// Connects to a node (scripts loaded, replication id read) unless it failed a moment
    /// ago.
    fn node(&mut self, at: &Endpoint) -> Option<&mut Node> {
        let ctx = &self.ctx;
        let n = self.nodes.entry(at.clone()).or_insert_with(|| Node {
            link: None,
            shas: Shas::default(),
            replid: Vec::new(),
            retry_at: Instant::now(),
        });
        if n.link.is_none() {
            if Instant::now() < n.retry_at {
                return None;
            }
            match open_node(ctx, at) {
                Ok((link, shas, replid)) => {
                    n.link = Some(link);
                    n.shas = shas;
                    n.replid = replid;
                }
                Err(e) => {
                    log::debug!(
                        shard = ctx.idx, addr:% = ctx.addr;
                        "redis shard {}: node {at}: {e}", ctx.addr
                    );
                    n.retry_at = Instant::now() + NODE_BACKOFF;
                    self.stale = true;
                    return None;
                }
            }
        }
        Some(n)
    }

    /// Replicas a node's writes wait for.
    fn wait_for(&self, at: &Endpoint) -> u32 {
        if let Some(n) = self.ctx.cfg.wait_replicas {
            return n;
        }
        let i = self.map.nodes.iter().position(|n| n == at);
        u32::from(i.is_some_and(|i| self.map.replicas.get(i).copied().unwrap_or(0) > 0))
    }

    /// Routes, writes and reads one round.
    fn round(&mut self) {
        let mut parts: Vec<(Endpoint, Part)> = Vec::new();
        for r in std::mem::take(&mut self.batch) {
            if let Command::Role = r.cmd {
                continue;
            }
            let Some(at) = self.target(&r) else {
                self.stale = true;
                self.refuse(r.cmd);
                continue;
            };
            match parts.iter_mut().find(|(a, _)| *a == at) {
                Some((_, p)) => p.cmds.push(r),
                None => parts.push((
                    at,
                    Part {
                        cmds: vec![r],
                        ..Part::default()
                    },
                )),
            }
        }
        let node = self.ctx.node;
        let mut sent = Vec::with_capacity(parts.len());
        for (at, mut part) in parts {
            // One slot's commands together, in their order (a publish group is per slot).
            part.cmds
                .sort_by_key(|r| command_slot(&r.cmd, node).unwrap_or(0));
            let wait = self.wait_for(&at);
            match self.send_part(&at, &mut part, wait) {
                Ok(()) => sent.push((at, part, wait)),
                Err(e) => self.node_failed(&at, part, &e),
            }
        }
        for (at, part, wait) in sent {
            self.read_part(&at, part, wait);
        }
    }

    fn send_part(&mut self, at: &Endpoint, part: &mut Part, wait: u32) -> Result<(), LinkError> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        if self.node(at).is_none() {
            self.buf = buf;
            return Err(LinkError::NoPrimary(format!("{at} cannot be reached")));
        }
        // Disjoint borrows of the context and the node (no copy of the context per round).
        let Multi { ctx, nodes, .. } = self;
        let Some(n) = nodes.get_mut(at) else {
            self.buf = buf;
            return Err(LinkError::NoPrimary(format!("{at} cannot be reached")));
        };
        let ctx: &ShardCtx = ctx;
        // The plain commands as one batch, then each asked one after its ASKING.
        let plain = part.cmds.iter().filter(|r| r.ask.is_none()).map(|r| &r.cmd);
        pack_batch(ctx, &n.shas, &n.replid, plain, &mut buf, &mut part.slots);
        for r in part.cmds.iter().filter(|r| r.ask.is_some()) {
            script::Packer::new(&mut buf).cmd(1).arg(b"ASKING");
            part.slots.push(Slot { n: 0, group: false });
            pack_batch(ctx, &n.shas, &n.replid, [&r.cmd], &mut buf, &mut part.slots);
        }
        // The replies come in packing order: plain first, then the asked ones.
        part.cmds.sort_by_key(|r| r.ask.is_some());
        part.waits = wait > 0 && part.cmds.iter().any(|r| super::shard::writes(&r.cmd));
        if part.waits {
            let timeout = u64::try_from(ctx.cfg.wait_timeout.as_millis()).unwrap_or(u64::MAX);
            script::Packer::new(&mut buf)
                .cmd(3)
                .arg(b"WAIT")
                .num(u64::from(wait))
                .num(timeout.max(1));
        }
        let counted = part.cmds.len() as u64;
        let r = match n.link.as_mut() {
            Some(l) => l.send(&buf),
            None => Err(LinkError::NoPrimary(format!("{at} cannot be reached"))),
        };
        if r.is_ok() {
            ctx.stats.in_flight.add(counted);
        }
        self.buf = buf;
        r
    }

    /// A node failed: its connection goes, its commands are answered, the map is read again.
    fn node_failed(&mut self, at: &Endpoint, part: Part, e: &LinkError) {
        let was_up = self.nodes.get_mut(at).and_then(|n| {
            n.retry_at = Instant::now() + NODE_BACKOFF;
            n.link.take()
        });
        // Said once per outage: while the node stays away its commands are refused quietly.
        if let Some(l) = was_up {
            l.shutdown();
            log::warn!(shard = self.ctx.idx, addr:% = self.ctx.addr;
                "redis shard {} ({}): node {at}: {e}",
                self.ctx.idx,
                self.ctx.addr
            );
        }
        self.stale = true;
        for r in part.cmds {
            self.refuse(r.cmd);
        }
    }

    fn read_part(&mut self, at: &Endpoint, part: Part, wait: u32) {
        let n_cmds = part.cmds.len() as u64;
        let replies = match self.nodes.get_mut(at).and_then(|n| n.link.as_mut()) {
            Some(link) => read_replies(link, &part),
            None => Err(LinkError::NoPrimary(format!("{at} cannot be reached"))),
        };
        self.ctx.stats.in_flight.sub(n_cmds);
        let (replies, acked) = match replies {
            Ok(r) => r,
            Err(e) => return self.node_failed(at, part, &e),
        };
        let confirmed = !part.waits || acked.is_some_and(|a| a >= i64::from(wait));
        if !confirmed {
            self.ctx.stats.wait_timeouts.inc();
        }
        let mut cmds = part.cmds.into_iter();
        let mut reload = false;
        for (slot, v) in part.slots.into_iter().zip(replies) {
            let mine: Vec<Routed> = cmds.by_ref().take(slot.n).collect();
            if mine.is_empty() {
                continue; // ASKING's +OK
            }
            if let Value::ServerError(e) = &v {
                let details = e.details().unwrap_or("");
                match e.code() {
                    "MOVED" | "ASK" => {
                        let ask = e.code() == "ASK";
                        if let Some((s, to)) = redirect(details) {
                            if ask {
                                self.ctx.stats.ask.inc();
                            } else {
                                self.ctx.stats.moved.inc();
                                self.map.moved(s, to.clone());
                                self.ctx.map.set(self.map.clone());
                                self.stale = true;
                            }
                            self.again(mine, ask.then_some(to));
                            continue;
                        }
                    }
                    "NOSCRIPT" => {
                        reload = true;
                        self.again(mine, None);
                        continue;
                    }
                    "TRYAGAIN" | "CLUSTERDOWN" | "READONLY" => {
                        self.stale = true;
                        self.again(mine, None);
                        continue;
                    }
                    _ => {}
                }
            }
            let cmds: Vec<Command> = mine.into_iter().map(|r| r.cmd).collect();
            if !confirmed && cmds.iter().any(super::shard::acknowledged) {
                cmds.into_iter().for_each(|c| unavailable(&self.ctx, c));
            } else {
                answer_slot(&self.ctx, cmds.into_iter(), slot, v);
            }
        }
        if reload {
            if let Some(n) = self.nodes.get_mut(at) {
                n.link = None; // reconnecting loads the scripts again
            }
        }
    }

    /// Sends commands again next round (after a redirect), or answers them `Unavailable`
    /// when they have been sent around too often.
    fn again(&mut self, cmds: Vec<Routed>, ask: Option<Endpoint>) {
        for mut r in cmds {
            r.hops += 1;
            if r.hops > MAX_HOPS {
                unavailable(&self.ctx, r.cmd);
                continue;
            }
            r.ask = ask.clone();
            self.batch.push(r);
        }
    }
}

/// Reads one reply per slot, then the `WAIT`'s when the part waits.
fn read_replies(link: &mut Link, part: &Part) -> Result<(Vec<Value>, Option<i64>), LinkError> {
    let mut out = Vec::with_capacity(part.slots.len());
    for _ in &part.slots {
        out.push(link.recv()?);
    }
    let acked = match part.waits {
        true => int(&link.recv()?),
        false => None,
    };
    Ok((out, acked))
}

/// Connects to one primary: login, scripts, replication id.
fn open_node(ctx: &ShardCtx, at: &Endpoint) -> Result<(Link, Shas, Vec<u8>), LinkError> {
    let mut link = Link::open(at, &login(ctx))?;
    let mut shas = Shas::default();
    for (i, s) in script::ALL.iter().enumerate() {
        let v = link.query(&[b"SCRIPT", b"LOAD", s.as_bytes()])?;
        shas.0[i] = text(&v).ok_or(LinkError::Protocol("SCRIPT LOAD".into()))?;
    }
    let replid = primary::replid(&mut link, &ctx.addr);
    Ok((link, shas, replid.into_bytes()))
}
