//! The in-memory engine built from the flags: one [`LocalEngine`] per worker, each with its
//! own mailbox, and, unless `--data-dir none`, durable (DECISIONS §6): the data directory
//! locked, read back into every worker's home state, and each worker's journal opened with
//! its sync thread reporting to the worker's engine.

use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::outbox::Peers;
use super::{HomeMsg, LocalEngine, LocalShared};
use crate::engine::memory::journal::recover::{self, Settings};
use crate::engine::memory::placement::Placement;
use crate::engine::{BuildError, Built, Engine, Exporter, Setup};
use crate::health::Health;
use crate::mailbox::{self, Receiver};
use crate::webhook::{OnGone, WebhookPool};

/// Builds every worker's in-memory engine, durable in `--data-dir` unless it is `none`.
pub fn build(setup: &Setup) -> Result<Built, BuildError> {
    let Some(dir) = setup.config.data_dir() else {
        let (engines, webhooks) = engines(setup, setup.seeds);
        log::info!(engine = "memory"; "no data directory: the relay's state lives in memory only");
        return Ok(Built {
            engines: engines.into_iter().map(boxed).collect(),
            webhooks,
            health: Arc::default(),
            exporters: Vec::new(),
            on_stop: None,
            lock: None,
            layout_switch: None,
        });
    };
    durable(setup, &dir)
}

fn boxed(e: LocalEngine) -> Box<dyn Engine> {
    Box::new(e)
}

/// The durable engine: the in-memory engine with a journal per worker in `dir`.
fn durable(setup: &Setup, dir: &Path) -> Result<Built, BuildError> {
    let (lock, seeds) = recover::open(dir, setup.seeds)?;
    let (mut engines, webhooks) = engines(setup, seeds);
    let placement = engines
        .first()
        .map(|e| e.shared.placement.clone())
        .unwrap_or_else(|| Placement::new(1, seeds));
    let back = recover::read_back(dir, engines.len(), &placement)?;
    let health = Arc::new(Health::default());
    let settings = Settings {
        writes: setup.metrics.store_writes.clone(),
        ..Settings::of(setup.config)
    };
    let mut logs = Vec::with_capacity(engines.len());
    for (i, engine) in engines.iter_mut().enumerate() {
        // The sync thread's reports go to this worker's engine; it may wait for room (a
        // helper thread), so no report is ever dropped.
        let mb = engine.shared.peers.get(i).cloned();
        let on_sync: recover::OnSync = Box::new(move |ev| {
            if let Some(mb) = &mb {
                mb.send_blocking(vec![HomeMsg::Sync(ev)]);
            }
        });
        let (journal, figures) = recover::open_journal(dir, i, &settings, on_sync, &health)?;
        logs.push(figures);
        engine.journal = Some(journal);
    }
    let workers = engines
        .iter_mut()
        .filter_map(|e| Some((&mut e.home, e.journal.as_mut()?)))
        .collect();
    let d = recover::recover(dir, lock, back, workers, &placement)?;
    let stats = d.stats;
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
        on_stop: None,
        lock: Some(d.lock),
        layout_switch: None,
    })
}

/// Every worker's in-memory engine, each topic on its home worker (placed by `seeds`).
fn engines(setup: &Setup, seeds: [u64; 4]) -> (Vec<LocalEngine>, WebhookPool) {
    let n = setup.bells.len();
    let placement = Placement::new(n, seeds);
    let (peers, inboxes) = mailboxes(setup);
    // A webhook given up by the pool is removed on its topic's home worker.
    let on_gone: OnGone = {
        let (peers, placement) = (peers.clone(), placement.clone());
        Arc::new(move |topic: Arc<str>, url: Arc<str>| {
            let home = placement.of(&topic);
            let msg = HomeMsg::RemoveWebhook { topic, url };
            let sent = peers.get(home).is_some_and(|mb| mb.send_patient(vec![msg]));
            if !sent {
                log::warn!("worker {home}: mailbox full; a webhook removal was dropped");
            }
        })
    };
    let webhooks = setup.webhook_pool(on_gone);
    let shared = LocalShared {
        placement,
        peers,
        limits: setup.config.limits.clone(),
        metrics: setup.metrics.clone(),
        webhooks: webhooks.clone(),
        webhook_count: Arc::new(AtomicUsize::new(0)),
        mailboxes: Arc::default(),
        notify: setup.notify.clone(),
    };
    let engines = inboxes
        .into_iter()
        .enumerate()
        .map(|(i, inbox)| LocalEngine::new(i, shared.clone(), inbox))
        .collect();
    (engines, webhooks)
}

/// Every worker's engine mailbox (bounded by `--mailbox-batches` batches) and the
/// receiving halves, in worker order.
fn mailboxes(setup: &Setup) -> (Peers, Vec<Receiver<Vec<HomeMsg>>>) {
    let cap = setup.config.limits.mailbox_batches;
    let (tx, rx): (Vec<_>, Vec<_>) = setup
        .bells
        .iter()
        .map(|bell| mailbox::bounded(bell.clone(), cap))
        .unzip();
    (tx.into(), rx)
}
