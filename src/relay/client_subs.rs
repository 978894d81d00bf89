//! The relay's side of subscriptions that belong to a client id (DECISIONS 13): a socket's
//! subscription of a client id tells the topic's home `+1 socket`, its close `-1 socket`
//! with the position it reached, an explicit unsubscribe ends the client's subscription;
//! HTTP subscriptions (no socket) and receipts (`irn_batchReceive`) go to the home too.
//! All of it travels in the worker's queue to the home with its `watch` and `read`, so
//! their order holds; nothing here runs per message.

use std::collections::HashMap;
use std::sync::Arc;

use super::{ConnRef, Dialect, Position, Relay, RelayError, SubId, Ticket, Waiter};
use crate::engine::{ClientOp, ClientRef};
use crate::message::Body;
use crate::notice::{Notice, Status, Typ};

impl Relay {
    /// [`Relay::subscribe`] on a connection of `client`: the subscription is the client's
    /// too, and starts after what the client was given. Refused past
    /// `--max-mailbox-topics`.
    pub fn subscribe_as(
        &mut self,
        conn: ConnRef,
        topic: &str,
        id: SubId,
        dialect: Dialect,
        client: &Arc<ClientRef>,
    ) -> Result<u32, RelayError> {
        let name: Arc<str> = match self.subs.name_and_slot(topic) {
            Some((name, _)) => name,
            None => Arc::from(topic),
        };
        let op = ClientOp::Subscribe { socket: true };
        self.engine.client(&name, client, op, &mut self.events)?;
        Ok(self.add_sub(conn, topic, Some(&name), id, dialect, Some(client.clone())))
    }

    /// [`Relay::fetch`] for a connection of `client`: after what the client was given, and
    /// what the answer gives counts as given to it (at most `max` messages).
    pub fn fetch_as(
        &mut self,
        conn: ConnRef,
        answer: u64,
        topic: &str,
        after: Position,
        client: &Arc<ClientRef>,
        max: usize,
    ) {
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
        let ev = &mut self.events;
        self.engine
            .read_for(&topic, after, client, Some(max), ticket, ev);
        self.absorb();
    }

    /// The connection's subscription on `slot` ends with its socket; a client id's stays,
    /// given everything up to where the socket's subscription reached, but not `unacked`
    /// (the socket's first push not acknowledged) or anything after it.
    pub fn closed(&mut self, slot: u32, conn: ConnRef, unacked: Option<Position>) {
        self.socket_gone(slot, conn, unacked);
        self.remove_sub(slot, conn);
    }

    /// The socket's subscription on `slot` ends; a client id's stays (`-1 socket`, given
    /// everything up to where the socket's subscription reached and before `unacked`).
    pub(super) fn socket_gone(&mut self, slot: u32, conn: ConnRef, unacked: Option<Position>) {
        let Some(t) = self.subs.get(slot) else { return };
        let Some(s) = t.subs.iter().find(|s| s.conn == conn) else {
            return;
        };
        let Some(client) = s.client.clone() else {
            return;
        };
        let reached = match s.follow.state {
            super::feed::SubState::Active(at) => at,
            super::feed::SubState::Syncing { from, .. } => from,
        };
        let at = match unacked {
            Some(u) => reached.min(Position {
                epoch: u.epoch,
                seq: u.seq.saturating_sub(1),
            }),
            None => reached,
        };
        let name = t.name.clone();
        let op = ClientOp::SocketGone { at };
        let _ = self.engine.client(&name, &client, op, &mut self.events);
    }

    /// An explicit unsubscribe of the connection's subscription on `slot`: a client id's
    /// subscription of the topic ends with it (DECISIONS 13).
    pub fn unsubscribe_client(&mut self, slot: u32, conn: ConnRef) {
        let found = self.subs.get(slot).and_then(|t| {
            let s = t.subs.iter().find(|s| s.conn == conn)?;
            Some((t.name.clone(), s.client.clone()?))
        });
        if let Some((name, client)) = found {
            let op = ClientOp::Unsubscribe { socket: true };
            let _ = self.engine.client(&name, &client, op, &mut self.events);
        }
        self.remove_sub(slot, conn);
    }

    /// An unsubscribe of `client` from `topic` that no socket of this worker holds (over
    /// HTTP, or a topic the connection did not subscribe to here).
    pub fn client_unsubscribe(&mut self, client: &str, project: Option<&str>, topic: &str) {
        let client = client_ref(client, project);
        let op = ClientOp::Unsubscribe { socket: false };
        let _ = self
            .engine
            .client(&Arc::from(topic), &client, op, &mut self.events);
        self.absorb();
    }

    /// A subscription of client id `client` (of project `project`) to `topic` that belongs
    /// to the client id, not to a socket (the HTTP transport's subscribes): kept for
    /// `--mailbox-ttl`, bounded per client id. Its id is the one the client computes itself.
    pub fn client_subscribe(
        &mut self,
        client: &str,
        project: Option<&str>,
        topic: &str,
    ) -> Result<SubId, RelayError> {
        let c = client_ref(client, project);
        let op = ClientOp::Subscribe { socket: false };
        self.engine
            .client(&Arc::from(topic), &c, op, &mut self.events)?;
        self.absorb();
        Ok(SubId::for_client(topic, client))
    }

    /// `irn_batchReceive`: `client` (its `did:key` id; `None` for a connection without a
    /// token, which has no mailbox) received these messages `(topic, message id)`: they
    /// are delivered for it (not fetched again, not given to its next subscription).
    pub fn receive(&mut self, client: Option<&str>, receipts: &[(&str, u64)]) {
        self.m().receipts.add(receipts.len() as u64);
        let Some(client) = client else { return };
        let c = client_ref(client, None);
        let mut by_topic: HashMap<&str, Vec<u64>> = HashMap::new();
        for &(topic, id) in receipts {
            by_topic.entry(topic).or_default().push(id);
        }
        for (topic, ids) in by_topic {
            let op = ClientOp::Receive { ids };
            let _ = self
                .engine
                .client(&Arc::from(topic), &c, op, &mut self.events);
        }
        self.absorb();
    }

    /// A socket of `client` acknowledged the push `push_id` of `body` on `topic`:
    /// `delivered` to its watches.
    pub fn acknowledged(&self, client: &str, topic: &str, push_id: u64, body: &Body) {
        if !self.notify.watched(client) {
            return;
        }
        let (message, tag, attestation) = body.parts();
        self.notify.event(&Notice {
            client,
            typ: Typ::Subscriber,
            status: Status::Delivered,
            message_id: push_id,
            topic,
            message,
            attestation,
            published_at: body.published_at(),
            tag,
            ttl: crate::engine::memory::home::clients::NOTICE_TTL_S,
        });
    }
}

/// A client id named by its `did:key` (the project, when known, selects its push URL).
fn client_ref(client: &str, project: Option<&str>) -> Arc<ClientRef> {
    ClientRef::new(client, project)
}
