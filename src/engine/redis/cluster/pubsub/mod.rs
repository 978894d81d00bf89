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
//! When Redis confirms a subscription, each watching worker gets `Subscribed`: read the history
//! after your last position (the subscription is live, so nothing published from now on can
//! be missed, and the read covers what came before). A worker that watches a topic already
//! live gets `Subscribed` at once. After a reconnect every watched topic is subscribed again and
//! its watchers get `Subscribed` again.
//!
//! The reader forwards by its own table of watchers (`routes`), which the writer keeps up to
//! date: no lock is taken on the way of a message.

use std::collections::HashMap;
use std::io::BufReader;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use redis::Value;

mod writer;

use writer::Writer;

use super::command::{set_health, ShardCtx};
use super::link::{ReadHalf, Split};
use super::routes::{self, Route, RouteSender, Routes};
use super::script;
use super::subconn::{connect, Sock};
use super::types::{Followup, NS_V1};
use crate::arcbuf::ArcBuf;
use crate::event::Event;
use crate::message::{Body, Message, Position};

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
pub(super) struct TopicSub {
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
pub(super) struct State {
    /// By channel name.
    topics: HashMap<Box<[u8]>, TopicSub>,
    /// Bumped on every connect and disconnect.
    gen: u64,
    /// The current connection (the writer writes to it, `shutdown` closes it).
    sock: Option<Arc<Sock>>,
}

pub(super) struct Shared {
    state: Mutex<State>,
    /// Watcher changes for the reader's table (sent under the state's lock, in order).
    routes: RouteSender,
    stop: AtomicBool,
    /// The shard this subscriber belongs to (the same context as its command thread).
    ctx: ShardCtx,
    /// Which server the connection goes to.
    target: Target,
}

/// Where a subscriber connects.
pub(crate) enum Target {
    /// The shard's primary (standalone or Sentinel; a reconnect asks for it again):
    /// `SUBSCRIBE`.
    Primary,
    /// One node of a Redis Cluster (`sharded`): `SSUBSCRIBE` to the channels of the slots
    /// it serves. A channel the server drops on its own (its slot moved: an `sunsubscribe`
    /// push nobody asked for) is reported on `lost`.
    Node {
        at: super::addr::Endpoint,
        lost: Sender<(u8, Arc<str>)>,
    },
}

impl Shared {
    /// Whether the connection uses sharded pub/sub.
    pub(super) fn sharded(&self) -> bool {
        matches!(self.target, Target::Node { .. })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
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
        Self::start_with(ctx, Target::Primary)
    }

    /// The same for one node of a Redis Cluster (`sharded`).
    pub(crate) fn start_with(
        ctx: ShardCtx,
        target: Target,
    ) -> std::io::Result<(Subscriber, Sender<Ctl>)> {
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
            target,
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
        let at = match &sh.target {
            Target::Primary => None,
            Target::Node { at, .. } => Some(at),
        };
        match connect(&sh.ctx, at) {
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
                    log::info!(shard = sh.ctx.idx, addr:% = sh.ctx.addr;
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
                log::warn!(shard = sh.ctx.idx, addr:% = sh.ctx.addr;
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
            b"message" | b"smessage" => {
                let Value::BulkString(payload) = third else {
                    continue;
                };
                forward(sh, routes, chan, payload);
            }
            b"subscribe" | b"unsubscribe" | b"ssubscribe" => confirm(sh, chan, &mut targets),
            b"sunsubscribe" if !dropped(sh, chan) => confirm(sh, chan, &mut targets),
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

pub(super) fn route_of(t: &TopicSub) -> Route {
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
        log::warn!(shard = sh.ctx.idx, addr:% = sh.ctx.addr;
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
        let stored = Body::from_stored(ArcBuf::copy_from_slice(&m.data));
        // Published on this node: its arrival stamp, kept while it went through Redis.
        let Some(body) = stored.map(|b| b.arrived_at(sh.ctx.arrivals.take(m.origin, &m.data)))
        else {
            log::warn!(shard = sh.ctx.idx, addr:% = sh.ctx.addr;
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
            Some(msg) => Event::Live {
                topic,
                msg: msg.clone(),
            },
            None => Event::V1Live {
                topic,
                frame: m.data.clone(),
                origin: m.origin,
            },
        };
        (sh.ctx.events)(w, ev);
    }
}

/// An `sunsubscribe` for a channel still wanted with nothing pending: the server dropped it
/// (its slot moved to another node). It is no longer live here; the cluster's subscriber
/// (`sharded`) is told, and subscribes it where the slot is now. True when so.
fn dropped(sh: &Shared, chan: &[u8]) -> bool {
    let Target::Node { lost, .. } = &sh.target else {
        return false;
    };
    let mut st = sh.lock();
    let Some(t) = st.topics.get_mut(chan) else {
        return false;
    };
    if !t.sub_sent || t.pending > 0 {
        return false;
    }
    t.was_live |= t.live;
    t.live = false;
    let _ = lost.try_send((t.ns, Arc::clone(&t.topic)));
    true
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
            Event::Engine(Followup::Subscribed {
                ns,
                topic: Arc::clone(&topic),
            }),
        );
    }
}
