//! The relay as one worker sees it ([`Relay`]): the subscriptions its connections hold
//! ([`subs`]), the engine (`crate::engine`, a floor below) that keeps the topics' shared
//! state wherever it lives, and the merge of history and live messages by position
//! ([`feed`]).
//!
//! Connections call in (`subscribe`, `unsubscribe`, `publish`, `add_webhook`); the engine
//! answers with [`Event`]s, at once or later (from its mailbox, read in [`Relay::on_mail`]).
//! Either way the relay queues what it hears and, once per loop round ([`Relay::deliver`]),
//! returns what the worker's connections get as [`Deliveries`] for the worker to apply:
//! which connection gets which push or answer is decided here, how bytes reach a socket is
//! not.
//! Refusals are [`RelayError`]s; the connection code maps them to its protocol.

pub mod feed;
pub mod subs;

mod blocking;
mod client_subs;
mod deliver;
mod deliveries;
mod v1;

use std::sync::Arc;

use slab::Slab;

use crate::config::Limits;
use crate::metrics::{CoreMetrics, Metrics, Pending, Stamp};

pub use crate::engine::{
    ClientRef, Done, Engine, Event, Message, Origin, Position, PublishReq, RelayError, Stored,
    Ticket,
};
pub use crate::message::{Body, Meta};
pub use crate::rpc::Dialect;
pub use deliver::EARLY_DELIVERY_BYTES;
pub use deliveries::{Deliveries, Delivery, Fetched, Outgoing, SubAt};
pub use subs::{ConnRef, SubId};

use feed::{Follow, SubState};
use subs::{Added, LocalSub, Removed, Subscriptions};

/// One publish a local connection asks for ([`Relay::publish`]).
#[derive(Debug)]
pub struct Publishing<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The message, as the request gave it.
    pub message: &'a str,
    /// What the stored body carries besides (`publishedAt`, `tag`, `attestation`).
    pub meta: Meta<'a>,
    /// Seconds to keep it cached.
    pub ttl: u32,
    /// Push notifications wanted.
    pub prompt: bool,
    /// The publishing connection's client id, when it has one (its watches hear of it).
    pub publisher: Option<Arc<ClientRef>>,
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
    /// A connection's `waku_publish`, read when `arrived` (`metrics::Stamp`).
    Publish {
        conn: ConnRef,
        answer: u64,
        arrived: Stamp,
    },
    /// A read of the topic for the subscriptions syncing on this ticket.
    Read { topic: Arc<str> },
    /// A connection's `POST /subscribe`.
    Webhook { conn: ConnRef },
    /// A connection's v1 `sub`: the topic's pending frames.
    V1Take { conn: ConnRef },
    /// A connection's fetch of a topic after a position.
    Fetch {
        conn: ConnRef,
        answer: u64,
        topic: Arc<str>,
        after: Position,
    },
}

/// An event the relay looked at and will carry out this round.
#[derive(Debug)]
struct Queued {
    event: Event,
    /// For a live message: its topic's slot here (found once, when it was queued).
    slot: u32,
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
    v1: subs::V1Subscriptions,
    engine: Box<dyn Engine>,
    /// What the engine said and the relay has not looked at yet.
    events: Vec<Event>,
    /// What waits for the engine: its tickets, the reads to ask again, the blocking
    /// subscribes.
    waiting: Waiting,
    /// Events to carry out since the worker last delivered, and what they will cost.
    queue: DeliveryQueue,
    limits: Limits,
    metrics: Arc<Metrics>,
    /// Who is told about client ids' messages (their acknowledgements: `client_subs.rs`).
    notify: Arc<dyn crate::notice::Notify>,
    /// The round's stamp, and the acks and pushes it made until the worker wrote them
    /// (`metrics::latency`).
    latency: Pending,
}

/// What a relay waits for from its engine.
#[derive(Debug, Default)]
struct Waiting {
    /// What each ticket waits for.
    tickets: Slab<Waiter>,
    /// Reads to ask again.
    retries: Vec<Retry>,
    /// Blocking subscribes waiting for their subscription to be in place.
    blocking: Vec<blocking::Blocking>,
}

/// The events a relay will carry out at the worker's next delivery, and what they will cost.
#[derive(Debug, Default)]
struct DeliveryQueue {
    /// The events, in order.
    items: Vec<Queued>,
    /// An empty vector with room, swapped with `items` while they are carried out.
    spare: Vec<Queued>,
    /// Pushes the queued deliveries will make: input processing pauses once this reaches
    /// the round's fan-out budget (`conn::Turn`, set by the worker's round).
    pushes: usize,
    /// Bytes of message bodies the queued live deliveries will copy (each body once per
    /// subscriber): see [`Relay::early_delivery_due`].
    bytes: usize,
    /// What the events carried out so far decided, for [`Relay::deliver`] to return.
    out: Deliveries,
    /// An empty vector with room, swapped with the relay's `events` while they are looked
    /// at (so a round does not allocate them again); see [`recycle`].
    spare_events: Vec<Event>,
    /// The local slot of the topic last published from here, if it has subscriptions here
    /// (see `absorb`).
    live_hint: Option<u32>,
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
        let engine_notify = engine.notifier();
        Relay {
            me: me as u16,
            node,
            subs: Subscriptions::default(),
            v1: subs::V1Subscriptions::default(),
            engine,
            events: Vec::new(),
            waiting: Waiting::default(),
            queue: DeliveryQueue::default(),
            limits,
            metrics,
            notify: engine_notify,
            latency: Pending::default(),
        }
    }

    /// A worker round begins: what it reads is stamped `at` (`clock::stamp`).
    #[inline]
    pub fn begin_round(&mut self, at: Stamp) {
        self.latency.begin(at);
    }

    /// The round's output is on the sockets at `now` (`clock::stamp`): its acks and pushes
    /// become samples of the worker's latency histograms.
    #[inline]
    pub fn written(&mut self, now: Stamp) {
        if !self.latency.is_empty() {
            let m = &self.metrics.cores[usize::from(self.me)];
            self.latency.written(now, &m.latency);
        }
    }

    fn m(&self) -> &CoreMetrics {
        &self.metrics.cores[usize::from(self.me)]
    }

    /// This process's node id (see `Origin`).
    pub fn node(&self) -> u64 {
        self.node
    }

    /// The origin of what connection `uid` of this worker publishes.
    pub fn origin_of(&self, uid: u64) -> Origin {
        Subscriptions::owner(self.node, self.me, uid)
    }

    /// The name of the topic in `slot` (a slot a connection's subscription refers to).
    pub fn topic_name(&self, slot: u32) -> Option<&Arc<str>> {
        self.subs.get(slot).map(|t| &t.name)
    }

    /// Pushes the queued deliveries will make (weighed against the round's fan-out budget:
    /// `conn::Turn`).
    pub fn pending_pushes(&self) -> usize {
        self.queue.pushes
    }

    /// Adds a subscription of a local connection; its history follows as pushes, then the
    /// live messages. Returns the topic's slot.
    pub fn subscribe(&mut self, conn: ConnRef, topic: &str, id: SubId, dialect: Dialect) -> u32 {
        self.add_sub(conn, topic, None, id, dialect, None)
    }

    /// A local connection's subscription, of `client` when it has one (see
    /// [`Relay::subscribe_as`]).
    fn add_sub(
        &mut self,
        conn: ConnRef,
        topic: &str,
        name: Option<&Arc<str>>,
        id: SubId,
        dialect: Dialect,
        client: Option<Arc<ClientRef>>,
    ) -> u32 {
        let owner = self.origin_of(conn.uid);
        let entry = self.waiting.tickets.vacant_entry();
        let ticket = entry.key() as Ticket;
        let follow = Follow {
            state: SubState::Syncing {
                ticket,
                from: Position::ZERO,
            },
            owner,
        };
        let sub = LocalSub {
            conn,
            id,
            dialect,
            follow,
            client: client.clone(),
        };
        let added = self.subs.add(topic, name, sub);
        let slot = added.slot();
        let name = self
            .subs
            .get(slot)
            .map_or_else(|| Arc::from(topic), |t| t.name.clone());
        entry.insert(Waiter::Read {
            topic: name.clone(),
        });
        if let Added::FirstHere(_) = added {
            self.engine.watch(&name, &mut self.events);
        }
        match &client {
            // After what the client was given (DECISIONS 13: each message once).
            Some(c) => {
                let ev = &mut self.events;
                self.engine
                    .read_for(&name, Position::ZERO, c, None, ticket, ev)
            }
            None => self
                .engine
                .read(&name, Position::ZERO, ticket, &mut self.events),
        }
        self.m().subscriptions.inc();
        self.absorb();
        slot
    }

    /// Removes a local connection's subscription on `slot` (its socket closed, or a
    /// connection without a client id unsubscribed): a client id's subscription stays,
    /// given everything up to where the socket's reached.
    pub fn unsubscribe(&mut self, slot: u32, conn: ConnRef) {
        self.socket_gone(slot, conn, None);
        self.remove_sub(slot, conn);
    }

    /// Removes the socket's subscription on `slot` from the table.
    fn remove_sub(&mut self, slot: u32, conn: ConnRef) {
        match self.subs.remove(slot, conn) {
            Removed::NotFound => return,
            Removed::Kept => {}
            Removed::Last(name) => self.engine.unwatch(&name, &mut self.events),
        }
        self.m().subscriptions.sub(1);
        self.absorb();
    }

    /// Where connection `conn`'s subscription on `slot` stands: everything up to this
    /// position was given to it (`None` when it has none there).
    pub fn sub_position(&self, slot: u32, conn: ConnRef) -> Option<Position> {
        let s = self.subs.get(slot)?.subs.iter().find(|s| s.conn == conn)?;
        Some(match s.follow.state {
            SubState::Active(at) => at,
            SubState::Syncing { from, .. } => from,
        })
    }

    /// The subscription `at` names (while the deliveries that name it are applied), and
    /// its topic.
    #[inline]
    pub fn sub_at(&self, at: SubAt) -> Option<(&LocalSub, &Arc<str>)> {
        let t = self.subs.get(at.slot)?;
        Some((t.subs.get(at.index as usize)?, &t.name))
    }

    /// Reads `topic` after `after` for a local connection's fetch; answered through
    /// a [`Delivery::Fetched`] with the connection's answer number `answer`.
    pub fn fetch(&mut self, conn: ConnRef, answer: u64, topic: &str, after: Position) {
        let topic: Arc<str> = match self.subs.name_and_slot(topic) {
            Some((name, _)) => name,
            None => Arc::from(topic),
        };
        let ticket = self.waiting.tickets.insert(Waiter::Fetch {
            conn,
            answer,
            topic: topic.clone(),
            after,
        }) as Ticket;
        self.engine.read(&topic, after, ticket, &mut self.events);
        self.absorb();
    }

    /// Publishes `p.message` (encoded here with `p.meta`, once: `message::Body`) from a
    /// local connection, whose `answer`-th reply waits for the outcome when it is not known
    /// at once.
    pub fn publish(
        &mut self,
        conn: ConnRef,
        answer: u64,
        p: Publishing<'_>,
    ) -> Done<Result<(), RelayError>> {
        let Publishing {
            topic,
            message,
            meta,
            ttl,
            prompt,
            publisher,
        } = p;
        self.m().published.inc();
        let (topic, hint) = match self.subs.name_and_slot(topic) {
            Some((name, slot)) => (name, Some(slot)),
            None => (Arc::from(topic), None),
        };
        self.queue.live_hint = hint;
        // The engine starts loading what the store will touch, then the body is encoded
        // while those lines arrive.
        let hash = self.engine.prepare_publish(&topic, message);
        let arrived = self.latency.round();
        let body = Body::encode(&topic, message, meta).arrived_at(arrived);
        // The hash is of `message` as it is: it is the body's when JSON wrote it verbatim.
        let verbatim = body.is_verbatim(&topic, message);
        let req = PublishReq {
            topic,
            body,
            ttl,
            prompt,
            origin: self.origin_of(conn.uid),
            hash: hash.filter(|_| verbatim),
            publisher,
        };
        // The ticket is taken only for an answer that comes later: most publishes are
        // answered at once (their topic's home is this worker), and their event, if any,
        // is looked at only after this (`absorb`).
        let entry = self.waiting.tickets.vacant_entry();
        let ticket = entry.key() as Ticket;
        let done = match self.engine.publish(req, ticket, &mut self.events) {
            Done::Now(r) => {
                self.latency.ack(arrived);
                Done::Now(r.map(|_| ()))
            }
            Done::Later => {
                entry.insert(Waiter::Publish {
                    conn,
                    answer,
                    arrived,
                });
                Done::Later
            }
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
        let ticket = self.waiting.tickets.insert(Waiter::Webhook { conn }) as Ticket;
        let done = self
            .engine
            .add_webhook(&topic, Arc::from(url), ticket, &mut self.events);
        if let Done::Now(_) = done {
            self.waiting.tickets.remove(ticket as usize);
        }
        self.absorb();
        done
    }

    /// Lets the engine read its mailbox (other workers' engines, its helper threads): at
    /// most `budget` batches this round.
    pub fn on_mail(&mut self, budget: usize) {
        let taken = self.engine.on_mail(budget, &mut self.events);
        if taken > 0 {
            self.m().core_messages_in.add(taken as u64);
            self.absorb();
        }
    }

    /// Something waits in the engine's mailbox.
    pub fn has_mail(&self) -> bool {
        self.engine.has_mail()
    }

    /// Periodic work at `now` (worker clock, ms): the engine's, and failed reads again.
    pub fn tick(&mut self, now: u64) {
        self.engine.tick(now, &mut self.events);
        if !self.waiting.retries.is_empty() {
            let due: Vec<Retry> = {
                let (due, later) = std::mem::take(&mut self.waiting.retries)
                    .into_iter()
                    .partition(|r| r.at <= now);
                self.waiting.retries = later;
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
    pub fn flush(&mut self) -> crate::engine::Handoff {
        let handoff = self.engine.flush(&mut self.events);
        self.absorb();
        handoff
    }

    /// Turns the engine's events into deliveries.
    fn absorb(&mut self) {
        // Mostly one event (a publish's own live message) or none: taken as it is, without
        // swapping the vectors.
        if self.events.len() <= 1 {
            if let Some(ev) = self.events.pop() {
                self.absorb_one(ev);
            }
            return;
        }
        let mut events = std::mem::replace(
            &mut self.events,
            std::mem::take(&mut self.queue.spare_events),
        );
        for ev in events.drain(..) {
            self.absorb_one(ev);
        }
        self.queue.spare_events = recycle(events);
    }

    /// Queues one event to carry out (or nothing: a topic without subscriptions here, a
    /// ticket nobody waits for), counting the pushes it will make.
    fn absorb_one(&mut self, mut event: Event) {
        let mut slot = 0;
        match &mut event {
            Event::Live { topic, msg } => {
                // The topic just published here is found without hashing it again
                // (the name's pointer proves the slot still holds it).
                let hinted = self.queue.live_hint.filter(|&s| {
                    self.subs
                        .get(s)
                        .is_some_and(|t| Arc::ptr_eq(&t.name, topic))
                });
                let Some(found) = hinted.or_else(|| self.subs.find(topic)) else {
                    return;
                };
                let Some(t) = self.subs.get(found) else {
                    return;
                };
                self.queue.pushes += t.subs.len();
                self.queue.bytes += t.subs.len() * msg.body.len();
                // Delivered under the slot's own name (`get_named` compares pointers).
                if !Arc::ptr_eq(&t.name, topic) {
                    *topic = t.name.clone();
                }
                slot = found;
            }
            Event::Published { ticket, .. } | Event::WebhookAdded { ticket, .. } => {
                if !self.waiting.tickets.contains(*ticket as usize) {
                    return;
                }
            }
            Event::V1Pending { ticket, frames } => {
                if !self.waiting.tickets.contains(*ticket as usize) {
                    return;
                }
                self.queue.pushes += frames.len();
            }
            Event::History { ticket, result } => match self.waiting.tickets.get(*ticket as usize) {
                Some(Waiter::Read { .. }) => {
                    if let Ok(h) = result {
                        self.queue.pushes += h.messages.len();
                    }
                }
                Some(_) => {}
                None => return,
            },
            Event::Resync { .. } => {}
            Event::V1Live { topic, .. } => self.queue.pushes += self.v1.of(topic).len(),
            Event::Engine(never) => match *never {},
        }
        self.queue.items.push(Queued { event, slot });
    }
}

/// Most entries an emptied event or delivery vector keeps room for (past a bigger burst,
/// its memory goes back). A closed-loop round of thousands of publishes fills them with
/// thousands of entries, and growing them again each round (by doubling, copying) costs
/// instructions per message (docs/PERFORMANCE.md, "Smaller choices"). At most ~400 KB
/// per vector and worker, and only once a round that large has happened.
const RECYCLE_MAX: usize = 4096;

/// `v`, emptied, to be used again: kept with its room unless a burst made it large.
fn recycle<T>(mut v: Vec<T>) -> Vec<T> {
    v.clear();
    if v.capacity() > RECYCLE_MAX {
        Vec::new()
    } else {
        v
    }
}
