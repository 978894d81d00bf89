//! The in-memory engine's side of client-id subscriptions (DECISIONS 13): a client's
//! subscribe, socket close, unsubscribe, fetch and receipts travel to the topic's home in
//! the worker's queue (after its `watch`, before its `read`), where `home/clients.rs` keeps
//! them; the durable engine records each change in the home's journal.

use std::sync::Arc;

use super::{HomeMsg, LocalEngine, Reply};
use crate::engine::clients::{ClientOp, ClientRef};
use crate::engine::memory::home::clients::ClientChange;
use crate::engine::RelayError;
use crate::engine::{Event, Events, Position, Ticket};

impl LocalEngine {
    /// See `Engine::client`.
    pub(super) fn client_op(
        &mut self,
        topic: &Arc<str>,
        client: &Arc<ClientRef>,
        op: ClientOp,
    ) -> Result<(), RelayError> {
        if let ClientOp::Subscribe { .. } = op {
            let max = self.shared.limits.max_mailbox_topics;
            if !self.shared.mailboxes.admit(&client.id, topic, max) {
                return Err(RelayError::SubscriberLimitExceeded(max));
            }
        }
        if self.is_mine(topic) {
            self.client_here(topic, client, op);
        } else {
            let home = self.home_of(topic);
            let msg = HomeMsg::Client {
                topic: topic.clone(),
                client: client.clone(),
                op,
            };
            self.send(home, msg);
        }
        Ok(())
    }

    /// Applies a client op on this home (and records it).
    pub(super) fn client_here(&mut self, topic: &Arc<str>, client: &Arc<ClientRef>, op: ClientOp) {
        let now = crate::clock::coarse().0;
        let change = self.home.client_op(topic, client, op, now);
        self.record_client(topic, change);
    }

    /// Writes what a client op changed into the journal, if there is one.
    fn record_client(&mut self, topic: &Arc<str>, change: ClientChange) {
        let Some(j) = self.journal.as_mut() else {
            return;
        };
        match change {
            ClientChange::None => {}
            ClientChange::Now(sub) => {
                if let Some(a) = j.client_sub(topic, &sub) {
                    self.home.set_client_record(topic, &sub.client.id, a.loc);
                    if let Some(old) = sub.record {
                        j.log_mut().release(old);
                    }
                }
            }
            ClientChange::Gone(client, record) => {
                if let Some(loc) = record {
                    j.client_gone(topic, &client, loc);
                }
            }
        }
    }

    /// A read for `client` on this home; a fetch's delivered position is recorded.
    pub(super) fn read_for_here(
        &mut self,
        topic: &Arc<str>,
        after: Position,
        client: &Arc<ClientRef>,
        fetch: Option<usize>,
    ) -> crate::engine::History {
        let h = self.home.read_for(topic, after, &client.id, fetch);
        if fetch.is_some() {
            let change = self.home.client_change(topic, &client.id);
            self.record_client(topic, change);
        }
        h
    }

    /// See `Engine::read_for`.
    pub(super) fn read_client(
        &mut self,
        topic: &Arc<str>,
        after: Position,
        client: &Arc<ClientRef>,
        fetch: Option<usize>,
        ticket: Ticket,
        out: &mut Events,
    ) {
        if self.is_mine(topic) {
            let result = Ok(self.read_for_here(topic, after, client, fetch));
            out.push(Event::History { ticket, result });
            return;
        }
        let reply = Reply {
            core: self.me,
            ticket,
        };
        let msg = HomeMsg::ReadFor {
            topic: topic.clone(),
            after,
            client: client.clone(),
            fetch,
            reply,
        };
        self.send(self.home_of(topic), msg);
    }
}
