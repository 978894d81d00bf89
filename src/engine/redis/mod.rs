//! The Redis engine (DECISIONS §7): a topic's state lives in Redis, on the shard its stable
//! hash picks (`cluster::ring`), shared by every node of the cluster. Each worker runs one
//! [`RedisEngine`] over a [`ClusterHandle`]: every request is a `try_send` to the node's
//! per-shard command thread (`cluster::shard`), every answer and live message comes back as
//! an [`Event`] through the engine's own mailbox ([`build`] makes them): the relay's own
//! (`Live`, `WebhookAdded`) passed on as it is, or `Event::Engine` with a
//! [`Followup`], which this engine finishes with its own state (below).
//!
//! What this engine adds to the cluster side:
//! - **reads wait for the subscription**: a worker's first read of a topic is held until
//!   Redis confirmed the node's channel subscription (the cluster's first `Subscribed` of the
//!   topic), so every message is in the history read, on the channel, or both;
//! - **paged reads are joined**: a history of more than one page is read page after page and
//!   answered once whole;
//! - **webhooks**: the publish script returns the topic's webhooks to the publishing node
//!   only, which calls them: one POST per stored publish in the whole cluster;
//! - a later `Subscribed` (a reconnect, an outage over) is said as `Event::Resync`:
//!   subscriptions read again after their positions;
//! - **WalletConnect 1.0 frames** across the nodes: [`v1`];
//! - **subscriptions that belong to the client id** (DECISIONS 13), kept in Redis, their
//!   notices and pushes sent by the publishing node: `clients`.

mod build;
mod clients;
pub mod cluster;
mod v1;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Done, Engine, Event, Events, History, Message, Position, PublishReq, Stored, Ticket, V1Publish,
};
use crate::engine::RelayError;
use crate::mailbox::Receiver;
use crate::webhook::{Delivery as WebhookCall, WebhookPool};
pub use build::build;
pub use clients::NodeMailboxes;
use cluster::{ClusterHandle, Followup, PublishOutcome, NS_V1, NS_V2};

/// A topic this worker watches.
#[derive(Debug, Default)]
struct Watch {
    /// Redis confirmed the node's subscription: reads go out at once.
    live: bool,
    /// Reads held until then.
    held: Vec<(Ticket, Position)>,
}

/// A history read in progress: the pages so far.
#[derive(Debug)]
struct Reading {
    topic: Arc<str>,
    messages: Vec<Message>,
}

/// One worker's Redis engine.
pub struct RedisEngine {
    handle: ClusterHandle,
    webhooks: WebhookPool,
    watched: HashMap<Arc<str>, Watch, ahash::RandomState>,
    /// Publishes waiting for their answer: the topic (for the webhook calls) and what their
    /// notices need.
    publishing: HashMap<Ticket, clients::Publishing, ahash::RandomState>,
    reading: HashMap<Ticket, Reading, ahash::RandomState>,
    /// Watch requests refused (a full queue): namespace and topic, asked again at the next
    /// tick.
    unasked: Vec<(u8, Arc<str>)>,
    /// WalletConnect 1.0 frames.
    v1: v1::V1State,
    /// What the node's cluster threads send this worker.
    inbox: Receiver<Event<Followup>>,
    /// Client ids (DECISIONS 13): settings, the node's count, who is told.
    mail: clients::Mail,
    /// Reads for client ids in flight.
    reads_for: HashMap<Ticket, clients::ReadFor, ahash::RandomState>,
    /// Client ids the cluster refused a subscription (`--max-mailbox-topics`): until when,
    /// and the topics they keep.
    full: HashMap<Arc<str>, clients::Full, ahash::RandomState>,
    /// This worker's socket counts of client ids, per topic.
    socks: clients::Socks,
}

impl RedisEngine {
    /// The engine of one worker, over its handle to the node's cluster threads, reading
    /// what they send it from `inbox`.
    pub fn new(
        handle: ClusterHandle,
        webhooks: WebhookPool,
        inbox: Receiver<Event<Followup>>,
    ) -> RedisEngine {
        RedisEngine {
            handle,
            webhooks,
            watched: HashMap::default(),
            publishing: HashMap::default(),
            reading: HashMap::default(),
            unasked: Vec::new(),
            v1: v1::V1State::default(),
            inbox,
            mail: clients::Mail::default(),
            reads_for: HashMap::default(),
            full: HashMap::default(),
            socks: clients::Socks::default(),
        }
    }

    /// Sets what client ids need: `--mailbox-ttl` (ms), `--max-mailbox-topics`, the node's
    /// count of each client's topics and who is told about their messages.
    pub fn with_clients(
        mut self,
        ttl_ms: u64,
        max: usize,
        node: Arc<NodeMailboxes>,
        notify: Arc<dyn crate::notice::Notify>,
    ) -> RedisEngine {
        self.mail = clients::Mail {
            ttl_ms: ttl_ms.max(1),
            max,
            node,
            notify,
            swept_at: 0,
        };
        self
    }

    /// Sends a read, or answers it `StorageUnavailable` when the shard refuses it.
    fn send_read(&mut self, topic: &Arc<str>, after: Position, ticket: Ticket, out: &mut Events) {
        self.reading.entry(ticket).or_insert_with(|| Reading {
            topic: topic.clone(),
            messages: Vec::new(),
        });
        // A read for a client id: its first page starts after what the client was given.
        let client = self
            .reads_for
            .get_mut(&ticket)
            .and_then(clients::ReadFor::first_page);
        let (epoch, seq) = (after.epoch, after.seq);
        let sent = self
            .handle
            .read_client(ticket, NS_V2, topic, epoch, seq, client.as_ref());
        if sent.is_err() {
            self.forget_for(ticket);
            self.reading.remove(&ticket);
            out.push(Event::History {
                ticket,
                result: Err(RelayError::StorageUnavailable),
            });
        }
    }

    fn on_published(
        &mut self,
        ticket: Ticket,
        result: Result<PublishOutcome, cluster::Unavailable>,
        out: &mut Events,
    ) {
        let publishing = self.publishing.remove(&ticket);
        let topic = publishing.as_ref().map(|p| p.topic.clone());
        let result = match result {
            Ok(PublishOutcome::Stored {
                epoch,
                seq,
                webhooks,
                clients,
            }) => {
                let pos = Position { epoch, seq };
                if let Some(p) = publishing {
                    for url in webhooks {
                        self.webhooks.submit(WebhookCall {
                            topic: p.topic.clone(),
                            url: Arc::from(url),
                        });
                    }
                    self.client_notices(&p, pos, &clients);
                }
                Ok(Stored::New(pos))
            }
            Ok(PublishOutcome::Duplicate { .. }) => Ok(Stored::Duplicate),
            Err(cluster::Unavailable) => {
                if let Some(topic) = topic {
                    self.handle.count_unavailable_answer(&topic);
                }
                Err(RelayError::StorageUnavailable)
            }
        };
        out.push(Event::Published { ticket, result });
    }

    fn on_history(
        &mut self,
        ticket: Ticket,
        result: Result<cluster::History, cluster::Unavailable>,
        out: &mut Events,
    ) {
        let Some(mut reading) = self.reading.remove(&ticket) else {
            return;
        };
        let mut h = match result {
            Ok(h) => h,
            Err(cluster::Unavailable) => {
                self.forget_for(ticket);
                let result = Err(RelayError::StorageUnavailable);
                return out.push(Event::History { ticket, result });
            }
        };
        if let Some(c) = h.client.take() {
            self.client_read(ticket, c);
        }
        reading.messages.extend(h.messages.iter().map(|m| Message {
            pos: Position {
                epoch: h.epoch,
                seq: m.seq,
            },
            body: m.body.clone(),
            origin: m.origin,
        }));
        if h.more() {
            // The next page, after what this one examined.
            let (topic, after) = (
                reading.topic.clone(),
                Position {
                    epoch: h.epoch,
                    seq: h.scanned_to,
                },
            );
            self.reading.insert(ticket, reading);
            return self.send_read(&topic, after, ticket, out);
        }
        let mut history = History {
            last: Position {
                epoch: h.epoch,
                seq: h.last_seq,
            },
            messages: reading.messages,
        };
        self.finish_for(ticket, &mut history);
        out.push(Event::History {
            ticket,
            result: Ok(history),
        });
    }

    fn on_subscribed(&mut self, topic: Arc<str>, out: &mut Events) {
        let Some(w) = self.watched.get_mut(&topic) else {
            return;
        };
        if w.live {
            // A reconnect or an outage over: live messages may have been missed, and Redis
            // may have missed a close.
            self.resend_sockets(&topic);
            return out.push(Event::Resync { topic });
        }
        w.live = true;
        for (ticket, after) in std::mem::take(&mut w.held) {
            self.send_read(&topic, after, ticket, out);
        }
    }

    /// One event from the cluster's threads: the relay's own are passed on (but v1 frames
    /// held while a take is out), the engine's own work finished here.
    fn on_cluster(&mut self, ev: Event<Followup>, out: &mut Events) {
        let f = match ev.for_relay() {
            Ok(Event::V1Live {
                topic,
                frame,
                origin,
            }) => return self.v1_live(topic, frame, origin, out),
            Ok(ev) => return out.push(ev),
            Err(f) => f,
        };
        match f {
            Followup::Published { ticket, result } => self.on_published(ticket, result, out),
            Followup::Page { ticket, result } => self.on_history(ticket, result, out),
            Followup::Subscribed { ns: NS_V2, topic } => self.on_subscribed(topic, out),
            Followup::Subscribed { ns: NS_V1, topic } => self.v1_subscribed(topic, out),
            Followup::Subscribed { .. } => {}
            Followup::V1Published { topic, result } => self.v1_published(topic, result),
            Followup::V1Taken { ticket, result } => self.v1_taken(ticket, result, out),
            Followup::ClientUnsent { topic, client } => self.client_unsent(topic, client),
            Followup::MailboxFull {
                topic,
                client,
                kept,
            } => self.mailbox_full(topic, client, kept),
        }
    }
}

impl Engine for RedisEngine {
    fn publish(
        &mut self,
        req: PublishReq,
        ticket: Ticket,
        _out: &mut Events,
    ) -> Done<Result<Stored, RelayError>> {
        let topic = req.topic.clone();
        let publishing = clients::Publishing {
            topic: req.topic.clone(),
            body: req.body.clone(),
            ttl: req.ttl,
            prompt: req.prompt,
            publisher: req.publisher.clone(),
        };
        let req = cluster::PublishReq {
            ns: NS_V2,
            topic: req.topic,
            body: req.body,
            ttl: Duration::from_secs(u64::from(req.ttl)),
            origin: req.origin,
            prompt: req.prompt,
            publisher: req.publisher.map(|c| c.id.clone()),
        };
        match self.handle.publish(ticket, req) {
            Ok(()) => {
                self.publishing.insert(ticket, publishing);
                Done::Later
            }
            Err(cluster::Unavailable) => {
                self.handle.count_unavailable_answer(&topic);
                Done::Now(Err(RelayError::StorageUnavailable))
            }
        }
    }

    fn read(&mut self, topic: &Arc<str>, after: Position, ticket: Ticket, out: &mut Events) {
        match self.watched.get_mut(topic) {
            Some(w) if !w.live => w.held.push((ticket, after)),
            _ => self.send_read(topic, after, ticket, out),
        }
    }

    fn watch(&mut self, topic: &Arc<str>, _out: &mut Events) {
        self.watched.entry(topic.clone()).or_default();
        if self.handle.watch(NS_V2, topic).is_err() {
            self.unasked.push((NS_V2, topic.clone()));
        }
    }

    fn unwatch(&mut self, topic: &Arc<str>, _out: &mut Events) {
        if let Some(w) = self.watched.remove(topic) {
            for (ticket, _) in w.held {
                self.forget_for(ticket);
            }
        }
        // A refused unwatch leaves the node subscribed: its live messages are dropped here.
        let _ = self.handle.unwatch(NS_V2, topic);
    }

    fn add_webhook(
        &mut self,
        topic: &Arc<str>,
        url: Arc<str>,
        ticket: Ticket,
        _out: &mut Events,
    ) -> Done<Result<(), RelayError>> {
        match self.handle.add_webhook(ticket, topic, &url) {
            Ok(()) => Done::Later,
            Err(cluster::Unavailable) => {
                self.handle.count_unavailable_answer(topic);
                Done::Now(Err(RelayError::StorageUnavailable))
            }
        }
    }

    fn remove_webhook(&mut self, topic: &Arc<str>, url: &Arc<str>) {
        let _ = self.handle.remove_webhook(topic, url);
    }

    fn v1_publish(&mut self, req: V1Publish, _out: &mut Events) {
        self.v1_publish_req(req);
    }

    fn v1_take(&mut self, topic: &Arc<str>, ticket: Ticket, out: &mut Events) {
        self.v1_take_req(topic, ticket, out);
    }

    fn v1_watch(&mut self, topic: &Arc<str>, delta: i32, out: &mut Events) {
        self.v1_watch_req(topic, delta, out);
    }

    fn on_mail(&mut self, budget: usize, out: &mut Events) -> usize {
        let mut taken = 0;
        // The cluster threads send events one by one: each counts as a batch.
        for _ in 0..budget {
            let Ok(ev) = self.inbox.try_recv() else {
                break;
            };
            taken += 1;
            self.on_cluster(ev, out);
        }
        taken
    }

    fn has_mail(&self) -> bool {
        !self.inbox.is_empty()
    }

    fn tick(&mut self, now: u64, out: &mut Events) {
        self.v1_tick(now, out);
        self.clients_tick(now);
        for (ns, topic) in std::mem::take(&mut self.unasked) {
            let wanted = match ns {
                NS_V2 => self.watched.contains_key(&topic),
                _ => self.v1_wanted(&topic),
            };
            if wanted && self.handle.watch(ns, &topic).is_err() {
                self.unasked.push((ns, topic));
            }
        }
    }

    fn flush(&mut self, _out: &mut Events) -> crate::engine::Handoff {
        crate::engine::Handoff::Done
    }

    fn client(
        &mut self,
        topic: &Arc<str>,
        client: &Arc<super::ClientRef>,
        op: super::ClientOp,
        _out: &mut Events,
    ) -> Result<(), RelayError> {
        self.client_op(topic, client, op)
    }

    fn read_for(
        &mut self,
        topic: &Arc<str>,
        after: Position,
        client: &Arc<super::ClientRef>,
        fetch: Option<usize>,
        ticket: Ticket,
        out: &mut Events,
    ) {
        self.read_client(topic, after, client, fetch, ticket, out)
    }

    fn notifier(&self) -> Arc<dyn crate::notice::Notify> {
        self.mail.notify.clone()
    }
}
