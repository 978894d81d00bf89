//! The queued events carried out: live messages through each topic's feed, histories,
//! answers (each ticket given back to what waited for it), v1 frames, handed to the worker's
//! connections through [`Recipients`]; and the reads a gap or a resync asks for.

use std::sync::Arc;

use super::feed::{Feed, SubState, UNASKED};
use super::subs::LocalSub;
use super::{
    Event, Message, Position, PushKind, Queued, Recipients, Relay, RelayError, Retry, Ticket,
    Unacked, Waiter, READ_RETRY_MS,
};
use crate::outbuf::{fanout_share_min, fanout_shares_body};

/// Bytes of bodies queued for delivery (each counted once per subscriber) past which a
/// worker delivers within its round, right after the input that queued them, rather than
/// at the round's end: a saturated round publishes megabytes, and by its end each body,
/// written as it was published, has left the core's cache (a core's L2 holds about 1 MiB).
/// A round below this (about 47 pushes of a 512-character message) is delivered at its end:
/// at any load the core keeps up with, rounds are far smaller (at 20,000 publishes a
/// second, about one publish each), so their latency is not touched (docs/PERFORMANCE.md,
/// "The publish path at saturation").
pub const EARLY_DELIVERY_BYTES: usize = 32 << 10;

impl Relay {
    /// Asks again for a read that failed: its subscriptions move to a new one.
    pub(super) fn retry(&mut self, topic: &Arc<str>, old: Ticket) {
        let Some(slot) = self.subs.find(topic) else {
            return;
        };
        let Some(t) = self.subs.get_named(slot, topic) else {
            return;
        };
        Feed::retag(&mut t.subs, old, UNASKED);
        let from = t
            .subs
            .iter()
            .filter_map(|s| match s.follow.state {
                SubState::Syncing { ticket, from } if ticket == UNASKED => Some(from),
                _ => None,
            })
            .min();
        if let Some(from) = from {
            self.ask(topic, from);
        }
    }

    /// The queued live deliveries will copy at least [`EARLY_DELIVERY_BYTES`] of bodies:
    /// the worker carries them out now, within the round (see [`Relay::deliver_within_round`]).
    pub fn early_delivery_due(&self) -> bool {
        self.queue.bytes >= EARLY_DELIVERY_BYTES
    }

    /// Bytes of bodies the queued live deliveries will copy.
    pub fn queued_bytes(&self) -> usize {
        self.queue.bytes
    }

    /// [`Relay::deliver`] within a round, while the bodies just published are still in the
    /// core's cache: the pushes made still count against the round's fan-out budget.
    pub fn deliver_within_round(&mut self, to: &mut impl Recipients) {
        let pending = self.queue.pushes;
        self.deliver(to);
        self.queue.pushes += pending;
    }

    /// Carries out the queued deliveries on the worker's connections.
    pub fn deliver(&mut self, to: &mut impl Recipients) {
        self.queue.pushes = 0;
        self.queue.bytes = 0;
        // Reads answered at once while delivering (a resync) queue more: a few rounds.
        for _ in 0..4 {
            if self.queue.items.is_empty() {
                break;
            }
            let mut list =
                std::mem::replace(&mut self.queue.items, std::mem::take(&mut self.queue.spare));
            self.queue.pushes = 0;
            for d in list.drain(..) {
                self.deliver_one(d, to);
            }
            self.queue.spare = super::recycle(list);
            self.absorb();
        }
        self.release_blocking(to);
    }

    fn deliver_one(&mut self, q: Queued, to: &mut impl Recipients) {
        match q.event {
            Event::Live { topic, msg } => self.deliver_live(q.slot, &topic, msg, to),
            Event::Published { ticket, result } => {
                if let Some(Waiter::Publish {
                    conn,
                    answer,
                    arrived,
                }) = self.waiter(ticket)
                {
                    to.answer(conn, answer, result.map(|_| ()));
                    self.latency.ack(arrived);
                }
            }
            Event::History { ticket, result } => match self.waiter(ticket) {
                Some(Waiter::Read { topic }) => self.deliver_history(&topic, ticket, result, to),
                Some(Waiter::Fetch {
                    conn,
                    answer,
                    topic,
                    after,
                }) => to.fetched(conn, answer, &topic, after, result),
                _ => {}
            },
            Event::WebhookAdded { ticket, result } => {
                if let Some(Waiter::Webhook { conn }) = self.waiter(ticket) {
                    to.webhook_answer(conn, result);
                }
            }
            Event::Resync { topic } => {
                if let Some(slot) = self.subs.find(&topic) {
                    self.resync(slot);
                }
            }
            Event::V1Live {
                topic,
                frame,
                origin,
            } => {
                let conns = self.v1.of(&topic);
                let kind = PushKind::Live {
                    share_min: fanout_share_min(conns.len(), frame.len()),
                };
                for &c in conns {
                    if self.origin_of(c.uid) != origin {
                        to.push_text(c, &frame, kind);
                    }
                }
            }
            Event::V1Pending { ticket, frames } => {
                if let Some(Waiter::V1Take { conn }) = self.waiter(ticket) {
                    for f in &frames {
                        to.push_text(conn, f, PushKind::Replay);
                    }
                }
            }
        }
    }

    /// What `ticket` waited for, now answered (`None`: nobody waits for it any more).
    fn waiter(&mut self, ticket: Ticket) -> Option<Waiter> {
        self.waiting.tickets.try_remove(ticket as usize)
    }

    fn deliver_live(
        &mut self,
        slot: u32,
        topic: &Arc<str>,
        mut msg: Message,
        to: &mut impl Recipients,
    ) {
        let hold = self.limits.max_cached_per_topic;
        let Some(t) = self.subs.get_named(slot, topic) else {
            return;
        };
        let n = t.subs.len();
        // A big fan-out queues the body by reference in every connection (a reference
        // count bumped per subscriber): this worker takes its own copy, once, so that
        // count's cache line does not bounce between the cores sharing the original.
        if n > 1 && fanout_shares_body(n, msg.body.len()) {
            msg.body = msg.body.detached();
        }
        let kind = PushKind::Live {
            share_min: fanout_share_min(n, msg.body.len()),
        };
        // One id for every subscriber of the message (DECISIONS 13: a receipt names it).
        let push_id = msg.body.message_id(msg.pos.seq);
        let notify = &*self.notify;
        let latency = &mut self.latency;
        let again = t
            .feed
            .deliver_live(&mut t.subs, &msg, hold, &mut |s: &mut LocalSub, m| {
                to.push(s.conn, &s.id, s.dialect, &m.body, push_id, kind);
                latency.delivered(m.body.arrived(), 1);
                if let Some(c) = &s.client {
                    let watched = notify.watching() && notify.watched(&c.id);
                    let u = Unacked {
                        push_id,
                        slot,
                        topic,
                        msg: m,
                        watched,
                    };
                    to.unacked(s.conn, u);
                }
            });
        if let Some(from) = again {
            self.ask(topic, from);
        }
    }

    fn deliver_history(
        &mut self,
        topic: &Arc<str>,
        ticket: Ticket,
        result: Result<crate::engine::History, RelayError>,
        to: &mut impl Recipients,
    ) {
        let Some(slot) = self.subs.find(topic) else {
            return;
        };
        let history = match result {
            Ok(h) => h,
            Err(_) => {
                // The store could not answer: the subscriptions keep waiting; ask again.
                let at = crate::clock::now_ms() + READ_RETRY_MS;
                let topic = topic.clone();
                self.waiting.retries.push(Retry { topic, ticket, at });
                return;
            }
        };
        let Some(t) = self.subs.get_named(slot, topic) else {
            return;
        };
        let notify = &*self.notify;
        let again = t.feed.on_history(
            &mut t.subs,
            ticket,
            &history,
            &mut |s: &mut LocalSub, m: &Message| {
                let push_id = m.body.message_id(m.pos.seq);
                // A replay is no latency sample: its age is the client's absence.
                to.push(s.conn, &s.id, s.dialect, &m.body, push_id, PushKind::Replay);
                if let Some(c) = &s.client {
                    let watched = notify.watching() && notify.watched(&c.id);
                    let u = Unacked {
                        push_id,
                        slot,
                        topic,
                        msg: m,
                        watched,
                    };
                    to.unacked(s.conn, u);
                }
            },
        );
        if let Some(from) = again {
            Feed::retag(&mut t.subs, ticket, UNASKED);
            self.ask(topic, from);
        }
    }

    /// Every subscription of the topic in `slot` reads again from its position.
    fn resync(&mut self, slot: u32) {
        let Some(topic) = self.subs.get(slot).map(|t| t.name.clone()) else {
            return;
        };
        let Some(t) = self.subs.get_named(slot, &topic) else {
            return;
        };
        if let Some(from) = t.feed.resync_all(&mut t.subs) {
            self.metrics.cores[usize::from(self.me)].resyncs.inc();
            self.ask(&topic, from);
        }
    }

    /// Reads the topic after `from` for its subscriptions waiting on [`UNASKED`].
    fn ask(&mut self, topic: &Arc<str>, from: Position) {
        let Some(slot) = self.subs.find(topic) else {
            return;
        };
        let Some(t) = self.subs.get_named(slot, topic) else {
            return;
        };
        let ticket = self.waiting.tickets.insert(Waiter::Read {
            topic: t.name.clone(),
        }) as Ticket;
        Feed::retag(&mut t.subs, UNASKED, ticket);
        let name = t.name.clone();
        self.engine.read(&name, from, ticket, &mut self.events);
    }
}
