//! What the relay does for a client beyond one socket's subscriptions: blocking subscribes
//! answered once their subscription is in place ([`Relay::when_in_place`]), receipts
//! (`irn_batchReceive`, [`Relay::receive`]) and subscriptions that belong to a client id
//! rather than a socket ([`Relay::client_subscribe`], the HTTP transport's). The last two
//! are seams: client-id subscriptions and mailboxes are built behind them (issue 47, H4).

use super::feed::SubState;
use super::subs::{ConnRef, SubId};
use super::{Recipients, Relay, RelayError};

/// A connection's answer that waits for its subscription on a topic to be in place: its
/// first read of the topic's history has come back (on Redis that read is held until the
/// node's SUBSCRIBE is confirmed), so it is known on every node that must know it.
#[derive(Debug)]
pub(super) struct Blocking {
    conn: ConnRef,
    answer: u64,
    slot: u32,
}

impl Relay {
    /// Resolves one result of `conn`'s pending answer `answer` (through
    /// [`Recipients::answer`]) once its subscription on `slot` is in place: at the end of
    /// the first delivery after it became active, or at once, at that delivery, when it
    /// already is or is gone (unsubscribed, closed: the answer must not wait forever).
    pub fn when_in_place(&mut self, conn: ConnRef, answer: u64, slot: u32) {
        self.blocking.push(Blocking { conn, answer, slot });
    }

    /// Whether `conn`'s subscription on `slot` is still waiting for its first history.
    fn still_syncing(&self, b: &Blocking) -> bool {
        self.subs.get(b.slot).is_some_and(|t| {
            t.subs.iter().any(|s| {
                s.conn == b.conn
                    && matches!(s.follow.state, SubState::Syncing { from, .. } if from == super::Position::ZERO)
            })
        })
    }

    /// Answers the blocking subscribes whose subscription is now in place.
    pub(super) fn release_blocking(&mut self, to: &mut impl Recipients) {
        if self.blocking.is_empty() {
            return;
        }
        let mut list = std::mem::take(&mut self.blocking);
        list.retain(|b| {
            if self.still_syncing(b) {
                return true;
            }
            to.answer(b.conn, b.answer, Ok(()));
            false
        });
        self.blocking = list;
    }

    /// `irn_batchReceive`: `client` (its `did:key` id; `None` for a connection without a
    /// token) acknowledges these messages `(topic, message id)`. Counted only for now.
    // H4: a receipt marks the message delivered for the client id (no `queued` event, no
    // push, not fetched again).
    pub fn receive(&mut self, client: Option<&str>, receipts: &[(&str, u64)]) {
        let _ = client;
        self.m().receipts.add(receipts.len() as u64);
    }

    /// Ends client id `client`'s own subscription to `topic` (the HTTP transport's
    /// unsubscribes). Nothing yet.
    // H4: removes the client-id subscription.
    pub fn client_unsubscribe(&mut self, client: &str, topic: &str) {
        let _ = (client, topic);
    }

    /// A subscription of client id `client` (of project `project`) to `topic` that belongs
    /// to the client id, not to a socket (the HTTP transport's subscribes): its id, the one
    /// the client computes itself. Only the id for now.
    // H4: the client-id subscription itself (kept for `--mailbox-ttl`, bounded per client
    // id, durable, in Redis on a cluster).
    pub fn client_subscribe(
        &mut self,
        client: &str,
        project: Option<&str>,
        topic: &str,
    ) -> Result<SubId, RelayError> {
        let _ = project;
        Ok(SubId::for_client(topic, client))
    }
}
