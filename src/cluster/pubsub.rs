//! One shard's subscriber connection: the node subscribes to a topic's channel while any of
//! its workers watches the topic (one Redis subscription per topic per node), and forwards
//! every message to each watching worker.
//!
//! Owns: the subscriber socket, the table of watched topics, re-subscription after a
//! reconnect, the `pubsub` half of the shard's health. Must not touch the command
//! connection (`shard`) or worker state: it only calls the event sink.
//!
//! Two threads share the socket: the *reader* connects (with backoff), authenticates and
//! then only reads (pushed messages, subscribe confirmations, pongs) with a read timeout that
//! a dead server trips; the *writer* takes `watch`/`unwatch` from a bounded queue and writes
//! SUBSCRIBE / UNSUBSCRIBE (batched, in order) and a PING every heartbeat. Neither waits for
//! the other, so a slow Redis never stalls a worker and a burst of subscriptions never waits
//! on replies.
//!
//! When Redis confirms a subscription, each watching worker gets `Resync`: read the history
//! after your last position (the subscription is live, so nothing published from now on can
//! be missed, and the read covers what came before). A worker that watches a topic already
//! live gets `Resync` at once. After a reconnect every watched topic is subscribed again and
//! its watchers get `Resync` again.
//!
//! The reader forwards by its own table of watchers (`routes`), which the writer keeps up to
//! date: no lock is taken on the way of a message.

use std::collections::HashMap;
use std::io::BufReader;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{select, Receiver, Sender};
use redis::Value;

use super::command::{set_health, ShardCtx};
use super::link::{ReadHalf, Split};
use super::routes::{self, Route, RouteSender, Routes};
use super::script::{self, Packer};
use super::subconn::{connect, Sock};
use super::types::{ClusterEvent, NS_V1};
use crate::arcbuf::ArcBuf;
use crate::message::{Body, Message, Position};

/// Most channels in one SUBSCRIBE / UNSUBSCRIBE command.
const CHANNELS_PER_COMMAND: usize = 256;
/// Most control messages handled before the writer flushes.
const CTL_PER_FLUSH: usize = 1024;

/// A worker starts or stops watching a topic.
#[derive(Debug)]
pub(crate) enum Ctl {
    Watch {
        worker: usize,
        ns: u8,
        topic: Arc<str>,
    },
    Unwatch {
        worker: usize,
        ns: u8,
        topic: Arc<str>,
    },
}

/// One watched (or being unsubscribed) topic.
struct TopicSub {
    ns: u8,
    topic: Arc<str>,
    /// Workers watching it.
    watchers: Vec<usize>,
    /// Whether the last command for it is SUBSCRIBE (wanted) rather than UNSUBSCRIBE.
    sub_sent: bool,
    /// Commands written on the current connection and not yet confirmed.
    pending: u32,
    /// Subscribed on the current connection, nothing pending.
    live: bool,
    /// Was live on an earlier connection (its next confirmation is a resync).
    was_live: bool,
}

#[derive(Default)]
struct State {
    /// By channel name.
    topics: HashMap<Box<[u8]>, TopicSub>,
    /// Bumped on every connect and disconnect.
    gen: u64,
    /// The current connection (the writer writes to it, `shutdown` closes it).
    sock: Option<Arc<Sock>>,
}

struct Shared {
    state: Mutex<State>,
    /// Watcher changes for the reader's table (sent under the state's lock, in order).
    routes: RouteSender,
    stop: AtomicBool,
    /// The shard this subscriber belongs to (the same context as its command thread).
    ctx: ShardCtx,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The subscriber of one shard.
pub(crate) struct Subscriber {
    shared: Arc<Shared>,
    stop_tx: Mutex<Option<Sender<()>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Subscriber {
    /// Starts the reader and writer threads; returns the subscriber and the sender of its
    /// control queue (bounded by `cfg.watch_queue`).
    pub(crate) fn start(ctx: ShardCtx) -> std::io::Result<(Subscriber, Sender<Ctl>)> {
        let (ctl_tx, ctl_rx) = crossbeam_channel::bounded(ctx.cfg.watch_queue.max(1));
        let (bell_tx, bell_rx) = crossbeam_channel::bounded(1);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        set_health(&ctx.health.pubsub, Some("not connected yet".into()));
        let idx = ctx.idx;
        let (route_tx, routes) = routes::routes();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            routes: route_tx,
            stop: AtomicBool::new(false),
            ctx,
        });
        let (s1, s2, stop2) = (Arc::clone(&shared), Arc::clone(&shared), stop_rx.clone());
        let reader = std::thread::Builder::new()
            .name(format!("redis-sub-{idx}"))
            .spawn(move || reader(&s1, routes, &bell_tx, &stop_rx))?;
        let writer = std::thread::Builder::new()
            .name(format!("redis-subw-{idx}"))
            .spawn(move || Writer::new(s2).run(&ctl_rx, &bell_rx, &stop2))?;
        Ok((
            Subscriber {
                shared,
                stop_tx: Mutex::new(Some(stop_tx)),
                threads: Mutex::new(vec![reader, writer]),
            },
            ctl_tx,
        ))
    }

    /// Stops both threads and closes the connection.
    pub(crate) fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        drop(
            self.stop_tx
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        if let Some(s) = self.shared.lock().sock.as_ref() {
            s.shutdown();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The reader thread: connect, install, read until error, uninstall, back off, again.
fn reader(sh: &Shared, mut routes: Routes, bell: &Sender<()>, stop: &Receiver<()>) {
    let mut delay = sh.ctx.cfg.backoff_min;
    let mut connected_once = false;
    while !sh.stop.load(Ordering::SeqCst) {
        match connect(&sh.ctx) {
            Ok(Split {
                mut reader,
                mut parser,
                writer,
                sock,
            }) => {
                delay = sh.ctx.cfg.backoff_min;
                {
                    let mut st = sh.lock();
                    st.gen += 1;
                    st.sock = Some(Arc::new(Sock::new(writer, sock)));
                }
                if sh.stop.load(Ordering::SeqCst) {
                    break;
                }
                let _ = bell.try_send(());
                if connected_once {
                    sh.ctx.stats.reconnects_pubsub.inc();
                    log::info!(
                        "redis shard {} ({}): subscriber reconnected",
                        sh.ctx.idx,
                        sh.ctx.addr
                    );
                }
                connected_once = true;
                set_health(&sh.ctx.health.pubsub, None);
                sh.ctx.stats.pubsub_up.set(1);
                let why = read_loop(sh, &mut routes, &mut reader, &mut parser);
                sh.ctx.stats.pubsub_up.set(0);
                uninstall(sh);
                if sh.stop.load(Ordering::SeqCst) {
                    break;
                }
                log::warn!(
                    "redis shard {} ({}): subscriber: {why}",
                    sh.ctx.idx,
                    sh.ctx.addr
                );
                set_health(&sh.ctx.health.pubsub, Some(why));
            }
            Err(e) => set_health(&sh.ctx.health.pubsub, Some(e)),
        }
        if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) = stop.recv_timeout(delay) {
            break;
        }
        delay = (delay * 2).min(sh.ctx.backoff_max());
    }
    uninstall(sh);
}

/// Forgets the connection: nothing is live, nothing pending; unwanted entries go.
fn uninstall(sh: &Shared) {
    let mut st = sh.lock();
    st.gen += 1;
    if let Some(s) = st.sock.take() {
        s.shutdown();
    }
    st.topics.retain(|_, t| t.sub_sent);
    for t in st.topics.values_mut() {
        t.pending = 0;
        t.was_live |= t.live;
        t.live = false;
    }
}

fn bulk(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        _ => None,
    }
}

/// Reads until an error; returns why it stopped.
fn read_loop(
    sh: &Shared,
    routes: &mut Routes,
    r: &mut BufReader<ReadHalf>,
    parser: &mut redis::Parser,
) -> String {
    let mut targets: Vec<usize> = Vec::new();
    loop {
        let v = match parser.parse_value(&mut *r) {
            Ok(v) => v,
            Err(e) => return e.to_string(),
        };
        // Whatever was read, the watcher changes sent since are taken (a pong every
        // heartbeat at least), so their queue empties even when no message comes.
        routes.refresh(|| whole_routes(sh));
        if sh.stop.load(Ordering::Relaxed) {
            return "stopping".into();
        }
        let items = match v {
            Value::Array(items) => items,
            Value::ServerError(e) => return format!("server error: {e:?}"),
            _ => continue, // +PONG outside subscribe mode
        };
        let mut it = items.into_iter();
        let (Some(kind), Some(chan), Some(third)) = (it.next(), it.next(), it.next()) else {
            continue; // ["pong", ""]
        };
        let (Some(kind), Some(chan)) = (bulk(&kind), bulk(&chan)) else {
            continue;
        };
        match kind {
            b"message" => {
                let Value::BulkString(payload) = third else {
                    continue;
                };
                forward(sh, routes, chan, payload);
            }
            b"subscribe" | b"unsubscribe" => confirm(sh, chan, &mut targets),
            _ => {}
        }
    }
}

/// Every channel's route, from the shared state (when the reader's table must be rebuilt).
fn whole_routes(sh: &Shared) -> Vec<(Box<[u8]>, Route)> {
    let st = sh.lock();
    st.topics
        .iter()
        .map(|(chan, t)| (chan.clone(), route_of(t)))
        .collect()
}

fn route_of(t: &TopicSub) -> Route {
    Route {
        ns: t.ns,
        topic: Arc::clone(&t.topic),
        watchers: t.watchers.clone(),
    }
}

/// Sends a message of `chan` to every worker watching it (by the reader's own table).
fn forward(sh: &Shared, routes: &Routes, chan: &[u8], payload: Vec<u8>) {
    sh.ctx.stats.live_received.inc();
    let Some(m) = script::decode_live(payload) else {
        log::warn!(
            "redis shard {}: undecodable message on a channel",
            sh.ctx.addr
        );
        return;
    };
    let Some(Route {
        ns,
        topic,
        watchers,
    }) = routes.get(chan)
    else {
        return;
    };
    let msg = if *ns == NS_V1 {
        None
    } else {
        let Some(body) = Body::from_stored(ArcBuf::copy_from_slice(&m.data)) else {
            log::warn!(
                "redis shard {}: a message on a channel is not a stored message body",
                sh.ctx.addr
            );
            return;
        };
        let pos = Position {
            epoch: m.epoch,
            seq: m.seq,
        };
        Some(Message {
            pos,
            body,
            origin: m.origin,
        })
    };
    for &w in watchers {
        let topic = Arc::clone(topic);
        let ev = match &msg {
            Some(msg) => ClusterEvent::Live {
                topic,
                msg: msg.clone(),
            },
            None => ClusterEvent::V1Live {
                topic,
                frame: m.data.clone(),
                origin: m.origin,
            },
        };
        (sh.ctx.events)(w, ev);
    }
}

fn confirm(sh: &Shared, chan: &[u8], targets: &mut Vec<usize>) {
    let (ns, topic, resync) = {
        let mut st = sh.lock();
        let Some(t) = st.topics.get_mut(chan) else {
            return;
        };
        t.pending = t.pending.saturating_sub(1);
        if t.pending > 0 {
            return;
        }
        if !t.sub_sent {
            st.topics.remove(chan);
            return;
        }
        t.live = true;
        let resync = std::mem::replace(&mut t.was_live, false);
        targets.clear();
        targets.extend_from_slice(&t.watchers);
        (t.ns, Arc::clone(&t.topic), resync)
    };
    if resync {
        sh.ctx.stats.resyncs.inc();
    }
    for &w in targets.iter() {
        (sh.ctx.events)(
            w,
            ClusterEvent::Resync {
                ns,
                topic: Arc::clone(&topic),
            },
        );
    }
}

/// SUBSCRIBE / UNSUBSCRIBE runs waiting to be written, in order.
#[derive(Default)]
struct Out {
    runs: Vec<(bool, Vec<Box<[u8]>>)>,
}

impl Out {
    fn push(&mut self, subscribe: bool, chan: Box<[u8]>) {
        match self.runs.last_mut() {
            Some((s, v)) if *s == subscribe && v.len() < CHANNELS_PER_COMMAND => v.push(chan),
            _ => self.runs.push((subscribe, vec![chan])),
        }
    }
}

struct Writer {
    sh: Arc<Shared>,
    /// The connection written to and its generation.
    sock: Option<(u64, Arc<Sock>)>,
    out: Out,
    /// `Resync` events to emit after the lock is released.
    now_live: Vec<(usize, u8, Arc<str>)>,
    last_ping: Instant,
    buf: Vec<u8>,
}

impl Writer {
    fn new(sh: Arc<Shared>) -> Writer {
        Writer {
            sh,
            sock: None,
            out: Out::default(),
            now_live: Vec::new(),
            last_ping: Instant::now(),
            buf: Vec::new(),
        }
    }

    fn run(mut self, ctl: &Receiver<Ctl>, bell: &Receiver<()>, stop: &Receiver<()>) {
        let hb = self.sh.ctx.cfg.heartbeat;
        loop {
            select! {
                recv(ctl) -> m => {
                    let Ok(m) = m else { return };
                    self.handle(m);
                    for _ in 0..CTL_PER_FLUSH {
                        match ctl.try_recv() {
                            Ok(m) => self.handle(m),
                            Err(_) => break,
                        }
                    }
                }
                recv(bell) -> _ => self.resubscribe_all(),
                recv(self.sh.ctx.commands_back.1) -> _ => self.resync_live(),
                recv(stop) -> _ => return,
                default(hb) => {}
            }
            if self.last_ping.elapsed() >= hb {
                self.last_ping = Instant::now();
                if self.sock.is_some() {
                    self.buf.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
                }
            }
            self.flush();
            for (w, ns, topic) in self.now_live.drain(..) {
                (self.sh.ctx.events)(w, ClusterEvent::Resync { ns, topic });
            }
        }
    }

    fn connected(&self, st: &State) -> bool {
        matches!(&self.sock, Some((g, _)) if *g == st.gen && st.sock.is_some())
    }

    fn handle(&mut self, m: Ctl) {
        let sh = Arc::clone(&self.sh);
        let mut st = sh.lock();
        let connected = self.connected(&st);
        match m {
            Ctl::Watch { worker, ns, topic } => {
                let chan: Box<[u8]> =
                    script::channel(self.sh.ctx.keys(), ns, topic.as_bytes()).into();
                let t = st.topics.entry(chan.clone()).or_insert_with(|| TopicSub {
                    ns,
                    topic: Arc::clone(&topic),
                    watchers: Vec::new(),
                    sub_sent: false,
                    pending: 0,
                    live: false,
                    was_live: false,
                });
                if !t.watchers.contains(&worker) {
                    t.watchers.push(worker);
                    self.sh.routes.send(&chan, route_of(t));
                }
                if t.live {
                    self.now_live.push((worker, ns, topic));
                } else if !t.sub_sent {
                    t.sub_sent = true;
                    if connected {
                        t.pending += 1;
                        self.out.push(true, chan);
                    }
                }
            }
            Ctl::Unwatch { worker, ns, topic } => {
                let chan = script::channel(self.sh.ctx.keys(), ns, topic.as_bytes());
                let Some(t) = st.topics.get_mut(&chan[..]) else {
                    return;
                };
                let before = t.watchers.len();
                t.watchers.retain(|w| *w != worker);
                if t.watchers.len() != before {
                    self.sh.routes.send(&chan, route_of(t));
                }
                if !t.watchers.is_empty() || !t.sub_sent {
                    return;
                }
                t.sub_sent = false;
                t.live = false;
                t.was_live = false;
                if connected {
                    t.pending += 1;
                    self.out.push(false, chan.into());
                } else if t.pending == 0 {
                    st.topics.remove(&chan[..]);
                }
            }
        }
    }

    /// The command connection is back: every live topic's watchers read again (a read
    /// refused during the outage would otherwise wait for the next reconnect).
    fn resync_live(&mut self) {
        let sh = Arc::clone(&self.sh);
        let st = sh.lock();
        for t in st.topics.values().filter(|t| t.live) {
            sh.ctx.stats.resyncs.inc();
            for &w in &t.watchers {
                self.now_live.push((w, t.ns, Arc::clone(&t.topic)));
            }
        }
    }

    /// A new connection: take it and subscribe every wanted topic on it.
    fn resubscribe_all(&mut self) {
        let sh = Arc::clone(&self.sh);
        let mut st = sh.lock();
        self.out.runs.clear();
        self.buf.clear();
        self.sock = st.sock.as_ref().map(|s| (st.gen, Arc::clone(s)));
        if self.sock.is_none() {
            return;
        }
        for (chan, t) in st.topics.iter_mut() {
            if t.sub_sent {
                t.pending = 1;
                self.out.push(true, chan.clone());
            }
        }
    }

    /// Writes what is waiting; a failed write closes the socket (the reader reconnects).
    fn flush(&mut self) {
        let runs = std::mem::take(&mut self.out.runs);
        for (subscribe, chans) in runs {
            let mut p = Packer::new(&mut self.buf);
            p.cmd(chans.len() + 1);
            p.arg(if subscribe {
                b"SUBSCRIBE"
            } else {
                b"UNSUBSCRIBE"
            });
            for c in &chans {
                p.arg(c);
            }
            if self.buf.len() >= 64 * 1024 {
                self.write();
            }
        }
        self.write();
    }

    fn write(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        if let Some((_, s)) = self.sock.as_ref() {
            let sent = s.writer().send(&self.buf);
            if let Err(e) = sent {
                log::warn!("redis shard {}: subscriber write: {e}", self.sh.ctx.addr);
                s.shutdown();
                self.sock = None;
            }
        }
        self.buf.clear();
    }
}
