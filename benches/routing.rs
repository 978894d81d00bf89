//! Topic routing across workers, in process (no sockets): a publish on worker 0 for a topic
//! homed on worker 1 travels 0 -> 1 (cache, dedup, fan-out) -> 0 (delivery to a local
//! subscriber), in batches over the real crossbeam mailboxes; and the same with publisher,
//! home and subscriber on one worker (no hop).

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use walletrelay::config::Limits;
use walletrelay::metrics::Metrics;
use walletrelay::relay::{Delivery, Homes, Mailboxes, Relay, SubId};
use walletrelay::webhook::WebhookPool;

fn relays(
    n: usize,
) -> (
    Vec<Relay>,
    Vec<crossbeam_channel::Receiver<Vec<walletrelay::relay::CoreMsg>>>,
    Vec<mio::Poll>,
) {
    let polls: Vec<mio::Poll> = (0..n).map(|_| mio::Poll::new().unwrap()).collect();
    let wakers = polls
        .iter()
        .map(|p| mio::Waker::new(p.registry(), mio::Token(0)).unwrap())
        .collect();
    let (mb, rx) = Mailboxes::new(wakers, 4096);
    let metrics = Metrics::new(n);
    let homes = Homes::new(n, [1, 2, 3, 4]);
    let pool = WebhookPool::default();
    let count = Arc::new(AtomicUsize::new(0));
    let limits = Limits {
        max_cached_per_topic: 16,
        ..Limits::default()
    };
    let rs = (0..n)
        .map(|i| {
            Relay::new(
                i,
                homes.clone(),
                mb.clone(),
                limits.clone(),
                metrics.clone(),
                pool.clone(),
                count.clone(),
            )
        })
        .collect();
    (rs, rx, polls)
}

fn routing(c: &mut Criterion) {
    let msg = "ab".repeat(256);
    let mut g = c.benchmark_group("route_publish_to_delivery");
    g.bench_function("same_worker", |b| {
        let (mut rs, _rx, _p) = relays(1);
        let topic = "f".repeat(64);
        let slot = rs[0].subscribe(1, 1, &topic, SubId::from_bytes(&[7; 32]));
        let _ = slot;
        rs[0].deliveries.clear();
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let data = Bytes::from(format!(
                "{{\"topic\":\"{topic}\",\"message\":\"{msg}{i}\"}}"
            ));
            rs[0].publish(&topic, data, 21600, false, 2);
            black_box(rs[0].deliveries.len());
            rs[0].deliveries.clear();
        })
    });
    g.bench_function("cross_worker_two_hops", |b| {
        let (mut rs, rx, _p) = relays(2);
        // A topic homed on worker 1, subscribed and published on worker 0.
        let topic = (0..)
            .map(|k| format!("{k:064x}"))
            .find(|t| rs[0].home_of(t) == 1)
            .unwrap();
        rs[0].subscribe(1, 1, &topic, SubId::from_bytes(&[7; 32]));
        rs[0].flush_outboxes();
        let batch = rx[1].try_recv().unwrap();
        rs[1].on_batch(batch);
        rs[1].flush_outboxes();
        let batch = rx[0].try_recv().unwrap();
        rs[0].on_batch(batch);
        rs[0].deliveries.clear();
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let data = Bytes::from(format!(
                "{{\"topic\":\"{topic}\",\"message\":\"{msg}{i}\"}}"
            ));
            rs[0].publish(&topic, data, 21600, false, 2);
            rs[0].flush_outboxes();
            let batch = rx[1].try_recv().unwrap();
            rs[1].on_batch(batch);
            rs[1].flush_outboxes();
            let batch = rx[0].try_recv().unwrap();
            rs[0].on_batch(batch);
            assert!(matches!(
                rs[0].deliveries.first(),
                Some(Delivery::Live { .. })
            ));
            rs[0].deliveries.clear();
        })
    });
    g.finish();
}

criterion_group!(benches, routing);
criterion_main!(benches);
