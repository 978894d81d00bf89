//! The in-memory engine: every topic's shared state lives on one *home* worker, chosen by the
//! topic's hash ([`Placement`]), in that worker's memory ([`HomeTopics`]). Each worker runs one
//! [`LocalEngine`]: requests for topics homed on it are served on the spot; the others travel
//! to the home as [`HomeMsg`]s over the workers' mailboxes, and their answers come back the
//! same way, each carrying the asking worker's ticket.
//!
//! A publish from a connection of worker A on a topic homed on worker H:
//! `A: publish -> HomeMsg::Publish -> H: store (position, dedup, cap, budget) -> HomeMsg::Live
//! to every watching worker, webhooks to the pool, HomeMsg::Answer(Published) -> A`.
//! When A is H, nothing crosses a thread and the publish is answered at once.
//!
//! Queues between workers are bounded (`--core-queue`): past the bound a publish is refused
//! (`Overloaded`, never acknowledged and dropped), and a live message is dropped and replaced
//! by one [`HomeMsg::Resync`] of its topic, so that the subscribers there re-read what they
//! missed. Answers and control messages are never dropped: each answers a ticket someone
//! waits for (their number is bounded by the requests the workers let their connections
//! have in flight).

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::home::HomeTopics;
use super::journal::{Held, Journal, Settled};
use super::outbox::Outboxes;
use super::{
    Done, Engine, EngineMsg, Event, Events, Message, Position, PublishReq, Stored, Ticket,
};
use crate::config::Limits;
use crate::metrics::Metrics;
use crate::relay::error::RelayError;
use crate::relay::transport::{Mailboxes, Placement};
use crate::webhook::{Delivery as WebhookCall, WebhookPool};

/// Where an answer goes: the asking worker and its ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The asking worker.
    pub core: u16,
    /// Its ticket.
    pub ticket: Ticket,
}

/// A message between the in-memory engines of two workers.
#[derive(Debug)]
pub enum HomeMsg {
    /// To the home: store a publish (`hash` is its content hash).
    Publish {
        /// The publish.
        req: PublishReq,
        /// Content hash of `req.data`.
        hash: u64,
        /// The publishing worker.
        reply: Reply,
    },
    /// To the home: read the topic after a position.
    Read {
        /// Topic.
        topic: Arc<str>,
        /// Read after this position.
        after: Position,
        /// The reading worker.
        reply: Reply,
    },
    /// To the home: worker `core` watches the topic.
    Watch {
        /// Topic.
        topic: Arc<str>,
        /// The watching worker.
        core: u16,
    },
    /// To the home: worker `core` no longer watches the topic.
    Unwatch {
        /// Topic.
        topic: Arc<str>,
        /// The worker.
        core: u16,
    },
    /// To the home: register a webhook.
    AddWebhook {
        /// Topic.
        topic: Arc<str>,
        /// Address.
        url: Arc<str>,
        /// The registering worker.
        reply: Reply,
    },
    /// To the home: forget a webhook.
    RemoveWebhook {
        /// Topic.
        topic: Arc<str>,
        /// Address.
        url: Arc<str>,
    },
    /// From the home to a watching worker: a stored message.
    Live {
        /// Topic.
        topic: Arc<str>,
        /// The message.
        msg: Message,
    },
    /// From the home to a watching worker: live messages of the topic were dropped on the
    /// way (a full queue); its subscribers must re-read.
    Resync {
        /// Topic.
        topic: Arc<str>,
    },
    /// From the home to an asking worker: the answer to one of its tickets.
    Answer(Event),
    /// From the home's log sync thread to the home: what became of its records.
    Sync(crate::store::SyncEvent),
}

/// Messages a worker's cache makes room for at start, for a budget of `bytes`: as many as
/// the budget can ever hold, so that no table of the cache grows while serving (a growth
/// past a million entries copies or rehashes it all at once: a stall of tens of ms,
/// docs/PERFORMANCE.md "The cache's tables never grow while serving"). The cost is address
/// space, not memory. Under strict overcommit (`vm.overcommit_memory=2`) reserved address
/// space counts against the commit limit: there the room is one message per KiB of budget,
/// at most a million, and the tables may grow beyond it.
pub fn cache_presize(bytes: usize, strict_overcommit: bool) -> usize {
    if strict_overcommit {
        (bytes / 1024).min(1 << 20)
    } else {
        bytes / (super::cache::ENTRY_OVERHEAD + MIN_CACHED_DATA)
    }
}

/// A floor on the bytes of a cached message's data: `{"topic":"","message":""}` is 26.
const MIN_CACHED_DATA: usize = 16;

/// The kernel refuses to overcommit memory (`vm.overcommit_memory` is 2).
fn strict_overcommit() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() == "2")
}

/// What every worker's in-memory engine shares.
#[derive(Clone)]
pub struct LocalShared {
    /// Topic placement and content hashes.
    pub placement: Placement,
    /// Every worker's mailbox.
    pub mailboxes: Arc<Mailboxes>,
    /// The limits.
    pub limits: Limits,
    /// All workers' metrics.
    pub metrics: Arc<Metrics>,
    /// The webhook delivery pool.
    pub webhooks: WebhookPool,
    /// Webhook registrations of the whole process.
    pub webhook_count: Arc<AtomicUsize>,
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
}

impl LocalEngine {
    /// The engine of worker `me`.
    pub fn new(me: usize, shared: LocalShared) -> LocalEngine {
        let n = shared.mailboxes.len().max(1);
        let budget = shared.limits.max_cache_bytes / n;
        let strict = strict_overcommit();
        let presize = cache_presize(budget, strict);
        if strict && me == 0 {
            log::info!(
                "vm.overcommit_memory=2: each worker's message cache reserves room for \
                 {presize} messages, not its budget's maximum; its tables grow past that"
            );
        }
        let home = HomeTopics::new(
            me,
            presize,
            budget,
            shared.limits.clone(),
            shared.metrics.clone(),
            shared.webhook_count.clone(),
        );
        LocalEngine {
            me: me as u16,
            home,
            outbox: Outboxes::new(n, shared.limits.core_queue),
            journal: None,
            settled: Vec::new(),
            shared,
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

    fn is_mine(&self, topic: &str) -> bool {
        self.home_of(topic) == usize::from(self.me)
    }

    fn send(&mut self, to: usize, msg: HomeMsg) {
        self.outbox.push(to, msg);
    }

    /// Sends `ev` to the worker that asked (or to this one's relay).
    fn answer(&mut self, to: u16, ev: Event, out: &mut Events) {
        if to == self.me {
            out.push(ev);
        } else {
            self.send(usize::from(to), HomeMsg::Answer(ev));
        }
    }

    /// Home side of a publish: store, record, fan out to the watching workers, call the
    /// webhooks. Returns the outcome and, when the answer must wait for the disk, the log
    /// sequence number of its record.
    fn store_here(
        &mut self,
        req: PublishReq,
        hash: u64,
        out: &mut Events,
    ) -> (Result<Stored, RelayError>, Option<u64>) {
        if self.journal.as_ref().is_some_and(Journal::refuses) {
            return (Err(RelayError::StorageUnavailable), None);
        }
        let now = crate::clock::now_ms();
        let o = self.home.store(&req, hash, now);
        let Stored::New(pos) = o.stored else {
            // A duplicate is as durable as its original, which may still wait for its sync.
            let wait = self.journal.as_ref().and_then(Journal::unsynced);
            return (Ok(o.stored), wait);
        };
        let mut wait = None;
        if let (Some(j), Some(key)) = (self.journal.as_mut(), o.key) {
            let expires = now + u64::from(req.ttl) * 1000;
            if let Some(a) = j.message(&req.topic, pos, expires, req.prompt, &req.data) {
                self.home.set_record(key, a.loc);
                wait = j.answers_after_sync().then_some(a.lsn);
            } else if j.answers_after_sync() {
                return (Err(RelayError::StorageUnavailable), None);
            }
        }
        if let Some(t) = o.slot.and_then(|slot| self.home.get(slot)) {
            let msg = Message {
                pos,
                data: req.data,
                origin: req.origin,
            };
            for &w in &t.watchers {
                let (topic, msg) = (t.name.clone(), msg.clone());
                if w == self.me {
                    out.push(Event::Live { topic, msg });
                } else {
                    self.outbox
                        .push(usize::from(w), HomeMsg::Live { topic, msg });
                }
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
        (Ok(o.stored), wait)
    }

    /// Answers a publish of worker `core` (this one included), now or once its record is
    /// synced.
    fn answer_publish(
        &mut self,
        core: u16,
        ticket: Ticket,
        done: (Result<Stored, RelayError>, Option<u64>),
        out: &mut Events,
    ) {
        match (done, self.journal.as_mut()) {
            ((Ok(stored), Some(lsn)), Some(j)) => {
                j.hold(lsn, core, ticket, Held::Published(stored))
            }
            ((result, _), _) => self.answer(core, Event::Published { ticket, result }, out),
        }
    }

    /// Home side of a webhook registration: answered now, or once its record is synced.
    fn register_here(
        &mut self,
        topic: &Arc<str>,
        url: Arc<str>,
        core: u16,
        ticket: Ticket,
        out: &mut Events,
    ) {
        if self.journal.as_ref().is_some_and(Journal::refuses) {
            let result = Err(RelayError::StorageUnavailable);
            return self.answer(core, Event::WebhookAdded { ticket, result }, out);
        }
        let added = self.home.add_webhook(topic, url.clone());
        if let (Ok(true), Some(j)) = (&added, self.journal.as_mut()) {
            if let Some(a) = j.webhook_add(topic, &url) {
                self.home.set_webhook_record(topic, &url, a.loc);
                if j.answers_after_sync() {
                    return j.hold(a.lsn, core, ticket, Held::WebhookAdded);
                }
            }
        }
        let result = added.map(|_| ());
        self.answer(core, Event::WebhookAdded { ticket, result }, out);
    }

    /// Home side of forgetting a webhook (and its record).
    fn unregister_here(&mut self, topic: &Arc<str>, url: &Arc<str>) {
        if let (Some(Some(record)), Some(j)) =
            (self.home.remove_webhook(topic, url), self.journal.as_mut())
        {
            j.webhook_remove(topic, url, record);
        }
    }

    /// Sends the answers the journal settled.
    fn send_settled(&mut self, out: &mut Events) {
        for st in std::mem::take(&mut self.settled) {
            let ticket = st.ticket;
            let failed = RelayError::StorageUnavailable;
            let ev = match (st.what, st.ok) {
                (Held::Published(stored), true) => Event::Published {
                    ticket,
                    result: Ok(stored),
                },
                (Held::Published(_), false) => Event::Published {
                    ticket,
                    result: Err(failed),
                },
                (Held::WebhookAdded, ok) => Event::WebhookAdded {
                    ticket,
                    result: if ok { Ok(()) } else { Err(failed) },
                },
            };
            self.answer(st.core, ev, out);
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
                self.answer(reply.core, ev, out);
            }
            HomeMsg::Watch { topic, core } => self.home.watch(&topic, core),
            HomeMsg::Unwatch { topic, core } => self.home.unwatch(&topic, core),
            HomeMsg::AddWebhook { topic, url, reply } => {
                self.register_here(&topic, url, reply.core, reply.ticket, out)
            }
            HomeMsg::RemoveWebhook { topic, url } => self.unregister_here(&topic, &url),
            HomeMsg::Live { topic, msg } => out.push(Event::Live { topic, msg }),
            HomeMsg::Resync { topic } => out.push(Event::Resync { topic }),
            HomeMsg::Answer(ev) => out.push(ev),
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
        let hash = self.shared.placement.content_hash(&req.data);
        let home = self.home_of(&req.topic);
        if home == usize::from(self.me) {
            return match self.store_here(req, hash, out) {
                (result, None) => Done::Now(result),
                done => {
                    self.answer_publish(self.me, ticket, done, out);
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
        _out: &mut Events,
    ) -> Done<Result<(), RelayError>> {
        if self.is_mine(topic) {
            self.register_here(topic, url, self.me, ticket, _out);
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

    fn on_message(&mut self, msg: EngineMsg, out: &mut Events) {
        if let EngineMsg::Local(m) = msg {
            self.on_home_msg(m, out);
        }
    }

    fn tick(&mut self, now: u64, _out: &mut Events) {
        self.home.sweep(now);
        if let Some(j) = self.journal.as_mut() {
            j.compact_step(&mut self.home);
        }
    }

    fn flush(&mut self, out: &mut Events) -> bool {
        // Records reach the kernel before any answer leaves: to a socket of this worker
        // (the worker writes sockets after this), or to another worker (sent below).
        if let Some(j) = self.journal.as_mut() {
            j.flush(&mut self.home, &mut self.settled);
            self.send_settled(out);
        }
        let m = &self.shared.metrics.cores[usize::from(self.me)];
        self.outbox.flush(&self.shared.mailboxes, m, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_presized_for_its_budget_unless_overcommit_is_strict() {
        let gib = 1 << 30;
        // Room for the most messages a GiB can hold: each costs at least 144 bytes.
        assert_eq!(cache_presize(gib, false), gib / 144);
        assert!(cache_presize(gib, false) * (super::super::cache::ENTRY_OVERHEAD + 26) > gib);
        // Under strict overcommit: one per KiB, at most a million.
        assert_eq!(cache_presize(gib, true), 1 << 20);
        assert_eq!(cache_presize(64 << 20, true), 64 << 10);
    }
}
