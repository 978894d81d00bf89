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
    _persister: store::Persister,
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
        let key = match (&config.notify.relay_key, config.redis.is_empty(), &dir) {
            (Some(path), _, _) => RelayKey::load_or_create(KeySource::File(path)),
            (None, false, _) => cluster_key(config),
            (None, true, Some(dir)) => RelayKey::load_or_create(KeySource::DataDir(dir)),
            (None, true, None) => RelayKey::load_or_create(KeySource::Fresh),
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
        let link = match config.redis.is_empty() {
            true => None,
            false => crate::cluster::SharedLink::open(&config.redis)?,
        };
        let mut n = match link {
            // On a cluster the registrations live in Redis, for every node.
            Some(mut link) => {
                let (tx, rx) = crossbeam_channel::bounded(redis_sync::QUEUE);
                let n = Notifier::assemble(key, max, pool, push, None, Some(tx));
                let loaded = redis_sync::load_all(&mut link, &n.hub)?;
                log::info!("watches: {loaded} registrations loaded from Redis");
                redis_sync::start(config.redis.clone(), Arc::downgrade(&n.hub), rx);
                n
            }
            None => {
                if !config.redis.is_empty() {
                    log::warn!("watches: the first Redis shard is not a plain standalone server; registrations stay on the node that took them");
                }
                let n = Notifier::new(key, max, pool, push, dir.clone());
                if let Some(dir) = &dir {
                    let loaded = store::load(dir, &n.hub, unix_now());
                    log::info!(
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
        redis: Option<crossbeam_channel::Sender<redis_sync::Op>>,
    ) -> Notifier {
        let (mut persister, rx) = store::Persister::channel();
        let bell = persister.bell();
        let to_redis = redis.map(redis_sync::hook);
        let hub = Arc::new(WatchHub::new(
            max_watches,
            Box::new(move |change| {
                let _ = bell.try_send(());
                if let Some(send) = &to_redis {
                    send(change);
                }
            }),
        ));
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
            _persister: persister,
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

    /// `irn_watchRegister {registerAuth}`: the relay's did:key, or the refusal.
    pub fn register(&self, token: &str) -> Result<&str, WatchError> {
        let now = unix_now();
        let c = claims::check(token, Action::Register, now, &self.audiences)?;
        self.hub.register(&c.client, Registration::of(&c), now)?;
        Ok(self.key.did_key())
    }

    /// `irn_watchUnregister {unregisterAuth}`: forgets the registration (none is no error).
    pub fn unregister(&self, token: &str) -> Result<(), WatchError> {
        let c = claims::check(token, Action::Unregister, unix_now(), &self.audiences)?;
        self.hub.unregister(&c.client, &c.sub, &c.whu, c.typ);
        Ok(())
    }

    /// Re-reads `--push-urls @FILE` (SIGHUP); logged.
    pub fn reload(&self) {
        match self.push.reload() {
            Some(Ok(n)) => log::info!("push URLs reloaded: {n} projects"),
            Some(Err(e)) => log::warn!("push URLs not reloaded: {e}"),
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

/// With `--redis` and no `--relay-key`: the cluster's one key, `SET walletrelay:relay-key
/// <hex seed> NX` then `GET` on the first shard (a blocking round trip at start, before the
/// workers run).
fn cluster_key(config: &Config) -> Result<RelayKey, crate::identity::KeyError> {
    use crate::identity::KeyError;
    let mine = RelayKey::random()?;
    let shared =
        crate::cluster::shared_value(&config.redis, "walletrelay:relay-key", mine.seed_hex())
            .map_err(KeyError::Cluster)?;
    let Some(seed) = shared else {
        log::warn!("relay key: the first Redis shard is not a plain standalone server; this node's own key is used (give every node the same --relay-key)");
        return match config.data_dir() {
            Some(dir) => RelayKey::load_or_create(KeySource::DataDir(&dir)),
            None => Ok(mine),
        };
    };
    RelayKey::from_hex(&seed).ok_or_else(|| {
        KeyError::Cluster("walletrelay:relay-key is not a 64-hex-character seed".into())
    })
}
