//! A Redis Cluster shard's subscriber (DECISIONS §12): live messages use sharded pub/sub
//! (`SPUBLISH` in the scripts, `SSUBSCRIBE` here), so a message crosses only the nodes of
//! its slot, and a topic's channel must be subscribed on the node that serves its slot now.
//!
//! Owns: one `pubsub::Subscriber` per primary that serves a watched topic (started on first
//! use, each with its own connection, health and counters), which topic is subscribed
//! where, and moving a topic when its slot moves: on a new slot map from the command thread
//! (`MapCell`), or when a node drops a channel (its `sunsubscribe` push), the topic is
//! unwatched on the old node and watched on the new one, whose confirmation sends the
//! workers `Subscribed` (they read from their last position: no gap). Must not touch the
//! command connections or worker state.
//!
//! One thread: it takes the workers' `watch`/`unwatch` (the same [`Ctl`] queue as a
//! standalone shard's subscriber), the nodes' "dropped" reports and the command thread's
//! "back" bell, and every [`TICK`] adds the nodes' health and counters up into the shard's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{select, Receiver, Sender};

use super::addr::Endpoint;
use super::command::{set_health, Health, ShardCtx};
use super::pubsub::{Ctl, Subscriber, Target};
use super::slots::{topic_slot, SlotMap};
use super::stats::ShardStats;

/// How often the nodes' health and counters are added up, and the map checked.
const TICK: Duration = Duration::from_millis(100);

/// One node's subscriber.
struct NodeSub {
    sub: Subscriber,
    tx: Sender<Ctl>,
    /// Its own "commands are back" bell (it reads its live topics again).
    back: Sender<()>,
    health: Arc<Health>,
    stats: Arc<ShardStats>,
}

/// A watched topic: who watches it and where it is subscribed.
struct Watched {
    watchers: Vec<usize>,
    /// The node it is subscribed on (`None`: no node serves its slot right now).
    node: Option<Endpoint>,
}

/// The subscriber of a Redis Cluster shard.
pub(crate) struct ShardedSubscriber {
    stop: Arc<AtomicBool>,
    stop_tx: Mutex<Option<Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl ShardedSubscriber {
    /// Starts the thread; returns it and the sender of its control queue.
    pub(crate) fn start(ctx: ShardCtx) -> std::io::Result<(ShardedSubscriber, Sender<Ctl>)> {
        let (ctl_tx, ctl_rx) = crossbeam_channel::bounded(ctx.cfg.watch_queue.max(1));
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let (lost_tx, lost_rx) = crossbeam_channel::bounded(ctx.cfg.watch_queue.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let name = format!("redis-ssub-{}", ctx.idx);
        let mut c = Control {
            ctx,
            nodes: HashMap::new(),
            topics: HashMap::new(),
            lost_tx,
            gen: u64::MAX,
            map: Arc::new(SlotMap::default()),
            retired: Retired::default(),
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || c.run(&ctl_rx, &lost_rx, &stop_rx))?;
        Ok((
            ShardedSubscriber {
                stop,
                stop_tx: Mutex::new(Some(stop_tx)),
                thread: Mutex::new(Some(thread)),
            },
            ctl_tx,
        ))
    }

    /// Stops the thread and every node's subscriber.
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        drop(
            self.stop_tx
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// Counters of node subscribers that were stopped (so the shard's totals never go down).
#[derive(Default)]
struct Retired {
    live_received: u64,
    reconnects: u64,
    resyncs: u64,
}

struct Control {
    ctx: ShardCtx,
    nodes: HashMap<Endpoint, NodeSub>,
    topics: HashMap<(u8, Arc<str>), Watched>,
    lost_tx: Sender<(u8, Arc<str>)>,
    /// The map generation last acted on, and that map.
    gen: u64,
    map: Arc<SlotMap>,
    retired: Retired,
}

impl Control {
    fn run(&mut self, ctl: &Receiver<Ctl>, lost: &Receiver<(u8, Arc<str>)>, stop: &Receiver<()>) {
        set_health(&self.ctx.health.pubsub, Some("not connected yet".into()));
        let back = self.ctx.commands_back.1.clone();
        loop {
            select! {
                recv(ctl) -> m => match m {
                    Ok(m) => self.handle(m),
                    Err(_) => break,
                },
                recv(lost) -> t => if let Ok((ns, topic)) = t {
                    self.place(ns, &topic, true);
                },
                recv(back) -> _ => for n in self.nodes.values() {
                    let _ = n.back.try_send(());
                },
                recv(stop) -> _ => break,
                default(TICK) => {}
            }
            if self.ctx.map.gen() != self.gen {
                self.gen = self.ctx.map.gen();
                self.map = self.ctx.map.get();
                let all: Vec<(u8, Arc<str>)> = self.topics.keys().cloned().collect();
                for (ns, topic) in all {
                    self.place(ns, &topic, false);
                }
                self.retire();
            }
            self.add_up();
        }
        for (_, n) in self.nodes.drain() {
            n.sub.shutdown();
        }
    }

    /// The node serving a topic's slot now.
    fn owner(&self, topic: &str) -> Option<Endpoint> {
        let slot = topic_slot(topic.as_bytes());
        self.map.owner(slot).map(|i| self.map.nodes[i].clone())
    }

    /// The subscriber of node `at`, started when needed.
    fn node(&mut self, at: &Endpoint) -> Option<&NodeSub> {
        if !self.nodes.contains_key(at) {
            let mut c = self.ctx.clone();
            let health = Arc::new(Health::default());
            let stats = Arc::new(ShardStats::default());
            let back = crossbeam_channel::bounded(1);
            c.health = Arc::clone(&health);
            c.stats = Arc::clone(&stats);
            c.commands_back = back.clone();
            let target = Target::Node {
                at: at.clone(),
                lost: self.lost_tx.clone(),
            };
            match Subscriber::start_with(c, target) {
                Ok((sub, tx)) => {
                    self.nodes.insert(
                        at.clone(),
                        NodeSub {
                            sub,
                            tx,
                            back: back.0,
                            health,
                            stats,
                        },
                    );
                }
                Err(e) => {
                    log::error!(shard = self.ctx.idx, addr:% = self.ctx.addr;
                        "redis shard {}: cannot start a subscriber for {at}: {e}",
                        self.ctx.addr
                    );
                    return None;
                }
            }
        }
        self.nodes.get(at)
    }

    fn send(&mut self, at: &Endpoint, m: Ctl) {
        if let Some(n) = self.node(at) {
            // The node's queue is as long as the shard's: full only if the shard's was.
            let _ = n.tx.try_send(m);
        }
    }

    fn handle(&mut self, m: Ctl) {
        match m {
            Ctl::Watch { worker, ns, topic } => {
                let key = (ns, Arc::clone(&topic));
                let known = self.topics.contains_key(&key);
                let w = self.topics.entry(key).or_insert_with(|| Watched {
                    watchers: Vec::new(),
                    node: None,
                });
                if !w.watchers.contains(&worker) {
                    w.watchers.push(worker);
                }
                if let (true, Some(at)) = (known, w.node.clone()) {
                    self.send(&at, Ctl::Watch { worker, ns, topic });
                } else {
                    self.place(ns, &topic, false);
                }
            }
            Ctl::Unwatch { worker, ns, topic } => {
                let key = (ns, Arc::clone(&topic));
                let Some(w) = self.topics.get_mut(&key) else {
                    return;
                };
                w.watchers.retain(|x| *x != worker);
                let (at, empty) = (w.node.clone(), w.watchers.is_empty());
                if empty {
                    self.topics.remove(&key);
                }
                if let Some(at) = at {
                    self.send(&at, Ctl::Unwatch { worker, ns, topic });
                }
            }
        }
    }

    /// Subscribes a topic on the node serving its slot, moving it from where it was
    /// (`again`: the node dropped it, subscribe it anew even on the same node).
    fn place(&mut self, ns: u8, topic: &Arc<str>, again: bool) {
        let owner = self.owner(topic);
        let Some(w) = self.topics.get_mut(&(ns, Arc::clone(topic))) else {
            return;
        };
        if w.node == owner && !again {
            return;
        }
        let old = std::mem::replace(&mut w.node, owner.clone());
        let watchers = w.watchers.clone();
        if let Some(old) = old {
            for &worker in &watchers {
                let topic = Arc::clone(topic);
                self.send(&old, Ctl::Unwatch { worker, ns, topic });
            }
        }
        // No owner: no node serves the slot now; placed again with the next map (the command
        // thread reads it again while a slot has no owner).
        if let Some(at) = owner {
            for worker in watchers {
                let topic = Arc::clone(topic);
                self.send(&at, Ctl::Watch { worker, ns, topic });
            }
        }
    }

    /// Stops the subscribers of nodes that are no primary any more and hold no topic.
    fn retire(&mut self) {
        let used: Vec<Endpoint> = self
            .topics
            .values()
            .filter_map(|w| w.node.clone())
            .collect();
        let gone: Vec<Endpoint> = self
            .nodes
            .keys()
            .filter(|at| !used.contains(at) && !self.map.nodes.contains(at))
            .cloned()
            .collect();
        for at in gone {
            if let Some(n) = self.nodes.remove(&at) {
                self.retired.live_received += n.stats.live_received.get();
                self.retired.reconnects += n.stats.reconnects_pubsub.get();
                self.retired.resyncs += n.stats.resyncs.get();
                n.sub.shutdown();
            }
        }
    }

    /// The shard's pub/sub health and counters from its nodes'.
    fn add_up(&self) {
        let mut why = Vec::new();
        let mut up = true;
        let (mut live, mut reconnects, mut resyncs) = (
            self.retired.live_received,
            self.retired.reconnects,
            self.retired.resyncs,
        );
        for (at, n) in &self.nodes {
            if let Some(e) = n
                .health
                .pubsub
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                why.push(format!("{at}: {e}"));
            }
            up &= n.stats.pubsub_up.get() == 1;
            live += n.stats.live_received.get();
            reconnects += n.stats.reconnects_pubsub.get();
            resyncs += n.stats.resyncs.get();
        }
        let s = &self.ctx.stats;
        s.pubsub_up.set(u64::from(up));
        s.live_received.set(live);
        s.reconnects_pubsub.set(reconnects);
        s.resyncs.set(resyncs);
        let why = (!why.is_empty()).then(|| why.join("; "));
        set_health(&self.ctx.health.pubsub, why);
    }
}
