//! WalletConnect 1.0 frames across the nodes of a cluster (DECISIONS §7 and §8, "all
//! cores, all nodes"), with real processes: real `redis-server`s and three real
//! `walletrelay` nodes started with `--redis`, driven byte for byte by raw WebSocket
//! clients. A `pub` on one node reaches the v1 subscribers on the others and not its
//! publisher; a `pub` nobody listens to anywhere is pending for the next `sub` on any node
//! (oldest first, then gone); the publisher alone subscribed keeps it pending; v1 and v2 of
//! one topic stay apart; a killed node stops counting once its liveness lapses; Redis
//! restarts (pending frames kept by a persistent Redis, subscriptions registered again);
//! one webhook call per non-silent `pub` in the cluster; a `sub` racing a `pub` on another
//! node gets the frame exactly once.
//!
//! When is a `sub` in place? Once Redis holds its worker's count (the script that sets it
//! also takes the pending frames), so the tests poll Redis for it rather than pause. "Nothing
//! came" is checked with a barrier: a later frame that must arrive through the same Redis
//! channel (so after anything sent before it), or a ping whose pong must come next.

mod common;

use std::time::Duration;

use common::cluster::{health, node, nodes, topic_on};
use common::redis::RedisServer;
use common::v1::sent_pub;
use common::wait::wait_for;
use common::{topic, RawWs, Server};
use serde_json::json;

/// The v1 subscribers of `tp` Redis counts (every field of its count hash, dead nodes'
/// included).
fn counted(r: &RedisServer, tp: &str) -> i64 {
    let v: Vec<i64> = redis::cmd("HVALS")
        .arg(format!("wr:1:v:{tp}"))
        .query(&mut r.conn())
        .expect("HVALS");
    v.iter().sum()
}

/// The frames pending on `tp`.
fn pending(r: &RedisServer, tp: &str) -> i64 {
    redis::cmd("LLEN")
        .arg(format!("wr:1:p:{tp}"))
        .query(&mut r.conn())
        .expect("LLEN")
}

/// A v1 subscriber of `tp` on `s`, in place once Redis counts `total` subscribers.
fn sub_on(s: &Server, r: &RedisServer, tp: &str, total: i64) -> RawWs {
    let mut c = RawWs::open(s);
    c.v1_sub(tp);
    wait_for("the sub counted in Redis", || counted(r, tp) == total);
    c
}

#[test]
fn a_pub_on_one_node_reaches_subscribers_on_the_others_byte_exact_and_not_its_publisher() {
    let r = RedisServer::start();
    let n = nodes(3, &[&r], &[]);
    let tp = topic();
    let mut a = sub_on(&n[0], &r, &tp, 1);
    let mut b = sub_on(&n[1], &r, &tp, 2);
    let mut c = sub_on(&n[2], &r, &tp, 3);

    a.v1_pub(&tp, "say \"hi\" \\ é/\u{1}", Some(true));
    let want = format!(
        "{{\"topic\":\"{tp}\",\"type\":\"pub\",\"payload\":\"say \\\"hi\\\" \\\\ é/\\u0001\",\"silent\":true}}"
    );
    b.expect_text(&want, "B");
    c.expect_text(&want, "C");
    // A's next frame is B's pub: its own never came back to it.
    b.v1_pub(&tp, "p2", None);
    a.expect_text(&sent_pub(&tp, "p2", false), "A");
    c.expect_text(&sent_pub(&tp, "p2", false), "C");
    for (x, who) in [(&mut a, "A"), (&mut b, "B"), (&mut c, "C")] {
        x.settled(who);
    }
    assert_eq!(pending(&r, &tp), 0, "nothing kept: both went live");
    // Published counts once, on the publisher's node; delivered where delivered.
    let published: Vec<f64> = n
        .iter()
        .map(|s| s.v1_metric("walletrelay_messages_published_total"))
        .collect();
    assert_eq!(published, [1.0, 1.0, 0.0]);
    let delivered: Vec<f64> = n
        .iter()
        .map(|s| s.v1_metric("walletrelay_messages_delivered_total"))
        .collect();
    assert_eq!(delivered, [1.0, 1.0, 2.0]);
}

#[test]
fn a_pub_with_no_subscriber_anywhere_is_pending_for_the_next_sub_on_any_node_then_gone() {
    let r = RedisServer::start();
    let n = nodes(3, &[&r], &[]);
    let tp = topic();
    let mut a = RawWs::open(&n[0]);
    for p in ["p1", "p2", "p3"] {
        a.v1_pub(&tp, p, Some(true));
    }
    wait_for("three frames pending", || pending(&r, &tp) == 3);

    let mut b = RawWs::open(&n[1]);
    b.v1_sub(&tp);
    for p in ["p1", "p2", "p3"] {
        b.expect_text(&sent_pub(&tp, p, true), "first subscriber");
    }
    assert_eq!(pending(&r, &tp), 0, "taken");
    // A second subscriber on a third node gets none of them: its first frame is the next
    // pub (which now goes live to both).
    let mut c = sub_on(&n[2], &r, &tp, 2);
    a.v1_pub(&tp, "p4", Some(true));
    b.expect_text(&sent_pub(&tp, "p4", true), "first subscriber");
    c.expect_text(&sent_pub(&tp, "p4", true), "second subscriber");
    for (x, who) in [(&mut a, "A"), (&mut b, "B"), (&mut c, "C")] {
        x.settled(who);
    }
}

#[test]
fn a_pub_whose_only_subscriber_is_its_publisher_is_pending_for_a_sub_on_another_node() {
    let r = RedisServer::start();
    let n = nodes(2, &[&r], &[]);
    let tp = topic();
    let mut a = sub_on(&n[0], &r, &tp, 1);
    a.v1_pub(&tp, "for-the-peer", None);
    wait_for("the frame pending", || pending(&r, &tp) == 1);
    let mut b = RawWs::open(&n[1]);
    b.v1_sub(&tp);
    b.expect_text(&sent_pub(&tp, "for-the-peer", false), "peer");
    wait_for("both counted", || counted(&r, &tp) == 2);
    // Now the topic has another subscriber: live both ways, nothing echoed.
    b.v1_pub(&tp, "back", None);
    a.expect_text(&sent_pub(&tp, "back", false), "publisher");
    a.v1_pub(&tp, "forth", None);
    b.expect_text(&sent_pub(&tp, "forth", false), "peer");
    a.settled("publisher");
    b.settled("peer");
}

#[test]
fn v1_and_v2_of_the_same_topic_stay_apart_across_nodes() {
    let r = RedisServer::start();
    let n = nodes(3, &[&r], &[]);
    let tp = topic();
    let mut v2 = RawWs::open(&n[1]);
    let id = v2.subscribe(&tp);
    let mut v1 = sub_on(&n[2], &r, &tp, 1);
    let mut publ = RawWs::open(&n[0]);

    publ.v1_pub(&tp, "v1-live", None);
    v1.expect_text(&sent_pub(&tp, "v1-live", false), "v1 subscriber");
    let call = publ.call(
        "waku_publish",
        json!({"topic": tp, "message": "v2-live", "ttl": 60}),
    );
    assert_eq!(publ.recv_json()["id"], call);
    let push = v2.recv_json();
    assert_eq!(push["params"]["id"], id.as_str(), "{push}");
    assert_eq!(
        push["params"]["data"],
        json!({"topic": tp, "message": "v2-live"}),
        "the v2 subscriber's first push is the v2 message, not the v1 pub"
    );
    // The v1 subscriber's next frame is the next v1 pub, not the v2 message.
    publ.v1_pub(&tp, "v1-barrier", None);
    v1.expect_text(&sent_pub(&tp, "v1-barrier", false), "v1 subscriber");
    // A v2 cached message is no v1 pending frame, and a v1 pending frame no v2 history.
    let tp2 = topic();
    publ.v1_pub(&tp2, "v1-pending", None);
    wait_for("the v1 frame pending", || pending(&r, &tp2) == 1);
    let call = publ.call(
        "waku_publish",
        json!({"topic": tp2, "message": "v2-cached", "ttl": 60}),
    );
    assert_eq!(publ.recv_json()["id"], call);
    let mut late_v2 = RawWs::open(&n[2]);
    let id2 = late_v2.subscribe(&tp2);
    let push = late_v2.recv_json();
    assert_eq!(push["params"]["id"], id2.as_str(), "{push}");
    assert_eq!(push["params"]["data"]["message"], "v2-cached", "{push}");
    late_v2.settled("late v2 subscriber");
    let mut late_v1 = RawWs::open(&n[1]);
    late_v1.v1_sub(&tp2);
    late_v1.expect_text(&sent_pub(&tp2, "v1-pending", false), "late v1 subscriber");
    late_v1.settled("late v1 subscriber");
    for (x, who) in [(&mut v2, "v2"), (&mut v1, "v1"), (&mut publ, "publisher")] {
        x.settled(who);
    }
}

#[test]
fn topics_on_two_shards_go_live_and_pending_across_nodes() {
    let (r0, r1) = (RedisServer::start(), RedisServer::start());
    let shards = [&r0, &r1];
    let n = nodes(3, &shards, &[]);
    for (i, r) in shards.iter().enumerate() {
        let tp = topic_on(i, 2);
        let mut a = RawWs::open(&n[0]);
        a.v1_pub(&tp, "early", None);
        wait_for("pending on its shard", || pending(r, &tp) == 1);
        let mut b = RawWs::open(&n[1]);
        b.v1_sub(&tp);
        b.expect_text(&sent_pub(&tp, "early", false), "late subscriber");
        wait_for("counted on its shard", || counted(r, &tp) == 1);
        a.v1_pub(&tp, "live", None);
        b.expect_text(&sent_pub(&tp, "live", false), "subscriber");
        assert_eq!(pending(r, &tp), 0);
        b.settled("subscriber");
    }
    // Every node keeps a liveness key on every shard.
    for r in shards {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("wr:node:*")
            .query(&mut r.conn())
            .expect("KEYS");
        assert_eq!(keys.len(), 3, "{keys:?}");
    }
}

#[test]
fn a_killed_subscribers_node_stops_counting_once_its_liveness_lapses() {
    let r = RedisServer::start();
    let mut n = nodes(3, &[&r], &[]);
    let tp = topic();
    let b = sub_on(&n[1], &r, &tp, 1);
    // SIGKILL: the node says nothing to Redis; its count stays in the hash.
    n[1].child.kill().expect("kill node 1");
    n[1].child.wait().expect("reap node 1");
    drop(b);
    // Pubs go live to the dead node (and are lost) until its liveness lapses; from then
    // on they are kept pending.
    let mut a = RawWs::open(&n[0]);
    let mut sent = Vec::new();
    wait_for("a pub kept pending", || {
        let p = format!("k{}", sent.len());
        a.v1_pub(&tp, &p, None);
        sent.push(p);
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            if pending(&r, &tp) > 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    });
    let last = sent.last().cloned().unwrap_or_default();
    let mut c = RawWs::open(&n[2]);
    c.v1_sub(&tp);
    c.expect_text(&sent_pub(&tp, &last, false), "a later subscriber");
    c.settled("a later subscriber");
    assert_eq!(
        counted(&r, &tp),
        2,
        "the dead node's field stays for a while"
    );
}

/// Waits until every node has reconnected its command connection to a restarted Redis and
/// answers `/health` 204 (a node notices a restart at its next command or heartbeat; a
/// frame sent before that meets the dead connection and is lost, counted).
fn wait_reconnected(n: &[Server]) {
    let series = "walletrelay_redis_reconnects_total{conn=\"command\",shard=\"0\"}";
    wait_for("every node reconnected", || {
        n.iter()
            .all(|s| health(s) == 204 && s.series(series) >= 1.0)
    });
}

#[test]
fn pending_frames_survive_a_restart_of_a_persistent_redis() {
    let mut r = RedisServer::start_persistent();
    let n = nodes(2, &[&r], &[]);
    let tp = topic();
    let mut a = RawWs::open(&n[0]);
    a.v1_pub(&tp, "kept", Some(true));
    wait_for("the frame pending", || pending(&r, &tp) == 1);
    r.restart();
    wait_reconnected(&n);
    let mut b = RawWs::open(&n[1]);
    b.v1_sub(&tp);
    b.expect_text(&sent_pub(&tp, "kept", true), "subscriber after the restart");
    b.settled("subscriber");
}

#[test]
fn subscriptions_are_registered_again_after_redis_restarts_empty() {
    let mut r = RedisServer::start();
    let n = nodes(2, &[&r], &[]);
    let tp = topic();
    let mut b = sub_on(&n[1], &r, &tp, 1);
    r.restart(); // no persistence: the counts are gone with it
    wait_reconnected(&n);
    wait_for("the count registered again", || counted(&r, &tp) == 1);
    let mut a = RawWs::open(&n[0]);
    a.v1_pub(&tp, "after", None);
    b.expect_text(&sent_pub(&tp, "after", false), "subscriber");
    b.settled("subscriber");
    assert_eq!(pending(&r, &tp), 0, "it went live");
}

#[test]
fn with_redis_down_a_sub_and_a_pub_are_counted_and_the_connection_lives() {
    let mut r = RedisServer::start();
    let s = node(&[&r], &[]);
    let tp = topic();
    r.kill();
    let mut a = RawWs::open(&s);
    a.v1_sub(&tp);
    a.v1_pub(&tp, "lost", None);
    a.settled("client");
    let name = "walletrelay_redis_storage_unavailable_answers_total";
    let got = s.wait_metric(name, Duration::from_secs(15), |v| v >= 2.0);
    assert!(got >= 2.0, "{name} = {got}");
    a.settled("client");
}

mod webhooks {
    use super::*;
    use crate::common::webhook::{Receiver, Reply};

    #[test]
    fn a_webhook_gets_one_call_per_non_silent_pub_in_the_cluster_live_or_pending() {
        let r = RedisServer::start();
        // One webhook thread per node: each node's POSTs leave in order (the barrier).
        let n = nodes(3, &[&r], &["--webhook-threads", "1"]);
        let rx = Receiver::start(|_| Reply::Status(200));
        let (tp, bar1, bar2) = (topic(), topic(), topic());
        for t in [&tp, &bar1, &bar2] {
            let (st, body) = n[0].register_webhook(t, &rx.url("/push"));
            assert_eq!(st, 200, "{body}");
        }
        let (mut p1, mut p2) = (RawWs::open(&n[1]), RawWs::open(&n[2]));
        // Pending (no subscriber yet): 2 calls, and a silent one: none. (Each waits for
        // the one before: two nodes' pubs have no order of their own.)
        p1.v1_pub(&tp, "a", None);
        wait_for("one pending", || pending(&r, &tp) == 1);
        p2.v1_pub(&tp, "b", Some(false));
        wait_for("two pending", || pending(&r, &tp) == 2);
        p1.v1_pub(&tp, "quiet", Some(true));
        wait_for("three pending", || pending(&r, &tp) == 3);
        // Live (a subscriber on node 0): 2 more calls, a silent one: none.
        let mut s = RawWs::open(&n[0]);
        s.v1_sub(&tp);
        for (p, silent) in [("a", false), ("b", false), ("quiet", true)] {
            s.expect_text(&sent_pub(&tp, p, silent), "subscriber");
        }
        wait_for("counted", || counted(&r, &tp) == 1);
        p1.v1_pub(&tp, "c", None);
        s.expect_text(&sent_pub(&tp, "c", false), "subscriber");
        p2.v1_pub(&tp, "d", None);
        p2.v1_pub(&tp, "quiet2", Some(true));
        s.expect_text(&sent_pub(&tp, "d", false), "subscriber");
        s.expect_text(&sent_pub(&tp, "quiet2", true), "subscriber");
        // Barrier: each publishing node's last call.
        p1.v1_pub(&bar1, "b", None);
        p2.v1_pub(&bar2, "b", None);
        let mut counts = std::collections::HashMap::new();
        wait_for("both barrier calls", || {
            rx.count_by_topic(&mut counts);
            counts.get(&bar1) == Some(&1) && counts.get(&bar2) == Some(&1)
        });
        rx.count_by_topic(&mut counts);
        assert_eq!(counts.get(&tp), Some(&4), "one call per non-silent pub");
        assert_eq!(counts.len(), 3, "{counts:?}");
    }
}

#[test]
fn a_sub_racing_a_pub_on_another_node_gets_the_frame_exactly_once() {
    let r = RedisServer::start();
    let n = nodes(2, &[&r], &[]);
    for round in 0..40 {
        let tp = topic();
        let mut a = RawWs::open(&n[0]);
        let mut b = RawWs::open(&n[1]);
        let p = format!("race-{round}");
        // Both frames leave together; either order in Redis is fine.
        std::thread::scope(|sc| {
            sc.spawn(|| b.v1_sub(&tp));
            sc.spawn(|| a.v1_pub(&tp, &p, None));
        });
        b.expect_text(&sent_pub(&tp, &p, false), &format!("round {round}"));
        // Exactly once: once the sub is in place, the next frame is the next pub.
        wait_for("the sub counted", || counted(&r, &tp) == 1);
        a.v1_pub(&tp, "next", None);
        b.expect_text(&sent_pub(&tp, "next", false), &format!("round {round}"));
        assert_eq!(pending(&r, &tp), 0, "round {round}: nothing left pending");
    }
}
