//! The Redis engine built from `--redis` (DECISIONS §7): the node's cluster threads (one
//! command thread per shard, the subscriber), one [`RedisEngine`] per worker with its own
//! mailbox for what those threads send it, the webhook pool, `/health` and `/metrics`.

use std::sync::Arc;

use super::cluster::{Cluster, ClusterConfig, EventSink, Followup};
use super::RedisEngine;
use crate::engine::{BuildError, Built, Engine, Event, Exporter, Setup};
use crate::health::Health;
use crate::mailbox::{self, Mailbox};
use crate::webhook::OnGone;

/// Builds every worker's Redis engine: each topic on its Redis shard, shared by every node.
pub fn build(setup: &Setup) -> Result<Built, BuildError> {
    let limits = &setup.config.limits;
    let cfg = cluster_config(setup)?;
    // Each event is one message (a batch of one) in its worker's engine mailbox.
    let cap = limits.mailbox_batches;
    let (boxes, inboxes): (Vec<Mailbox<Event<Followup>>>, Vec<_>) = setup
        .bells
        .iter()
        .map(|bell| mailbox::bounded(bell.clone(), cap))
        .unzip();
    // The cluster threads may wait for room (they are helper threads), so nothing the
    // store said is ever dropped.
    let sink: EventSink = Arc::new(move |w: usize, ev| {
        if let Some(mb) = boxes.get(w) {
            mb.send_blocking(ev);
        }
    });
    let cluster = Arc::new(Cluster::start(cfg, sink)?);
    let on_gone: OnGone = {
        let handle = cluster.handle(0);
        Arc::new(move |topic: Arc<str>, url: Arc<str>| {
            let _ = handle.remove_webhook(&topic, &url);
        })
    };
    let webhooks = setup.webhook_pool(on_gone);
    let node_mailboxes = Arc::new(super::NodeMailboxes::default());
    let engines = inboxes
        .into_iter()
        .enumerate()
        .map(|(i, inbox)| {
            let engine = RedisEngine::new(cluster.handle(i), webhooks.clone(), inbox).with_clients(
                limits.mailbox_ttl.saturating_mul(1000),
                limits.max_mailbox_topics,
                node_mailboxes.clone(),
                setup.notify.clone(),
            );
            Box::new(engine) as Box<dyn Engine>
        })
        .collect();
    let mut health = Health::default();
    let c = cluster.clone();
    health.add_check(Box::new(move || c.healthy()));
    let c = cluster.clone();
    let layout_switch: crate::engine::LayoutSwitch =
        Arc::new(move || c.switch_layout().map_err(|e| e.to_string()));
    let c = cluster.clone();
    let exporters: Vec<Exporter> = vec![Box::new(move |s: &mut String| c.render_metrics(s))];
    log::info!(engine = "redis", shards = cluster.shards();
        "cluster mode: state on {} Redis server(s)",
        cluster.shards()
    );
    Ok(Built {
        engines,
        webhooks,
        health: Arc::new(health),
        exporters,
        on_stop: Some(Box::new(move || cluster.shutdown())),
        lock: None,
        layout_switch: Some(layout_switch),
    })
}

/// What the cluster threads are started with: `--redis` and its options, the limits they
/// apply on the shards.
fn cluster_config(setup: &Setup) -> Result<ClusterConfig, BuildError> {
    let config = setup.config;
    let limits = &config.limits;
    let opts = &config.redis_opts;
    let password = opts
        .password()
        .map_err(BuildError::Config)?
        .map(super::cluster::Secret);
    Ok(ClusterConfig {
        urls: config.redis.clone(),
        tls: super::cluster::tls::RedisTlsFiles {
            ca: opts.redis_tls_ca.clone(),
            cert: opts.redis_tls_cert.clone(),
            key: opts.redis_tls_key.clone(),
        },
        password,
        wait_replicas: opts.redis_wait_replicas,
        wait_timeout: std::time::Duration::from_millis(opts.redis_wait_timeout_ms),
        max_cached_per_topic: limits.max_cached_per_topic,
        max_webhooks_per_topic: limits.max_webhooks_per_topic,
        max_webhooks: limits.max_webhooks,
        v1_pending_ttl: std::time::Duration::from_secs(u64::from(limits.v1_pending_ttl)),
        mailbox_ttl: std::time::Duration::from_secs(limits.mailbox_ttl),
        max_mailbox_topics: limits.max_mailbox_topics,
        writes: setup.metrics.store_writes.clone(),
        layouts: setup.layouts.clone(),
        ..ClusterConfig::default()
    })
}
