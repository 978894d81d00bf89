//! The relay as one worker sees it ([`Relay`]): the subscriptions its connections hold
//! ([`subs`]), the [`engine`] that keeps the topics' shared state wherever it lives, and the
//! merge of history and live messages by position ([`feed`]).
//!
//! Connections call in (`subscribe`, `unsubscribe`, `publish`, `add_webhook`); the engine
//! answers with [`Event`]s, at once or later through the worker's mailbox ([`transport`]).
//! Either way the relay turns what it hears into deliveries and hands them to the worker
//! through the [`Recipients`] trait, once per loop round ([`Relay::deliver`]): which
//! connection gets which push or answer is decided here, how bytes reach a socket is not.
//! Refusals are [`RelayError`]s; the connection code maps them to its protocol.

pub mod engine;
pub mod error;
pub mod feed;
pub mod subs;
pub mod transport;

use std::sync::Arc;

use bytes::Bytes;
use slab::Slab;

use crate::config::Limits;
use crate::metrics::{CoreMetrics, Metrics};
use crate::outbuf::{fanout_share_min, fanout_shares_body};

pub use engine::{Done, Engine, Event, Message, Origin, Position, PublishReq, Stored, Ticket};
pub use error::RelayError;
pub use subs::{ConnRef, SubId};
pub use transport::{CoreMsg, Mailboxes, Placement};

use feed::{Feed, Follow, SubState, UNASKED};
use subs::{LocalSub, Removed, Subscriptions};

/// What a worker does with the relay's deliveries: its connections, seen from the relay.
/// Every call names the connection by [`ConnRef`]; a connection that is gone (or not in a
/// state to take it) ignores the call.
pub trait Recipients {
    /// Queues a `waku_subscription` push of `data` for subscription `id`.
    fn push(&mut self, conn: ConnRef, id: &SubId, data: &Bytes, kind: PushKind);
    /// Resolves the answer `answer` of a `waku_publish` the connection is waiting for.
    fn answer(&mut self, conn: ConnRef, answer: u64, result: Result<(), RelayError>);
    /// Answers the connection's `POST /subscribe`.
    fn webhook_answer(&mut self, conn: ConnRef, result: Result<(), RelayError>);
}

/// How a push is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushKind {
    /// A live message; its body is queued by reference from `share_min` bytes (see
    /// `outbuf::fanout_share_min`) and it counts against the outbound limit.
    Live {
        /// Smallest body queued by reference.
        share_min: usize,
    },
    /// History: cached data, queued by reference, not counted as falling behind.
    Replay,
}

/// What a ticket of this worker waits for.
#[derive(Debug)]
enum Waiter {
    /// A connection's `waku_publish`.
    Publish { conn: ConnRef, answer: u64 },
    /// A read of the topic for the subscriptions syncing on this ticket.
    Read { topic: Arc<str> },
    /// A connection's `POST /subscribe`.
    Webhook { conn: ConnRef },
}

/// A delivery decided and not yet carried out.
#[derive(Debug)]
enum Delivery {
    Live {
        slot: u32,
        topic: Arc<str>,
        msg: Message,
    },
    History {
        topic: Arc<str>,
        ticket: Ticket,
        result: Result<engine::History, RelayError>,
    },
    Answer {
        conn: ConnRef,
        answer: u64,
        result: Result<(), RelayError>,
    },
    WebhookAnswer {
        conn: ConnRef,
        result: Result<(), RelayError>,
    },
    Resync {
        topic: Arc<str>,
    },
}

/// A read to ask again (its store failed): the topic, and when.
#[derive(Debug)]
struct Retry {
    topic: Arc<str>,
    ticket: Ticket,
    at: u64,
}

/// Milliseconds before a read that failed is asked again.
const READ_RETRY_MS: u64 = 1000;

/// One worker's share of the relay.
pub struct Relay {
    me: u16,
    /// This process (see `Origin`).
    node: u64,
    subs: Subscriptions,
    engine: Box<dyn Engine>,
    /// What the engine said and the relay has not looked at yet.
    events: Vec<Event>,
    /// What each ticket waits for.
    waiters: Slab<Waiter>,
    /// Deliveries decided since the worker last carried them out.
    queue: Vec<Delivery>,
    /// Pushes the queued deliveries will make: input processing pauses once this reaches
    /// the round's budget (`Limits::fanout_min`).
    pending_pushes: usize,
    fanout_budget: usize,
    retries: Vec<Retry>,
    limits: Limits,
    metrics: Arc<Metrics>,
}

impl Relay {
    /// The relay share of worker `me` of process `node`, over `engine`.
    pub fn new(
        me: usize,
        node: u64,
        engine: Box<dyn Engine>,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Relay {
        Relay {
            me: me as u16,
            node,
            subs: Subscriptions::default(),
            engine,
            events: Vec::new(),
            waiters: Slab::new(),
            queue: Vec::new(),
            pending_pushes: 0,
            fanout_budget: limits.fanout_min,
            retries: Vec::new(),
            limits,
            metrics,
        }
    }

    fn m(&self) -> &CoreMetrics {
        &self.metrics.cores[usize::from(self.me)]
    }

    /// The origin of what connection `uid` of this worker publishes.
    pub fn origin_of(&self, uid: u64) -> Origin {
        Subscriptions::owner(self.node, self.me, uid)
    }

    /// The name of the topic in `slot` (a slot a connection's subscription refers to).
    pub fn topic_name(&self, slot: u32) -> Option<&Arc<str>> {
        self.subs.get(slot).map(|t| &t.name)
    }

    /// The queued deliveries have reached this round's budget: deliver and flush before
    /// processing more input.
    pub fn over_fanout_budget(&self) -> bool {
        self.pending_pushes >= self.fanout_budget
    }

    /// Sets the round's fan-out budget for a worker holding `connections`.
    pub fn set_fanout_budget(&mut self, connections: usize) {
        self.fanout_budget = connections
            .saturating_mul(self.limits.fanout_per_conn)
            .max(self.limits.fanout_min);
    }

    /// Adds a subscription of a local connection; its history follows as pushes, then the
    /// live messages. Returns the topic's slot.
    pub fn subscribe(&mut self, conn: ConnRef, topic: &str, id: SubId) -> u32 {
        let owner = self.origin_of(conn.uid);
        let entry = self.waiters.vacant_entry();
        let ticket = entry.key() as Ticket;
        let follow = Follow {
            state: SubState::Syncing {
                ticket,
                from: Position::ZERO,
            },
            owner,
        };
        let (slot, first) = self.subs.add(topic, LocalSub { conn, id, follow });
        let name = self
            .subs
            .get(slot)
            .map_or_else(|| Arc::from(topic), |t| t.name.clone());
        entry.insert(Waiter::Read {
            topic: name.clone(),
        });
        if first {
            self.engine.watch(&name, &mut self.events);
        }
        self.engine
            .read(&name, Position::ZERO, ticket, &mut self.events);
        self.m().subscriptions.inc();
        self.absorb();
        slot
    }

    /// Removes a local connection's subscription on `slot`.
    pub fn unsubscribe(&mut self, slot: u32, conn: ConnRef) {
        match self.subs.remove(slot, conn) {
            Removed::NotFound => return,
            Removed::Kept => {}
            Removed::Last(name) => self.engine.unwatch(&name, &mut self.events),
        }
        self.m().subscriptions.sub(1);
        self.absorb();
    }

    /// Publishes `data` (the encoded `{"topic":..,"message":..}`) from a local connection,
    /// whose `answer`-th reply waits for the outcome when it is not known at once.
    pub fn publish(
        &mut self,
        conn: ConnRef,
        answer: u64,
        topic: &str,
        data: Bytes,
        ttl: u32,
        prompt: bool,
    ) -> Done<Result<(), RelayError>> {
        self.m().published.inc();
        let topic = self.subs.name(topic).unwrap_or_else(|| Arc::from(topic));
        let req = PublishReq {
            topic,
            data,
            ttl,
            prompt,
            origin: self.origin_of(conn.uid),
        };
        let ticket = self.waiters.insert(Waiter::Publish { conn, answer }) as Ticket;
        let done = self.engine.publish(req, ticket, &mut self.events);
        let done = match done {
            Done::Now(r) => {
                self.waiters.remove(ticket as usize);
                Done::Now(r.map(|_| ()))
            }
            Done::Later => Done::Later,
        };
        self.absorb();
        done
    }

    /// Registers a webhook for a local connection's `POST /subscribe`.
    pub fn add_webhook(
        &mut self,
        conn: ConnRef,
        topic: &str,
        url: &str,
    ) -> Done<Result<(), RelayError>> {
        let topic: Arc<str> = Arc::from(topic);
        let ticket = self.waiters.insert(Waiter::Webhook { conn }) as Ticket;
        let done = self
            .engine
            .add_webhook(&topic, Arc::from(url), ticket, &mut self.events);
        if let Done::Now(_) = done {
            self.waiters.remove(ticket as usize);
        }
        self.absorb();
        done
    }

    /// Handles a batch from the mailbox. Returns `true` when it holds a shutdown order.
    pub fn on_batch(&mut self, batch: Vec<CoreMsg>) -> bool {
        let mut shutdown = false;
        self.m().core_messages_in.add(batch.len() as u64);
        for msg in batch {
            match msg {
                CoreMsg::Engine(m) => self.engine.on_message(m, &mut self.events),
                CoreMsg::Shutdown => shutdown = true,
                // The worker's own; it takes them out of the batch first.
                CoreMsg::Reload(_) => {}
            }
        }
        self.absorb();
        shutdown
    }

    /// Periodic work at `now` (worker clock, ms): the engine's, and failed reads again.
    pub fn tick(&mut self, now: u64) {
        self.engine.tick(now, &mut self.events);
        if !self.retries.is_empty() {
            let due: Vec<Retry> = {
                let (due, later) = std::mem::take(&mut self.retries)
                    .into_iter()
                    .partition(|r| r.at <= now);
                self.retries = later;
                due
            };
            for r in due {
                self.retry(&r.topic, r.ticket);
            }
        }
        self.absorb();
    }

    /// End of the loop iteration, before sockets are written: the engine hands its work on.
    /// Returns `true` when something waits for room (come back within a millisecond).
    pub fn flush(&mut self) -> bool {
        let waiting = self.engine.flush(&mut self.events);
        self.absorb();
        waiting
    }

    /// Turns the engine's events into deliveries.
    fn absorb(&mut self) {
        for ev in std::mem::take(&mut self.events) {
            let d = match ev {
                Event::Live { topic, msg } => {
                    let Some(slot) = self.subs.find(&topic) else {
                        continue;
                    };
                    let Some(t) = self.subs.get(slot) else {
                        continue;
                    };
                    self.pending_pushes += t.subs.len();
                    let topic = t.name.clone();
                    Delivery::Live { slot, topic, msg }
                }
                Event::Published { ticket, result } => {
                    match self.waiters.try_remove(ticket as usize) {
                        Some(Waiter::Publish { conn, answer }) => Delivery::Answer {
                            conn,
                            answer,
                            result: result.map(|_| ()),
                        },
                        _ => continue,
                    }
                }
                Event::History { ticket, result } => {
                    match self.waiters.try_remove(ticket as usize) {
                        Some(Waiter::Read { topic }) => {
                            if let Ok(h) = &result {
                                self.pending_pushes += h.messages.len();
                            }
                            Delivery::History {
                                topic,
                                ticket,
                                result,
                            }
                        }
                        _ => continue,
                    }
                }
                Event::WebhookAdded { ticket, result } => {
                    match self.waiters.try_remove(ticket as usize) {
                        Some(Waiter::Webhook { conn }) => Delivery::WebhookAnswer { conn, result },
                        _ => continue,
                    }
                }
                Event::Resync { topic } => Delivery::Resync { topic },
            };
            self.queue.push(d);
        }
    }

    /// Asks again for a read that failed: its subscriptions move to a new one.
    fn retry(&mut self, topic: &Arc<str>, old: Ticket) {
        let Some(slot) = self.subs.find(topic) else {
            return;
        };
        let Some(t) = self.subs.get_named(slot, topic) else {
            return;
        };
        Feed::retag(&mut t.subs, old, UNASKED);
        let from = t
            .subs
            .iter()
            .filter_map(|s| match s.follow.state {
                SubState::Syncing { ticket, from } if ticket == UNASKED => Some(from),
                _ => None,
            })
            .min();
        if let Some(from) = from {
            self.ask(topic, from);
        }
    }

    /// Carries out the queued deliveries on the worker's connections.
    pub fn deliver(&mut self, to: &mut impl Recipients) {
        // Reads answered at once while delivering (a resync) queue more: a few rounds.
        for _ in 0..4 {
            if self.queue.is_empty() {
                break;
            }
            let list = std::mem::take(&mut self.queue);
            self.pending_pushes = 0;
            for d in list {
                self.deliver_one(d, to);
            }
            self.absorb();
        }
    }

    fn deliver_one(&mut self, d: Delivery, to: &mut impl Recipients) {
        match d {
            Delivery::Live { slot, topic, msg } => self.deliver_live(slot, &topic, msg, to),
            Delivery::History {
                topic,
                ticket,
                result,
            } => self.deliver_history(&topic, ticket, result, to),
            Delivery::Answer {
                conn,
                answer,
                result,
            } => to.answer(conn, answer, result),
            Delivery::WebhookAnswer { conn, result } => to.webhook_answer(conn, result),
            Delivery::Resync { topic } => {
                if let Some(slot) = self.subs.find(&topic) {
                    self.resync(slot);
                }
            }
        }
    }

    fn deliver_live(
        &mut self,
        slot: u32,
        topic: &Arc<str>,
        mut msg: Message,
        to: &mut impl Recipients,
    ) {
        let hold = self.limits.max_cached_per_topic;
        let Some(t) = self.subs.get_named(slot, topic) else {
            return;
        };
        let n = t.subs.len();
        // A big fan-out queues the body by reference in every connection (a reference
        // count bumped per subscriber): this worker takes its own copy, once, so that
        // count's cache line does not bounce between the cores sharing the original.
        if n > 1 && fanout_shares_body(n, msg.data.len()) {
            msg.data = Bytes::copy_from_slice(&msg.data);
        }
        let kind = PushKind::Live {
            share_min: fanout_share_min(n, msg.data.len()),
        };
        let again = t
            .feed
            .deliver_live(&mut t.subs, &msg, hold, &mut |s: &mut LocalSub, m| {
                to.push(s.conn, &s.id, &m.data, kind)
            });
        if let Some(from) = again {
            self.ask(topic, from);
        }
    }

    fn deliver_history(
        &mut self,
        topic: &Arc<str>,
        ticket: Ticket,
        result: Result<engine::History, RelayError>,
        to: &mut impl Recipients,
    ) {
        let Some(slot) = self.subs.find(topic) else {
            return;
        };
        let history = match result {
            Ok(h) => h,
            Err(_) => {
                // The store could not answer: the subscriptions keep waiting; ask again.
                let at = crate::clock::now_ms() + READ_RETRY_MS;
                let topic = topic.clone();
                self.retries.push(Retry { topic, ticket, at });
                return;
            }
        };
        let Some(t) = self.subs.get_named(slot, topic) else {
            return;
        };
        let again = t.feed.on_history(
            &mut t.subs,
            ticket,
            &history,
            &mut |s: &mut LocalSub, m: &Message| to.push(s.conn, &s.id, &m.data, PushKind::Replay),
        );
        if let Some(from) = again {
            Feed::retag(&mut t.subs, ticket, UNASKED);
            self.ask(topic, from);
        }
    }

    /// Every subscription of the topic in `slot` reads again from its position.
    fn resync(&mut self, slot: u32) {
        let Some(topic) = self.subs.get(slot).map(|t| t.name.clone()) else {
            return;
        };
        let Some(t) = self.subs.get_named(slot, &topic) else {
            return;
        };
        if let Some(from) = t.feed.resync_all(&mut t.subs) {
            self.metrics.cores[usize::from(self.me)].resyncs.inc();
            self.ask(&topic, from);
        }
    }

    /// Reads the topic after `from` for its subscriptions waiting on [`UNASKED`].
    fn ask(&mut self, topic: &Arc<str>, from: Position) {
        let Some(slot) = self.subs.find(topic) else {
            return;
        };
        let Some(t) = self.subs.get_named(slot, topic) else {
            return;
        };
        let ticket = self.waiters.insert(Waiter::Read {
            topic: t.name.clone(),
        }) as Ticket;
        Feed::retag(&mut t.subs, UNASKED, ticket);
        let name = t.name.clone();
        self.engine.read(&name, from, ticket, &mut self.events);
    }
}
