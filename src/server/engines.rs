//! Which engine keeps the topics' state, built once at start from the flags: Redis when
//! `--redis` is given (DECISIONS §7), else the home workers' engine, durable in
//! `--data-dir` (DECISIONS §6) unless that is `none` (memory only). Also
//! what depends on that choice: where the webhook pool sends a webhook it gave up on, what
//! `/health` asks, what `/metrics` adds, and what must stop at shutdown.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::StartError;
use crate::cluster::{Cluster, ClusterConfig};
use crate::config::Config;
use crate::conn::Exporter;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::relay::engine::local::{HomeMsg, LocalEngine, LocalShared};
use crate::relay::engine::redis::RedisEngine;
use crate::relay::engine::EngineMsg;
use crate::relay::{CoreMsg, Engine, Mailboxes, Placement};
use crate::webhook::{OnGone, WebhookConfig, WebhookPool};

/// The engines, one per worker, and what goes with them.
pub struct Built {
    /// One engine per worker, in worker order.
    pub engines: Vec<Box<dyn Engine>>,
    /// The webhook delivery pool the engines submit to.
    pub webhooks: WebhookPool,
    /// What `/health` asks.
    pub health: Arc<Health>,
    /// What `/metrics` adds.
    pub exporters: Vec<Exporter>,
    /// Stopped at shutdown.
    pub cluster: Option<Arc<Cluster>>,
    /// The data directory's lock, held for the process lifetime.
    pub lock: Option<crate::store::DirLock>,
}

fn pool(config: &Config, on_gone: OnGone) -> WebhookPool {
    WebhookPool::start(
        WebhookConfig {
            threads: config.limits.webhook_threads,
            queue: config.limits.webhook_queue,
            allow_private: config.webhook_allow_private,
            ..WebhookConfig::default()
        },
        on_gone,
    )
}

/// Builds the engines for `n` workers: Redis with `--redis`, else the in-memory engine,
/// durable unless `--data-dir none`.
pub fn build(
    config: &Config,
    mailboxes: &Arc<Mailboxes>,
    metrics: &Arc<Metrics>,
    seeds: [u64; 4],
) -> Result<Built, StartError> {
    if !config.redis.is_empty() {
        return redis(config, mailboxes);
    }
    let Some(dir) = config.data_dir() else {
        let (engines, webhooks) = local(config, mailboxes, metrics, seeds);
        log::info!("no data directory: the relay's state lives in memory only");
        return Ok(Built {
            engines: engines.into_iter().map(boxed).collect(),
            webhooks,
            health: Arc::default(),
            exporters: Vec::new(),
            cluster: None,
            lock: None,
        });
    };
    durable(config, mailboxes, metrics, seeds, &dir)
}

fn boxed(e: LocalEngine) -> Box<dyn Engine> {
    Box::new(e)
}

/// The durable local engine: the in-memory engine with a log per worker in `dir`.
fn durable(
    config: &Config,
    mailboxes: &Arc<Mailboxes>,
    metrics: &Arc<Metrics>,
    seeds: [u64; 4],
    dir: &std::path::Path,
) -> Result<Built, StartError> {
    let (lock, seeds) = super::durable::open(dir, seeds)?;
    let (mut engines, webhooks) = local(config, mailboxes, metrics, seeds);
    let placement = Placement::new(mailboxes.len(), seeds);
    let health = Arc::new(Health::default());
    let d = super::durable::recover(
        dir,
        lock,
        &mut engines,
        &placement,
        super::durable::Settings::of(config),
        mailboxes,
        &health,
    )?;
    let (logs, stats) = (d.logs, d.stats);
    let exporters: Vec<Exporter> = vec![Box::new(move |s: &mut String| {
        let refs: Vec<(&str, &crate::store::StoreMetrics)> =
            logs.iter().map(|(o, m)| (o.as_str(), &**m)).collect();
        crate::store::metrics::render(s, &refs, &stats);
    })];
    Ok(Built {
        engines: engines.into_iter().map(boxed).collect(),
        webhooks,
        health,
        exporters,
        cluster: None,
        lock: Some(d.lock),
    })
}

/// The in-memory engines: each topic on its home worker.
fn local(
    config: &Config,
    mailboxes: &Arc<Mailboxes>,
    metrics: &Arc<Metrics>,
    seeds: [u64; 4],
) -> (Vec<LocalEngine>, WebhookPool) {
    let placement = Placement::new(mailboxes.len(), seeds);
    // A webhook given up by the pool is removed on its topic's home worker.
    let on_gone: OnGone = {
        let (mailboxes, placement) = (mailboxes.clone(), placement.clone());
        Arc::new(move |topic: Arc<str>, url: Arc<str>| {
            let home = placement.of(&topic);
            let msg = HomeMsg::RemoveWebhook { topic, url };
            mailboxes.send_external(home, CoreMsg::Engine(EngineMsg::Local(msg)))
        })
    };
    let webhooks = pool(config, on_gone);
    let local = LocalShared {
        placement,
        mailboxes: mailboxes.clone(),
        limits: config.limits.clone(),
        metrics: metrics.clone(),
        webhooks: webhooks.clone(),
        webhook_count: Arc::new(AtomicUsize::new(0)),
    };
    let engines = (0..mailboxes.len())
        .map(|i| LocalEngine::new(i, local.clone()))
        .collect();
    (engines, webhooks)
}

/// The Redis engine: each topic on its Redis shard, shared by every node.
fn redis(config: &Config, mailboxes: &Arc<Mailboxes>) -> Result<Built, StartError> {
    let limits = &config.limits;
    let cfg = ClusterConfig {
        urls: config.redis.clone(),
        max_cached_per_topic: limits.max_cached_per_topic,
        max_webhooks_per_topic: limits.max_webhooks_per_topic,
        max_webhooks: limits.max_webhooks,
        v1_pending_ttl: std::time::Duration::from_secs(u64::from(limits.v1_pending_ttl)),
        ..ClusterConfig::default()
    };
    // Answers and live messages go to the worker's mailbox. The cluster threads may wait
    // for room there (they are helper threads), so nothing the store said is ever dropped.
    let sink = {
        let mailboxes = mailboxes.clone();
        Arc::new(move |w: usize, ev| {
            mailboxes.send_blocking(w, CoreMsg::Engine(EngineMsg::Cluster(ev)));
        })
    };
    let cluster = Arc::new(Cluster::start(cfg, sink)?);
    let on_gone: OnGone = {
        let handle = cluster.handle(0);
        Arc::new(move |topic: Arc<str>, url: Arc<str>| {
            let _ = handle.remove_webhook(&topic, &url);
        })
    };
    let webhooks = pool(config, on_gone);
    let engines = (0..mailboxes.len())
        .map(|i| Box::new(RedisEngine::new(cluster.handle(i), webhooks.clone())) as Box<dyn Engine>)
        .collect();
    let mut health = Health::default();
    let c = cluster.clone();
    health.add_check(Box::new(move || c.healthy()));
    let health = Arc::new(health);
    let c = cluster.clone();
    let exporters: Vec<Exporter> = vec![Box::new(move |s: &mut String| c.render_metrics(s))];
    log::info!(
        "cluster mode: state on {} Redis server(s)",
        cluster.shards()
    );
    Ok(Built {
        engines,
        webhooks,
        health,
        exporters,
        cluster: Some(cluster),
        lock: None,
    })
}
