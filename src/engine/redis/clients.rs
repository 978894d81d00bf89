//! Client-id subscriptions on the Redis engine (DECISIONS 13): the worker's side of
//! `cluster::clients`. A client's subscribe, socket close, unsubscribe, fetch and receipts
//! go to the topic's Redis slot in the same queue as the worker's reads of the topic (so
//! their order holds); a read for a client starts after what the client was given (the
//! read script looks it up); the publishing node sends the notices and pushes of each
//! stored message (the publish script returns the topic's client ids): once in the cluster.
//!
//! Owns: the reads for clients in flight, the node's own count of each client's topics
//! (`--max-mailbox-topics` answered at once for what this node made), the refusals Redis
//! sent for the whole cluster. Must not touch connections: the relay gets [`Event`]s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::cluster::clients::{ClientCmd, MailboxCmd};
use super::cluster::{ClientRead, ClientSeen};
use super::RedisEngine;
use crate::engine::clients::{ClientOp, ClientRef};
use crate::engine::RelayError;
use crate::engine::{Body, Events, History, Position, Ticket};
use crate::notice::{Notice, Notify, PushNotice, Status, Typ};

/// How long a client id the cluster refused (`--max-mailbox-topics`) is refused at once
/// by this worker for a topic it does not keep, ms.
const FULL_HOLD_MS: u64 = 10_000;

/// Most client ids remembered as refused (past it the memory is cleared).
const MAX_FULL: usize = 4096;
/// How often worker 0 sweeps the node's count of expired mailboxes, ms.
const SWEEP_EVERY_MS: u64 = 60_000;

/// A client id the cluster refused: until when its new topics are refused here, and the
/// topics it keeps (subscribed again, they are admitted).
#[derive(Debug)]
pub(super) struct Full {
    until: u64,
    kept: std::collections::HashSet<Arc<str>>,
}

/// How often counts Redis may have missed are sent again, ms.
const RESEND_EVERY_MS: u64 = 1000;

/// This worker's sockets following a topic for a client id, as sent to Redis.
#[derive(Debug)]
struct Sock {
    client: Arc<ClientRef>,
    count: u32,
    /// Redis may have missed it: sent again at the next tick.
    dirty: bool,
}

/// This worker's socket counts per topic and client id (absolute counts are what
/// `clients.lua` keeps per worker: a close Redis missed is made good by sending the count
/// again, after a resync of the topic or when the op came back unsent).
#[derive(Debug, Default)]
pub(super) struct Socks {
    by_topic: HashMap<Arc<str>, Vec<Sock>, ahash::RandomState>,
    dirty: usize,
    resend_at: u64,
}

impl Socks {
    fn count(&self, topic: &str, client: &str) -> u32 {
        self.by_topic
            .get(topic)
            .and_then(|v| v.iter().find(|s| *s.client.id == *client))
            .map_or(0, |s| s.count)
    }

    /// Sets the count (an entry at 0 stays while it is to be sent again).
    fn set(&mut self, topic: &Arc<str>, client: &Arc<ClientRef>, count: u32) {
        let v = self.by_topic.entry(topic.clone()).or_default();
        match v.iter().position(|s| s.client.id == client.id) {
            Some(i) => {
                v[i].count = count;
                if count == 0 && !v[i].dirty {
                    v.swap_remove(i);
                }
            }
            None if count > 0 => v.push(Sock {
                client: client.clone(),
                count,
                dirty: false,
            }),
            None => {}
        }
        if v.is_empty() {
            self.by_topic.remove(topic);
        }
    }

    /// Redis may have missed the count of `client` on `topic`.
    fn mark(&mut self, topic: &Arc<str>, client: &Arc<ClientRef>) {
        let v = self.by_topic.entry(topic.clone()).or_default();
        match v.iter_mut().find(|s| s.client.id == client.id) {
            Some(s) if s.dirty => return,
            Some(s) => s.dirty = true,
            None => v.push(Sock {
                client: client.clone(),
                count: 0,
                dirty: true,
            }),
        }
        self.dirty += 1;
    }
}

/// What a publish needs for its notices once Redis stored it.
#[derive(Debug)]
pub(super) struct Publishing {
    pub topic: Arc<str>,
    pub body: Body,
    pub ttl: u32,
    pub prompt: bool,
    pub publisher: Option<Arc<ClientRef>>,
}

/// A read for a client id in flight.
#[derive(Debug)]
pub(super) struct ReadFor {
    topic: Arc<str>,
    client: Arc<ClientRef>,
    fetch: Option<usize>,
    /// Its first page was sent (as a read for the client).
    asked: bool,
    /// What the first page said about the client.
    read: Option<ClientRead>,
}

impl ReadFor {
    /// The client id, the first time only (its first page reads for it; the next pages
    /// follow on from where that one stopped).
    pub(super) fn first_page(&mut self) -> Option<Arc<str>> {
        if self.asked {
            return None;
        }
        self.asked = true;
        Some(self.client.id.clone())
    }
}

/// The topics each client id keeps through this node, with when each mailbox would expire
/// (`u64::MAX` while a socket of this node follows it): the node's own share of the
/// cluster's count, answered at once. Shared by the node's workers.
#[derive(Debug, Default)]
pub struct NodeMailboxes {
    table: Mutex<Table>,
}

/// Per client id, per topic, when its mailbox would expire.
type Table = HashMap<Arc<str>, HashMap<Arc<str>, u64>, ahash::RandomState>;

impl NodeMailboxes {
    fn with<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        let mut g = match self.table.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }

    /// `client` subscribes to `topic` at `now` (`until`: its mailbox expiry bound):
    /// `false` when it keeps `max` other unexpired topics through this node.
    fn admit(&self, client: &Arc<str>, topic: &Arc<str>, max: usize, now: u64, until: u64) -> bool {
        self.with(|t| {
            let set = t.entry(client.clone()).or_default();
            set.retain(|_, exp| *exp > now);
            if !set.contains_key(topic) && set.len() >= max {
                return false;
            }
            let e = set.entry(topic.clone()).or_insert(0);
            *e = (*e).max(until);
            true
        })
    }

    /// Forgets the mailboxes expired at `now` (a bounded table: clients that never come
    /// back leave nothing behind).
    pub(super) fn sweep(&self, now: u64) {
        self.with(|t| {
            t.retain(|_, set| {
                set.retain(|_, exp| *exp > now);
                !set.is_empty()
            })
        });
    }

    fn set(&self, client: &str, topic: &str, until: Option<u64>) {
        self.with(|t| {
            let Some(set) = t.get_mut(client) else { return };
            match until {
                Some(u) => {
                    if let Some(e) = set.get_mut(topic) {
                        *e = u;
                    }
                }
                None => {
                    set.remove(topic);
                }
            }
            if set.is_empty() {
                t.remove(client);
            }
        });
    }
}

impl RedisEngine {
    /// See `Engine::client`.
    pub(super) fn client_op(
        &mut self,
        topic: &Arc<str>,
        client: &Arc<ClientRef>,
        op: ClientOp,
    ) -> Result<(), RelayError> {
        let now = crate::clock::now_ms();
        let ttl = self.mail.ttl_ms;
        let (id, project) = (&client.id, &client.project);
        let mut count = None;
        let (cmd, mailbox) = match op {
            ClientOp::Subscribe { socket } => {
                let max = self.mail.max;
                let until = if socket { u64::MAX } else { now + ttl };
                let refused = self
                    .full
                    .get(id)
                    .is_some_and(|f| f.until > now && !f.kept.contains(topic));
                if refused || !self.mail.node.admit(id, topic, max, now, until) {
                    return Err(RelayError::SubscriberLimitExceeded(max));
                }
                let cmd = match socket {
                    true => {
                        let n = self.socks.count(topic, id) + 1;
                        count = Some(n);
                        ClientCmd::Sub(n)
                    }
                    false => ClientCmd::Http,
                };
                (cmd, Some(MailboxCmd::Add))
            }
            ClientOp::SocketGone { at } => {
                self.mail.node.set(id, topic, Some(now + ttl));
                let n = self.socks.count(topic, id).saturating_sub(1);
                count = Some(n);
                let cmd = ClientCmd::Gone(at.epoch, at.seq, n);
                (cmd, Some(MailboxCmd::Touch))
            }
            ClientOp::Unsubscribe { socket } => {
                self.mail.node.set(id, topic, None);
                self.full.remove(id);
                if socket {
                    count = Some(self.socks.count(topic, id).saturating_sub(1));
                }
                (ClientCmd::Unsub, Some(MailboxCmd::Del))
            }
            ClientOp::Delivered { at } => (ClientCmd::Delivered(at.epoch, at.seq), None),
            ClientOp::Receive { ids } => (ClientCmd::Receive(ids), None),
        };
        let subscribing = mailbox == Some(MailboxCmd::Add);
        if self.handle.client(topic, id, project, cmd).is_err() {
            self.handle.count_unavailable_answer(topic);
            if subscribing {
                self.mail.node.set(id, topic, None);
                return Err(RelayError::StorageUnavailable);
            }
            if let Some(n) = count {
                // A close or unsubscribe Redis did not get: its count goes again.
                self.socks.set(topic, client, n);
                self.socks.mark(topic, client);
            }
            return Err(RelayError::StorageUnavailable);
        }
        if let Some(n) = count {
            self.socks.set(topic, client, n);
        }
        if let Some(m) = mailbox {
            // Refused (a full queue): the cluster's count misses it until the next op.
            let _ = self.handle.mailbox(id, topic, m);
        }
        Ok(())
    }

    /// Periodic work: the node's count swept (worker 0, every [`SWEEP_EVERY_MS`]), the
    /// refusals past their time forgotten.
    pub(super) fn clients_tick(&mut self, now: u64) {
        self.resend_dirty(now);
        if now < self.mail.swept_at + SWEEP_EVERY_MS {
            return;
        }
        self.mail.swept_at = now;
        if self.handle.worker() == 0 {
            self.mail.node.sweep(crate::clock::now_ms());
        }
        let at = crate::clock::now_ms();
        self.full.retain(|_, f| f.until > at);
    }

    /// The topic's subscription on this node is live again after Redis was away: this
    /// worker's socket counts of its client ids go again (a close it missed is made good).
    pub(super) fn resend_sockets(&mut self, topic: &Arc<str>) {
        let Some(v) = self.socks.by_topic.get(topic) else {
            return;
        };
        let all: Vec<(Arc<ClientRef>, u32)> =
            v.iter().map(|s| (s.client.clone(), s.count)).collect();
        for (c, n) in all {
            let cmd = ClientCmd::Sockets(n);
            if self.handle.client(topic, &c.id, &c.project, cmd).is_err() {
                self.socks.mark(topic, &c);
            }
        }
    }

    /// An op carrying a socket count did not reach Redis.
    pub(super) fn client_unsent(&mut self, topic: Arc<str>, client: Arc<str>) {
        let c = Arc::new(ClientRef {
            id: client,
            project: Arc::from(""),
        });
        self.socks.mark(&topic, &c);
    }

    /// Sends again the counts Redis may have missed (at most every [`RESEND_EVERY_MS`]).
    fn resend_dirty(&mut self, now: u64) {
        if self.socks.dirty == 0 || now < self.socks.resend_at {
            return;
        }
        self.socks.resend_at = now + RESEND_EVERY_MS;
        self.socks.dirty = 0;
        let mut again = Vec::new();
        for (topic, v) in self.socks.by_topic.iter_mut() {
            for s in v.iter_mut().filter(|s| s.dirty) {
                s.dirty = false;
                again.push((topic.clone(), s.client.clone(), s.count));
            }
            v.retain(|s| s.count > 0);
        }
        self.socks.by_topic.retain(|_, v| !v.is_empty());
        for (topic, c, n) in again {
            let cmd = ClientCmd::Sockets(n);
            if self.handle.client(&topic, &c.id, &c.project, cmd).is_err() {
                self.socks.set(&topic, &c, n);
                self.socks.mark(&topic, &c);
            }
        }
    }

    /// The cluster refused `client`'s subscription of `topic`: it is undone, and the
    /// client's next subscriptions here are refused for a while.
    pub(super) fn mailbox_full(&mut self, topic: Arc<str>, client: Arc<str>, kept: Vec<String>) {
        log::debug!("client {client}: --max-mailbox-topics reached in the cluster ({topic})");
        let project: Arc<str> = Arc::from("");
        let _ = self
            .handle
            .client(&topic, &client, &project, ClientCmd::Unsub);
        self.mail.node.set(&client, &topic, None);
        if self.full.len() >= MAX_FULL {
            self.full.clear();
        }
        let full = Full {
            until: crate::clock::now_ms() + FULL_HOLD_MS,
            kept: kept.into_iter().map(Arc::from).collect(),
        };
        self.full.insert(client, full);
    }

    /// See `Engine::read_for`: the read's first page starts after what the client was
    /// given (`read.lua` looks it up: no extra round trip).
    pub(super) fn read_client(
        &mut self,
        topic: &Arc<str>,
        after: Position,
        client: &Arc<ClientRef>,
        fetch: Option<usize>,
        ticket: Ticket,
        out: &mut Events,
    ) {
        self.reads_for.insert(
            ticket,
            ReadFor {
                topic: topic.clone(),
                client: client.clone(),
                fetch,
                asked: false,
                read: None,
            },
        );
        crate::engine::Engine::read(self, topic, after, ticket, out);
    }

    /// What a read's first page said about its client.
    pub(super) fn client_read(&mut self, ticket: Ticket, c: ClientRead) {
        if let Some(rf) = self.reads_for.get_mut(&ticket) {
            rf.read = Some(c);
        }
    }

    /// A history read for a client is whole: its receipts left out; a fetch's messages
    /// count as given to it.
    pub(super) fn finish_for(&mut self, ticket: Ticket, h: &mut History) {
        let Some(rf) = self.reads_for.remove(&ticket) else {
            return;
        };
        let Some(read) = &rf.read else { return };
        if !read.received.is_empty() {
            h.messages
                .retain(|m| !read.received.contains(&m.body.message_id(m.pos.seq)));
        }
        let Some(max) = rf.fetch.filter(|_| read.subscribed) else {
            return;
        };
        h.messages.truncate(max);
        let reached = h.messages.last().map_or(h.last, |m| m.pos);
        let n = &self.mail.notify;
        if n.watched(&rf.client.id) {
            for m in &h.messages {
                let (message, tag, attestation) = m.body.parts();
                n.event(&Notice {
                    client: &rf.client.id,
                    typ: Typ::Subscriber,
                    status: Status::Delivered,
                    message_id: m.body.message_id(m.pos.seq),
                    topic: &rf.topic,
                    message,
                    attestation,
                    published_at: m.body.published_at(),
                    tag,
                    ttl: crate::engine::memory::home::clients::NOTICE_TTL_S,
                });
            }
        }
        if reached > Position::ZERO {
            let cmd = ClientCmd::Delivered(reached.epoch, reached.seq);
            let (id, project) = (&rf.client.id, &rf.client.project);
            let _ = self.handle.client(&rf.topic, id, project, cmd);
        }
    }

    /// A read for a client failed.
    pub(super) fn forget_for(&mut self, ticket: Ticket) {
        self.reads_for.remove(&ticket);
    }

    /// A message `p` was stored at `pos`: `accepted` for the publisher's watches, and for
    /// each other client id of the topic `accepted`, `queued` when no socket follows the
    /// topic for it anywhere, and a push for a `prompt` message then.
    pub(super) fn client_notices(&self, p: &Publishing, pos: Position, clients: &[ClientSeen]) {
        let n: &dyn Notify = &*self.mail.notify;
        let publisher = p.publisher.as_deref();
        let pushes = p.prompt && n.pushes() && clients.iter().any(|c| !c.socket);
        if !pushes && !n.watching() {
            return;
        }
        let wanted = pushes
            || publisher.is_some_and(|c| n.watched(&c.id))
            || clients.iter().any(|c| n.watched(&c.id));
        if !wanted {
            return;
        }
        let (message, tag, attestation) = p.body.parts();
        let message_id = p.body.message_id(pos.seq);
        let published_at = p.body.published_at();
        let notice = |client: &str, typ: Typ, status: Status| {
            n.event(&Notice {
                client,
                typ,
                status,
                message_id,
                topic: &p.topic,
                message,
                attestation,
                published_at,
                tag,
                ttl: p.ttl,
            })
        };
        if let Some(c) = publisher {
            if n.watched(&c.id) {
                notice(&c.id, Typ::Publisher, Status::Accepted);
            }
        }
        for c in clients {
            if n.watched(&c.id) {
                notice(&c.id, Typ::Subscriber, Status::Accepted);
                if !c.socket {
                    notice(&c.id, Typ::Subscriber, Status::Queued);
                }
            }
            if pushes && !c.socket {
                n.push(&PushNotice {
                    client: &c.id,
                    project: &c.project,
                    topic: &p.topic,
                    message,
                    tag,
                    ttl: p.ttl,
                });
            }
        }
    }
}

/// What a worker's Redis engine needs for client ids.
pub(super) struct Mail {
    /// `--mailbox-ttl`, ms.
    pub ttl_ms: u64,
    /// `--max-mailbox-topics`.
    pub max: usize,
    /// This node's count of each client's topics.
    pub node: Arc<NodeMailboxes>,
    /// Who is told about client ids' messages.
    pub notify: Arc<dyn Notify>,
    /// When [`RedisEngine::clients_tick`] last swept (worker clock, ms).
    pub swept_at: u64,
}

impl Default for Mail {
    fn default() -> Self {
        Mail {
            ttl_ms: crate::engine::memory::home::clients::DEFAULT_MAILBOX_TTL_S * 1000,
            max: 1000,
            node: Arc::default(),
            notify: Arc::new(crate::notice::Silent),
            swept_at: 0,
        }
    }
}
