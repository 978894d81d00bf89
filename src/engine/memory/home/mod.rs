//! A home worker's topics: the shared state of every topic whose home is this worker, as the
//! in-memory engine keeps it. Per topic: its epoch and last position, its cached messages
//! oldest first (in the worker's [`Cache`], which owns expiry and the byte budget), a dedup
//! filter, its webhooks, and which workers watch it.
//!
//! Pure state: no channel, no socket, no clock read. `engine::local` routes requests here
//! and carries the results to the workers that need them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use slab::Slab;

use super::cache::{Cache, Cached, Entry};
use crate::config::Limits;
use crate::engine::clients::TopicClients;
use crate::engine::RelayError;
use crate::engine::{new_epoch, History, Message, Origin, Position, PublishReq, Stored};
use crate::metrics::{CoreMetrics, DropReason, Metrics};
use crate::store::Loc;
use by_name::ByName;
use filter::Filter;

/// How many publishes ahead on a topic the entry its eviction removes is asked for (see
/// [`HomeTopics::prefetch_ahead`]).
const AHEAD: usize = 8;

/// One home topic.
#[derive(Debug)]
pub struct HomeTopic {
    /// The topic string.
    pub name: Arc<str>,
    /// The topic's history (see `Position`): new each time the topic is created here.
    epoch: u64,
    /// Position number of the last stored message (0 before the first).
    last_seq: u64,
    /// The other workers watching the topic (they have local subscribers); the home is
    /// not among them (see [`HomeTopics::watch`]).
    pub watchers: Vec<u16>,
    /// Cached message keys, oldest first.
    cached: VecDeque<usize>,
    /// The content hashes of `cached` (see [`Filter`]): a publish whose hash is absent is
    /// new without reading any cached message; a present one is compared byte for byte.
    hashes: Filter,
    /// Webhook registrations.
    pub webhooks: Vec<Webhook>,
    /// WalletConnect 1.0: workers with v1 subscribers, and how many each has.
    v1_watchers: Vec<(u16, u32)>,
    /// WalletConnect 1.0: pending frames (cache keys), oldest first.
    v1_pending: VecDeque<usize>,
    /// WalletConnect 1.0: the history of the pending frames' positions, apart from the v2
    /// cache's (a restart restores each from its own records).
    v1_epoch: u64,
    /// WalletConnect 1.0: number of the last pending frame (the `seq` of its position).
    v1_seq: u64,
    /// The client ids subscribed to the topic (DECISIONS 13), when it has any.
    clients: Option<Box<TopicClients>>,
}

/// A webhook registration of a home topic.
#[derive(Debug, Clone)]
pub struct Webhook {
    /// Its address.
    pub url: Arc<str>,
    /// Its record in the durable log, when there is one.
    pub record: Option<Loc>,
}

/// What [`HomeTopics::store`] did.
#[derive(Debug, Clone, Copy)]
pub struct StoreOutcome {
    /// Stored (with its position) or a duplicate.
    pub stored: Stored,
    /// The topic's slot, if the topic is still here (the byte budget may have evicted all
    /// of it, the topic too).
    pub slot: Option<u32>,
    /// The new message's cache key, if it is still cached.
    pub key: Option<usize>,
}

impl HomeTopic {
    fn new(name: Arc<str>) -> HomeTopic {
        let epoch = new_epoch();
        HomeTopic {
            name,
            epoch,
            last_seq: 0,
            watchers: Vec::new(),
            cached: VecDeque::new(),
            hashes: Filter::default(),
            webhooks: Vec::new(),
            v1_watchers: Vec::new(),
            v1_pending: VecDeque::new(),
            v1_epoch: epoch,
            v1_seq: 0,
            clients: None,
        }
    }

    /// Nothing refers to the topic any more: it can be forgotten (and its history with it).
    fn is_empty(&self) -> bool {
        self.watchers.is_empty()
            && self.cached.is_empty()
            && self.webhooks.is_empty()
            && self.v1_watchers.is_empty()
            && self.v1_pending.is_empty()
            && self.clients.is_none()
    }

    /// The position of the last stored message.
    pub fn last(&self) -> Position {
        Position {
            epoch: self.epoch,
            seq: self.last_seq,
        }
    }

    /// The position of `m`, a cached message or a pending v1 frame of this topic: the one
    /// its record names.
    pub fn position(&self, m: &Cached) -> Position {
        Position {
            epoch: if m.v1 { self.v1_epoch } else { self.epoch },
            seq: m.topic_seq,
        }
    }
}

/// The topics homed on one worker, and their cache.
pub struct HomeTopics {
    me: usize,
    topics: Slab<HomeTopic>,
    index: HashMap<Arc<str>, u32, ahash::RandomState>,
    /// `index` without hashing, for the names handed in as the topics' own `Arc`s.
    by_name: ByName,
    cache: Cache,
    /// This worker's share of `--max-cache-bytes`.
    budget: usize,
    limits: Limits,
    metrics: Arc<Metrics>,
    /// Webhook registrations of the whole process (`--max-webhooks`).
    webhook_count: Arc<AtomicUsize>,
    /// Records of what was removed since the engine last took them (to release in the log).
    released: Vec<Loc>,
    /// The client-id subscriptions' shared parts: mailbox ttl, the process's table, the
    /// expiry queue, the notices (see `clients.rs`).
    mail: clients::Mailboxes,
}

impl HomeTopics {
    /// The home state of worker `me`, with room for `presize` cached messages before any
    /// table grows (see `local::cache_presize`) and `budget` bytes of cache.
    pub fn new(
        me: usize,
        presize: usize,
        budget: usize,
        limits: Limits,
        metrics: Arc<Metrics>,
        webhook_count: Arc<AtomicUsize>,
    ) -> HomeTopics {
        HomeTopics {
            me,
            topics: Slab::new(),
            index: HashMap::default(),
            by_name: ByName::new(),
            cache: Cache::with_capacity(presize),
            budget: budget.max(1),
            limits,
            metrics,
            webhook_count,
            released: Vec::new(),
            mail: clients::Mailboxes::default(),
        }
    }

    fn m(&self) -> &CoreMetrics {
        &self.metrics.cores[self.me]
    }

    /// The topic in `slot`.
    pub fn get(&self, slot: u32) -> Option<&HomeTopic> {
        self.topics.get(slot as usize)
    }

    /// The slot of `topic`, if it is known here.
    pub fn find(&self, topic: &str) -> Option<u32> {
        self.index.get(topic).copied()
    }

    fn slot_of(&mut self, topic: &Arc<str>) -> u32 {
        let hint = self.by_name.candidate(topic);
        let named = |t: &HomeTopic| Arc::ptr_eq(&t.name, topic);
        if self.topics.get(hint as usize).is_some_and(named) {
            return hint;
        }
        let slot = match self.index.get(&**topic) {
            Some(&s) => s,
            None => {
                let slot = self.topics.insert(HomeTopic::new(topic.clone())) as u32;
                self.index.insert(topic.clone(), slot);
                self.m().topics.inc();
                slot
            }
        };
        if self.topics.get(slot as usize).is_some_and(named) {
            self.by_name.set(topic, slot);
        }
        slot
    }

    /// Forgets the topic in `slot` when nothing refers to it any more.
    fn gc(&mut self, slot: u32) {
        if self
            .topics
            .get(slot as usize)
            .is_some_and(HomeTopic::is_empty)
        {
            let t = self.topics.remove(slot as usize);
            self.index.remove(&t.name);
            self.m().topics.sub(1);
        }
    }

    /// The cache key of the message a publish on `t` will evict (its oldest, once the topic
    /// holds its cap).
    fn next_evicted(&self, t: &HomeTopic) -> Option<usize> {
        if t.cached.len() < self.limits.max_cached_per_topic {
            return None;
        }
        t.cached.front().copied()
    }

    /// Before a publish on `topic` is hashed: starts loading the message it will evict, so
    /// that this miss overlaps the hashing (see `crate::prefetch`). Returns the topic's slot
    /// when `topic` is its name's own allocation, for [`HomeTopics::prefetch_dedup`].
    pub fn prefetch_eviction(&self, topic: &Arc<str>) -> Option<u32> {
        let slot = self.by_name.candidate(topic);
        let t = self
            .topics
            .get(slot as usize)
            .filter(|t| Arc::ptr_eq(&t.name, topic))?;
        if let Some(k) = self.next_evicted(t) {
            self.cache.prefetch(k);
        }
        self.cache.prefetch_expiry();
        Some(slot)
    }

    /// Before a publish with content hash `hash` on the topic in `slot` is stored: starts
    /// loading the lines of the topic's filter that its check and the eviction's removal
    /// will probe, the evicted body's first line and its neighbours' entries, together (see
    /// `crate::prefetch`).
    pub fn prefetch_dedup(&self, slot: u32, hash: u64) {
        let Some(t) = self.topics.get(slot as usize) else {
            return;
        };
        t.hashes.prefetch(hash);
        if let Some(k) = self.next_evicted(t) {
            if let Some(m) = self.cache.get(k) {
                t.hashes.prefetch(m.hash);
                // The start of its body, which freeing it writes.
                crate::prefetch::line(&*m.data);
            }
            // Its neighbours in the cache's order, which removing it relinks.
            self.cache.prefetch_links(k);
        }
    }

    /// After a store on `t`: asks for the cache entries of the topic's next evictions, the
    /// next one and the one [`AHEAD`] publishes from now. A client sends many publishes to
    /// its topic in one read (about eighteen per read at saturation), so the next publishes
    /// on `t` follow at once and find their entries arrived; what lies behind an entry (its
    /// filter slot, its body, its neighbours) is asked for by the publish that evicts it
    /// ([`HomeTopics::prefetch_dedup`]). Only keys are read here: an entry that is not
    /// needed soon (a client with few publishes in flight) costs a hint, never a wait.
    fn prefetch_ahead(&self, t: &HomeTopic) {
        if t.cached.len() < self.limits.max_cached_per_topic {
            return;
        }
        if let Some(&k) = t.cached.get(AHEAD) {
            self.cache.prefetch(k);
        }
        // The queue's own line that the read above reaches eight publishes from now (a
        // reference, not read): the queue is cold too, a miss every eighth publish.
        if let Some(k) = t.cached.get(2 * AHEAD) {
            crate::prefetch::line(k);
        }
        if let Some(&k) = t.cached.front() {
            self.cache.prefetch(k);
        }
    }

    /// Stores a publish whose content hash is `hash` at `now` (worker clock, ms): dedup,
    /// next position, per-topic cap, byte budget.
    pub fn store(&mut self, req: &PublishReq, hash: u64, now: u64) -> StoreOutcome {
        let slot = self.slot_of(&req.topic);
        if self.is_duplicate(slot, req, hash) {
            self.m().drop(DropReason::Duplicate, 1);
            self.gc(slot);
            return StoreOutcome {
                stored: Stored::Duplicate,
                slot: None,
                key: None,
            };
        }
        let expires = now + u64::from(req.ttl) * 1000;
        let t = &mut self.topics[slot as usize];
        t.last_seq += 1;
        let pos = t.last();
        let key = self.insert(slot, pos.seq, hash, &req.body, expires, req.origin);
        self.m().stored.inc();
        let t = self.topics.get(slot as usize);
        if let Some(t) = t {
            self.prefetch_ahead(t);
        }
        let still = t.is_some().then_some(slot);
        StoreOutcome {
            stored: Stored::New(pos),
            slot: still,
            key: self
                .cache
                .get(key)
                .is_some_and(|m| m.topic == slot && m.topic_seq == pos.seq)
                .then_some(key),
        }
    }

    /// Caches a message of the topic in `slot`, then enforces the per-topic cap and the
    /// byte budget; returns its key (which the budget may already have evicted).
    fn insert(
        &mut self,
        slot: u32,
        seq: u64,
        hash: u64,
        body: &crate::message::Body,
        expires: u64,
        origin: Origin,
    ) -> usize {
        let key = self.cache.insert(Entry {
            topic: slot,
            topic_seq: seq,
            hash,
            data: body.irn().clone(),
            beta_len: body.beta_len(),
            expires,
            origin,
        });
        let t = &mut self.topics[slot as usize];
        t.cached.push_back(key);
        t.hashes.note(hash);
        self.m().cached_messages.inc();
        self.bound(slot, false);
        key
    }

    /// After an insert: the topic's queue (its v2 cache, or with `v1` its pending frames)
    /// back within `--max-cached-per-topic`, then the whole cache within its byte budget,
    /// oldest first. Inlined into `insert` (once per stored message).
    #[inline]
    fn bound(&mut self, slot: u32, v1: bool) {
        loop {
            let t = &self.topics[slot as usize];
            let queue = if v1 { &t.v1_pending } else { &t.cached };
            if queue.len() <= self.limits.max_cached_per_topic {
                break;
            }
            let Some(old) = queue.front().copied() else {
                break;
            };
            self.evict(old, DropReason::TopicCacheFull);
        }
        while self.cache.bytes() > self.budget || self.cache.len() > super::cache::MAX_LEN {
            let Some(k) = self.cache.oldest() else { break };
            self.evict(k, DropReason::CacheBytes);
        }
        self.m().cached_bytes.set(self.cache.bytes() as u64);
    }

    /// A message identical to `req` is cached on the topic.
    fn is_duplicate(&self, slot: u32, req: &PublishReq, hash: u64) -> bool {
        let t = &self.topics[slot as usize];
        t.hashes.may_contain(hash)
            && t.cached.iter().any(|&k| {
                self.cache.get(k).is_some_and(|m| {
                    m.hash == hash
                        && m.data.get(..m.beta_len as usize) == Some(req.body.beta_bytes())
                })
            })
    }

    /// Removes a cached message (counted as `why`), and the topic if that was the last of it.
    fn evict(&mut self, key: usize, why: DropReason) {
        let Some(m) = self.cache.remove(key) else {
            return;
        };
        self.m().cached_messages.sub(1);
        self.m().drop(why, 1);
        if let Some(loc) = m.record {
            self.released.push(loc);
        }
        if let Some(t) = self.topics.get_mut(m.topic as usize) {
            let list = if m.v1 {
                &mut t.v1_pending
            } else {
                &mut t.cached
            };
            if list.front() == Some(&key) {
                list.pop_front();
            } else if let Some(pos) = list.iter().position(|&k| k == key) {
                list.remove(pos);
            }
            if !m.v1 {
                t.hashes.forget(m.hash);
            }
        }
        self.gc(m.topic);
        // Its bytes become the next body's buffer (see `message::recycle`).
        crate::message::recycle(m.data);
    }

    /// Removes the messages expired at `now` (cost proportional to what expires).
    pub fn sweep(&mut self, now: u64) {
        let mut n = 0;
        while let Some(k) = self.cache.next_expired(now) {
            self.evict(k, DropReason::Expired);
            n += 1;
        }
        self.sweep_mailboxes(now);
        if n > 0 {
            self.m().cached_bytes.set(self.cache.bytes() as u64);
        }
    }

    /// The topic's cached messages after `after`, oldest first, and its last position (a
    /// topic unknown here has none: [`Position::ZERO`]).
    pub fn read(&self, topic: &str, after: Position) -> History {
        let Some(t) = self
            .index
            .get(topic)
            .and_then(|&s| self.topics.get(s as usize))
        else {
            return History::default();
        };
        let last = t.last();
        // Positions of another epoch than the topic's are from a history it no longer has.
        let from = if after.epoch == last.epoch {
            after.seq
        } else {
            0
        };
        let to_msg = |m: &Cached| {
            Some(Message {
                pos: Position {
                    epoch: last.epoch,
                    seq: m.topic_seq,
                },
                body: m.body()?,
                origin: m.origin,
            })
        };
        // Cached keys are in position order: skip the older ones from the back's view.
        let skip = t
            .cached
            .iter()
            .take_while(|&&k| self.cache.get(k).is_some_and(|m| m.topic_seq <= from))
            .count();
        let messages = t
            .cached
            .iter()
            .skip(skip)
            .filter_map(|&k| self.cache.get(k))
            .filter_map(to_msg)
            .collect();
        History { last, messages }
    }

    /// Worker `core` watches the topic. The home itself is never recorded: every live
    /// message of its topics goes to its own relay, which drops those of topics it has no
    /// subscriber of. So a topic subscribed only on its home has no home state until it has
    /// a message or a webhook (an idle subscription costs its connection's worker alone);
    /// its first message then starts a new epoch at position 1, which a subscription at
    /// [`Position::ZERO`] follows on from.
    pub fn watch(&mut self, topic: &Arc<str>, core: u16) {
        if usize::from(core) == self.me {
            return;
        }
        let slot = self.slot_of(topic);
        let t = &mut self.topics[slot as usize];
        if !t.watchers.contains(&core) {
            t.watchers.push(core);
        }
    }

    /// Worker `core` no longer watches the topic (see [`HomeTopics::watch`]).
    pub fn unwatch(&mut self, topic: &str, core: u16) {
        if usize::from(core) == self.me {
            return;
        }
        if let Some(slot) = self.find(topic) {
            self.topics[slot as usize].watchers.retain(|&c| c != core);
            self.gc(slot);
        }
    }

    /// Registers a webhook (the same address twice keeps one).
    pub fn add_webhook(
        &mut self,
        topic: &Arc<str>,
        url: Arc<str>,
    ) -> Result<WebhookAdded, RelayError> {
        let slot = self.slot_of(topic);
        let per_topic = self.limits.max_webhooks_per_topic;
        let global = self.limits.max_webhooks;
        let t = &mut self.topics[slot as usize];
        let res = if t.webhooks.iter().any(|w| *w.url == *url) {
            Ok(WebhookAdded::Exists)
        } else if t.webhooks.len() >= per_topic {
            Err(RelayError::TooManyWebhooksForTopic)
        } else if self.webhook_count.fetch_add(1, Ordering::Relaxed) >= global {
            self.webhook_count.fetch_sub(1, Ordering::Relaxed);
            Err(RelayError::TooManyWebhooks)
        } else {
            t.webhooks.push(Webhook { url, record: None });
            Ok(WebhookAdded::New)
        };
        self.gc(slot);
        res
    }

    /// Records where a webhook registration lives in the durable log.
    pub fn set_webhook_record(&mut self, topic: &str, url: &str, loc: Loc) {
        let Some(slot) = self.find(topic) else { return };
        if let Some(w) = self.topics[slot as usize]
            .webhooks
            .iter_mut()
            .find(|w| &*w.url == url)
        {
            w.record = Some(loc);
        }
    }

    /// Forgets a webhook.
    pub fn remove_webhook(&mut self, topic: &str, url: &str) -> WebhookRemoved {
        let Some(slot) = self.find(topic) else {
            return WebhookRemoved::NotThere;
        };
        let t = &mut self.topics[slot as usize];
        let Some(i) = t.webhooks.iter().position(|w| &*w.url == url) else {
            return WebhookRemoved::NotThere;
        };
        let w = t.webhooks.swap_remove(i);
        self.webhook_count.fetch_sub(1, Ordering::Relaxed);
        self.gc(slot);
        match w.record {
            Some(loc) => WebhookRemoved::Recorded(loc),
            None => WebhookRemoved::Unrecorded,
        }
    }

    /// Takes the records of what was removed since the last call.
    pub fn take_released(&mut self, into: &mut Vec<Loc>) {
        into.append(&mut self.released);
    }
}

/// What registering a webhook did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookAdded {
    /// A new registration.
    New,
    /// The topic had it already (one is kept).
    Exists,
}

/// What forgetting a webhook did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookRemoved {
    /// The topic had no such registration.
    NotThere,
    /// Forgotten; it had no record in the durable log (memory only, or not written yet).
    Unrecorded,
    /// Forgotten; its record in the durable log, to cancel.
    Recorded(Loc),
}

#[cfg(test)]
mod tests;

mod by_name;
pub mod clients;
mod durable;
mod filter;
mod v1;
