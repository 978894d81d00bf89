//! Start-up with 1 GiB of live cache (issue 15 §3, docs/TUNING.md): a measurement, not a
//! pass/fail timing test. It fills a server's cache with about 1 GiB of messages, stops it,
//! starts it again on the same directory and prints how long the restart took and what the
//! recovery line says; it checks only that everything came back (what a restart must keep
//! is tested in `tests/durability_restart.rs`).
//!
//! ```sh
//! cargo bench --bench durability_startup
//! ```
//! The data directory is a 2 GiB tmpfs (the VM's disk had under 2 GiB free when this was
//! written; needs root), so this measures the server's own work with the files in memory,
//! as after a restart whose files are still in the page cache; `WR_STARTUP_DIR=/path` uses
//! a directory on a real disk instead (drop the page cache before the restart for a cold
//! read). `WR_STARTUP_THREADS` (default 2) sets `--threads` of the restart. Without
//! `--bench` (`cargo test --all-targets`) it runs once, tiny (a few MB, no tmpfs).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::durability::{body, history, Load, Node, Plan};
use common::tempdir::Tmpfs;
use common::TempDir;

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let dir = match std::env::var("WR_STARTUP_DIR") {
        Ok(parent) => TempDir::under(parent.as_ref(), "1gib"),
        Err(_) => TempDir::new("1gib"),
    };
    // Unmounted before the directory is removed (dropped in reverse order).
    let _fs = match std::env::var("WR_STARTUP_DIR") {
        Err(_) if bench => match Tmpfs::mount(&dir, "2g") {
            Ok(fs) => Some(fs),
            Err(why) => {
                println!("not measured: {why} (or set WR_STARTUP_DIR to a directory on disk)");
                return;
            }
        },
        _ => None,
    };
    let budget = (3u64 << 30).to_string();
    let args = ["--threads", "2", "--max-cache-bytes", &budget];
    let node = Node::start(&dir, &args);
    let (plan, min_cached) = if bench {
        let plan = Plan {
            window: 64,
            per_topic: 500,
            size: 4000,
            record: false,
            ..Plan::new(4, 128)
        };
        (plan, f64::from(1 << 30))
    } else {
        let plan = Plan {
            per_topic: 50,
            size: 400,
            record: false,
            ..Plan::new(2, 8)
        };
        (plan, (2 * 8 * 50 * 400) as f64)
    };
    let t0 = Instant::now();
    let published = Load::start(node.addr, plan).join();
    let took = t0.elapsed();
    assert!(published.iter().all(|p| p.errors.is_empty()));
    let total: usize = published.iter().flat_map(|p| &p.acked_count).sum();
    assert_eq!(total, plan.publishers * plan.topics_each * plan.per_topic);
    let cached = node.metric("walletrelay_cached_bytes");
    let rss = node.rss_kib();
    println!(
        "published {total} messages in {took:.1?}: {:.2} GiB cached, server RSS {} MiB, \
         {} MiB on disk",
        cached / f64::from(1 << 30),
        rss / 1024,
        dir.bytes() >> 20
    );
    assert!(cached >= min_cached, "only {cached} bytes cached");
    assert!(node.sigterm().success());

    let threads = std::env::var("WR_STARTUP_THREADS").unwrap_or_else(|_| "2".into());
    let args = ["--threads", &threads, "--max-cache-bytes", &budget];
    let t0 = Instant::now();
    let node = Node::start(&dir, &args);
    let listening = t0.elapsed();
    let (n, _, line) = node.recovered();
    println!(
        "restart at --threads {threads}: listening after {listening:.2?}, server RSS {} MiB\n{line}",
        node.rss_kib() / 1024
    );
    assert_eq!(n as usize, total, "{line}");
    // One topic's history, message by message.
    let (p, t) = (plan.publishers / 2, plan.topics_each / 2);
    let topic = &published[p].topics[t];
    let want: Vec<String> = (0..plan.per_topic)
        .map(|n| body(p, t, n, plan.size))
        .collect();
    assert_eq!(history(&node, topic, "marker"), want);
}
