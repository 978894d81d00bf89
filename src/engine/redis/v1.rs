//! WalletConnect 1.0 frames on the Redis engine (DECISIONS §8 "all cores, all nodes"): the
//! worker's side of `cluster::v1`.
//!
//! Owns: per topic, this worker's v1 subscriber count as Redis knows it, the `sub`s waiting
//! for the node's channel subscription, live frames held while a take is in flight. Must
//! not touch v2 state (the parent module) or connections: the relay gets [`Event`]s.
//!
//! The order that loses no frame between a `sub` on one node and a `pub` on another:
//! 1. the worker's first v1 subscriber of a topic: watch the topic's [`NS_V1`] channel and
//!    hold the `sub`'s take until the cluster's first `Subscribed` (Redis confirmed the node's
//!    SUBSCRIBE);
//! 2. then one script sets this worker's count and takes the pending frames, atomically:
//!    a `pub` that ran before left its frame pending (taken here), one that runs after sees
//!    the count and publishes on the channel, which this node now receives;
//! 3. later `sub`s send the count again with their take (idempotent);
//! 4. the last subscriber gone: the count goes (HDEL) first, then the unwatch;
//! 5. a later `Subscribed` (reconnect, Redis restarted) sends the count again.
//!
//! Frames arriving live while a take is in flight are held until its answer (bounded by
//! [`HELD_LIVE`]), so a subscriber gets the older pending frames first.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::cluster::{self, V1PublishReq, V1Published, NS_V1};
use super::RedisEngine;
use crate::engine::{Event, Events, Origin, Ticket, V1Publish};
use crate::webhook::Delivery as WebhookCall;

/// How long a `sub` waits for the node's channel subscription before it is answered with
/// no frames (Redis unreachable: a v1 `sub` has no error to answer).
const TAKE_WAIT_MS: u64 = 3000;
/// Most live frames held per topic while a take is in flight (past it they go at once).
const HELD_LIVE: usize = 1024;

/// One topic this worker has v1 subscribers of.
#[derive(Debug, Default)]
struct Topic {
    /// This worker's v1 subscriptions of it.
    count: u32,
    /// The node's channel subscription was confirmed (and the count sent since).
    live: bool,
    /// `sub`s waiting for that: ticket, deadline (worker clock ms).
    held: Vec<(Ticket, u64)>,
    /// Takes sent and not answered yet.
    taking: u32,
    /// Live frames that arrived meanwhile.
    early: Vec<(Bytes, Origin)>,
}

/// The v1 side of one worker's Redis engine.
#[derive(Debug, Default)]
pub(super) struct V1State {
    topics: HashMap<Arc<str>, Topic, ahash::RandomState>,
    /// Held `sub`s in all topics (skips the deadline scan when 0).
    held: usize,
    /// Takes in flight: their topic.
    taking: HashMap<Ticket, Arc<str>, ahash::RandomState>,
    /// Failures were logged and no v1 call succeeded since (one log line per outage).
    outage: bool,
}

impl RedisEngine {
    /// A v1 call failed: counted on the topic's shard, logged once per outage.
    fn v1_failed(&mut self, topic: &str, what: &str) {
        self.handle.count_unavailable_answer(topic);
        if !self.v1.outage {
            self.v1.outage = true;
            log::warn!("WalletConnect 1.0 {what} failed: Redis unavailable (counted in redis_storage_unavailable_answers_total; logged once per outage)");
        }
    }

    fn v1_ok(&mut self) {
        if self.v1.outage {
            self.v1.outage = false;
            log::info!("WalletConnect 1.0 frames reach Redis again");
        }
    }

    /// Whether this worker has v1 subscribers of the topic.
    pub(super) fn v1_wanted(&self, topic: &str) -> bool {
        self.v1.topics.contains_key(topic)
    }

    pub(super) fn v1_publish_req(&mut self, req: V1Publish) {
        let topic = req.topic.clone();
        let req = V1PublishReq {
            topic: req.topic,
            frame: req.frame,
            self_subscribed: req.self_subscribed,
            origin: req.origin,
            prompt: !req.silent,
        };
        if self.handle.v1_publish(req).is_err() {
            self.v1_failed(&topic, "pub");
        }
    }

    /// Sends a take (with the current count) or answers it with no frames when refused.
    fn v1_send_take(&mut self, topic: &Arc<str>, ticket: Ticket, out: &mut Events) {
        let count = self.v1.topics.get(topic).map_or(0, |t| t.count);
        if self.handle.v1_sub(Some(ticket), topic, count).is_ok() {
            if let Some(t) = self.v1.topics.get_mut(topic) {
                t.taking += 1;
                self.v1.taking.insert(ticket, topic.clone());
            }
        } else {
            self.v1_failed(topic, "sub");
            let frames = Vec::new();
            out.push(Event::V1Pending { ticket, frames });
        }
    }

    pub(super) fn v1_take_req(&mut self, topic: &Arc<str>, ticket: Ticket, out: &mut Events) {
        let deadline = crate::clock::now_ms() + TAKE_WAIT_MS;
        match self.v1.topics.get_mut(topic) {
            Some(t) if !t.live => {
                t.held.push((ticket, deadline));
                self.v1.held += 1;
            }
            _ => self.v1_send_take(topic, ticket, out),
        }
    }

    pub(super) fn v1_watch_req(&mut self, topic: &Arc<str>, delta: i32, out: &mut Events) {
        if delta > 0 {
            let t = self.v1.topics.entry(topic.clone()).or_default();
            t.count += 1;
            // The count goes with the take that follows (the relay takes after each sub).
            if t.count == 1 && !t.live && self.handle.watch(NS_V1, topic).is_err() {
                self.unasked.push((NS_V1, topic.clone()));
            }
            return;
        }
        let Some(t) = self.v1.topics.get_mut(topic) else {
            return;
        };
        t.count = t.count.saturating_sub(1);
        let (count, live) = (t.count, t.live);
        if live && self.handle.v1_sub(None, topic, count).is_err() {
            // Redis will not hear it: a node whose count stays is sent frames it drops
            // until its next resync (counted like any refused v1 call).
            self.v1_failed(topic, "unsubscribe");
        }
        if count > 0 {
            return;
        }
        let Some(t) = self.v1.topics.remove(topic) else {
            return;
        };
        let _ = self.handle.unwatch(NS_V1, topic);
        self.v1.held -= t.held.len();
        for (ticket, _) in t.held {
            out.push(Event::V1Pending {
                ticket,
                frames: Vec::new(),
            });
        }
        push_live(topic, t.early, out);
    }

    /// The node's subscription of the topic's channel is live (first time or again).
    pub(super) fn v1_subscribed(&mut self, topic: Arc<str>, out: &mut Events) {
        let Some(t) = self.v1.topics.get_mut(&topic) else {
            return;
        };
        t.live = true;
        let held = std::mem::take(&mut t.held);
        self.v1.held -= held.len();
        if held.is_empty() {
            let count = t.count;
            if self.handle.v1_sub(None, &topic, count).is_err() {
                self.v1_failed(&topic, "subscription");
            }
        }
        for (ticket, _) in held {
            self.v1_send_take(&topic, ticket, out);
        }
    }

    /// A frame on a v1 channel: to this worker's subscribers (held while a take is out).
    pub(super) fn v1_live(
        &mut self,
        topic: Arc<str>,
        frame: Bytes,
        origin: Origin,
        out: &mut Events,
    ) {
        match self.v1.topics.get_mut(&topic) {
            Some(t) if t.taking > 0 && t.early.len() < HELD_LIVE => t.early.push((frame, origin)),
            _ => out.push(Event::V1Live {
                topic,
                frame,
                origin,
            }),
        }
    }

    pub(super) fn v1_taken(
        &mut self,
        ticket: Ticket,
        result: Result<Vec<Bytes>, cluster::Unavailable>,
        out: &mut Events,
    ) {
        let topic = self.v1.taking.remove(&ticket);
        let frames = match result {
            Ok(f) => {
                self.v1_ok();
                f
            }
            Err(cluster::Unavailable) => {
                if let Some(t) = &topic {
                    self.v1_failed(t, "sub");
                }
                Vec::new()
            }
        };
        out.push(Event::V1Pending { ticket, frames });
        let Some(topic) = topic else { return };
        if let Some(t) = self.v1.topics.get_mut(&topic) {
            t.taking = t.taking.saturating_sub(1);
            if t.taking == 0 {
                let early = std::mem::take(&mut t.early);
                push_live(&topic, early, out);
            }
        }
    }

    pub(super) fn v1_published(
        &mut self,
        topic: Arc<str>,
        result: Result<V1Published, cluster::Unavailable>,
    ) {
        match result {
            Ok(p) => {
                self.v1_ok();
                for url in p.webhooks {
                    self.webhooks.submit(WebhookCall {
                        topic: topic.clone(),
                        url: Arc::from(url),
                    });
                }
            }
            Err(cluster::Unavailable) => self.v1_failed(&topic, "pub"),
        }
    }

    /// Answers (with no frames) the `sub`s that waited too long for the node's channel
    /// subscription; their count is sent when it comes.
    pub(super) fn v1_tick(&mut self, now: u64, out: &mut Events) {
        if self.v1.held == 0 {
            return;
        }
        let mut late = Vec::new();
        for (name, t) in self.v1.topics.iter_mut() {
            t.held.retain(|&(ticket, deadline)| {
                let keep = deadline > now;
                if !keep {
                    late.push((name.clone(), ticket));
                }
                keep
            });
        }
        self.v1.held -= late.len();
        for (topic, ticket) in late {
            self.v1_failed(&topic, "sub");
            out.push(Event::V1Pending {
                ticket,
                frames: Vec::new(),
            });
        }
    }
}

fn push_live(topic: &Arc<str>, frames: Vec<(Bytes, Origin)>, out: &mut Events) {
    for (frame, origin) in frames {
        out.push(Event::V1Live {
            topic: topic.clone(),
            frame,
            origin,
        });
    }
}
