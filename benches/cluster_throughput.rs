//! Throughput of stored publishes through one Redis with pipelining (issue 16 asks for at
//! least 100,000/s), and Redis's CPU per publish. A measurement, not a pass/fail test:
//! bounded (a fixed number of publishes), loopback only, on a real `redis-server`. Run:
//! `cargo bench --bench cluster_throughput`
//! (`CLUSTER_BENCH_N` publishes, default 300,000; `CLUSTER_BENCH_TOPICS`, default 10,000).
//! Without `--bench` (`cargo test --all-targets`) it runs once, tiny (2,000 publishes on 100
//! topics). That every publish is stored is tested in `tests/cluster_store.rs`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::{test_config, RedisServer};
use walletrelay::engine::redis::cluster::{
    Cluster, EventSink, Followup, Origin, PublishOutcome, PublishReq, NS_V2,
};
use walletrelay::event::Event;

/// Most publishes sent and not yet answered.
const WINDOW: u64 = 8192;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// utime + stime of a process, seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (n, topics) = if bench {
        (
            env("CLUSTER_BENCH_N", 300_000),
            env("CLUSTER_BENCH_TOPICS", 10_000),
        )
    } else {
        (2_000, 100)
    };
    let r = RedisServer::start();
    let stored = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let (s2, f2) = (Arc::clone(&stored), Arc::clone(&failed));
    let sink: EventSink = Arc::new(move |_, e| {
        if let Event::Engine(Followup::Published { result, .. }) = e {
            match result {
                Ok(PublishOutcome::Stored { .. }) => s2.fetch_add(1, Ordering::Relaxed),
                _ => f2.fetch_add(1, Ordering::Relaxed),
            };
        }
    });
    let mut cfg = test_config(&[r.url()]);
    cfg.read_timeout = Duration::from_secs(5);
    let cluster = Cluster::start(cfg, sink).expect("start");
    let h = cluster.handle(0);
    let names: Vec<Arc<str>> = (0..topics)
        .map(|i| Arc::from(format!("{i:064x}")))
        .collect();
    let pad = "x".repeat(496); // 16 digits + 496 = a 512-character message
    let cpu0 = cpu_seconds(r.pid());
    let t0 = Instant::now();
    let mut retries = 0u64;
    for i in 0..n {
        let topic = &names[(i % topics) as usize];
        let meta = walletrelay::message::Meta {
            published_at: walletrelay::clock::unix_ms(),
            tag: 1108,
            attestation: None,
            plain: false,
        };
        let body = walletrelay::message::Body::encode(topic, &format!("{i:016}{pad}"), meta);
        let req = PublishReq {
            ns: NS_V2,
            topic: Arc::clone(topic),
            body,
            ttl: Duration::from_secs(300),
            origin: Origin { node: 1, conn: i },
            prompt: false,
            publisher: None,
        };
        // Like workers at a steady rate: at most WINDOW unanswered, then wait for room.
        while i - (stored.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed)) >= WINDOW {
            std::thread::sleep(Duration::from_micros(200));
        }
        while h.publish(i, req.clone()).is_err() {
            retries += 1; // queue full
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // Not `common::wait`: this wait ends the measured time, so it looks every millisecond.
    let deadline = Instant::now() + Duration::from_secs(120);
    while stored.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "answers stopped coming");
        std::thread::sleep(Duration::from_millis(1));
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(r.pid()) - cpu0;
    let ok = stored.load(Ordering::Relaxed);
    let mut metrics = String::new();
    cluster.render_metrics(&mut metrics);
    let rtts: Vec<&str> = metrics
        .lines()
        .filter(|l| l.contains("roundtrip_seconds_"))
        .collect();
    println!(
        "{n} publishes (512-char messages, {} B stored each, {topics} topics): {ok} stored, {} failed in {secs:.2} s = \
         {:.0} stored/s; redis CPU {cpu:.2} s = {:.2} us/publish; queue-full retries {retries}",
        10 + 64 + 13 + 512 + 2,
        failed.load(Ordering::Relaxed),
        ok as f64 / secs,
        cpu / n as f64 * 1e6
    );
    println!("{}", rtts.join("\n"));
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut r.conn())
        .unwrap();
    println!("{stats}");
    assert_eq!(ok, n, "every publish stored");
}
