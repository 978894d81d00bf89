//! Topics and routing across workers (DECISIONS §3, issue 2 §5).
//!
//! Every topic has a *home* worker, `hash(topic) % workers`, the single owner of the topic's
//! shared state: which other workers hold subscribers, the message cache (ttl, dedup,
//! eviction) and the webhook registrations. Every worker also keeps, per topic, the
//! subscriptions of its own connections. Workers talk only through [`CoreMsg`] batches on
//! bounded `crossbeam-channel` queues, each followed by a `mio::Waker` wake-up when the
//! receiver sleeps; no lock is taken on the way of a message.
//!
//! A publish goes publisher's worker -> home (skipped when they are the same) -> every worker
//! with subscribers, each of which fans it out to its own connections. A new subscription is
//! *pending* until the home answers with a replay of the cache: live messages that reach a
//! pending subscription are skipped, because the home's snapshot already contains them, and
//! the per-queue FIFO order guarantees that everything after the snapshot arrives after it.
//!
//! This module owns the tables and decides what to deliver; it never touches a socket. The
//! worker executes the [`Delivery`] list against its connections after each batch of events.

pub mod cache;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use slab::Slab;

use crate::config::Limits;
use crate::metrics::{CoreMetrics, DropReason};
use crate::webhook::{Delivery as WebhookCall, WebhookPool};

use cache::Cache;
pub use cache::Origin;

/// A subscription id: 32 bytes from the OS CSPRNG, held in the form every use needs, 64
/// lowercase hex characters (a push copies it as it is; nothing is encoded per message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubId([u8; 64]);

impl SubId {
    /// The id of 32 random bytes.
    pub fn from_bytes(raw: &[u8; 32]) -> SubId {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (pair, b) in out.chunks_exact_mut(2).zip(raw) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 15)];
        }
        SubId(out)
    }

    /// The 64-character lowercase hex form.
    pub fn hex(&self) -> &[u8; 64] {
        &self.0
    }

    /// Parses the hex form (any case); `None` when it is not 64 hex characters.
    pub fn from_hex(s: &str) -> Option<SubId> {
        let s = s.as_bytes();
        if s.len() != 64 || !s.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let mut out = [0u8; 64];
        for (o, c) in out.iter_mut().zip(s) {
            *o = c.to_ascii_lowercase();
        }
        Some(SubId(out))
    }
}

/// Pushes a worker lets its input queue up in one round before it stops reading, delivers
/// and flushes: at least [`FANOUT_MIN`], and [`FANOUT_PER_CONN`] per open connection, so that
/// a round gives each connection a few pushes to write at once (one publish to 10,000
/// subscribers is 10,000 pushes). Without a bound, one read of a few hundred publishes to a
/// big topic meant millions of queued pushes, gigabytes of buffers and seconds without a
/// write; with a bound too small, every round writes one push per connection and the
/// syscalls per delivery multiply (measured: 500k -> 157k deliveries/s for 1 -> 10,000 at
/// a bound of 32k).
pub const FANOUT_MIN: usize = 64 * 1024;

/// See [`FANOUT_MIN`]. Each write costs a connection a syscall, so the more pushes a round
/// gives each connection, the fewer writes per delivery: measured for 1 -> 10,000 at
/// saturation (one worker, EPYC VM), 16 per connection 1.39-1.43M deliveries/s, 32
/// 1.55-1.68M, 64 1.79-1.95M. A big topic's pushes hold their body by reference
/// (`outbuf::fanout_share_min`), so a round of 64 per connection takes ~190 bytes per push
/// (peak RSS in that overload 269 -> 368 MB); with 700-byte copies, 128 per connection was
/// already slower than 64.
pub const FANOUT_PER_CONN: usize = 64;

/// Messages a worker's cache makes room for at start, for a budget of `bytes`: as many as
/// the budget can ever hold (each costs at least [`cache::ENTRY_OVERHEAD`] plus
/// [`MIN_CACHED_DATA`]), so that no table of the cache ever grows while serving. A table
/// growing past a million entries copied or rehashed it all at once: measured, `pairs` at
/// 20,000/s right after a saturating run had taken the cache past the earlier presize of one
/// message per KiB: p99 94 ms, max 143 ms, against p99 1.2-1.6 ms in the runs after it.
/// The cost is address space, not memory: the slab and the expiry heaps are reserved, not
/// touched, and all fill from their start (the dedup filter, which would be touched at
/// random, is per topic: see `Home::hashes`). Measured at start, 1 GiB budget, one worker:
/// RSS 57 MB with the old presize (its global dedup map), 51 MB with this one.
///
/// Under strict overcommit (`vm.overcommit_memory=2`) reserved address space counts against
/// the commit limit (about 1.4 GB per GiB of budget here), and a failed reservation aborts
/// the process at start: there, the room is one message per KiB of budget, at most a
/// million, and the tables may grow (stalling the worker once per doubling) beyond it.
fn cache_presize(bytes: usize, strict_overcommit: bool) -> usize {
    if strict_overcommit {
        (bytes / 1024).min(1 << 20)
    } else {
        bytes / (cache::ENTRY_OVERHEAD + MIN_CACHED_DATA)
    }
}

/// The kernel refuses to overcommit memory (`vm.overcommit_memory` is 2).
fn strict_overcommit() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() == "2")
}

/// A floor on the bytes of a cached message's data: `{"topic":"","message":""}` is 26.
const MIN_CACHED_DATA: usize = 16;

/// A message from one worker to another.
#[derive(Debug)]
pub enum CoreMsg {
    /// To the home: store and fan out a publish.
    Publish {
        /// Topic.
        topic: Arc<str>,
        /// Encoded `{"topic":..,"message":..}`.
        data: Bytes,
        /// Content hash of `data`.
        hash: u64,
        /// Seconds to cache.
        ttl: u32,
        /// Push notifications wanted.
        prompt: bool,
        /// Publisher.
        origin: Origin,
    },
    /// To the home: worker `core` has a new subscription; reply with a [`CoreMsg::Replay`].
    Subscribe {
        /// Topic.
        topic: Arc<str>,
        /// The subscribing worker.
        core: u16,
        /// The subscription's connection (slab key) on that worker.
        conn_key: usize,
        /// The connection's uid.
        conn_uid: u64,
        /// Which subscribe this answers (a connection may resubscribe before a replay lands).
        serial: u64,
    },
    /// To the home: worker `core` has no subscriptions left on the topic.
    Unsubscribed {
        /// Topic.
        topic: Arc<str>,
        /// The worker.
        core: u16,
    },
    /// To a subscriber worker: deliver to the topic's active local subscriptions.
    Deliver {
        /// Topic.
        topic: Arc<str>,
        /// Encoded data object.
        data: Bytes,
        /// Publisher (not delivered back to it).
        origin: Origin,
    },
    /// To a subscriber worker: the cache snapshot for one pending subscription.
    Replay {
        /// Topic.
        topic: Arc<str>,
        /// Connection slab key.
        conn_key: usize,
        /// Connection uid.
        conn_uid: u64,
        /// The subscribe this answers.
        serial: u64,
        /// Cached messages, oldest first.
        messages: Vec<Bytes>,
    },
    /// To the home: register a webhook (answered with [`CoreMsg::WebhookAdded`]).
    AddWebhook {
        /// Topic.
        topic: Arc<str>,
        /// Webhook address.
        url: Arc<str>,
        /// Where to send the answer: (worker, connection key, connection uid).
        reply_to: (u16, usize, u64),
    },
    /// To the registering worker: the outcome of an [`CoreMsg::AddWebhook`].
    WebhookAdded {
        /// Connection slab key.
        conn_key: usize,
        /// Connection uid.
        conn_uid: u64,
        /// `Err(status, message)` when refused.
        result: Result<(), (u16, &'static str)>,
    },
    /// To the home: forget a webhook that has failed for too long.
    RemoveWebhook {
        /// Topic.
        topic: Arc<str>,
        /// Webhook address.
        url: Arc<str>,
    },
    /// Stop: close every connection and exit.
    Shutdown,
}

impl CoreMsg {
    /// Data messages may be dropped under overload; control messages are kept longer.
    fn is_data(&self) -> bool {
        matches!(self, CoreMsg::Publish { .. } | CoreMsg::Deliver { .. })
    }
}

/// One worker's inbox: a bounded queue of message batches and the waker of its poll loop.
#[derive(Debug)]
pub struct Mailbox {
    tx: Sender<Vec<CoreMsg>>,
    waker: mio::Waker,
    /// Set by the owner just before it may block in `poll`; a sender that finds it set
    /// clears it and wakes the owner.
    pub sleeping: AtomicBool,
}

/// Every worker's mailbox, shared by all workers.
#[derive(Debug)]
pub struct Mailboxes {
    boxes: Vec<Mailbox>,
}

impl Mailboxes {
    /// Builds mailboxes for workers whose wakers are given; returns the receivers in the
    /// same order. `batches` bounds each queue.
    pub fn new(
        wakers: Vec<mio::Waker>,
        batches: usize,
    ) -> (Arc<Mailboxes>, Vec<Receiver<Vec<CoreMsg>>>) {
        let mut boxes = Vec::new();
        let mut rxs = Vec::new();
        for waker in wakers {
            let (tx, rx) = crossbeam_channel::bounded(batches);
            boxes.push(Mailbox {
                tx,
                waker,
                sleeping: AtomicBool::new(false),
            });
            rxs.push(rx);
        }
        (Arc::new(Mailboxes { boxes }), rxs)
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.boxes.len()
    }

    /// No workers.
    pub fn is_empty(&self) -> bool {
        self.boxes.is_empty()
    }

    /// Sends a batch without blocking; gives it back when the queue is full.
    pub fn try_send(&self, to: usize, batch: Vec<CoreMsg>) -> Result<(), Vec<CoreMsg>> {
        let mb = &self.boxes[to];
        match mb.tx.try_send(batch) {
            Ok(()) => {
                if mb.sleeping.swap(false, Ordering::SeqCst) {
                    let _ = mb.waker.wake();
                }
                Ok(())
            }
            Err(TrySendError::Full(b)) | Err(TrySendError::Disconnected(b)) => Err(b),
        }
    }

    /// Sends one message from outside any worker (signal handler thread, webhook pool),
    /// retrying briefly when the queue is full.
    pub fn send_external(&self, to: usize, msg: CoreMsg) {
        let mut batch = vec![msg];
        for _ in 0..1000 {
            match self.try_send(to, batch) {
                Ok(()) => return,
                Err(b) => batch = b,
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        log::warn!("worker {to} inbox full; a control message was dropped");
    }

    /// Sets or clears worker `who`'s sleeping flag (only `who` itself calls this).
    pub fn set_sleeping(&self, who: usize, v: bool) {
        self.boxes[who].sleeping.store(v, Ordering::SeqCst);
    }
}

/// Which worker is home of a topic. Shared by all workers (same keys), random per process.
#[derive(Debug, Clone)]
pub struct Homes {
    hasher: ahash::RandomState,
    /// Content hashes: foldhash, measured 2.2x faster than ahash on a 600-byte message
    /// without AES instructions enabled at build time (49 vs 109 ns); a collision only costs
    /// a byte comparison in the dedup check.
    content: foldhash::quality::SeedableRandomState,
    workers: usize,
}

impl Homes {
    /// A random placement over `workers` workers.
    pub fn new(workers: usize, seeds: [u64; 4]) -> Homes {
        Homes {
            hasher: ahash::RandomState::with_seeds(seeds[0], seeds[1], seeds[2], seeds[3]),
            content: foldhash::quality::SeedableRandomState::with_seed(
                seeds[0] ^ seeds[3].rotate_left(17),
                foldhash::SharedSeed::global_random(),
            ),
            workers: workers.max(1),
        }
    }
    /// The home worker of `topic`.
    pub fn of(&self, topic: &str) -> usize {
        (self.hasher.hash_one(topic) % self.workers as u64) as usize
    }
    /// The content hash of a message's encoded data (same on every worker).
    pub fn content_hash(&self, data: &[u8]) -> u64 {
        std::hash::BuildHasher::hash_one(&self.content, data)
    }
}

/// A subscription held by one of this worker's connections.
#[derive(Debug, Clone)]
pub struct LocalSub {
    /// Connection slab key.
    pub conn_key: usize,
    /// Connection uid (guards against reused keys).
    pub conn_uid: u64,
    /// Subscription id.
    pub id: SubId,
    /// 0 when active; otherwise the serial of the replay it waits for.
    pub pending: u64,
}

/// Home-side state of a topic (present on its home worker only).
#[derive(Debug, Default)]
struct Home {
    /// Other workers holding subscribers.
    cores: Vec<u16>,
    /// Cached message keys, oldest first.
    cache: VecDeque<usize>,
    /// Content hash -> how many of `cache` have it: a publish whose hash is absent is new
    /// without reading any cached message; a present one is compared byte for byte.
    hashes: HashMap<u64, u32, foldhash::fast::RandomState>,
    /// Webhook addresses.
    webhooks: Vec<Arc<str>>,
}

impl Home {
    fn is_empty(&self) -> bool {
        self.cores.is_empty() && self.cache.is_empty() && self.webhooks.is_empty()
    }

    /// Records a cached message's hash.
    fn note(&mut self, hash: u64) {
        *self.hashes.entry(hash).or_insert(0) += 1;
    }

    /// Forgets a removed message's hash (the map's memory goes with its last entry).
    fn forget(&mut self, hash: u64) {
        if let Some(c) = self.hashes.get_mut(&hash) {
            *c -= 1;
            if *c == 0 {
                self.hashes.remove(&hash);
                if self.hashes.is_empty() {
                    self.hashes = HashMap::default();
                }
            }
        }
    }
}

/// A topic as seen by one worker.
#[derive(Debug)]
pub struct Topic {
    /// The topic string.
    pub name: Arc<str>,
    /// This worker's subscriptions to it.
    pub subs: Vec<LocalSub>,
    home: Option<Box<Home>>,
}

/// A delivery for the worker to carry out on its connections.
#[derive(Debug)]
pub enum Delivery {
    /// A live message for every active subscription of the topic except the publisher's.
    Live {
        /// Topic slot.
        slot: u32,
        /// Encoded data object.
        data: Bytes,
        /// Publisher's connection uid if it is on this worker, else 0.
        exclude_uid: u64,
    },
    /// The cache snapshot that activates one pending subscription.
    Replay {
        /// Topic slot.
        slot: u32,
        /// Connection slab key.
        conn_key: usize,
        /// Connection uid.
        conn_uid: u64,
        /// The subscribe it answers.
        serial: u64,
        /// Messages, oldest first.
        messages: Vec<Bytes>,
    },
    /// Answer to a deferred `POST /subscribe`.
    WebhookAnswer {
        /// Connection slab key.
        conn_key: usize,
        /// Connection uid.
        conn_uid: u64,
        /// Outcome.
        result: Result<(), (u16, &'static str)>,
    },
}

/// The outcome of registering a webhook from a connection of this worker.
#[derive(Debug, PartialEq, Eq)]
pub enum WebhookRegistration {
    /// Decided now.
    Done(Result<(), (u16, &'static str)>),
    /// Sent to the home worker; a [`Delivery::WebhookAnswer`] will follow.
    Deferred,
}

/// One worker's share of the relay.
pub struct Relay {
    me: u16,
    homes: Homes,
    mailboxes: Arc<Mailboxes>,
    topics: Slab<Topic>,
    index: HashMap<Arc<str>, u32, ahash::RandomState>,
    cache: Cache,
    /// Outgoing batches per destination worker, sent at the end of each loop iteration.
    outbox: Vec<Vec<CoreMsg>>,
    /// Deliveries decided since the worker last drained them.
    pub deliveries: Vec<Delivery>,
    /// Pushes the queued `deliveries` will make (subscribers of each live message, messages
    /// of each replay): input processing pauses once it reaches `fanout_budget`.
    pub pending_pushes: usize,
    /// This round's bound on `pending_pushes` (see [`FANOUT_MIN`]), set by the worker.
    pub fanout_budget: usize,
    next_serial: u64,
    limits: Limits,
    cache_budget: usize,
    metrics: Arc<crate::metrics::Metrics>,
    webhooks: WebhookPool,
    webhook_count: Arc<std::sync::atomic::AtomicUsize>,
}

impl Relay {
    /// The queued deliveries have reached this round's budget (see [`FANOUT_MIN`]): deliver
    /// and flush before processing more input.
    pub fn over_fanout_budget(&self) -> bool {
        self.pending_pushes >= self.fanout_budget
    }

    /// Sets the round's fan-out budget for a worker holding `connections`.
    pub fn set_fanout_budget(&mut self, connections: usize) {
        self.fanout_budget = connections.saturating_mul(FANOUT_PER_CONN).max(FANOUT_MIN);
    }

    /// The relay share of worker `me`.
    pub fn new(
        me: usize,
        homes: Homes,
        mailboxes: Arc<Mailboxes>,
        limits: Limits,
        metrics: Arc<crate::metrics::Metrics>,
        webhooks: WebhookPool,
        webhook_count: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Relay {
        let n = mailboxes.len();
        let strict = strict_overcommit();
        let presize = cache_presize(limits.max_cache_bytes / n.max(1), strict);
        if strict && me == 0 {
            log::info!(
                "vm.overcommit_memory=2: each worker's message cache reserves room for \
                 {presize} messages, not its budget's maximum; its tables grow past that"
            );
        }
        Relay {
            me: me as u16,
            homes,
            mailboxes,
            topics: Slab::new(),
            index: HashMap::default(),
            cache: Cache::with_capacity(presize),
            outbox: (0..n).map(|_| Vec::new()).collect(),
            deliveries: Vec::new(),
            pending_pushes: 0,
            fanout_budget: FANOUT_MIN,
            next_serial: 1,
            cache_budget: (limits.max_cache_bytes / n.max(1)).max(1),
            limits,
            metrics,
            webhooks,
            webhook_count,
        }
    }

    fn m(&self) -> &CoreMetrics {
        &self.metrics.cores[self.me as usize]
    }

    /// The topic in `slot`.
    pub fn topic(&self, slot: u32) -> Option<&Topic> {
        self.topics.get(slot as usize)
    }

    /// The home worker of `topic`.
    pub fn home_of(&self, topic: &str) -> usize {
        self.homes.of(topic)
    }

    fn slot_of(&mut self, topic: &str) -> u32 {
        if let Some(&s) = self.index.get(topic) {
            return s;
        }
        let name: Arc<str> = Arc::from(topic);
        let home = (self.homes.of(topic) == self.me as usize).then(Box::<Home>::default);
        if home.is_some() {
            self.m().topics.inc();
        }
        let slot = self.topics.insert(Topic {
            name: name.clone(),
            subs: Vec::new(),
            home,
        }) as u32;
        self.index.insert(name, slot);
        slot
    }

    /// Frees the slot when nothing refers to it any more.
    fn gc(&mut self, slot: u32) {
        let Some(t) = self.topics.get(slot as usize) else {
            return;
        };
        if t.subs.is_empty() && t.home.as_ref().is_none_or(|h| h.is_empty()) {
            let t = self.topics.remove(slot as usize);
            self.index.remove(&t.name);
            if t.home.is_some() {
                self.m().topics.sub(1);
            }
        }
    }

    fn send(&mut self, to: usize, msg: CoreMsg) {
        self.outbox[to].push(msg);
    }

    /// Adds a subscription of a local connection. It starts pending; its replay follows as
    /// a [`Delivery::Replay`]. Returns the topic slot.
    pub fn subscribe(&mut self, conn_key: usize, conn_uid: u64, topic: &str, id: SubId) -> u32 {
        let slot = self.slot_of(topic);
        let serial = self.next_serial;
        self.next_serial += 1;
        let t = &mut self.topics[slot as usize];
        t.subs.push(LocalSub {
            conn_key,
            conn_uid,
            id,
            pending: serial,
        });
        self.m().subscriptions.inc();
        let home = self.homes.of(topic);
        if home == self.me as usize {
            let messages = self.snapshot(slot, (self.me, conn_uid));
            self.pending_pushes += messages.len();
            self.deliveries.push(Delivery::Replay {
                slot,
                conn_key,
                conn_uid,
                serial,
                messages,
            });
        } else {
            let name = self.topics[slot as usize].name.clone();
            let core = self.me;
            self.send(
                home,
                CoreMsg::Subscribe {
                    topic: name,
                    core,
                    conn_key,
                    conn_uid,
                    serial,
                },
            );
        }
        slot
    }

    /// Cached messages of a home topic, oldest first, except those `exclude` published.
    fn snapshot(&self, slot: u32, exclude: Origin) -> Vec<Bytes> {
        let Some(h) = self.topics.get(slot as usize).and_then(|t| t.home.as_ref()) else {
            return Vec::new();
        };
        h.cache
            .iter()
            .filter_map(|&k| self.cache.get(k))
            .filter(|m| m.origin != exclude)
            .map(|m| m.data.clone())
            .collect()
    }

    /// Marks a pending subscription active if `serial` is the replay it waits for.
    pub fn activate(&mut self, slot: u32, conn_key: usize, conn_uid: u64, serial: u64) -> bool {
        let Some(t) = self.topics.get_mut(slot as usize) else {
            return false;
        };
        match t
            .subs
            .iter_mut()
            .find(|s| s.conn_key == conn_key && s.conn_uid == conn_uid)
        {
            Some(s) if s.pending == serial => {
                s.pending = 0;
                true
            }
            _ => false,
        }
    }

    /// Removes a local connection's subscription on `slot`.
    pub fn unsubscribe(&mut self, slot: u32, conn_key: usize, conn_uid: u64) {
        let Some(t) = self.topics.get_mut(slot as usize) else {
            return;
        };
        let before = t.subs.len();
        t.subs
            .retain(|s| !(s.conn_key == conn_key && s.conn_uid == conn_uid));
        if t.subs.len() == before {
            return;
        }
        self.metrics.cores[self.me as usize].subscriptions.sub(1);
        if t.subs.is_empty() {
            let home = self.homes.of(&t.name);
            if home != self.me as usize {
                let name = t.name.clone();
                let core = self.me;
                self.send(home, CoreMsg::Unsubscribed { topic: name, core });
            }
        }
        self.gc(slot);
    }

    /// Publishes from a local connection. `data` is the encoded data object.
    pub fn publish(&mut self, topic: &str, data: Bytes, ttl: u32, prompt: bool, conn_uid: u64) {
        self.m().published.inc();
        let hash = self.homes.content_hash(&data);
        let origin = (self.me, conn_uid);
        let home = self.homes.of(topic);
        if home == self.me as usize {
            self.store_and_fan_out(topic, data, hash, ttl, prompt, origin);
        } else {
            let topic: Arc<str> = match self.index.get_key_value(topic) {
                Some((k, _)) => k.clone(),
                None => Arc::from(topic),
            };
            self.send(
                home,
                CoreMsg::Publish {
                    topic,
                    data,
                    hash,
                    ttl,
                    prompt,
                    origin,
                },
            );
        }
    }

    /// Home side of a publish: dedup, cache, fan out, push notifications.
    fn store_and_fan_out(
        &mut self,
        topic: &str,
        data: Bytes,
        hash: u64,
        ttl: u32,
        prompt: bool,
        origin: Origin,
    ) {
        let slot = self.slot_of(topic);
        // A hash the topic's filter has never seen is new without reading any message.
        let dup = self.topics[slot as usize].home.as_ref().is_some_and(|h| {
            h.hashes.contains_key(&hash)
                && h.cache.iter().any(|&k| {
                    self.cache
                        .get(k)
                        .is_some_and(|m| m.hash == hash && m.data == data)
                })
        });
        if dup {
            self.m().drop(DropReason::Duplicate, 1);
            self.gc(slot);
            return;
        }
        let now = crate::clock::now_ms();
        let key = self.cache.insert(
            slot,
            hash,
            data.clone(),
            now + u64::from(ttl) * 1000,
            origin,
        );
        self.m().stored.inc();
        self.m().cached_messages.inc();
        let mut webhooks = Vec::new();
        {
            let t = &mut self.topics[slot as usize];
            let Some(h) = t.home.as_mut() else { return };
            h.cache.push_back(key);
            h.note(hash);
            if prompt {
                webhooks.clone_from(&h.webhooks);
            }
        }
        // Per-topic cap: evict this topic's oldest.
        loop {
            let over = self.topics[slot as usize]
                .home
                .as_ref()
                .is_some_and(|h| h.cache.len() > self.limits.max_cached_per_topic);
            if !over {
                break;
            }
            let Some(h) = self.topics[slot as usize].home.as_mut() else {
                break;
            };
            let Some(old) = h.cache.pop_front() else {
                break;
            };
            if let Some(m) = self.cache.remove(old) {
                h.forget(m.hash);
            }
            self.m().cached_messages.sub(1);
            self.m().drop(DropReason::TopicCacheFull, 1);
        }
        self.enforce_budget();
        self.m().cached_bytes.set(self.cache.bytes() as u64);
        // The budget may have evicted everything of this topic, even the topic itself.
        let Some(t) = self.topics.get(slot as usize) else {
            return;
        };
        // Fan out: this worker's own subscribers, then every other worker holding some.
        let exclude_uid = if origin.0 == self.me { origin.1 } else { 0 };
        if !t.subs.is_empty() {
            self.pending_pushes += t.subs.len();
            self.deliveries.push(Delivery::Live {
                slot,
                data: data.clone(),
                exclude_uid,
            });
        }
        if let Some(h) = t.home.as_ref() {
            for &c in &h.cores {
                let msg = CoreMsg::Deliver {
                    topic: t.name.clone(),
                    data: data.clone(),
                    origin,
                };
                self.outbox[c as usize].push(msg);
            }
        }
        let name = t.name.clone();
        for url in webhooks {
            self.webhooks.submit(WebhookCall {
                topic: name.clone(),
                url,
            });
        }
    }

    /// Evicts the oldest messages of this worker until the cache fits its byte budget.
    fn enforce_budget(&mut self) {
        while self.cache.bytes() > self.cache_budget {
            let Some(k) = self.cache.oldest() else { break };
            self.evict(k, DropReason::CacheBytes);
        }
    }

    fn evict(&mut self, key: usize, why: DropReason) {
        let Some(m) = self.cache.remove(key) else {
            return;
        };
        self.m().cached_messages.sub(1);
        self.m().drop(why, 1);
        if let Some(h) = self
            .topics
            .get_mut(m.topic as usize)
            .and_then(|t| t.home.as_mut())
        {
            if h.cache.front() == Some(&key) {
                h.cache.pop_front();
            } else if let Some(pos) = h.cache.iter().position(|&k| k == key) {
                h.cache.remove(pos);
            }
            h.forget(m.hash);
        }
        self.gc(m.topic);
    }

    /// Removes expired messages (cost proportional to what expires).
    pub fn sweep(&mut self, now: u64) {
        let mut n = 0;
        while let Some(k) = self.cache.next_expired(now) {
            self.evict(k, DropReason::Expired);
            n += 1;
        }
        if n > 0 {
            self.m().cached_bytes.set(self.cache.bytes() as u64);
        }
    }

    /// Registers a webhook for a topic from a local connection (`reply_to` = its key, uid).
    pub fn add_webhook(
        &mut self,
        topic: &str,
        url: &str,
        reply_to: (usize, u64),
    ) -> WebhookRegistration {
        let home = self.homes.of(topic);
        if home == self.me as usize {
            WebhookRegistration::Done(self.add_webhook_home(topic, Arc::from(url)))
        } else {
            let msg = CoreMsg::AddWebhook {
                topic: Arc::from(topic),
                url: Arc::from(url),
                reply_to: (self.me, reply_to.0, reply_to.1),
            };
            self.send(home, msg);
            WebhookRegistration::Deferred
        }
    }

    fn add_webhook_home(&mut self, topic: &str, url: Arc<str>) -> Result<(), (u16, &'static str)> {
        let slot = self.slot_of(topic);
        let per_topic = self.limits.max_webhooks_per_topic;
        let global = self.limits.max_webhooks;
        let count = self.webhook_count.clone();
        let res = {
            let Some(h) = self.topics[slot as usize].home.as_mut() else {
                return Err((500, "topic is not homed here"));
            };
            if h.webhooks.iter().any(|u| **u == *url) {
                Ok(())
            } else if h.webhooks.len() >= per_topic {
                Err((400, "Too many webhooks for this topic"))
            } else if count.fetch_add(1, Ordering::Relaxed) >= global {
                count.fetch_sub(1, Ordering::Relaxed);
                Err((429, "Too many webhook registrations"))
            } else {
                h.webhooks.push(url);
                Ok(())
            }
        };
        self.gc(slot);
        res
    }

    fn remove_webhook_home(&mut self, topic: &str, url: &str) {
        let Some(&slot) = self.index.get(topic) else {
            return;
        };
        if let Some(h) = self.topics[slot as usize].home.as_mut() {
            let before = h.webhooks.len();
            h.webhooks.retain(|u| &**u != url);
            if h.webhooks.len() < before {
                self.webhook_count.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.gc(slot);
    }

    /// Handles a batch from another worker. Returns `true` when it holds a shutdown order.
    pub fn on_batch(&mut self, batch: Vec<CoreMsg>) -> bool {
        let mut shutdown = false;
        self.m().core_messages_in.add(batch.len() as u64);
        for msg in batch {
            match msg {
                CoreMsg::Publish {
                    topic,
                    data,
                    hash,
                    ttl,
                    prompt,
                    origin,
                } => {
                    self.store_and_fan_out(&topic, data, hash, ttl, prompt, origin);
                }
                CoreMsg::Subscribe {
                    topic,
                    core,
                    conn_key,
                    conn_uid,
                    serial,
                } => {
                    let slot = self.slot_of(&topic);
                    if let Some(h) = self.topics[slot as usize].home.as_mut() {
                        if !h.cores.contains(&core) {
                            h.cores.push(core);
                        }
                    }
                    let messages = self.snapshot(slot, (core, conn_uid));
                    let name = self.topics[slot as usize].name.clone();
                    self.send(
                        core as usize,
                        CoreMsg::Replay {
                            topic: name,
                            conn_key,
                            conn_uid,
                            serial,
                            messages,
                        },
                    );
                }
                CoreMsg::Unsubscribed { topic, core } => {
                    if let Some(&slot) = self.index.get(&*topic) {
                        if let Some(h) = self.topics[slot as usize].home.as_mut() {
                            h.cores.retain(|&c| c != core);
                        }
                        self.gc(slot);
                    }
                }
                CoreMsg::Deliver {
                    topic,
                    data,
                    origin,
                } => {
                    if let Some(&slot) = self.index.get(&*topic) {
                        let exclude_uid = if origin.0 == self.me { origin.1 } else { 0 };
                        let subs = self.topics.get(slot as usize).map_or(0, |t| t.subs.len());
                        self.pending_pushes += subs;
                        // Connections queue a big fan-out's body by reference (a reference
                        // count bumped per subscriber): on the home worker's copy, that
                        // count's cache line would bounce between cores, so such a topic
                        // gets this worker's own copy, once.
                        let shared = crate::outbuf::fanout_shares_body(subs, data.len());
                        let data = if subs > 1 && shared {
                            Bytes::copy_from_slice(&data)
                        } else {
                            data
                        };
                        self.deliveries.push(Delivery::Live {
                            slot,
                            data,
                            exclude_uid,
                        });
                    }
                }
                CoreMsg::Replay {
                    topic,
                    conn_key,
                    conn_uid,
                    serial,
                    messages,
                } => {
                    if let Some(&slot) = self.index.get(&*topic) {
                        self.pending_pushes += messages.len();
                        self.deliveries.push(Delivery::Replay {
                            slot,
                            conn_key,
                            conn_uid,
                            serial,
                            messages,
                        });
                    }
                }
                CoreMsg::AddWebhook {
                    topic,
                    url,
                    reply_to,
                } => {
                    let result = self.add_webhook_home(&topic, url);
                    let (core, conn_key, conn_uid) = reply_to;
                    self.send(
                        core as usize,
                        CoreMsg::WebhookAdded {
                            conn_key,
                            conn_uid,
                            result,
                        },
                    );
                }
                CoreMsg::WebhookAdded {
                    conn_key,
                    conn_uid,
                    result,
                } => {
                    self.deliveries.push(Delivery::WebhookAnswer {
                        conn_key,
                        conn_uid,
                        result,
                    });
                }
                CoreMsg::RemoveWebhook { topic, url } => self.remove_webhook_home(&topic, &url),
                CoreMsg::Shutdown => shutdown = true,
            }
        }
        shutdown
    }

    /// Sends the batches queued for other workers. A full queue keeps them for the next
    /// iteration; past `core_queue` waiting messages, data messages are dropped (counted),
    /// and past twice that, everything. Returns `true` when something is still waiting.
    pub fn flush_outboxes(&mut self) -> bool {
        let mut waiting = false;
        for to in 0..self.outbox.len() {
            if self.outbox[to].is_empty() {
                continue;
            }
            let batch = std::mem::take(&mut self.outbox[to]);
            if let Err(mut back) = self.mailboxes.try_send(to, batch) {
                let cap = self.limits.core_queue;
                if back.len() > cap {
                    let before = back.len();
                    let mut seen = 0usize;
                    back.retain(|m| {
                        seen += 1;
                        !m.is_data() || seen <= cap
                    });
                    if back.len() > 2 * cap {
                        back.truncate(2 * cap);
                    }
                    let dropped = before - back.len();
                    self.m().drop(DropReason::CoreQueueFull, dropped as u64);
                }
                self.outbox[to] = back;
                waiting = true;
            }
        }
        waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_ids_round_trip_hex() {
        let id = SubId::from_bytes(&[0xAB; 32]);
        let h = *id.hex();
        assert_eq!(
            &h,
            b"abababababababababababababababababababababababababababababababab"
        );
        let upper = String::from_utf8(h.to_ascii_uppercase()).unwrap();
        assert_eq!(SubId::from_hex(&upper), Some(id));
        assert_eq!(&h[..4], b"abab");
        assert_eq!(SubId::from_hex(std::str::from_utf8(&h).unwrap()), Some(id));
        assert_eq!(SubId::from_hex("xyz"), None);
    }

    #[test]
    fn a_topics_hash_filter_counts_copies_and_lets_its_memory_go_when_empty() {
        let mut h = Home::default();
        h.note(1);
        h.note(1);
        h.note(2);
        h.forget(1);
        assert!(
            h.hashes.contains_key(&1),
            "one copy of hash 1 is still cached"
        );
        h.forget(1);
        assert!(!h.hashes.contains_key(&1));
        h.forget(7); // never noted: nothing happens
        h.forget(2);
        assert!(h.hashes.is_empty());
        assert_eq!(h.hashes.capacity(), 0, "an empty filter keeps no table");
    }

    #[test]
    fn the_cache_is_presized_for_its_budget_unless_overcommit_is_strict() {
        let gib = 1 << 30;
        // Room for the most messages a GiB can hold: each costs at least 144 bytes.
        assert_eq!(cache_presize(gib, false), gib / 144);
        assert!(cache_presize(gib, false) * (cache::ENTRY_OVERHEAD + 26) > gib);
        // Under strict overcommit: one per KiB, at most a million.
        assert_eq!(cache_presize(gib, true), 1 << 20);
        assert_eq!(cache_presize(64 << 20, true), 64 << 10);
    }

    #[test]
    fn homes_are_stable_and_spread() {
        let h = Homes::new(4, [1, 2, 3, 4]);
        let mut seen = [0usize; 4];
        for i in 0..1000 {
            let t = format!("topic-{i}");
            assert_eq!(h.of(&t), h.clone().of(&t));
            seen[h.of(&t)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 150), "{seen:?}");
    }
}
