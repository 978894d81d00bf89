//! Blocking subscribes (`irn_subscribeBlocking`, `irn_batchSubscribeBlocking`): answered
//! once their subscription is in place ([`Relay::when_in_place`]). Subscriptions that
//! belong to a client id are `client_subs.rs`.

use super::deliveries::Delivery;
use super::feed::SubState;
use super::subs::ConnRef;
use super::Relay;

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
    /// Resolves one result of `conn`'s pending answer `answer` (a [`Delivery::Answer`])
    /// once its subscription on `slot` is in place: at the end of the first delivery after
    /// it became active, or at once, at that delivery, when it already is or is gone
    /// (unsubscribed, closed: the answer must not wait forever).
    pub fn when_in_place(&mut self, conn: ConnRef, answer: u64, slot: u32) {
        self.waiting.blocking.push(Blocking { conn, answer, slot });
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
    pub(super) fn release_blocking(&mut self) {
        if self.waiting.blocking.is_empty() {
            return;
        }
        let mut list = std::mem::take(&mut self.waiting.blocking);
        list.retain(|b| {
            if self.still_syncing(b) {
                return true;
            }
            self.queue.out.list.push(Delivery::Answer {
                conn: b.conn,
                answer: b.answer,
                result: Ok(()),
            });
            false
        });
        self.waiting.blocking = list;
    }
}
