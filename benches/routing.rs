//! Topic routing across workers, in process (no sockets): a publish on worker 0 for a topic
//! homed on worker 1 travels 0 -> 1 (the in-memory engine stores it: position, dedup,
//! fan-out) -> 0 (live delivery to a local subscriber, and the publish's answer), in batches
//! over the engines' real mailboxes; and the same with publisher, home and subscriber on
//! one worker (no hop).

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use walletrelay::config::Limits;
use walletrelay::engine::memory::local::{LocalEngine, LocalShared};
use walletrelay::engine::memory::placement::Placement;
use walletrelay::mailbox::{self, Doorbell};
use walletrelay::metrics::Metrics;
use walletrelay::relay::{
    ConnRef, Deliveries, Delivery, Dialect, Done, Meta, Publishing, Relay, SubId,
};
use walletrelay::webhook::WebhookPool;

/// Counts what would be written.
#[derive(Default)]
struct Count {
    pushes: usize,
    answers: usize,
}

impl Count {
    /// Counts `d` and gives it back to `r`.
    fn take(&mut self, r: &mut Relay, d: Deliveries) {
        for one in &d.list {
            match one {
                Delivery::Push { .. } | Delivery::Text { .. } => self.pushes += 1,
                Delivery::Answer { .. } | Delivery::Fetched { .. } => self.answers += 1,
                Delivery::Unacked { .. } | Delivery::Webhook { .. } => {}
            }
        }
        r.recycle(d);
    }
}

/// A publish of `message` on `topic` with the bench's ttl, no prompt, no client id.
fn publishing<'a>(topic: &'a str, message: &'a str) -> Publishing<'a> {
    Publishing {
        topic,
        message,
        meta: Meta::default(),
        ttl: 21600,
        prompt: false,
        publisher: None,
    }
}

fn relays(n: usize) -> (Vec<Relay>, Placement, Vec<mio::Poll>) {
    let polls: Vec<mio::Poll> = (0..n).map(|_| mio::Poll::new().unwrap()).collect();
    let (peers, rx): (Vec<_>, Vec<_>) = polls
        .iter()
        .map(|p| {
            let waker = mio::Waker::new(p.registry(), mio::Token(0)).unwrap();
            mailbox::bounded(Doorbell::new(waker), 4096)
        })
        .unzip();
    let metrics = Metrics::new(n);
    let limits = Limits {
        max_cached_per_topic: 16,
        max_cache_bytes: 64 << 20,
        ..Limits::default()
    };
    let placement = Placement::new(n, [1, 2, 3, 4]);
    let shared = LocalShared {
        placement: placement.clone(),
        peers: peers.into(),
        limits: limits.clone(),
        metrics: metrics.clone(),
        webhooks: WebhookPool::default(),
        webhook_count: Arc::new(AtomicUsize::new(0)),
        mailboxes: Arc::default(),
        notify: Arc::new(walletrelay::notice::Silent),
    };
    let rs = rx
        .into_iter()
        .enumerate()
        .map(|(i, inbox)| {
            let engine = LocalEngine::new(i, shared.clone(), inbox);
            Relay::new(i, 1, Box::new(engine), limits.clone(), metrics.clone())
        })
        .collect();
    (rs, placement, polls)
}

/// Moves every waiting batch between the relays until none is left.
fn pump(rs: &mut [Relay], out: &mut Count) {
    loop {
        let mut moved = false;
        for r in rs.iter_mut() {
            r.flush();
        }
        for r in rs.iter_mut() {
            while r.has_mail() {
                r.on_mail(usize::MAX);
                moved = true;
            }
            let d = r.deliver();
            out.take(r, d);
        }
        if !moved {
            return;
        }
    }
}

fn routing(c: &mut Criterion) {
    let msg = "ab".repeat(256);
    let sub = ConnRef { key: 1, uid: 1 };
    let publisher = ConnRef { key: 2, uid: 2 };
    let mut g = c.benchmark_group("route_publish_to_delivery");
    g.bench_function("same_worker", |b| {
        let (mut rs, _, _p) = relays(1);
        let topic = "f".repeat(64);
        rs[0].subscribe(sub, &topic, SubId::from_bytes(&[7; 32]), Dialect::Waku);
        let mut out = Count::default();
        pump(&mut rs, &mut out);
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let m = format!("{msg}{i}");
            let done = rs[0].publish(publisher, 1, publishing(&topic, &m));
            assert_eq!(done, Done::Now(Ok(())));
            let d = rs[0].deliver();
            out.take(&mut rs[0], d);
            black_box(out.pushes);
        })
    });
    g.bench_function("cross_worker_two_hops", |b| {
        let (mut rs, placement, _p) = relays(2);
        // A topic homed on worker 1, subscribed and published on worker 0.
        let topic = (0..)
            .map(|k| format!("{k:064x}"))
            .find(|t| placement.of(t) == 1)
            .unwrap();
        rs[0].subscribe(sub, &topic, SubId::from_bytes(&[7; 32]), Dialect::Waku);
        let mut out = Count::default();
        pump(&mut rs, &mut out);
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let m = format!("{msg}{i}");
            let (pushes, answers) = (out.pushes, out.answers);
            assert_eq!(
                rs[0].publish(publisher, 1, publishing(&topic, &m)),
                Done::Later
            );
            pump(&mut rs, &mut out);
            assert_eq!((out.pushes, out.answers), (pushes + 1, answers + 1));
        })
    });
    g.finish();
}

criterion_group!(benches, routing);
criterion_main!(benches);
