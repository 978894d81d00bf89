//! Several nodes on Redis (DECISIONS §7), with real processes: real `redis-server`s on free
//! loopback ports and three real `walletrelay` nodes started with `--redis`, driven by
//! WebSocket and HTTP clients. The same semantics as one node, across nodes: a publish on
//! one node reaches subscribers on the others (never the publishing connection), a late
//! subscriber on a third node gets the cached messages then the live ones, in order; one
//! dedup per topic; unsubscribe; topics on two shards; one webhook POST per stored publish
//! in the whole cluster; the per-shard metrics. Failures are in `cluster_outage.rs`.

mod common;

use common::cluster::{channel_subscribers, nodes, publish_raw, push, pushes, topic_on};
use common::metrics::series;
use common::redis::RedisServer;
use common::topic;
use common::wait::wait_for;
use serde_json::json;

#[test]
fn a_publish_reaches_other_nodes_in_order_and_a_late_subscriber_on_a_third_gets_history() {
    let r = RedisServer::start();
    let n = nodes(3, &[&r], &[]);
    let tp = topic();
    // Subscriber on node 1; on node 2 the publisher (subscribed too) and a neighbour.
    let mut sub1 = n[0].ws();
    sub1.subscribe(&tp);
    let mut publ = n[1].ws();
    publ.subscribe(&tp);
    let mut neighbour = n[1].ws();
    neighbour.subscribe(&tp);
    let sent: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
    for m in &sent {
        publ.publish(&tp, m);
    }
    assert_eq!(pushes(&mut sub1, &tp, 50), sent, "node 1, in order");
    assert_eq!(
        pushes(&mut neighbour, &tp, 50),
        sent,
        "same node, other connection"
    );
    // A late subscriber on node 3: the cached messages, oldest first, then live ones.
    let mut late = n[2].ws();
    late.subscribe(&tp);
    assert_eq!(pushes(&mut late, &tp, 50), sent, "history on node 3");
    late.publish(&tp, "from node 3");
    for ws in [&mut sub1, &mut neighbour, &mut publ] {
        assert_eq!(push(ws), (tp.clone(), "from node 3".to_string()));
    }
    // No echo: the publisher's first push was node 3's message, none of its own 50; and
    // node 3's publisher gets nothing back while node 2 publishes after it.
    publ.publish(&tp, "last");
    assert_eq!(push(&mut late), (tp.clone(), "last".to_string()));
    assert_eq!(push(&mut sub1), (tp.clone(), "last".to_string()));
}

#[test]
fn a_message_published_on_two_nodes_is_stored_and_delivered_once() {
    let r = RedisServer::start();
    let n = nodes(3, &[&r], &[]);
    let tp = topic();
    let mut sub = n[0].ws();
    sub.subscribe(&tp);
    let (mut p2, mut p3) = (n[1].ws(), n[2].ws());
    p2.publish(&tp, "same");
    p3.publish(&tp, "same"); // answered true, neither stored nor delivered again
    p3.publish(&tp, "after");
    assert_eq!(pushes(&mut sub, &tp, 2), ["same", "after"]);
    let mut late = n[1].ws();
    late.subscribe(&tp);
    assert_eq!(pushes(&mut late, &tp, 2), ["same", "after"]);
    let len: i64 = redis::cmd("XLEN")
        .arg(format!("wr:0:2:{tp}"))
        .query(&mut r.conn())
        .unwrap();
    assert_eq!(len, 2, "one cached copy in Redis");
}

#[test]
fn unsubscribe_stops_delivery_and_the_last_one_on_a_node_leaves_the_channel() {
    let r = RedisServer::start();
    let n = nodes(2, &[&r], &[]);
    let (gone, kept) = (topic(), topic());
    let mut sub = n[0].ws();
    let id = sub.subscribe(&gone);
    sub.subscribe(&kept);
    wait_for("node 1 on both channels", || {
        channel_subscribers(&r, &gone) == 1 && channel_subscribers(&r, &kept) == 1
    });
    let res = sub.call("waku_unsubscribe", json!({"topic": gone, "id": id}));
    assert_eq!(res["result"], true, "{res}");
    let mut publ = n[1].ws();
    publ.publish(&gone, "not for you");
    publ.publish(&kept, "for you");
    // Same publisher, same shard: had the first been delivered, it would come first.
    assert_eq!(push(&mut sub), (kept.clone(), "for you".to_string()));
    wait_for("node 1 off the channel", || {
        channel_subscribers(&r, &gone) == 0
    });
    assert_eq!(channel_subscribers(&r, &kept), 1);
    // Subscribing again reads the history: the message published meanwhile is there.
    sub.subscribe(&gone);
    assert_eq!(push(&mut sub), (gone.clone(), "not for you".to_string()));
}

#[test]
fn topics_on_two_shards_each_live_on_their_own_redis_and_work_across_nodes() {
    let (r0, r1) = (RedisServer::start(), RedisServer::start());
    let n = nodes(3, &[&r0, &r1], &[]);
    let tps = [topic_on(0, 2), topic_on(1, 2)];
    let mut sub = n[0].ws();
    for t in &tps {
        sub.subscribe(t);
    }
    let mut publ = n[1].ws();
    for (i, t) in tps.iter().enumerate() {
        for k in 0..5 {
            publ.publish(t, &format!("s{i}-{k}"));
        }
    }
    // The two topics' pushes come from two shards' connections: in order per topic, in no
    // set order between the topics.
    let mut got: [Vec<String>; 2] = Default::default();
    for _ in 0..10 {
        let (t, m) = push(&mut sub);
        let i = tps
            .iter()
            .position(|x| *x == t)
            .expect("a push of a subscribed topic");
        got[i].push(m);
    }
    for (i, t) in tps.iter().enumerate() {
        let want: Vec<String> = (0..5).map(|k| format!("s{i}-{k}")).collect();
        assert_eq!(got[i], want, "subscriber, shard {i}");
        let mut late = n[2].ws();
        late.subscribe(t);
        assert_eq!(pushes(&mut late, t, 5), want, "late subscriber, shard {i}");
    }
    for (i, t) in tps.iter().enumerate() {
        for (j, r) in [&r0, &r1].into_iter().enumerate() {
            let exists: bool = redis::cmd("EXISTS")
                .arg(format!("wr:0:2:{t}"))
                .query(&mut r.conn())
                .unwrap();
            assert_eq!(exists, i == j, "topic of shard {i} in Redis {j}");
        }
    }
    // Per-shard metrics: both shards did round trips; none failed.
    let m = n[1].metrics_text().expect("/metrics");
    for s in ["0", "1"] {
        let rtts = series(
            &m,
            &format!("walletrelay_redis_roundtrip_seconds_count{{shard=\"{s}\"}}"),
        );
        assert!(rtts.is_some_and(|v| v > 0.0), "shard {s}: {m}");
        for name in [
            "walletrelay_redis_in_flight",
            "walletrelay_redis_resyncs_total",
            "walletrelay_redis_storage_unavailable_answers_total",
        ] {
            let v = series(&m, &format!("{name}{{shard=\"{s}\"}}"));
            assert_eq!(v, Some(0.0), "{name} shard {s}");
        }
        for conn in ["command", "pubsub"] {
            let l = format!("{{conn=\"{conn}\",shard=\"{s}\"}}");
            assert_eq!(
                series(&m, &format!("walletrelay_redis_reconnects_total{l}")),
                Some(0.0)
            );
            assert_eq!(series(&m, &format!("walletrelay_redis_up{l}")), Some(1.0));
        }
    }
}

mod webhooks {
    use super::*;
    use crate::common::webhook::{Receiver, Reply};

    #[test]
    fn a_webhook_registered_on_one_node_gets_one_post_per_stored_publish_in_the_cluster() {
        let r = RedisServer::start();
        // One webhook thread per node: each node's POSTs leave in order (the barrier below).
        let n = nodes(3, &[&r], &["--webhook-threads", "1"]);
        let rx = Receiver::start(|_| Reply::Status(200));
        let (tp, bar2, bar3) = (topic(), topic(), topic());
        for t in [&tp, &bar2, &bar3] {
            let (st, body) = n[0].register_webhook(t, &rx.url("/push"));
            assert_eq!(st, 200, "{body}");
        }
        // Registered again on another node: still one registration.
        assert_eq!(n[2].register_webhook(&tp, &rx.url("/push")).0, 200);
        let (mut p2, mut p3) = (n[1].ws(), n[2].ws());
        for i in 0..10 {
            let (first, second) = if i % 2 == 0 {
                (&mut p2, &mut p3)
            } else {
                (&mut p3, &mut p2)
            };
            let m = format!("w{i}");
            assert_eq!(publish_raw(first, &tp, &m, None)["result"], true);
            // The same message on the other node: a duplicate, no POST.
            assert_eq!(publish_raw(second, &tp, &m, Some(true))["result"], true);
        }
        // Stored but prompt false: no POST.
        assert_eq!(
            publish_raw(&mut p2, &tp, "quiet", Some(false))["result"],
            true
        );
        // Barrier: each node's last POST; a wrong POST of that node would have left first.
        assert_eq!(publish_raw(&mut p2, &bar2, "b", None)["result"], true);
        assert_eq!(publish_raw(&mut p3, &bar3, "b", None)["result"], true);
        let mut counts = std::collections::HashMap::new();
        wait_for("both barrier POSTs and the topic's", || {
            rx.count_by_topic(&mut counts);
            counts.get(&bar2) == Some(&1)
                && counts.get(&bar3) == Some(&1)
                && counts.get(&tp).copied().unwrap_or(0) >= 10
        });
        rx.count_by_topic(&mut counts);
        assert_eq!(counts.get(&tp), Some(&10), "one POST per stored publish");
        assert_eq!(counts.len(), 3, "{counts:?}");
    }
}
