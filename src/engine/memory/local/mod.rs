//! The in-memory engine: every topic's shared state lives on one *home* worker, chosen by the
//! topic's hash ([`Placement`]), in that worker's memory ([`HomeTopics`]). Each worker runs one
//! [`LocalEngine`]: requests for topics homed on it are served on the spot; the others travel
//! to the home as [`HomeMsg`]s over the engines' own mailboxes ([`Peers`]), and what the home
//! reports to another worker (a live message, an answer carrying that worker's ticket) goes
//! back the same way as the [`Event`] itself (`HomeMsg::Report`).
//!
//! A publish from a connection of worker A on a topic homed on worker H:
//! `A: publish -> HomeMsg::Publish -> H: store (position, dedup, cap, budget) -> Event::Live
//! to every watching worker, webhooks to the pool, Event::Published -> A`.
//! When A is H, nothing crosses a thread and the publish is answered at once.
//!
//! [`build`] makes every worker's engine, durable in `--data-dir` (its journal and
//! recovery: [`super::journal`]) unless that is `none`.
//!
//! Queues between workers are bounded (`--core-queue`): past the bound a publish is refused
//! (`Overloaded`, never acknowledged and dropped), and a live message is dropped and replaced
//! by one `Event::Resync` of its topic, so that the subscribers there re-read what they
//! missed. Answers and control messages are never dropped: each answers a ticket someone
//! waits for (their number is bounded by the requests the workers let their connections
//! have in flight).

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::cache::{cache_presize, strict_overcommit};
use super::home::HomeTopics;
use super::journal::{Journal, Settled};
use super::placement::Placement;

mod answers;
mod build;
mod clients;
mod msg;
pub mod outbox;
mod v1;

use crate::config::Limits;
use crate::engine::RelayError;
use crate::engine::{
    Done, Engine, Event, Events, Message, Position, PublishReq, Stored, Ticket, V1Publish,
};
use crate::mailbox::Receiver;
use crate::metrics::Metrics;
use crate::webhook::{Delivery as WebhookCall, WebhookPool};
pub use build::build;
pub use msg::{HomeMsg, Reply};
use outbox::{Outboxes, Peers};

/// What a publish at its home comes to: its answer now, or once the journal has synced the
/// record it waits for.
#[derive(Debug)]
enum HomeStored {
    /// Answered now: stored (in memory, or written where the policy needs no sync), a
    /// duplicate, or refused.
    Now(Result<Stored, RelayError>),
    /// Stored (or a duplicate of a message still unsynced), answered once the journal has
    /// synced the record with this log sequence number.
    AfterSync(Stored, u64),
}

/// What every worker's in-memory engine shares.
#[derive(Clone)]
pub struct LocalShared {
    /// Topic placement and content hashes.
    pub placement: Placement,
    /// Every worker's engine's mailbox.
    pub peers: Peers,
    /// The limits.
    pub limits: Limits,
    /// All workers' metrics.
    pub metrics: Arc<Metrics>,
    /// The webhook delivery pool.
    pub webhooks: WebhookPool,
    /// Webhook registrations of the whole process.
    pub webhook_count: Arc<AtomicUsize>,
    /// The topics each client id keeps (`--max-mailbox-topics`).
    pub mailboxes: Arc<crate::engine::clients::MailboxTable>,
    /// Who is told about client ids' messages.
    pub notify: Arc<dyn crate::notice::Notify>,
}

/// One worker's in-memory engine.
pub struct LocalEngine {
    me: u16,
    shared: LocalShared,
    home: HomeTopics,
    /// Messages for the other workers, sent at the end of the round.
    outbox: Outboxes,
    /// The durable log of the home topics (`--data-dir`), if any.
    journal: Option<Journal>,
    /// Answers the journal settled, to send.
    settled: Vec<Settled>,
    /// This engine's mailbox: other workers' engines, the journal's sync thread.
    inbox: Receiver<Vec<HomeMsg>>,
}

impl LocalEngine {
    /// The engine of worker `me`, reading `inbox` (the receiving half of `shared.peers[me]`).
    pub fn new(me: usize, shared: LocalShared, inbox: Receiver<Vec<HomeMsg>>) -> LocalEngine {
        let n = shared.peers.len().max(1);
        let budget = shared.limits.max_cache_bytes / n;
        let strict = strict_overcommit();
        let presize = cache_presize(budget, strict);
        if strict && me == 0 {
            log::info!(
                "vm.overcommit_memory=2: each worker's message cache reserves room for \
                 {presize} messages, not its budget's maximum; its tables grow past that"
            );
        }
        let mut home = HomeTopics::new(
            me,
            presize,
            budget,
            shared.limits.clone(),
            shared.metrics.clone(),
            shared.webhook_count.clone(),
        );
        home.set_mailboxes(
            shared.limits.mailbox_ttl.saturating_mul(1000),
            shared.mailboxes.clone(),
            shared.notify.clone(),
        );
        LocalEngine {
            me: me as u16,
            home,
            outbox: Outboxes::new(n, shared.limits.core_queue),
            journal: None,
            settled: Vec::new(),
            shared,
            inbox,
        }
    }

    /// Keeps the home topics in `journal` from now on (the durable engine).
    pub fn set_journal(&mut self, journal: Journal) {
        self.journal = Some(journal);
    }

    /// The home state and the journal, while the recovered state is restored.
    pub fn parts_mut(&mut self) -> (&mut HomeTopics, Option<&mut Journal>) {
        (&mut self.home, self.journal.as_mut())
    }

    /// The content hash of `data` (as the dedup check computes it).
    pub fn content_hash(&self, data: &[u8]) -> u64 {
        self.shared.placement.content_hash(data)
    }

    fn home_of(&self, topic: &str) -> usize {
        self.shared.placement.of(topic)
    }

    /// Whether a v1 step (pub, watch, take) is carried out at once: only with one worker.
    /// With several, every step goes through its home's mailbox, even from the home's own
    /// connections: the home reads its sockets before its mailbox in a round, so a step
    /// handed on earlier by another worker, or an earlier step of the same connection,
    /// could otherwise take effect after a later one (a v1 frame has no position to catch
    /// up from).
    fn v1_at_once(&self) -> bool {
        self.shared.peers.len() == 1
    }

    fn is_mine(&self, topic: &str) -> bool {
        self.home_of(topic) == usize::from(self.me)
    }

    fn send(&mut self, to: usize, msg: HomeMsg) {
        self.outbox.push(to, msg);
    }

    /// Reports `ev` to worker `to`'s relay (this one's, or another's through its mailbox).
    fn report(&mut self, to: u16, ev: Event, out: &mut Events) {
        if to == self.me {
            out.push(ev);
        } else {
            self.send(usize::from(to), HomeMsg::Report(ev));
        }
    }

    /// Home side of a publish: store, record, fan out to the watching workers, call the
    /// webhooks. Says whether the answer is known now or waits for the disk.
    fn store_here(&mut self, req: PublishReq, hash: u64, out: &mut Events) -> HomeStored {
        if self.journal.as_ref().is_some_and(Journal::refuses) {
            return HomeStored::Now(Err(RelayError::StorageUnavailable));
        }
        let now = crate::clock::coarse().0;
        let o = self.home.store(&req, hash, now);
        let Stored::New(pos) = o.stored else {
            // A duplicate is as durable as its original, which may still wait for its sync.
            return match self.journal.as_ref().and_then(Journal::unsynced) {
                Some(lsn) => HomeStored::AfterSync(o.stored, lsn),
                None => HomeStored::Now(Ok(o.stored)),
            };
        };
        let mut wait = None;
        if let (Some(j), Some(key)) = (self.journal.as_mut(), o.key) {
            let expires = now + u64::from(req.ttl) * 1000;
            if let Some(a) = j.message(false, &req.topic, pos, expires, req.prompt, req.body.irn())
            {
                self.home.set_record(key, a.loc);
                wait = j.answers_after_sync().then_some(a.lsn);
            } else if j.answers_after_sync() {
                return HomeStored::Now(Err(RelayError::StorageUnavailable));
            }
        }
        self.home.client_notices(o.slot, &req, pos);
        let msg = Message {
            pos,
            body: req.body,
            origin: req.origin,
        };
        if let Some(t) = o.slot.and_then(|slot| self.home.get(slot)) {
            for &w in &t.watchers {
                let (topic, msg) = (t.name.clone(), msg.clone());
                self.outbox
                    .push(usize::from(w), HomeMsg::Report(Event::Live { topic, msg }));
            }
            if req.prompt {
                for w in &t.webhooks {
                    self.shared.webhooks.submit(WebhookCall {
                        topic: t.name.clone(),
                        url: w.url.clone(),
                    });
                }
            }
        }
        // This worker's own subscribers (the home never watches its topics: see
        // `HomeTopics::watch`); its relay drops it when it has none.
        out.push(Event::Live {
            topic: req.topic,
            msg,
        });
        match wait {
            Some(lsn) => HomeStored::AfterSync(o.stored, lsn),
            None => HomeStored::Now(Ok(o.stored)),
        }
    }

    fn on_home_msg(&mut self, msg: HomeMsg, out: &mut Events) {
        match msg {
            HomeMsg::Publish { req, hash, reply } => {
                let done = self.store_here(req, hash, out);
                self.answer_publish(reply.core, reply.ticket, done, out);
            }
            HomeMsg::Read {
                topic,
                after,
                reply,
            } => {
                let result = Ok(self.home.read(&topic, after));
                let ev = Event::History {
                    ticket: reply.ticket,
                    result,
                };
                self.report(reply.core, ev, out);
            }
            HomeMsg::Watch { topic, core } => self.home.watch(&topic, core),
            HomeMsg::Unwatch { topic, core } => self.home.unwatch(&topic, core),
            HomeMsg::AddWebhook { topic, url, reply } => {
                self.register_here(&topic, url, reply.core, reply.ticket, out)
            }
            HomeMsg::RemoveWebhook { topic, url } => self.unregister_here(&topic, &url),
            HomeMsg::Report(ev) => out.push(ev),
            HomeMsg::Client { topic, client, op } => self.client_here(&topic, &client, op),
            HomeMsg::ReadFor {
                topic,
                after,
                client,
                fetch,
                reply,
            } => {
                let result = Ok(self.read_for_here(&topic, after, &client, fetch));
                let ev = Event::History {
                    ticket: reply.ticket,
                    result,
                };
                self.report(reply.core, ev, out);
            }
            HomeMsg::V1Publish(req) => self.v1_publish_here(req, out),
            HomeMsg::V1Take { topic, reply } => {
                let frames = self.v1_take_here(&topic);
                let ev = Event::V1Pending {
                    ticket: reply.ticket,
                    frames,
                };
                self.report(reply.core, ev, out);
            }
            HomeMsg::V1Watch { topic, core, delta } => self.home.v1_watch(&topic, core, delta),
            HomeMsg::Sync(ev) => {
                if let Some(j) = self.journal.as_mut() {
                    j.on_sync(ev, &mut self.settled);
                }
                self.send_settled(out);
            }
        }
    }
}

impl Engine for LocalEngine {
    fn publish(
        &mut self,
        req: PublishReq,
        ticket: Ticket,
        out: &mut Events,
    ) -> Done<Result<Stored, RelayError>> {
        let home = self.home_of(&req.topic);
        let here = home == usize::from(self.me);
        let hash = match req.hash {
            Some(h) => h,
            None => {
                // Not prepared: the home's cold lines are asked for now, together.
                let named = here
                    .then(|| self.home.prefetch_eviction(&req.topic))
                    .flatten();
                let h = self.shared.placement.content_hash(req.body.beta_bytes());
                if let Some(slot) = named {
                    self.home.prefetch_dedup(slot, h);
                }
                h
            }
        };
        if here {
            return match self.store_here(req, hash, out) {
                HomeStored::Now(result) => Done::Now(result),
                later => {
                    self.answer_publish(self.me, ticket, later, out);
                    Done::Later
                }
            };
        }
        let reply = Reply {
            core: self.me,
            ticket,
        };
        self.send(home, HomeMsg::Publish { req, hash, reply });
        Done::Later
    }

    /// At saturation the lines a store touches are cold (the topic's dedup filter, the
    /// message it evicts): asked for here, before the body is encoded, their misses overlap
    /// the encoding instead of stalling the store one after another.
    fn prepare_publish(&self, topic: &Arc<str>, message: &str) -> Option<u64> {
        let hash = self.shared.placement.message_hash(message.as_bytes());
        if self.is_mine(topic) {
            if let Some(slot) = self.home.prefetch_eviction(topic) {
                self.home.prefetch_dedup(slot, hash);
            }
        }
        Some(hash)
    }

    fn read(&mut self, topic: &Arc<str>, after: Position, ticket: Ticket, out: &mut Events) {
        if self.is_mine(topic) {
            let result = Ok(self.home.read(topic, after));
            out.push(Event::History { ticket, result });
        } else {
            let reply = Reply {
                core: self.me,
                ticket,
            };
            let home = self.home_of(topic);
            let topic = topic.clone();
            self.send(
                home,
                HomeMsg::Read {
                    topic,
                    after,
                    reply,
                },
            );
        }
    }

    fn watch(&mut self, topic: &Arc<str>, _out: &mut Events) {
        if self.is_mine(topic) {
            self.home.watch(topic, self.me);
        } else {
            let (home, core) = (self.home_of(topic), self.me);
            self.send(
                home,
                HomeMsg::Watch {
                    topic: topic.clone(),
                    core,
                },
            );
        }
    }

    fn unwatch(&mut self, topic: &Arc<str>, _out: &mut Events) {
        if self.is_mine(topic) {
            self.home.unwatch(topic, self.me);
        } else {
            let (home, core) = (self.home_of(topic), self.me);
            self.send(
                home,
                HomeMsg::Unwatch {
                    topic: topic.clone(),
                    core,
                },
            );
        }
    }

    fn add_webhook(
        &mut self,
        topic: &Arc<str>,
        url: Arc<str>,
        ticket: Ticket,
        out: &mut Events,
    ) -> Done<Result<(), RelayError>> {
        if self.is_mine(topic) {
            self.register_here(topic, url, self.me, ticket, out);
            return Done::Later;
        }
        let reply = Reply {
            core: self.me,
            ticket,
        };
        let home = self.home_of(topic);
        let topic = topic.clone();
        self.send(home, HomeMsg::AddWebhook { topic, url, reply });
        Done::Later
    }

    fn remove_webhook(&mut self, topic: &Arc<str>, url: &Arc<str>) {
        if self.is_mine(topic) {
            self.unregister_here(topic, url);
        } else {
            let home = self.home_of(topic);
            let (topic, url) = (topic.clone(), url.clone());
            self.send(home, HomeMsg::RemoveWebhook { topic, url });
        }
    }

    fn v1_publish(&mut self, req: V1Publish, out: &mut Events) {
        if self.v1_at_once() {
            self.v1_publish_here(req, out);
        } else {
            let home = self.home_of(&req.topic);
            self.send(home, HomeMsg::V1Publish(req));
        }
    }

    fn v1_take(&mut self, topic: &Arc<str>, ticket: Ticket, out: &mut Events) {
        if self.v1_at_once() {
            let frames = self.v1_take_here(topic);
            out.push(Event::V1Pending { ticket, frames });
        } else {
            let reply = Reply {
                core: self.me,
                ticket,
            };
            let (home, topic) = (self.home_of(topic), topic.clone());
            self.send(home, HomeMsg::V1Take { topic, reply });
        }
    }

    fn v1_watch(&mut self, topic: &Arc<str>, delta: i32, _out: &mut Events) {
        if self.v1_at_once() {
            self.home.v1_watch(topic, self.me, delta);
        } else {
            let (home, core, topic) = (self.home_of(topic), self.me, topic.clone());
            self.send(home, HomeMsg::V1Watch { topic, core, delta });
        }
    }

    fn on_mail(&mut self, budget: usize, out: &mut Events) -> usize {
        let mut taken = 0;
        for _ in 0..budget {
            let Ok(batch) = self.inbox.try_recv() else {
                break;
            };
            taken += batch.len();
            for m in batch {
                self.on_home_msg(m, out);
            }
        }
        taken
    }

    fn has_mail(&self) -> bool {
        !self.inbox.is_empty()
    }

    fn tick(&mut self, now: u64, _out: &mut Events) {
        self.home.sweep(now);
        if let Some(j) = self.journal.as_mut() {
            j.tick();
            j.compact_step(&mut self.home);
        }
    }

    fn client(
        &mut self,
        topic: &Arc<str>,
        client: &Arc<crate::engine::ClientRef>,
        op: crate::engine::ClientOp,
        _out: &mut Events,
    ) -> Result<(), RelayError> {
        self.client_op(topic, client, op)
    }

    fn read_for(
        &mut self,
        topic: &Arc<str>,
        after: Position,
        client: &Arc<crate::engine::ClientRef>,
        fetch: Option<usize>,
        ticket: Ticket,
        out: &mut Events,
    ) {
        self.read_client(topic, after, client, fetch, ticket, out)
    }

    fn notifier(&self) -> Arc<dyn crate::notice::Notify> {
        self.shared.notify.clone()
    }

    fn flush(&mut self, out: &mut Events) -> crate::engine::Handoff {
        // Records reach the kernel before any answer leaves: to a socket of this worker
        // (the worker writes sockets after this), or to another worker (sent below).
        if let Some(j) = self.journal.as_mut() {
            j.flush(&mut self.home, &mut self.settled);
            self.send_settled(out);
        }
        let m = &self.shared.metrics.cores[usize::from(self.me)];
        self.outbox.flush(&self.shared.peers, m, out)
    }
}
