//! The client-id subscriptions of a home's topics (DECISIONS 13; the types in
//! `engine::clients`): what a client id's subscribe, socket close, unsubscribe, fetch and
//! receipts do to its subscription of a topic, the reads that start after what the client
//! was given, the expiry of mailboxes with no socket (`--mailbox-ttl`), and the notices a
//! stored message gives the client ids of its topic (`notice::Notify`).

use std::collections::VecDeque;
use std::sync::Arc;

use super::HomeTopics;
use crate::engine::clients::{ClientOp, ClientRef, ClientSub, MailboxTable, MAX_CLIENTS_PER_TOPIC};
use crate::engine::{History, Message, Position, PublishReq};
use crate::notice::{Notice, Notify, PushNotice, Silent, Status, Typ};

/// Default `--mailbox-ttl`, seconds (DECISIONS 13: 7 days).
pub const DEFAULT_MAILBOX_TTL_S: u64 = 7 * 24 * 3600;

/// What a home's client-id subscriptions share.
pub struct Mailboxes {
    /// `--mailbox-ttl`, ms.
    pub ttl_ms: u64,
    /// The topics each client id keeps, process-wide.
    pub table: Arc<MailboxTable>,
    /// Who is told about the client ids' messages.
    pub notify: Arc<dyn Notify>,
    /// (expiry, topic, client) of subscriptions left without a socket, in expiry order (the
    /// ttl is one for all); an entry whose subscription has a socket again, or a later
    /// expiry, is skipped when it comes up.
    queue: VecDeque<(u64, Arc<str>, Arc<str>)>,
    /// Client subscriptions held here.
    held: usize,
}

impl Default for Mailboxes {
    fn default() -> Self {
        Mailboxes {
            ttl_ms: DEFAULT_MAILBOX_TTL_S * 1000,
            table: Arc::default(),
            notify: Arc::new(Silent),
            queue: VecDeque::new(),
            held: 0,
        }
    }
}

impl std::fmt::Debug for Mailboxes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailboxes")
            .field("ttl_ms", &self.ttl_ms)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

/// What a client op changed, for the durable log.
#[derive(Debug)]
pub enum ClientChange {
    /// Nothing to record.
    None,
    /// The subscription is as this now (its old record, if any, is superseded).
    Now(ClientSub),
    /// The client's subscription ended; its record, if any, is cancelled.
    Gone(Arc<str>, Option<crate::store::Loc>),
}

impl HomeTopics {
    /// Sets the mailbox ttl (ms), the process's table and the notices.
    pub fn set_mailboxes(
        &mut self,
        ttl_ms: u64,
        table: Arc<MailboxTable>,
        notify: Arc<dyn Notify>,
    ) {
        self.mail.ttl_ms = ttl_ms.max(1);
        self.mail.table = table;
        self.mail.notify = notify;
    }

    /// `client`'s subscription of `topic` as its record would hold it now.
    pub fn client_change(&self, topic: &str, client: &str) -> ClientChange {
        match self.client_sub(topic, client) {
            Some(s) => ClientChange::Now(recordable(s, crate::clock::coarse().0, self.mail.ttl_ms)),
            None => ClientChange::None,
        }
    }

    /// Client subscriptions held by this home.
    pub fn client_subs(&self) -> usize {
        self.mail.held
    }

    /// `client`'s subscription of `topic`, if it has one here.
    pub fn client_sub(&self, topic: &str, client: &str) -> Option<&ClientSub> {
        let t = self.topics.get(self.find(topic)? as usize)?;
        let c = t.clients.as_ref()?;
        c.subs.get(c.find(client)?)
    }

    /// Applies `op` of `client` on `topic` at `now` (worker clock, ms).
    pub fn client_op(
        &mut self,
        topic: &Arc<str>,
        client: &ClientRef,
        op: ClientOp,
        now: u64,
    ) -> ClientChange {
        let creating = matches!(op, ClientOp::Subscribe { .. });
        let slot = match self.find(topic) {
            Some(s) => s,
            None if creating => self.slot_of(topic),
            None => return ClientChange::None,
        };
        let ttl = self.mail.ttl_ms;
        let t = &mut self.topics[slot as usize];
        let last = t.last();
        let clients = t.clients.get_or_insert_with(Default::default);
        let i = match clients.find(&client.id) {
            Some(i) => i,
            None if creating && clients.subs.len() < MAX_CLIENTS_PER_TOPIC => {
                if clients.subs.len() == clients.subs.capacity() && clients.subs.len() < 4 {
                    // A topic has one or two client ids (a dApp and a wallet): room for
                    // four would be kept by every idle topic.
                    clients.subs.reserve_exact(1);
                }
                clients.subs.push(ClientSub::new(client.clone()));
                self.mail.held += 1;
                self.mail.table.hold(&client.id, topic);
                clients.subs.len() - 1
            }
            None => {
                if clients.subs.is_empty() {
                    t.clients = None;
                }
                if creating {
                    // The topic is full of client ids: this one was counted for nothing.
                    self.mail.table.release(&client.id, topic);
                }
                self.gc(slot);
                return ClientChange::None;
            }
        };
        let change = match op {
            ClientOp::Unsubscribe { .. } => {
                let gone = clients.subs.swap_remove(i);
                self.mail.held = self.mail.held.saturating_sub(1);
                self.mail.table.release(&gone.client.id, topic);
                ClientChange::Gone(gone.client.id, gone.record)
            }
            op => {
                let s = &mut clients.subs[i];
                let before = s.expires;
                let change = apply_op(s, op, last, now + ttl);
                if s.expires != before && s.expires != 0 {
                    // Idle from now: its mailbox expires then unless a socket comes back.
                    let exp = s.expires;
                    self.mail
                        .queue
                        .push_back((exp, topic.clone(), client.id.clone()));
                }
                change
            }
        };
        self.settle_clients(slot);
        let moved = self.advance_receipts(slot, &client.id);
        match change {
            ClientChange::None if moved => match self.client_sub(topic, &client.id) {
                Some(s) => ClientChange::Now(recordable(s, now, ttl)),
                None => ClientChange::None,
            },
            ClientChange::Now(_) => match self.client_sub(topic, &client.id) {
                Some(s) => ClientChange::Now(recordable(s, now, ttl)),
                None => ClientChange::None,
            },
            other => other,
        }
    }

    /// After a change of the topic's clients: its idle count, the receipts that now follow
    /// on, the topic itself if nothing refers to it any more.
    fn settle_clients(&mut self, slot: u32) {
        if let Some(t) = self.topics.get_mut(slot as usize) {
            if let Some(c) = t.clients.as_mut() {
                c.recount();
                if c.subs.is_empty() {
                    t.clients = None;
                }
            }
        }
        self.gc(slot);
    }

    /// Moves the client's delivered position over the cached messages it received next;
    /// `true` when it moved.
    fn advance_receipts(&mut self, slot: u32, client: &str) -> bool {
        let Some(t) = self.topics.get_mut(slot as usize) else {
            return false;
        };
        let epoch = t.epoch;
        let Some(c) = t.clients.as_mut() else {
            return false;
        };
        let Some(i) = c.find(client) else {
            return false;
        };
        let s = &mut c.subs[i];
        if s.received.is_empty() {
            return false;
        }
        let before = s.delivered;
        for &k in &t.cached {
            let Some(m) = self.cache.get(k) else { continue };
            let pos = Position {
                epoch,
                seq: m.topic_seq,
            };
            if pos <= s.delivered {
                continue;
            }
            let Some(body) = m.body() else { break };
            let id = body.message_id(m.topic_seq);
            if !s.has_received(id) {
                break;
            }
            s.delivered = pos;
            s.received.retain(|&r| r != id);
        }
        s.delivered != before
    }

    /// The topic's cached messages after `after` for `client`: after what it was given, the
    /// ones it received left out. With `fetch`, at most `max` of them, and what they
    /// reach counts as given to the client (each reported `delivered` to a watch).
    pub fn read_for(
        &mut self,
        topic: &str,
        after: Position,
        client: &str,
        fetch: Option<usize>,
    ) -> History {
        let sub = self.client_sub(topic, client);
        // A position of an older history than the topic's reads it all (see `read`).
        let from = sub.map_or(after, |s| after.max(s.delivered));
        let received: Vec<u64> = sub.map(|s| s.received.clone()).unwrap_or_default();
        let mut h = self.read(topic, from);
        if !received.is_empty() {
            h.messages
                .retain(|m| !received.contains(&m.body.message_id(m.pos.seq)));
        }
        let Some(max) = fetch else { return h };
        if h.messages.len() > max {
            h.messages.truncate(max);
        }
        let reached = h.messages.last().map_or(h.last, |m| m.pos);
        if sub.is_some() {
            self.notify_each(topic, client, &h.messages, Status::Delivered);
        }
        if let Some(slot) = self.find(topic) {
            if let Some(c) = self.topics[slot as usize].clients.as_mut() {
                if let Some(i) = c.find(client) {
                    c.subs[i].deliver_to(reached);
                }
            }
            self.advance_receipts(slot, client);
        }
        h
    }

    /// Reports `status` (typ subscriber) of each of `messages` to the watches of `client`.
    fn notify_each(&self, topic: &str, client: &str, messages: &[Message], status: Status) {
        let n = &self.mail.notify;
        if messages.is_empty() || !n.watched(client) {
            return;
        }
        for m in messages {
            let (message, tag, attestation) = m.body.parts();
            n.event(&Notice {
                client,
                typ: Typ::Subscriber,
                status,
                message_id: m.body.message_id(m.pos.seq),
                topic,
                message,
                attestation,
                published_at: m.body.published_at(),
                tag,
                ttl: NOTICE_TTL_S,
            });
        }
    }

    /// A message `msg` was stored on the topic in `slot` from `req`: `accepted` for the
    /// publisher's watches, and for each other client id subscribed `accepted`, `queued`
    /// when it has no socket, and a push for a `prompt` message when it has no socket.
    pub fn client_notices(&self, slot: Option<u32>, req: &PublishReq, pos: Position) {
        let n = &*self.mail.notify;
        let may_push = req.prompt && n.pushes();
        if !may_push && !n.watching() {
            // Nobody to tell (the common case): the topic's clients are not looked at.
            return;
        }
        let clients = slot
            .and_then(|s| self.topics.get(s as usize))
            .and_then(|t| t.clients.as_deref());
        let publisher = req.publisher.as_deref();
        let is_publisher = |id: &str| publisher.is_some_and(|p| *p.id == *id);
        let pushes = may_push && clients.is_some_and(|c| c.idle > 0);
        let wanted = pushes
            || publisher.is_some_and(|p| n.watched(&p.id))
            || clients.is_some_and(|c| {
                c.subs
                    .iter()
                    .any(|s| !is_publisher(&s.client.id) && n.watched(&s.client.id))
            });
        if !wanted {
            return;
        }
        let (message, tag, attestation) = req.body.parts();
        let message_id = req.body.message_id(pos.seq);
        let published_at = req.body.published_at();
        let notice = |client: &'_ str, typ: Typ, status: Status| {
            n.event(&Notice {
                client,
                typ,
                status,
                message_id,
                topic: &req.topic,
                message,
                attestation,
                published_at,
                tag,
                ttl: req.ttl,
            })
        };
        if let Some(p) = publisher {
            if n.watched(&p.id) {
                notice(&p.id, Typ::Publisher, Status::Accepted);
            }
        }
        let Some(clients) = clients else { return };
        for s in &clients.subs {
            let id = &*s.client.id;
            if is_publisher(id) {
                continue;
            }
            if n.watched(id) {
                notice(id, Typ::Subscriber, Status::Accepted);
                if s.sockets == 0 {
                    notice(id, Typ::Subscriber, Status::Queued);
                }
            }
            if pushes && s.sockets == 0 {
                n.push(&PushNotice {
                    client: id,
                    project: &s.client.project,
                    topic: &req.topic,
                    message,
                    tag,
                    ttl: req.ttl,
                });
            }
        }
    }

    /// Ends the client subscriptions whose mailbox expired at `now` (no socket since).
    pub(super) fn sweep_mailboxes(&mut self, now: u64) {
        while let Some((exp, _, _)) = self.mail.queue.front() {
            if *exp > now {
                break;
            }
            let Some((exp, topic, client)) = self.mail.queue.pop_front() else {
                break;
            };
            let Some(slot) = self.find(&topic) else {
                continue;
            };
            let t = &mut self.topics[slot as usize];
            let Some(c) = t.clients.as_mut() else {
                continue;
            };
            let Some(i) = c.find(&client) else { continue };
            if c.subs[i].sockets > 0 || c.subs[i].expires != exp {
                continue;
            }
            let gone = c.subs.swap_remove(i);
            self.mail.held = self.mail.held.saturating_sub(1);
            self.mail.table.release(&client, &topic);
            if let Some(loc) = gone.record {
                self.released.push(loc);
            }
            self.settle_clients(slot);
        }
        // Stale entries (a socket came back, a later expiry) stay bounded.
        if self.mail.queue.len() > 2 * self.mail.held + 1024 {
            let topics = &self.topics;
            let index = &self.index;
            self.mail.queue.retain(|(exp, topic, client)| {
                index
                    .get(topic)
                    .and_then(|&s| topics.get(s as usize))
                    .and_then(|t| t.clients.as_ref())
                    .and_then(|c| c.subs.iter().find(|s| *s.client.id == **client))
                    .is_some_and(|s| s.sockets == 0 && s.expires == *exp)
            });
        }
    }

    /// Restores a client subscription at start (`expires` on the worker clock).
    pub fn restore_client(&mut self, topic: &Arc<str>, mut sub: ClientSub, now: u64) {
        if sub.expires <= now {
            if let Some(loc) = sub.record {
                self.released.push(loc);
            }
            return;
        }
        sub.sockets = 0;
        let slot = self.slot_of(topic);
        let t = &mut self.topics[slot as usize];
        let c = t.clients.get_or_insert_with(Default::default);
        if let Some(i) = c.find(&sub.client.id) {
            if let Some(loc) = c.subs[i].record.take() {
                self.released.push(loc);
            }
            c.subs[i] = sub.clone();
        } else {
            c.subs.push(sub.clone());
            self.mail.held += 1;
        }
        self.mail.table.hold(&sub.client.id, topic);
        self.mail
            .queue
            .push_back((sub.expires, topic.clone(), sub.client.id.clone()));
        self.settle_clients(slot);
    }

    /// Records where `client`'s subscription of `topic` now lives in the log (the caller
    /// releases the record it supersedes).
    pub fn set_client_record(&mut self, topic: &str, client: &str, loc: crate::store::Loc) {
        let Some(slot) = self.find(topic) else { return };
        let Some(c) = self.topics[slot as usize].clients.as_mut() else {
            return;
        };
        if let Some(i) = c.find(client) {
            c.subs[i].record = Some(loc);
        }
    }

    /// Every client subscription with its topic, as recorded (to copy forward, repair or
    /// rewrite).
    pub fn client_records(&self) -> Vec<(Arc<str>, ClientSub)> {
        let (now, ttl) = (crate::clock::coarse().0, self.mail.ttl_ms);
        self.topics
            .iter()
            .flat_map(|(_, t)| {
                t.clients.iter().flat_map(move |c| {
                    c.subs
                        .iter()
                        .map(move |s| (t.name.clone(), recordable(s, now, ttl)))
                })
            })
            .collect()
    }
}

/// `s` as its record holds it: with a socket, the mailbox expiry it would have if that
/// socket closed now (a record outlived by a later one, or by its tombstone, can come
/// back at a restart: it comes back bounded by its own expiry).
fn recordable(s: &ClientSub, now: u64, ttl: u64) -> ClientSub {
    let mut r = s.clone();
    if r.expires == 0 {
        r.expires = now + ttl;
    }
    r
}

/// The ttl a `delivered` notice is retried within, seconds (the message's own ttl is not
/// at hand where a fetch or an acknowledgement delivers it).
pub const NOTICE_TTL_S: u32 = 24 * 3600;

/// `op` (any but an unsubscribe) applied to the client's subscription `s` of a topic whose
/// last position is `last`; `expires`: when its mailbox expires if it is idle from now.
fn apply_op(s: &mut ClientSub, op: ClientOp, last: Position, expires: u64) -> ClientChange {
    match op {
        ClientOp::Subscribe { socket } => {
            let new = s.record.is_none() && s.sockets == 0 && s.expires == 0;
            if socket {
                s.sockets += 1;
                s.expires = 0;
            } else if s.sockets == 0 {
                s.expires = expires;
            }
            if new || !socket {
                ClientChange::Now(s.clone())
            } else {
                ClientChange::None
            }
        }
        ClientOp::SocketGone { at } => {
            s.sockets = s.sockets.saturating_sub(1);
            s.deliver_to(at.min(last));
            if s.sockets == 0 {
                s.expires = expires;
            }
            ClientChange::Now(s.clone())
        }
        ClientOp::Delivered { at } => {
            if s.deliver_to(at.min(last)) {
                ClientChange::Now(s.clone())
            } else {
                ClientChange::None
            }
        }
        ClientOp::Receive { ids } => {
            for id in ids {
                s.receive(id);
            }
            ClientChange::Now(s.clone())
        }
        ClientOp::Unsubscribe { .. } => ClientChange::None,
    }
}

#[cfg(test)]
#[path = "clients_tests.rs"]
mod tests;
