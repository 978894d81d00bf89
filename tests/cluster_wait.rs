//! `WAIT` before a publish is acknowledged (DECISIONS §12), through the real binary on a real
//! Sentinel group: with `--redis-wait-replicas 1` a publish is answered `true` only while a
//! replica holds it; with the replica gone it is answered -32000 `storage unavailable` (and
//! counted in `walletrelay_redis_wait_timeouts_total`), never `true`; with the replica back,
//! `true` again. The publishes refused that way were stored on the primary all the same: a
//! late subscriber gets them (nothing the client retries is lost, dedup keeps one copy).

mod common;

use std::time::Duration;

use common::cluster::{node_args, publish_raw};
use common::metrics::sum;
use common::redis_topo::SentinelGroup;
use common::wait::wait_until;
use common::{topic, Ws};

fn answer(ws: &mut Ws, topic: &str, msg: &str) -> Result<(), i64> {
    let v = publish_raw(ws, topic, msg, None);
    match v["result"].as_bool() {
        Some(true) => Ok(()),
        _ => Err(v["error"]["code"].as_i64().unwrap_or(0)),
    }
}

#[test]
fn a_publish_is_acknowledged_only_while_a_replica_holds_it() {
    let mut g = SentinelGroup::start(false);
    let args = vec![
        "--redis".to_string(),
        g.url(),
        "--redis-wait-replicas".to_string(),
        "1".to_string(),
        "--redis-wait-timeout-ms".to_string(),
        "500".to_string(),
    ];
    let node = node_args(&args, &[]);
    let t = topic();
    let mut ws = Ws::connect(node.addr);
    // The replica's first acknowledgements may lag its sync on a busy machine: the first
    // `true` is waited for (a refused try is stored all the same and checked below).
    let acked = wait_until(Duration::from_secs(30), || {
        answer(&mut ws, &t, "with-replica").is_ok()
    });
    assert!(acked, "never acknowledged with a replica");

    let primary = g.primary_port();
    let replica = *g
        .data_ports()
        .iter()
        .find(|p| **p != primary)
        .expect("a replica");
    g.kill_data(replica);
    // The primary notices its replica is gone at once or after its timeout: until then a
    // WAIT may still be answered by the dead link's last ack. Every answer is -32000 from
    // the first one that is.
    let mut refused = None;
    let found = wait_until(Duration::from_secs(30), || {
        let m = format!("without-replica-{}", refused.unwrap_or(0) + 1);
        match answer(&mut ws, &t, &m) {
            Ok(()) => false,
            Err(code) => {
                assert_eq!(code, -32000, "refused as storage unavailable");
                refused = Some(1);
                true
            }
        }
    });
    assert!(found, "a publish without a replica was never refused");
    for i in 0..5 {
        assert_eq!(
            answer(&mut ws, &t, &format!("still-without-{i}")),
            Err(-32000),
            "no replica: never acknowledged"
        );
    }
    let timeouts = sum(
        &node.metrics_text().expect("/metrics"),
        "walletrelay_redis_wait_timeouts_total",
    );
    assert!(timeouts >= 6.0, "WAIT timeouts counted: {timeouts}");

    g.restart_data(replica);
    g.wait_replicas(1);
    let back = wait_until(Duration::from_secs(30), || {
        answer(&mut ws, &t, "replica-back").is_ok()
    });
    assert!(back, "acknowledged again once the replica is back");

    // The refused ones were stored on the primary: a late subscriber gets them, in order.
    let mut late = Ws::connect(node.addr);
    late.subscribe(&t);
    let mut got = Vec::new();
    while !got.iter().any(|m: &String| m == "replica-back") {
        let (_, tp, m) = late.next_push();
        assert_eq!(tp, t);
        got.push(m);
    }
    assert_eq!(got.first().map(String::as_str), Some("with-replica"));
    assert_eq!(
        got.iter().filter(|m| *m == "with-replica").count(),
        1,
        "a retried message is stored once"
    );
    for i in 0..5 {
        let m = format!("still-without-{i}");
        assert!(got.contains(&m), "{m} stored though refused: {got:?}");
    }
}
