//! The data directory's disk (DECISIONS §6, issue 15 §3-4), through the real binary: disk
//! use stays bounded under short-lived traffic (space of expired records is reclaimed while
//! running), and a full disk is handled as the DECISIONS say: with `--fsync always`
//! publishes are refused with -32000 `storage unavailable`; with `everysec` messages are
//! still relayed and cached in memory; in both `/health` answers 503 with the reason and
//! a metric counts the failures, and once space is freed the disk is used again (`/health`
//! 204) and what was kept in memory meanwhile is written (it survives a `kill -9`).
//!
//! The full disk is a small tmpfs mounted on the data directory (needs root; where the
//! mount fails the tests say so with `common::skip` and are counted as skipped).

mod common;

use std::time::{Duration, Instant};

use common::durability::{check_history, history, Node};
use common::skip::skip;
use common::tempdir::Tmpfs;
use common::wait::poll;
use common::TempDir;
use serde_json::{json, Value};
use tungstenite::Message;

/// `--segment-bytes` of the bounded-disk test: small, so that the run seals many segments.
const SEGMENT: u64 = 64 << 10;

/// Bytes of the record of a message with `body` on a 64-byte topic, at most: the stored
/// data (`{"topic":..,"message":..}`), the topic again, and the record's fixed fields.
fn record_bytes(body: usize) -> u64 {
    (body + 2 * 64 + 26 + 64) as u64
}

#[test]
fn disk_use_stays_bounded_while_short_lived_messages_come_and_go() {
    let dir = TempDir::new("bounded");
    let seg = SEGMENT.to_string();
    let node = Node::start(&dir, &["--threads", "2", "--segment-bytes", &seg]);
    let topics: Vec<String> = (0..8).map(|_| common::topic()).collect();
    let mut ws = node.ws();
    let ttl = 2;
    let body = common::hex(1000, 3);
    // (when, record bytes) of every publish, for the live bytes of the last ttl.
    let mut published: Vec<(Instant, u64)> = Vec::new();
    let (mut worst, mut max_dir, mut n) = (0.0f64, 0, 0u64);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(12) {
        // A burst of 20 pipelined publishes every 20 ms: about 1,000 a second.
        for i in 0..20 {
            let req = json!({"id": n + i, "jsonrpc": "2.0", "method": "waku_publish",
                "params": {"topic": topics[(n + i) as usize % topics.len()],
                           "message": format!("{n:08}{i:02}{body}"), "ttl": ttl}});
            ws.sock.send(Message::text(req.to_string())).unwrap();
        }
        for _ in 0..20 {
            let r = ws.recv();
            assert_eq!(r["result"], true, "{r}");
            published.push((Instant::now(), record_bytes(1010)));
        }
        n += 20;
        std::thread::sleep(Duration::from_millis(20));
        // Live: what was published in the last ttl, plus the tick it takes to expire.
        let now = Instant::now();
        let window = Duration::from_millis(ttl * 1000 + 500);
        let live: u64 = published
            .iter()
            .filter(|(t, _)| now.duration_since(*t) < window)
            .map(|(_, b)| b)
            .sum();
        let on_disk = dir.bytes();
        max_dir = max_dir.max(on_disk);
        let bound = 2 * live + 4 * SEGMENT + 4096;
        worst = worst.max(on_disk as f64 / bound as f64);
        assert!(
            on_disk <= bound,
            "{on_disk} bytes on disk with {live} live (bound {bound}) after {:?}",
            start.elapsed()
        );
    }
    let written = node.metric("walletrelay_store_bytes_written_total");
    println!(
        "{n} publishes, {written} bytes written, at most {max_dir} on disk ({:.0}% of the \
         bound at worst), {} segments retired",
        worst * 100.0,
        node.metric("walletrelay_store_segments_retired_total")
    );
    assert!(
        written > 3.0 * max_dir as f64,
        "the run must write much more than it keeps: {written} written, {max_dir} kept"
    );
}

/// Publishes `message` on `topic` and returns the answer.
fn publish(ws: &mut common::Ws, topic: &str, message: &str) -> Value {
    ws.call(
        "waku_publish",
        json!({"topic": topic, "message": message, "ttl": 3600}),
    )
}

/// Polls `/health` until it answers `status` (at most 10 s); returns the body.
fn health_becomes(node: &Node, status: u16) -> String {
    let body = poll(Duration::from_secs(10), || {
        let (st, body) = node.get("/health");
        (st == Some(status)).then(|| String::from_utf8_lossy(&body).to_string())
    });
    body.unwrap_or_else(|| panic!("/health never answered {status}"))
}

/// A `--threads 1` server with `--fsync fsync` on a data directory that is a 1 MiB tmpfs,
/// with its flags (`None`: the tmpfs could not be mounted, and `test` said it is skipped).
/// Whatever the order they are dropped in, the directory goes (see `Tmpfs`).
type OnTmpfs = (Node, Tmpfs, TempDir, [&'static str; 6]);

fn on_tmpfs(test: &str, fsync: &'static str) -> Option<OnTmpfs> {
    let dir = TempDir::new(&format!("full-{fsync}"));
    let fs = match Tmpfs::mount(&dir, "1m") {
        Ok(fs) => fs,
        Err(why) => {
            skip(test, &why);
            return None;
        }
    };
    let args = [
        "--threads",
        "1",
        "--fsync",
        fsync,
        "--segment-bytes",
        "65536",
    ];
    Some((Node::start(&dir, &args), fs, dir, args))
}

#[test]
fn a_full_disk_with_fsync_always_refuses_publishes_until_space_is_freed() {
    let Some((node, fs, dir, args)) = on_tmpfs(
        "a_full_disk_with_fsync_always_refuses_publishes_until_space_is_freed",
        "always",
    ) else {
        return;
    };
    let topic = common::topic();
    let mut ws = node.ws();
    let mut sent: Vec<String> = Vec::new();
    let mut acked: Vec<String> = Vec::new();
    for i in 0..5 {
        let m = format!("before {i} {}", common::hex(300, i));
        assert_eq!(publish(&mut ws, &topic, &m)["result"], true);
        sent.push(m.clone());
        acked.push(m);
    }
    let filler = fs.fill();
    // The segment's last page may still take a record or two; then writes fail.
    let mut refused = None;
    for i in 0..100 {
        let m = format!("during {i} {}", common::hex(300, 100 + i));
        let r = publish(&mut ws, &topic, &m);
        sent.push(m.clone());
        if r["result"] == true {
            acked.push(m);
        } else {
            refused = Some(r);
            break;
        }
    }
    let r = refused.expect("a full disk never refused a publish");
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert_eq!(r["error"]["message"], "storage unavailable", "{r}");
    let why = health_becomes(&node, 503);
    assert!(
        why.contains("storage w0") && why.contains("disk full"),
        "{why}"
    );
    assert!(node.metric("walletrelay_store_write_errors_total") >= 1.0);
    // While full, publishes are refused at once; nothing of them is kept.
    let r = publish(&mut ws, &topic, "refused while full");
    assert_eq!(r["error"]["message"], "storage unavailable", "{r}");

    std::fs::remove_file(&filler).unwrap();
    health_becomes(&node, 204);
    let m = "after the disk came back".to_string();
    assert_eq!(publish(&mut ws, &topic, &m)["result"], true);
    sent.push(m.clone());
    acked.push(m);
    node.kill9();

    let node = Node::start(&dir, &args);
    let got = history(&node, &topic, "marker");
    check_history(&topic, &got, &sent, &acked);
    assert!(!got.iter().any(|m| m == "refused while full"), "{got:?}");
}

#[test]
fn a_full_disk_with_fsync_everysec_keeps_relaying_and_writes_it_all_once_space_is_freed() {
    let Some((node, fs, dir, args)) = on_tmpfs(
        "a_full_disk_with_fsync_everysec_keeps_relaying_and_writes_it_all_once_space_is_freed",
        "everysec",
    ) else {
        return;
    };
    let topic = common::topic();
    let (mut publ, mut sub) = (node.ws(), node.ws());
    sub.subscribe(&topic);
    let mut all = Vec::new();
    let filler = fs.fill();
    for i in 0..30 {
        let m = format!("message {i} {}", common::hex(300, i));
        assert_eq!(publish(&mut publ, &topic, &m)["result"], true, "{m}");
        // Relayed live whatever the disk does.
        assert_eq!(sub.next_push().2, m);
        all.push(m);
    }
    let why = health_becomes(&node, 503);
    assert!(
        why.contains("storage w0") && why.contains("disk full"),
        "{why}"
    );
    assert!(node.metric("walletrelay_store_write_errors_total") >= 1.0);
    assert!(node.metric("walletrelay_store_records_deferred_total") >= 1.0);
    // Cached in memory: a new subscriber gets them all.
    let got = history(&node, &topic, "marker-1");
    assert_eq!(got, all);
    all.push("marker-1".into());

    std::fs::remove_file(&filler).unwrap();
    health_becomes(&node, 204);
    // A publish answered after the disk came back was handled after the repair began.
    assert_eq!(publish(&mut publ, &topic, "after")["result"], true);
    all.push("after".into());
    node.kill9();

    let node = Node::start(&dir, &args);
    let (n, _, line) = node.recovered();
    assert_eq!(n as usize, all.len(), "{line}");
    assert_eq!(history(&node, &topic, "marker-2"), all);
}
