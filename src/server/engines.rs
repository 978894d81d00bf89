//! Which engine keeps the topics' state, built once at start from the flags: Redis when
//! `--redis` is given (DECISIONS §7), else the in-memory engine of the home workers. Also
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
    pub health: Health,
    /// What `/metrics` adds.
    pub exporters: Vec<Exporter>,
    /// Stopped at shutdown.
    pub cluster: Option<Arc<Cluster>>,
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

/// Builds the engines for `n` workers.
pub fn build(
    config: &Config,
    mailboxes: &Arc<Mailboxes>,
    metrics: &Arc<Metrics>,
    seeds: [u64; 4],
) -> Result<Built, StartError> {
    if config.redis.is_empty() {
        Ok(memory(config, mailboxes, metrics, seeds))
    } else {
        redis(config, mailboxes)
    }
}

/// The in-memory engine: each topic on its home worker.
fn memory(
    config: &Config,
    mailboxes: &Arc<Mailboxes>,
    metrics: &Arc<Metrics>,
    seeds: [u64; 4],
) -> Built {
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
        .map(|i| Box::new(LocalEngine::new(i, local.clone())) as Box<dyn Engine>)
        .collect();
    Built {
        engines,
        webhooks,
        health: Health::default(),
        exporters: Vec::new(),
        cluster: None,
    }
}

/// The Redis engine: each topic on its Redis shard, shared by every node.
fn redis(config: &Config, mailboxes: &Arc<Mailboxes>) -> Result<Built, StartError> {
    let limits = &config.limits;
    let cfg = ClusterConfig {
        urls: config.redis.clone(),
        max_cached_per_topic: limits.max_cached_per_topic,
        max_webhooks_per_topic: limits.max_webhooks_per_topic,
        max_webhooks: limits.max_webhooks,
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
    })
}
