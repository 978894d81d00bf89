//! The in-memory engine's messages to other workers, batched per destination and sent at
//! the end of each loop round, within a bound: past `--core-queue` messages waiting for a
//! worker, a publish is refused (`Overloaded`, answered here) and a live message dropped,
//! its topic owed one `Resync` there; answers and control messages always stay (each
//! answers a ticket somebody waits for).

use crate::engine::Handoff;
use std::sync::Arc;

use super::msg::HomeMsg;
use crate::engine::RelayError;
use crate::engine::{Event, Events};
use crate::mailbox::Mailbox;
use crate::metrics::{CoreMetrics, DropReason};

/// The mailboxes of every worker's in-memory engine, in worker order.
pub type Peers = Arc<[Mailbox<Vec<HomeMsg>>]>;

/// One worker's outgoing batches.
pub struct Outboxes {
    /// Messages per destination worker, oldest first.
    batches: Vec<Vec<HomeMsg>>,
    /// Per destination: topics whose live messages were dropped, owed a `Resync`.
    resync_owed: Vec<Vec<Arc<str>>>,
    /// `--core-queue`.
    cap: usize,
    /// Something may wait in `batches` or `resync_owed` (a round with nothing to send
    /// skips the walk over every destination).
    any: bool,
}

impl Outboxes {
    /// Empty outboxes for `workers` destinations, bounded by `cap` messages each.
    pub fn new(workers: usize, cap: usize) -> Outboxes {
        Outboxes {
            batches: (0..workers).map(|_| Vec::new()).collect(),
            resync_owed: (0..workers).map(|_| Vec::new()).collect(),
            cap,
            any: false,
        }
    }

    /// Queues `msg` for worker `to`.
    pub fn push(&mut self, to: usize, msg: HomeMsg) {
        if let Some(o) = self.batches.get_mut(to) {
            o.push(msg);
            self.any = true;
        }
    }

    /// Sends every waiting batch; a batch that finds its queue full is kept (within the
    /// bound) for the next round. Returns `true` when something is still waiting.
    pub fn flush(&mut self, peers: &Peers, m: &CoreMetrics, out: &mut Events) -> Handoff {
        if !self.any {
            return Handoff::Done;
        }
        let mut waiting = false;
        for to in 0..self.batches.len() {
            for topic in std::mem::take(&mut self.resync_owed[to]) {
                self.push(to, HomeMsg::Report(Event::Resync { topic }));
            }
            if self.batches[to].is_empty() {
                continue;
            }
            let batch = std::mem::take(&mut self.batches[to]);
            let sent = match peers.get(to) {
                Some(mb) => mb.try_send(batch),
                None => Ok(()),
            };
            if let Err(mut back) = sent {
                self.shed(to, &mut back, m, out);
                self.batches[to] = back;
                waiting = true;
            }
        }
        // What `shed` kept or owes is in `batches` / `resync_owed` again: look next round.
        self.any = waiting;
        if waiting {
            Handoff::Waiting
        } else {
            Handoff::Done
        }
    }

    /// Makes a batch that found its queue full fit the bound.
    fn shed(&mut self, to: usize, batch: &mut Vec<HomeMsg>, m: &CoreMetrics, out: &mut Events) {
        if batch.len() <= self.cap {
            return;
        }
        let cap = self.cap;
        let mut kept = 0usize;
        let mut dropped = 0u64;
        let mut refused = Vec::new();
        let owed = &mut self.resync_owed[to];
        batch.retain_mut(|msg| {
            kept += 1;
            if kept <= cap {
                return true;
            }
            match msg {
                HomeMsg::Publish { reply, .. } => {
                    refused.push(reply.ticket);
                    false
                }
                // A v1 frame has no position to read again from: dropped and counted.
                HomeMsg::Report(Event::V1Live { .. }) => {
                    dropped += 1;
                    false
                }
                HomeMsg::Report(Event::Live { topic, .. }) => {
                    if !owed.iter().any(|t| t == topic) {
                        owed.push(topic.clone());
                    }
                    dropped += 1;
                    false
                }
                _ => true,
            }
        });
        m.drop(DropReason::CoreQueueFull, dropped + refused.len() as u64);
        for ticket in refused {
            out.push(Event::Published {
                ticket,
                result: Err(RelayError::Overloaded),
            });
        }
    }
}
