//! Several nodes on Redis when things go wrong (DECISIONS §7, issue 16 §4), with real
//! processes: Redis killed (`SIGKILL`) under load and restarted with `appendonly yes` +
//! `appendfsync always`; a node killed under load; a Redis that stops answering. What must
//! hold: no publish answered `true` is lost or delivered twice, each publisher's messages
//! arrive in order, publishes during an outage are refused -32000 `storage unavailable`,
//! `/health` says 503 during it and 204 after, the clients of a dead node get everything
//! from another node, and a stalled Redis stalls no event loop.

mod common;

use common::cluster::{
    channel_subscribers, check_delivery, health, nodes, push, pushes, topic_on, Publisher,
    Subscriber,
};
use common::metrics::series;
use common::redis::RedisServer;
use common::topic;
use common::wait::wait_for;
use serde_json::json;

/// Publishes in flight per publisher connection.
const WINDOW: usize = 16;
/// Publishes each publisher gets answered `true` in each phase of a test.
const PHASE: usize = 300;

fn metric(s: &common::Server, name: &str) -> f64 {
    let m = s.metrics_text().expect("/metrics");
    series(&m, name).unwrap_or_else(|| panic!("no {name} in {m}"))
}

#[test]
fn redis_killed_under_load_loses_no_acknowledged_publish_and_every_node_catches_up() {
    let mut r = RedisServer::start_persistent();
    let n = nodes(3, &[&r], &["--max-cached-per-topic", "100000"]);
    let tp = topic();
    let sub1 = Subscriber::start(n[0].ws(), &tp);
    let sub2 = Subscriber::start(n[1].ws(), &tp);
    let p2 = Publisher::start(n[1].ws(), &tp, "p2", WINDOW);
    let p3 = Publisher::start(n[2].ws(), &tp, "p3", WINDOW);
    wait_for("load before the outage", || {
        p2.acked() >= PHASE && p3.acked() >= PHASE
    });

    r.kill();
    wait_for("/health 503 on every node", || {
        n.iter().all(|s| health(s) == 503)
    });
    let refused = (p2.unavailable(), p3.unavailable());
    wait_for("publishes refused during the outage", || {
        p2.unavailable() > refused.0 && p3.unavailable() > refused.1
    });
    // A subscriber that arrives during the outage gets everything once Redis is back.
    let late = Subscriber::start(n[2].ws(), &tp);

    r.restart();
    wait_for("/health 204 on every node", || {
        n.iter().all(|s| health(s) == 204)
    });
    let acked = (p2.acked(), p3.acked());
    wait_for("load after the restart", || {
        p2.acked() >= acked.0 + PHASE && p3.acked() >= acked.1 + PHASE
    });
    let (s2, s3) = (p2.finish(), p3.finish());
    for s in [&s2, &s3] {
        assert!(s.other_errors().is_empty(), "{:?}", s.other_errors());
        assert_eq!(s.outcome.len(), s.order.len(), "every publish answered");
    }
    let all_acked: Vec<String> = s2.acked().into_iter().chain(s3.acked()).collect();
    for (who, sub) in [("node 1", sub1), ("node 2", sub2), ("late, node 3", late)] {
        sub.wait_all(who, &all_acked);
        let (_, got) = sub.finish();
        check_delivery(who, &got, &[&s2, &s3]);
    }

    // The metrics of §8 moved: reconnects, resyncs, and the -32000 answers each node gave.
    for (i, s) in n.iter().enumerate() {
        for conn in ["command", "pubsub"] {
            let name = format!("walletrelay_redis_reconnects_total{{conn=\"{conn}\",shard=\"0\"}}");
            assert!(metric(s, &name) >= 1.0, "node {i}: {name}");
        }
    }
    assert!(metric(&n[0], "walletrelay_redis_resyncs_total{shard=\"0\"}") >= 1.0);
    for (s, sent) in [(&n[1], &s2), (&n[2], &s3)] {
        assert_eq!(
            metric(
                s,
                "walletrelay_redis_storage_unavailable_answers_total{shard=\"0\"}"
            ),
            sent.unavailable() as f64,
            "the node counts the refusals its clients got"
        );
    }
}

#[test]
fn a_node_killed_under_load_loses_nothing_and_its_clients_get_everything_elsewhere() {
    let r = RedisServer::start();
    let mut n = nodes(3, &[&r], &["--max-cached-per-topic", "100000"]);
    let tp = topic();
    let stays = Subscriber::start(n[0].ws(), &tp);
    let dies = Subscriber::start(n[2].ws(), &tp);
    let p2 = Publisher::start(n[1].ws(), &tp, "p2", WINDOW);
    let p3 = Publisher::start(n[2].ws(), &tp, "p3", WINDOW);
    wait_for("load before the kill", || {
        p2.acked() >= PHASE && p3.acked() >= PHASE
    });

    n[2].child.kill().expect("SIGKILL node 3");
    n[2].child.wait().expect("reap node 3");
    // Its clients notice, and come back through the "load balancer" on node 1.
    let s3 = p3.finish();
    let (_, got_before) = dies.finish();
    check_delivery("node 3 before it died", &got_before, &[]);
    let p3b = Publisher::start(n[0].ws(), &tp, "p3b", WINDOW);
    let back = Subscriber::start(n[0].ws(), &tp);
    let acked = p2.acked();
    wait_for("load after the kill", || {
        p2.acked() >= acked + PHASE && p3b.acked() >= PHASE
    });
    let (s2, s3b) = (p2.finish(), p3b.finish());
    let sent = [&s2, &s3, &s3b];
    let all_acked: Vec<String> = sent.iter().flat_map(|s| s.acked()).collect();
    assert!(s3.acked().len() >= PHASE);
    for (who, sub) in [("stayed on node 1", stays), ("back on node 1", back)] {
        sub.wait_all(who, &all_acked);
        let (_, got) = sub.finish();
        check_delivery(who, &got, &sent);
    }
    for s in &sent {
        assert!(s.other_errors().is_empty(), "{:?}", s.other_errors());
        assert_eq!(s.unavailable(), 0, "Redis never went away");
    }
}

#[test]
fn a_subscriber_connection_cut_by_redis_is_resubscribed_and_what_it_missed_is_read_again() {
    let r = RedisServer::start();
    let n = nodes(2, &[&r], &[]);
    let tp = topic();
    let mut sub = n[0].ws();
    sub.subscribe(&tp);
    wait_for("node 1 on the channel", || {
        channel_subscribers(&r, &tp) == 1
    });
    let mut publ = n[1].ws();
    publ.publish(&tp, "m0");
    assert_eq!(push(&mut sub), (tp.clone(), "m0".to_string()));
    // Redis drops the subscriber connections (as `client-output-buffer-limit pubsub` does
    // to one that falls behind); the command connections stay.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut r.conn())
        .expect("CLIENT KILL");
    assert_eq!(
        killed, 3,
        "node 1's topic subscriber and each node's listener of watch changes (node 2 \
         subscribes to no topic)"
    );
    // Stored before node 1 is subscribed again (it waits at least 50 ms before it
    // reconnects), and nothing follows them: only the read after its re-subscription
    // brings them.
    publ.publish(&tp, "m1");
    publ.publish(&tp, "m2");
    assert_eq!(pushes(&mut sub, &tp, 2), ["m1", "m2"]);
    let m = n[0].metrics_text().expect("/metrics");
    let reconnects = "walletrelay_redis_reconnects_total{conn=\"pubsub\",shard=\"0\"}";
    assert_eq!(series(&m, reconnects), Some(1.0), "{m}");
    assert!(series(&m, "walletrelay_redis_resyncs_total{shard=\"0\"}").is_some_and(|v| v >= 1.0));
}

/// Stops (`SIGSTOP`) or resumes (`SIGCONT`) a process: a Redis that accepts connections
/// and answers nothing, for as long as the test wants, without a timer to race.
fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid this test started and a plain signal number.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

#[test]
fn a_redis_that_stops_answering_stalls_no_event_loop_and_other_shards_keep_working() {
    let (frozen, fine) = (RedisServer::start(), RedisServer::start());
    let n = nodes(2, &[&frozen, &fine], &[]);
    let (ta, tb) = (topic_on(0, 2), topic_on(1, 2));
    let mut sub = n[0].ws();
    sub.subscribe(&ta);
    sub.subscribe(&tb);
    let mut pa = n[1].ws();
    // On the same worker: its event loop serves `pb` while `pa` waits for the frozen shard.
    let mut pb = n[1].ws_on(pa.worker);
    pa.publish(&ta, "before");
    assert_eq!(push(&mut sub), (ta.clone(), "before".to_string()));

    signal(frozen.pid(), libc::SIGSTOP);
    pa.send(
        &json!({"id": 77, "jsonrpc": "2.0", "method": "waku_publish",
        "params": {"topic": ta, "message": "stalled", "ttl": 60}}),
    );
    // Meanwhile: greetings on both nodes, and the other shard's topic across nodes.
    for s in &n {
        assert_eq!(s.get("/hello").1, common::checks::HELLO.as_bytes());
    }
    for i in 0..20 {
        pb.publish(&tb, &format!("b{i}"));
        assert_eq!(push(&mut sub), (tb.clone(), format!("b{i}")));
    }
    let mut late = n[0].ws();
    late.subscribe(&tb);
    for i in 0..20 {
        assert_eq!(push(&mut late), (tb.clone(), format!("b{i}")));
    }
    // The stalled publish is answered, not left hanging: storage unavailable.
    let a = pa.recv();
    assert_eq!(a["id"], 77, "{a}");
    assert_eq!(a["error"]["code"], -32000, "{a}");
    assert_eq!(a["error"]["message"], "storage unavailable", "{a}");
    assert_eq!(health(&n[1]), 503);
    let before = metric(
        &n[1],
        "walletrelay_redis_storage_unavailable_answers_total{shard=\"0\"}",
    );
    assert!(before >= 1.0);
    assert_eq!(
        metric(
            &n[1],
            "walletrelay_redis_storage_unavailable_answers_total{shard=\"1\"}"
        ),
        0.0
    );

    signal(frozen.pid(), libc::SIGCONT);
    wait_for("/health 204 on both nodes", || {
        n.iter().all(|s| health(s) == 204)
    });
    pa.publish(&ta, "after");
    // Redis may still have run the stalled publish when it woke (answered unavailable,
    // stored anyway: docs/CLUSTER.md); if so it comes once, before "after".
    let mut on_a = Vec::new();
    while on_a.last().map(String::as_str) != Some("after") {
        let (t, m) = push(&mut sub);
        assert_eq!(t, ta, "nothing else was published");
        on_a.push(m);
    }
    assert!(
        on_a == ["after"] || on_a == ["stalled", "after"],
        "{on_a:?}"
    );
}
