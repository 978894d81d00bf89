//! The queued events carried out: live messages through each topic's feed, histories,
//! answers (each ticket given back to what waited for it), v1 frames, written down as the
//! [`Deliveries`] the worker applies; and the reads a gap or a resync asks for.

use std::sync::Arc;

use super::deliveries::{Deliveries, Delivery, Fetched, SubAt};
use super::feed::{Feed, SubState, UNASKED};
use super::subs::LocalSub;
use super::{
    Event, Message, Position, PushKind, Queued, Relay, RelayError, Retry, Ticket, Waiter,
    READ_RETRY_MS,
};
use crate::notice::Notify;
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
    pub fn deliver_within_round(&mut self) -> Deliveries {
        let pending = self.queue.pushes;
        let out = self.deliver();
        self.queue.pushes += pending;
        out
    }

    /// Carries out the queued events: returns what this worker's connections get, in
    /// order, for the worker to apply (then to give back: [`Relay::recycle`]).
    pub fn deliver(&mut self) -> Deliveries {
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
                self.deliver_one(d);
            }
            self.queue.spare = super::recycle(list);
            self.absorb();
        }
        self.release_blocking();
        std::mem::take(&mut self.queue.out)
    }

    /// `d`, applied, back for the next round (with its room, unless a burst made it large).
    pub fn recycle(&mut self, d: Deliveries) {
        if self.queue.out.is_empty() {
            self.queue.out = d.recycled();
        }
    }

    fn deliver_one(&mut self, q: Queued) {
        match q.event {
            Event::Live { topic, msg } => self.deliver_live(q.slot, &topic, msg),
            Event::Published { ticket, result } => {
                if let Some(Waiter::Publish {
                    conn,
                    answer,
                    arrived,
                }) = self.waiter(ticket)
                {
                    let result = result.map(|_| ());
                    self.queue.out.list.push(Delivery::Answer {
                        conn,
                        answer,
                        result,
                    });
                    self.latency.ack(arrived);
                }
            }
            Event::History { ticket, result } => match self.waiter(ticket) {
                Some(Waiter::Read { topic }) => self.deliver_history(&topic, ticket, result),
                Some(Waiter::Fetch {
                    conn,
                    answer,
                    topic,
                    after,
                }) => {
                    let f = Fetched {
                        conn,
                        answer,
                        topic,
                        after,
                        result,
                    };
                    self.queue.out.list.push(Delivery::Fetched(Box::new(f)));
                }
                _ => {}
            },
            Event::WebhookAdded { ticket, result } => {
                if let Some(Waiter::Webhook { conn }) = self.waiter(ticket) {
                    self.queue.out.list.push(Delivery::Webhook { conn, result });
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
                let ix = self.queue.out.frame(frame, kind);
                for &c in conns {
                    if self.origin_of(c.uid) != origin {
                        let text = Delivery::Text { conn: c, frame: ix };
                        self.queue.out.list.push(text);
                    }
                }
            }
            Event::V1Pending { ticket, frames } => {
                if let Some(Waiter::V1Take { conn }) = self.waiter(ticket) {
                    for frame in frames {
                        let ix = self.queue.out.frame(frame, PushKind::Replay);
                        let text = Delivery::Text { conn, frame: ix };
                        self.queue.out.list.push(text);
                    }
                }
            }
        }
    }

    /// What `ticket` waited for, now answered (`None`: nobody waits for it any more).
    fn waiter(&mut self, ticket: Ticket) -> Option<Waiter> {
        self.waiting.tickets.try_remove(ticket as usize)
    }

    fn deliver_live(&mut self, slot: u32, topic: &Arc<str>, mut msg: Message) {
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
        let notify = &*self.notify;
        let latency = &mut self.latency;
        let out = &mut self.queue.out;
        // One push id for every subscriber of the message (DECISIONS 13: a receipt names
        // it), one entry for all its pushes.
        let ix = out.message(&msg.body, msg.pos, kind);
        let again = t
            .feed
            .deliver_live(&mut t.subs, &msg, hold, &mut |i, s: &mut LocalSub, m| {
                push(
                    out,
                    s,
                    SubAt {
                        slot,
                        index: i as u32,
                    },
                    ix,
                    notify,
                );
                latency.delivered(m.body.arrived(), 1);
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
        let out = &mut self.queue.out;
        let again = t.feed.on_history(
            &mut t.subs,
            ticket,
            &history,
            &mut |i, s: &mut LocalSub, m: &Message| {
                // A replay is no latency sample: its age is the client's absence.
                let ix = out.message(&m.body, m.pos, PushKind::Replay);
                push(
                    out,
                    s,
                    SubAt {
                        slot,
                        index: i as u32,
                    },
                    ix,
                    notify,
                );
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

/// The push of message `ix` to subscription `s` (at `at`); to a client id's subscription,
/// followed by what the connection keeps until it acknowledges it.
#[inline]
fn push(out: &mut Deliveries, s: &LocalSub, at: SubAt, ix: u32, notify: &dyn Notify) {
    let conn = s.conn;
    out.list.push(Delivery::Push { conn, at, msg: ix });
    if let Some(c) = &s.client {
        let watched = notify.watching() && notify.watched(&c.id);
        out.list.push(Delivery::Unacked {
            conn,
            at,
            msg: ix,
            watched,
        });
    }
}
