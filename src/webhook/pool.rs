//! The delivery pool's machinery: the bounded delivery queue, the delivery threads, the
//! retry delay queue and its scheduler thread, failure bookkeeping and shutdown.
//!
//! Retries do not sleep in a delivery thread: a failed try that deserves another goes to a
//! small delay queue (a heap ordered by due time, owned by one scheduler thread), which puts
//! it back on the delivery queue when its backoff is over. So a webhook backing off never
//! holds a thread that other webhooks could use; only a try in progress does (at most the
//! per-try timeout).

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender, TrySendError};

use super::client::{Client, TryOutcome};
use super::health::{BoundedMap, Health, MAX_LOGGED_REFUSALS, MAX_TRACKED_URLS};
use super::stats::{DropReason, Stats};
use super::types::{Delivery, OnGone, Sent, Signed, WebhookConfig};
use crate::redact::Host;

/// Backoff before the first retry; doubled for each further retry, then jittered.
pub(crate) const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest backoff before jitter.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Longest backoff of a signed call (retried for up to 72 hours, not a few tries).
pub(crate) const SIGNED_BACKOFF_MAX: Duration = Duration::from_secs(600);

/// A call with the number of tries already made.
pub(crate) struct Job {
    d: Delivery,
    tries: u32,
    /// A signed call's body, headers and deadline (`None`: a topic webhook).
    signed: Option<Box<Signed>>,
}

impl Job {
    /// Tells a signed call's owner how it ended.
    fn done(&self, how: Sent) {
        if let Some(cb) = self.signed.as_ref().and_then(|s| s.on_done.as_ref()) {
            cb(how);
        }
    }
}

/// A retry waiting in the delay queue; ordered so that the heap pops the earliest first.
struct Delayed {
    due: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        self.due == o.due && self.seq == o.seq
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> CmpOrdering {
        // Reversed: BinaryHeap is a max-heap.
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}

/// A registration: (topic, webhook url).
type TopicUrl = (Arc<str>, Arc<str>);

/// State shared by the handles, the delivery threads and the scheduler.
pub(crate) struct Inner {
    cfg: WebhookConfig,
    /// Delivery queue (bounded by `cfg.queue`).
    tx: Sender<Job>,
    rx: Receiver<Job>,
    /// Retries on their way to the scheduler.
    retry_tx: Sender<(Instant, Job)>,
    /// Retries waiting (in the channel or the heap); bounded by `cfg.queue`.
    retry_pending: AtomicUsize,
    /// Set once shutdown begins: no new work is taken.
    stopping: AtomicBool,
    /// Dropped at shutdown, which wakes every thread blocked on the queue.
    stop_tx: Mutex<Option<Sender<()>>>,
    /// The delivery threads and the scheduler, joined at shutdown.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Threads still running, with a condition variable signalled as each exits.
    alive: Mutex<usize>,
    alive_cv: Condvar,
    client: Client,
    pub(crate) stats: Stats,
    health: Mutex<Health>,
    refusals_logged: Mutex<BoundedMap<TopicUrl, ()>>,
    on_gone: OnGone,
}

/// Locks a mutex, taking the data even if a thread panicked while holding it (the data here
/// are counters and maps that stay consistent between statements).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// Starts the threads and returns the shared state.
    pub(crate) fn start(mut cfg: WebhookConfig, on_gone: OnGone) -> Arc<Inner> {
        cfg.threads = cfg.threads.max(1);
        cfg.queue = cfg.queue.max(1);
        cfg.tries = cfg.tries.max(1);
        let (tx, rx) = bounded(cfg.queue);
        let (retry_tx, retry_rx) = bounded(cfg.queue);
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let inner = Arc::new(Inner {
            client: Client::new(&cfg),
            tx,
            rx,
            retry_tx,
            retry_pending: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            stop_tx: Mutex::new(Some(stop_tx)),
            threads: Mutex::new(Vec::new()),
            alive: Mutex::new(0),
            alive_cv: Condvar::new(),
            stats: Stats::default(),
            health: Mutex::new(Health::new(MAX_TRACKED_URLS)),
            refusals_logged: Mutex::new(BoundedMap::new(MAX_LOGGED_REFUSALS)),
            on_gone,
            cfg,
        });
        let mut handles = Vec::with_capacity(inner.cfg.threads + 1);
        for i in 0..inner.cfg.threads {
            let (me, stop) = (inner.clone(), stop_rx.clone());
            handles.push(inner.spawn(format!("webhook-{i}"), move || me.deliver_loop(&stop)));
        }
        let (me, stop) = (inner.clone(), stop_rx);
        handles.push(inner.spawn("webhook-retry".into(), move || {
            me.retry_loop(&retry_rx, &stop)
        }));
        *lock(&inner.threads) = handles.into_iter().flatten().collect();
        inner
    }

    fn spawn(
        self: &Arc<Self>,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> Option<JoinHandle<()>> {
        *lock(&self.alive) += 1;
        let me = self.clone();
        let res = std::thread::Builder::new().name(name).spawn(move || {
            let _exit = ExitGuard(&me);
            f();
        });
        match res {
            Ok(h) => Some(h),
            Err(e) => {
                log::error!("webhook: cannot start a delivery thread: {e}");
                *lock(&self.alive) -= 1;
                None
            }
        }
    }

    /// Hands a call to the pool without blocking.
    pub(crate) fn submit(&self, d: Delivery) {
        if self.stopping.load(Ordering::Acquire) {
            self.stats.drop(DropReason::Shutdown);
            return;
        }
        let job = Job {
            d,
            tries: 0,
            signed: None,
        };
        self.enqueue(job);
    }

    /// Hands a signed call to the pool without blocking.
    pub(crate) fn submit_signed(&self, d: Delivery, call: Signed) {
        let job = Job {
            d,
            tries: 0,
            signed: Some(Box::new(call)),
        };
        if self.stopping.load(Ordering::Acquire) {
            self.stats.drop(DropReason::Shutdown);
            job.done(Sent::Dropped);
            return;
        }
        self.enqueue(job);
    }

    fn enqueue(&self, job: Job) {
        match self.tx.try_send(job) {
            Ok(()) => self.stats.queued.inc(),
            Err(TrySendError::Full(job)) => {
                self.stats.drop(DropReason::QueueFull);
                job.done(Sent::Dropped);
            }
            Err(TrySendError::Disconnected(job)) => {
                self.stats.drop(DropReason::Shutdown);
                job.done(Sent::Dropped);
            }
        }
    }

    /// Calls waiting in the delivery queue.
    pub(crate) fn queue_depth(&self) -> usize {
        self.rx.len()
    }

    /// Retries waiting for their backoff.
    pub(crate) fn retry_pending(&self) -> usize {
        self.retry_pending.load(Ordering::Relaxed)
    }

    fn deliver_loop(&self, stop: &Receiver<()>) {
        let mut rng = Rng::new();
        loop {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            select! {
                recv(self.rx) -> job => match job {
                    Ok(job) if self.stopping.load(Ordering::Acquire) => {
                        drop(job);
                        self.stats.drop(DropReason::Shutdown);
                        return;
                    }
                    Ok(job) => self.deliver(job, &mut rng),
                    Err(_) => return,
                },
                recv(stop) -> _ => return,
            }
        }
    }

    /// Makes one try of `job` and books its outcome: success, retry later, or give up.
    fn deliver(&self, job: Job, rng: &mut Rng) {
        let started = Instant::now();
        let outcome = self.client.try_once(&job.d, job.signed.as_deref());
        let reason = match outcome {
            TryOutcome::Refused(why) => return self.refused(job, &why),
            TryOutcome::Success => {
                self.stats.sent.inc();
                self.stats.latency.observe(started.elapsed());
                self.stats.succeeded.inc();
                if job.signed.is_some() {
                    job.done(Sent::Delivered);
                } else {
                    lock(&self.health).success(&job.d.url);
                }
                return;
            }
            TryOutcome::Failed(reason) => {
                self.stats.sent.inc();
                self.stats.latency.observe(started.elapsed());
                reason
            }
        };
        let tries = job.tries + 1;
        let stopping = self.stopping.load(Ordering::Acquire);
        let (more, delay) = match &job.signed {
            None => (tries < self.cfg.tries, backoff(tries, rng.next())),
            Some(s) => {
                let delay = backoff_upto(tries, rng.next(), SIGNED_BACKOFF_MAX);
                (Instant::now() + delay < s.until, delay)
            }
        };
        if reason.retryable() && more && !stopping {
            return self.retry(job, tries, delay);
        }
        let host = Host(&job.d.url);
        log::debug!(host:% = host, reason = reason.label(), tries, signed = job.signed.is_some();
            "webhook call failed ({}) after {tries} tries: {host}",
            reason.label()
        );
        self.stats.fail(reason);
        if job.signed.is_some() {
            job.done(if reason.retryable() {
                Sent::Failed
            } else {
                Sent::Rejected
            });
            return;
        }
        self.given_up(&job.d);
    }

    /// The SSRF guard refused `job`'s address: a signed call is dropped (said once, at
    /// debug); a webhook can never succeed there and ages out like any failing one (the
    /// refusal logged once per topic and URL).
    fn refused(&self, job: Job, why: &impl std::fmt::Display) {
        self.stats.drop(DropReason::Ssrf);
        if job.signed.is_some() {
            let host = Host(&job.d.url);
            log::debug!(host:% = host, why:% = why;
                "signed call refused (SSRF guard): {host} ({why})");
            job.done(Sent::Dropped);
            return;
        }
        let key = (job.d.topic.clone(), job.d.url.clone());
        if lock(&self.refusals_logged).insert_new(&key, ()) {
            let host = Host(&job.d.url);
            log::warn!(host:% = host, topic = &*job.d.topic, why:% = why;
                "webhook refused (SSRF guard) for topic {:?}: {host} ({why})",
                &*job.d.topic
            );
        }
        self.given_up(&job.d);
    }

    /// Queues `job`'s try number `tries + 1` after `delay`, unless the retry queue is full
    /// (or the pool stops): then it is dropped and counted.
    fn retry(&self, job: Job, tries: u32, delay: Duration) {
        if self.retry_pending.fetch_add(1, Ordering::AcqRel) >= self.cfg.queue {
            self.retry_pending.fetch_sub(1, Ordering::AcqRel);
            self.stats.drop(DropReason::RetryQueueFull);
            return;
        }
        let job = Job {
            d: job.d,
            tries,
            signed: job.signed,
        };
        match self.retry_tx.try_send((Instant::now() + delay, job)) {
            Ok(()) => self.stats.retried.inc(),
            Err(e) => {
                self.retry_pending.fetch_sub(1, Ordering::AcqRel);
                let (reason, job) = match e {
                    TrySendError::Disconnected(j) => (DropReason::Shutdown, j),
                    TrySendError::Full(j) => (DropReason::RetryQueueFull, j),
                };
                self.stats.drop(reason);
                job.1.done(Sent::Failed);
            }
        }
    }

    /// A call failed for good: update the URL's failure record, and report the registration
    /// gone once the URL has failed every try for the give-up period.
    fn given_up(&self, d: &Delivery) {
        let gone = lock(&self.health).failure(&d.url, Instant::now(), self.cfg.give_up_after);
        if gone {
            self.stats.gone.inc();
            let host = Host(&d.url);
            log::info!(host:% = host, topic = &*d.topic;
                "webhook {host} for topic {:?} failed every try for {:?}: giving it up",
                &*d.topic,
                self.cfg.give_up_after
            );
            let cb = &self.on_gone;
            let res = catch_unwind(AssertUnwindSafe(|| cb(d.topic.clone(), d.url.clone())));
            if res.is_err() {
                log::error!("webhook: the on_gone callback panicked");
            }
        }
    }

    /// The scheduler: holds retries until their backoff is over, then queues them again.
    fn retry_loop(&self, retry_rx: &Receiver<(Instant, Job)>, stop: &Receiver<()>) {
        let mut heap = BinaryHeap::new();
        let mut seq = 0u64;
        loop {
            let wait = heap
                .peek()
                .map_or(Duration::from_secs(3600), |d: &Delayed| {
                    d.due.saturating_duration_since(Instant::now())
                });
            select! {
                recv(retry_rx) -> m => match m {
                    Ok((due, job)) => {
                        seq += 1;
                        heap.push(Delayed { due, seq, job });
                    }
                    Err(_) => break,
                },
                recv(stop) -> _ => break,
                default(wait) => {}
            }
            let now = Instant::now();
            while heap.peek().is_some_and(|d| d.due <= now) {
                let Some(d) = heap.pop() else { break };
                self.retry_pending.fetch_sub(1, Ordering::AcqRel);
                if let Err(e) = self.tx.try_send(d.job) {
                    self.stats.drop(DropReason::RetryQueueFull);
                    e.into_inner().done(Sent::Failed);
                }
            }
        }
        let left = heap.len() + retry_rx.try_iter().count();
        for _ in 0..left {
            self.retry_pending.fetch_sub(1, Ordering::AcqRel);
            self.stats.drop(DropReason::Shutdown);
        }
    }

    /// Marks the pool stopping and wakes every thread. Returns false if already stopping.
    pub(crate) fn begin_stop(&self) -> bool {
        let first = !self.stopping.swap(true, Ordering::AcqRel);
        drop(lock(&self.stop_tx).take());
        first
    }

    /// Stops taking work, lets tries in flight finish until `grace` is nearly over, then
    /// aborts those still running, joins what has exited and returns within `grace` (threads
    /// stuck in an uninterruptible name lookup are left to end on their own).
    pub(crate) fn shutdown(&self, grace: Duration) {
        let deadline = Instant::now() + grace;
        self.begin_stop();
        let handles = std::mem::take(&mut *lock(&self.threads));
        let margin = (grace / 4).min(Duration::from_millis(250));
        if !self.wait_exited(deadline - margin) {
            self.client.abort_in_flight();
            self.wait_exited(deadline);
        }
        for h in handles {
            if h.is_finished() {
                let _ = h.join();
            }
        }
        for _ in self.rx.try_iter() {
            self.stats.drop(DropReason::Shutdown);
        }
    }

    /// Waits until every thread has exited or `until`; true if they all have.
    fn wait_exited(&self, until: Instant) -> bool {
        let mut alive = lock(&self.alive);
        while *alive > 0 {
            let now = Instant::now();
            if now >= until {
                return false;
            }
            alive = match self.alive_cv.wait_timeout(alive, until - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }
}

/// Counts a thread's exit (also when it unwinds).
struct ExitGuard<'a>(&'a Inner);

impl Drop for ExitGuard<'_> {
    fn drop(&mut self) {
        *lock(&self.0.alive) -= 1;
        self.0.alive_cv.notify_all();
    }
}

/// The wait before try number `tries + 1`: `BACKOFF_BASE * 2^(tries-1)`, capped at
/// `BACKOFF_MAX`, with "equal jitter" (uniform in its upper half), so that receivers that
/// fail together are not retried in lockstep. `random` is any uniformly random `u64`.
pub(crate) fn backoff(tries: u32, random: u64) -> Duration {
    backoff_upto(tries, random, BACKOFF_MAX)
}

/// [`backoff`] with another longest wait (before jitter).
pub(crate) fn backoff_upto(tries: u32, random: u64, max: Duration) -> Duration {
    let exp = tries.saturating_sub(1).min(16);
    let full = BACKOFF_BASE.saturating_mul(1 << exp).min(max);
    let half = full / 2;
    let half_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX - 1);
    half + Duration::from_nanos(random % (half_ns + 1))
}

/// A small per-thread generator for backoff jitter (SplitMix64), seeded from the OS.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = getrandom::u64().unwrap_or_else(|_| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
        });
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_in_the_upper_half() {
        let mut rng = Rng::new();
        for _ in 0..1000 {
            let r = rng.next();
            let b1 = backoff(1, r);
            assert!(b1 >= BACKOFF_BASE / 2 && b1 <= BACKOFF_BASE, "{b1:?}");
            let b2 = backoff(2, r);
            assert!(b2 >= BACKOFF_BASE && b2 <= BACKOFF_BASE * 2, "{b2:?}");
            let b9 = backoff(40, r);
            assert!(b9 >= BACKOFF_MAX / 2 && b9 <= BACKOFF_MAX, "{b9:?}");
        }
        assert_eq!(backoff(1, 0), BACKOFF_BASE / 2);
        assert_ne!(backoff(1, 1), backoff(1, 2));
    }

    #[test]
    fn delay_heap_pops_earliest_first() {
        let t = Instant::now();
        let job = || Job {
            d: Delivery {
                topic: "t".into(),
                url: "u".into(),
            },
            tries: 1,
            signed: None,
        };
        let mut heap = BinaryHeap::new();
        for (i, s) in [5u64, 1, 3, 1].into_iter().enumerate() {
            heap.push(Delayed {
                due: t + Duration::from_secs(s),
                seq: i as u64,
                job: job(),
            });
        }
        let order: Vec<u64> = std::iter::from_fn(|| heap.pop()).map(|d| d.seq).collect();
        assert_eq!(order, vec![1, 3, 2, 0]);
    }
}
