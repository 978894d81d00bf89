//! The latency histograms of `/metrics` (issue 54 item 5), on the real binary and real
//! sockets, for each engine (memory, the journal on a data directory, a real `redis-server`):
//! a publisher and two subscribers (one on each of two workers, so messages cross workers on
//! their way), `N` publishes; then `walletrelay_publish_ack_seconds` counts `N` acks,
//! `walletrelay_publish_delivery_seconds` one sample per push the subscribers received (the
//! subscriptions in place first: live deliveries, not a replay of history), and
//! `walletrelay_store_write_seconds` the store's writes (some for the journal and Redis, none
//! in memory). Each family is a well-formed Prometheus histogram: its `# TYPE`, the bucket
//! bounds the deploy files rely on, cumulative buckets ending in `+Inf` equal to `_count`,
//! the `engine` label of the engine the node runs. No timing is asserted.

mod common;

use common::redis::RedisServer;
use common::tempdir::TempDir;
use common::wait::{wait_for, wait_until, WAIT};
use common::{hex, topic, Server, Ws};

/// Publishes per run.
const N: usize = 20;

/// The bucket bounds (`le`) of the three families, as `docs/OBSERVABILITY.md` and the rules
/// use them.
const LE: [&str; 17] = [
    "0.00005", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
    "0.1", "0.25", "0.5", "1", "2.5", "5", "+Inf",
];

const ACK: &str = "walletrelay_publish_ack_seconds";
const DELIVERY: &str = "walletrelay_publish_delivery_seconds";
const STORE: &str = "walletrelay_store_write_seconds";

/// One histogram series as `/metrics` gave it.
#[derive(Debug)]
struct Hist {
    /// (le, cumulative count), in the order written.
    buckets: Vec<(String, f64)>,
    count: f64,
    sum: f64,
}

/// The series of family `name` labelled `engine="{engine}"` in `text`, checked to be a
/// well-formed histogram.
fn histogram(text: &str, name: &str, engine: &str) -> Hist {
    assert!(
        text.contains(&format!("\n# TYPE {name} histogram\n")),
        "no `# TYPE {name} histogram` in:\n{text}"
    );
    let label = format!("{{engine=\"{engine}\"");
    let value = |l: &str| -> f64 { l.rsplit(' ').next().unwrap().parse().unwrap() };
    let mut buckets = Vec::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(&format!("{name}_bucket")) else {
            continue;
        };
        assert!(
            rest.starts_with(&label),
            "{name} without engine=\"{engine}\": {l}"
        );
        let le = rest
            .split("le=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        buckets.push((le.to_string(), value(l)));
    }
    let one = |suffix: &str| -> f64 {
        let series = format!("{name}_{suffix}{{engine=\"{engine}\"}} ");
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&series)).collect();
        assert_eq!(lines.len(), 1, "one {series}in:\n{text}");
        value(lines[0])
    };
    let h = Hist {
        buckets,
        count: one("count"),
        sum: one("sum"),
    };
    let les: Vec<&str> = h.buckets.iter().map(|(le, _)| le.as_str()).collect();
    assert_eq!(les, LE, "{name}'s bounds");
    assert!(
        h.buckets.windows(2).all(|w| w[0].1 <= w[1].1),
        "{name}'s buckets are not cumulative: {h:?}"
    );
    assert_eq!(
        h.buckets.last().unwrap().1,
        h.count,
        "{name}: +Inf != _count"
    );
    assert!(h.sum >= 0.0);
    h
}

/// Where a run reads `/metrics`.
#[derive(Clone, Copy)]
enum Scrape {
    /// The public port (no `--admin-listen`).
    Public,
    /// The admin address.
    Admin,
}

fn metrics(s: &Server, at: Scrape) -> String {
    match at {
        Scrape::Public => s.metrics_text().expect("/metrics on the public port"),
        Scrape::Admin => {
            let r = s.admin_request("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
            assert_eq!(r.status, 200);
            r.body_str().to_string()
        }
    }
}

/// `N` publishes from a connection on worker 0 to subscribers on workers 0 and 1; returns
/// the pushes they received.
fn publish_to_two(s: &Server) -> usize {
    let t = topic();
    let mut subs: Vec<Ws> = vec![s.ws_on(0), s.ws_on(1)];
    // Blocking subscribes: answered once the subscription is in place, so every publish
    // after them is a live delivery (a push replayed from the topic's history while a
    // subscription catches up is not a sample; on Redis a plain subscribe's answer can
    // come before the node's SUBSCRIBE is confirmed).
    for w in &mut subs {
        let r = w.call("irn_subscribeBlocking", serde_json::json!({ "topic": t }));
        assert!(r["result"].is_string(), "subscribeBlocking failed: {r}");
    }
    let mut publisher = s.ws_on(0);
    for i in 0..N {
        publisher.publish(&t, &hex(64, i as u64 + 1));
    }
    let mut pushes = 0;
    for w in &mut subs {
        for _ in 0..N {
            let m = w.recv();
            assert_eq!(m["method"], "irn_subscription", "not a push: {m}");
            assert_eq!(m["params"]["data"]["topic"], t.as_str());
            pushes += 1;
        }
    }
    pushes
}

/// One engine's run: the server started with `args` (two workers), the publishes, then the
/// three families read at `at`; `store_writes`: the engine writes to a store.
fn run(args: &[&str], engine: &str, at: Scrape, store_writes: bool) {
    let mut all = vec!["--threads", "2"];
    if let Scrape::Admin = at {
        all.extend(["--admin-listen", "127.0.0.1:0"]);
    }
    all.extend(args);
    let s = Server::start(&all);
    let pushes = publish_to_two(&s);
    assert_eq!(pushes, 2 * N);
    // A sample is taken once its round's output is written: the client may read the
    // answer a moment before.
    wait_until(WAIT, || {
        let text = metrics(&s, at);
        histogram(&text, ACK, engine).count == N as f64
            && histogram(&text, DELIVERY, engine).count == pushes as f64
    });
    if store_writes {
        wait_for("a store write counted", || {
            histogram(&metrics(&s, at), STORE, engine).count > 0.0
        });
    }
    let text = metrics(&s, at);
    assert_eq!(histogram(&text, ACK, engine).count, N as f64);
    assert_eq!(histogram(&text, DELIVERY, engine).count, pushes as f64);
    let store = histogram(&text, STORE, engine);
    if !store_writes {
        assert_eq!(store.count, 0.0);
        assert_eq!(store.sum, 0.0);
    }
}

#[test]
fn memory_engine_histograms_on_the_public_port() {
    run(&["--data-dir", "none"], "memory", Scrape::Public, false);
}

#[test]
fn memory_engine_histograms_on_the_admin_address() {
    run(&["--data-dir", "none"], "memory", Scrape::Admin, false);
}

#[test]
fn journal_histograms_time_its_syncs() {
    let dir = TempDir::new("latency-journal");
    run(&["--data-dir", dir.arg()], "journal", Scrape::Admin, true);
}

#[test]
fn journal_histograms_with_fsync_always() {
    let dir = TempDir::new("latency-journal-always");
    let args = ["--data-dir", dir.arg(), "--fsync", "always"];
    run(&args, "journal", Scrape::Admin, true);
}

#[test]
fn redis_histograms_time_its_round_trips() {
    let redis = RedisServer::start();
    run(&["--redis", &redis.url()], "redis", Scrape::Admin, true);
}
