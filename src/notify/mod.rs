//! Who is told about a client's messages, and how (DECISIONS 13): watch registrations
//! (`irn_watchRegister` / `irn_watchUnregister`, [`claims`], [`table`], saved by [`store`])
//! and the signed POSTs that tell them ([`send`]): watch events to the registrations'
//! webhooks, pushes to a project's push server ([`push_urls`]).
//!
//! [`Notifier`] implements `notice::Notify`, the seam the engines call; every call returns
//! at once: the JWT or the signature is made on the caller's thread, the POST on the webhook
//! pool's threads (`webhook::WebhookPool::submit_signed`: bounded queue, retries with
//! backoff until the message's ttl, at most 72 hours, 4xx never retried, private addresses
//! refused unless `--webhook-allow-private`). A floor below `engine/` and `relay/`.

pub mod claims;
pub mod push_urls;
pub mod redis_sync;
pub mod send;
pub mod store;
pub mod table;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::identity::{KeySource, RelayKey};
use crate::metrics::{labelled, Counter, Kind};
use crate::notice::{Notice, Notify, PushNotice};
use crate::webhook::{Sent, Signed, WebhookConfig, WebhookPool};

pub use claims::{Action, Audiences, WatchError};
use push_urls::PushUrls;
pub use store::Done;
use table::{Registration, WatchHub};

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Counts of signed calls by how they ended.
#[derive(Debug, Default)]
pub struct Counts([Counter; 4]);

impl Counts {
    const LABELS: [&'static str; 4] = ["delivered", "rejected", "failed", "dropped"];

    fn add(&self, s: Sent) {
        let i = match s {
            Sent::Delivered => 0,
            Sent::Rejected => 1,
            Sent::Failed => 2,
            Sent::Dropped => 3,
        };
        self.0[i].inc();
    }

    /// The count of one `result` label.
    pub fn get(&self, label: &str) -> u64 {
        Self::LABELS
            .iter()
            .position(|l| *l == label)
            .map_or(0, |i| self.0[i].get())
    }
}

/// The relay's watches and pushes.
pub struct Notifier {
    key: Arc<RelayKey>,
    hub: Arc<WatchHub>,
    audiences: Audiences,
    pool: WebhookPool,
    push: PushUrls,
    events: Arc<Counts>,
    pushes: Arc<Counts>,
    durable: Durable,
    persister: store::Persister,
}

/// Where a change must be before its request is answered.
enum Durable {
    /// Nowhere (no data directory, no Redis): answered at once.
    Memory,
    /// In the data directory's file (the persister's next save).
    File,
    /// In Redis (the writer's acknowledged write).
    Redis(crossbeam_channel::Sender<(redis_sync::Op, Option<Done>)>),
}

/// Whether a change's answer is due now or waits for its [`Done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// Nothing to wait for (memory only): answer now; the `Done` was dropped.
    Now,
    /// The `Done` will be told, once, on a helper thread.
    Later,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("key", &self.key)
            .field("hub", &self.hub)
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// Builds the notifier of `config`: the relay key (see `identity`), the watch table
    /// (loaded from `--data-dir`), its own webhook pool, the push URLs.
    pub fn build(config: &Config) -> Result<Notifier, String> {
        let dir = config.data_dir();
        let spec = shared_spec(config)?;
        let key = match (&config.notify.relay_key, &spec, &dir) {
            (Some(path), _, _) => RelayKey::load_or_create(KeySource::File(path)),
            (None, Some(spec), _) => cluster_key(spec),
            (None, None, Some(dir)) => RelayKey::load_or_create(KeySource::DataDir(dir)),
            (None, None, None) => RelayKey::load_or_create(KeySource::Fresh),
        }
        .map_err(|e| e.to_string())?;
        let push = PushUrls::new(
            config.notify.push_url.as_deref(),
            config.notify.push_urls.as_deref(),
        )?;
        let pool = WebhookPool::start(
            WebhookConfig {
                threads: config.limits.webhook_threads,
                queue: config.limits.webhook_queue,
                allow_private: config.webhook_allow_private,
                ..WebhookConfig::default()
            },
            Arc::new(|_, _| {}),
        );
        let key = Arc::new(key);
        let max = config.notify.max_watches;
        let mut n = match spec {
            // On a cluster the registrations live in Redis, for every node.
            Some(spec) => {
                let mut link = crate::engine::redis::cluster::SharedLink::open(&spec)
                    .map_err(|e| format!("watches: Redis: {e}"))?;
                let (tx, rx) = crossbeam_channel::bounded(redis_sync::QUEUE);
                let n = Notifier::assemble(key, max, pool, push, None, Some(tx));
                let loaded = redis_sync::load_all(&mut link, &n.hub)?;
                log::info!(
                    watches = loaded, from = "redis";
                    "watches: {loaded} registrations loaded from Redis"
                );
                redis_sync::start(spec, Arc::downgrade(&n.hub), rx);
                n
            }
            None => {
                let n = Notifier::new(key, max, pool, push, dir.clone());
                if let Some(dir) = &dir {
                    let loaded = store::load(dir, &n.hub, unix_now());
                    log::info!(watches = loaded, from:% = dir.display();
                        "watches: {loaded} registrations loaded from {}",
                        dir.display()
                    );
                }
                n
            }
        };
        n.audiences = Audiences::new(&config.auth_audience);
        Ok(n)
    }

    /// A notifier of these parts (tests build one directly).
    pub fn new(
        key: Arc<RelayKey>,
        max_watches: usize,
        pool: WebhookPool,
        push: PushUrls,
        dir: Option<std::path::PathBuf>,
    ) -> Notifier {
        Notifier::assemble(key, max_watches, pool, push, dir, None)
    }

    fn assemble(
        key: Arc<RelayKey>,
        max_watches: usize,
        pool: WebhookPool,
        push: PushUrls,
        dir: Option<std::path::PathBuf>,
        redis: Option<crossbeam_channel::Sender<(redis_sync::Op, Option<Done>)>>,
    ) -> Notifier {
        let (mut persister, rx) = store::Persister::channel();
        let bell = persister.bell();
        let hub = Arc::new(WatchHub::new(
            max_watches,
            Box::new(move |_| {
                let _ = bell.try_send(());
            }),
        ));
        let durable = match (redis, &dir) {
            (Some(tx), _) => Durable::Redis(tx),
            (None, Some(_)) => Durable::File,
            (None, None) => Durable::Memory,
        };
        if let Some(d) = &dir {
            if let Err(e) = std::fs::create_dir_all(d) {
                log::warn!("watches: cannot create {}: {e}", d.display());
            }
        }
        persister.start(rx, Arc::downgrade(&hub), dir);
        Notifier {
            key,
            hub,
            audiences: Audiences::default(),
            pool,
            push,
            events: Arc::default(),
            pushes: Arc::default(),
            durable,
            persister,
        }
    }

    /// A notifier in memory only, with no push: for tests of the layers above.
    pub fn memory(key: Arc<RelayKey>) -> Notifier {
        Notifier::new(key, 100_000, WebhookPool::default(), PushUrls::Off, None)
    }

    /// The relay's key.
    pub fn key(&self) -> &Arc<RelayKey> {
        &self.key
    }

    /// The watch table.
    pub fn hub(&self) -> &WatchHub {
        &self.hub
    }

    /// `irn_watchRegister {registerAuth}` applied at once (the table, then Redis or the
    /// file, not waited for): the relay's did:key, or the refusal. For tests of the layers
    /// above; requests use [`Notifier::register_then`].
    pub fn register(&self, token: &str) -> Result<&str, WatchError> {
        self.register_then(token, Box::new(|_| {}))?;
        Ok(self.key.did_key())
    }

    /// `irn_watchUnregister {unregisterAuth}` applied at once (see [`Notifier::register`]).
    pub fn unregister(&self, token: &str) -> Result<(), WatchError> {
        self.unregister_then(token, Box::new(|_| {})).map(|_| ())
    }

    /// `irn_watchRegister {registerAuth}`: checks and applies it; a refusal is an `Err` (and
    /// `done` is dropped). Else the answer (`{"relayId": did_key}`) is due once the
    /// registration is durable: now ([`Saved::Now`]), or when `done` is told (on the
    /// persister's or the Redis writer's thread; `Err(Storage)` when it could not be).
    pub fn register_then(&self, token: &str, done: Done) -> Result<Saved, WatchError> {
        let now = unix_now();
        // The reason only: the token itself is a credential (DECISIONS, "Logs").
        let c = claims::check(token, Action::Register, now, &self.audiences).inspect_err(
            |e| log::debug!(reason:% = e, action = "register"; "watch registration refused: {e}"),
        )?;
        let r = Registration::of(&c);
        self.hub.register(&c.client, r.clone(), now)?;
        self.durably(redis_sync::Op::Set(c.client, r), done)
    }

    /// `irn_watchUnregister {unregisterAuth}`: forgets the registration (none is no error);
    /// answered `true` as [`Notifier::register_then`] says.
    pub fn unregister_then(&self, token: &str, done: Done) -> Result<Saved, WatchError> {
        let c = claims::check(token, Action::Unregister, unix_now(), &self.audiences).inspect_err(
            |e| log::debug!(reason:% = e, action = "unregister"; "watch registration refused: {e}"),
        )?;
        self.hub.unregister(&c.client, &c.sub, &c.whu, c.typ);
        let op = redis_sync::Op::del(&c.client, &c.sub, &c.whu, c.typ.as_str());
        self.durably(op, done)
    }

    /// The change `op` (already in the table) made durable, then `done` told.
    fn durably(&self, op: redis_sync::Op, done: Done) -> Result<Saved, WatchError> {
        match &self.durable {
            Durable::Memory => Ok(Saved::Now),
            Durable::File => self.persister.after(done).map(|()| Saved::Later),
            Durable::Redis(tx) => match tx.try_send((op, Some(done))) {
                Ok(()) => Ok(Saved::Later),
                Err(_) => {
                    log::warn!("watches: the Redis writer is behind; a change refused");
                    Err(WatchError::Storage)
                }
            },
        }
    }

    /// Re-reads `--push-urls @FILE` (SIGHUP); logged.
    pub fn reload(&self) {
        match self.push.reload() {
            Some(Ok(n)) => log::info!(reload = "push-urls", outcome = "loaded", projects = n;
                "push URLs reloaded: {n} projects"),
            Some(Err(e)) => log::warn!(reload = "push-urls", outcome = "failed", error:% = e;
                "push URLs not reloaded: {e}"),
            None => {}
        }
    }

    /// Appends the figures to `/metrics`.
    pub fn render_metrics(&self, out: &mut String) {
        let rows = |c: &Counts| Counts::LABELS.map(|l| (l, c.get(l)));
        labelled(
            out,
            (
                "walletrelay_watch_events_total",
                Kind::Counter,
                "Watch event POSTs by result",
            ),
            "result",
            rows(&self.events),
        );
        labelled(
            out,
            (
                "walletrelay_pushes_total",
                Kind::Counter,
                "Push server POSTs by result",
            ),
            "result",
            rows(&self.pushes),
        );
        crate::metrics::single(
            out,
            "walletrelay_watches",
            Kind::Gauge,
            "Watch registrations",
            self.hub.snapshot().len(),
        );
    }

    /// Stops the webhook pool (at shutdown), waiting up to `grace`.
    pub fn shutdown(&self, grace: Duration) {
        self.pool.shutdown(grace);
    }

    fn on_done(counts: &Arc<Counts>) -> Option<crate::webhook::OnDone> {
        let c = counts.clone();
        Some(Arc::new(move |s| c.add(s)))
    }
}

impl Notify for Notifier {
    fn watching(&self) -> bool {
        self.hub.watching()
    }

    fn watched(&self, client: &str) -> bool {
        self.hub.watched(client)
    }

    fn event(&self, n: &Notice<'_>) {
        let Some(regs) = self.hub.of(n.client) else {
            return;
        };
        let now = unix_now();
        for r in regs.iter().filter(|r| r.wants(n, now)) {
            let body = send::event_body(&self.key, r, n, now);
            let call = Signed {
                body,
                headers: Vec::new(),
                until: Instant::now() + Duration::from_secs(send::event_life(n)),
                on_done: Self::on_done(&self.events),
            };
            self.pool
                .submit_signed(Arc::from(n.client), r.whu.clone(), call);
        }
    }

    fn pushes(&self) -> bool {
        self.push.on()
    }

    fn push(&self, p: &PushNotice<'_>) {
        let Some(base) = self.push.url(p.project) else {
            return;
        };
        let req = send::push_request(&self.key, p, unix_now());
        let url: Arc<str> = format!("{base}/{}", req.path).into();
        let life = u64::from(p.ttl).clamp(1, send::MAX_EVENT_LIFE_S);
        let call = Signed {
            body: req.body,
            headers: vec![
                ("X-Ed25519-Timestamp", req.timestamp),
                ("X-Ed25519-Signature", req.signature),
            ],
            until: Instant::now() + Duration::from_secs(life),
            on_done: Self::on_done(&self.pushes),
        };
        self.pool.submit_signed(Arc::from(p.client), url, call);
    }
}

/// The first Redis shard as `--redis`, `--redis-password-file` and `--redis-tls-*` name it
/// (`None`: no `--redis`).
fn shared_spec(
    config: &Config,
) -> Result<Option<Arc<crate::engine::redis::cluster::SharedSpec>>, String> {
    let opts = &config.redis_opts;
    let tls = crate::engine::redis::cluster::tls::RedisTlsFiles {
        ca: opts.redis_tls_ca.clone(),
        cert: opts.redis_tls_cert.clone(),
        key: opts.redis_tls_key.clone(),
    };
    let spec = crate::engine::redis::cluster::SharedSpec::new(
        &config.redis,
        opts.password()?.as_deref(),
        &tls,
        opts.redis_wait_replicas,
        Duration::from_millis(opts.redis_wait_timeout_ms),
    )?;
    Ok(spec.map(Arc::new))
}

/// With `--redis` and no `--relay-key`: the cluster's one key, `SET walletrelay:relay-key
/// <hex seed> NX` then `GET` on the first shard, whatever its kind (a blocking round trip
/// at start, before the workers run).
fn cluster_key(
    spec: &Arc<crate::engine::redis::cluster::SharedSpec>,
) -> Result<RelayKey, crate::identity::KeyError> {
    use crate::identity::KeyError;
    let mine = RelayKey::random()?;
    let seed =
        crate::engine::redis::cluster::shared_value(spec, "walletrelay:relay-key", mine.seed_hex())
            .map_err(KeyError::Cluster)?;
    RelayKey::from_hex(&seed).ok_or_else(|| {
        KeyError::Cluster("walletrelay:relay-key is not a 64-hex-character seed".into())
    })
}
