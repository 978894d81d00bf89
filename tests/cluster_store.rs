//! The Redis side of the cluster (DECISIONS §7) against a real `redis-server`, through the
//! public API: what a publish stores, dedup, order, reads after a position, expiry, the cap
//! per topic, two nodes on one Redis, webhooks, two shards.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis::{data, Node, RedisServer};
use walletrelay::engine::redis::cluster::{
    shard_of, Followup, Origin, PublishOutcome, NS_V1, NS_V2,
};
use walletrelay::event::{Event, RelayError};

const MIN: Duration = Duration::from_secs(60);

fn stored(
    r: Result<PublishOutcome, walletrelay::engine::redis::cluster::Unavailable>,
) -> (u64, u64, Vec<String>) {
    match r {
        Ok(PublishOutcome::Stored {
            epoch,
            seq,
            webhooks,
            ..
        }) => (epoch, seq, webhooks),
        other => panic!("expected stored, got {other:?}"),
    }
}

fn seqs(h: &walletrelay::engine::redis::cluster::History) -> Vec<u64> {
    h.messages.iter().map(|m| m.seq).collect()
}

#[test]
fn publishes_are_numbered_deduplicated_and_read_in_order_after_a_position() {
    let r = RedisServer::start();
    let n = Node::start(&[r.url()]);
    assert_eq!(
        n.cluster.healthy(),
        Ok(()),
        "a started node is healthy at once"
    );
    let (e1, s1, _) = stored(n.publish("t", "a", MIN));
    let (e2, s2, _) = stored(n.publish("t", "b", MIN));
    assert_eq!((s1, s2), (1, 2));
    assert_eq!(e1, e2);
    assert!(e1 > 0);
    // Same bytes as a cached message: answered, neither stored nor numbered.
    assert_eq!(
        n.publish("t", "a", MIN),
        Ok(PublishOutcome::Duplicate { epoch: e1, seq: 1 })
    );
    let (_, s3, _) = stored(n.publish("t", "c", MIN));
    assert_eq!(s3, 3);
    let o = Origin { node: 42, conn: 7 };
    let (_, s4, _) = stored(n.publish_as("t", data("t", "d"), MIN, o, false));
    assert_eq!(s4, 4);

    let all = n.read("t", 0, 0).unwrap();
    assert_eq!((all.epoch, all.last_seq, all.more()), (e1, 4, false));
    assert_eq!(seqs(&all), [1, 2, 3, 4]);
    assert_eq!(all.messages[1].body, data("t", "b"));
    assert_eq!(all.messages[3].origin, o);
    assert_eq!(seqs(&n.read("t", e1, 2).unwrap()), [3, 4]);
    assert!(n.read("t", e1, 4).unwrap().messages.is_empty());
    // A position of another epoch means nothing: the read starts over.
    assert_eq!(seqs(&n.read("t", e1 + 1, 3).unwrap()), [1, 2, 3, 4]);
    // Another topic, and the same topic name in the v1 namespace, are separate.
    let empty = n.read("other", 0, 0).unwrap();
    assert_eq!(
        (empty.epoch, empty.last_seq, empty.messages.len()),
        (0, 0, 0)
    );
    let t = n.ticket();
    n.h(0).read(t, NS_V1, &Arc::from("t"), 0, 0).unwrap();
    let v1 = n.wait("v1 history", |_, e| match e {
        Event::Engine(Followup::Page { ticket, result }) if *ticket == t => Some(result.clone()),
        _ => None,
    });
    assert_eq!(v1.unwrap().messages.len(), 0);
}

#[test]
fn expired_messages_are_not_read_nor_deduplicated_and_keys_expire_with_the_last() {
    let r = RedisServer::start();
    let n = Node::start(&[r.url()]);
    let short = Duration::from_millis(300);
    stored(n.publish("t", "short", short));
    let (e, _, _) = stored(n.publish("t", "long", MIN));
    std::thread::sleep(Duration::from_millis(600));
    let h = n.read("t", 0, 0).unwrap();
    assert_eq!(seqs(&h), [2]);
    // The expired copy no longer counts for dedup.
    assert_eq!(stored(n.publish("t", "short", MIN)).1, 3);
    // Keys live until the topic's last message would expire.
    let mut c = r.conn();
    let ttl: i64 = redis::cmd("PTTL").arg("wr:0:2:t").query(&mut c).unwrap();
    // (extended in steps of min(ttl, 10 s): at most that long after the last message)
    assert!(ttl > 50_000 && ttl <= 70_000, "stream ttl {ttl}");
    stored(n.publish("gone", "x", short));
    std::thread::sleep(Duration::from_millis(900));
    let keys: Vec<String> = redis::cmd("KEYS").arg("wr:*gone").query(&mut c).unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    // History lost: the topic starts a new epoch.
    let (e2, s, _) = stored(n.publish("gone", "y", MIN));
    assert_eq!(s, 1);
    assert_ne!(e2, e);
}

#[test]
fn the_cap_evicts_the_oldest_and_keeps_dedup_state_bounded() {
    let r = RedisServer::start();
    let mut cfg = common::redis::test_config(&[r.url()]);
    cfg.max_cached_per_topic = 5;
    let n = Node::try_start(cfg).unwrap();
    for i in 1..=8 {
        stored(n.publish("t", &format!("m{i}"), MIN));
    }
    let h = n.read("t", 0, 0).unwrap();
    assert_eq!(seqs(&h), [4, 5, 6, 7, 8]);
    let mut c = r.conn();
    // The meta hash holds e, s, f, x, r and one dedup field per cached message.
    let dedup: usize = redis::cmd("HLEN").arg("wr:2:m:t").query(&mut c).unwrap();
    assert_eq!(dedup, 5 + 5);
    // An evicted message is new again; a cached one is still a duplicate.
    assert_eq!(stored(n.publish("t", "m1", MIN)).1, 9);
    assert!(matches!(
        n.publish("t", "m8", MIN),
        Ok(PublishOutcome::Duplicate { seq: 8, .. })
    ));
    assert_eq!(seqs(&n.read("t", 0, 0).unwrap()), [5, 6, 7, 8, 9]);
}

#[test]
fn a_large_history_is_read_in_pages() {
    let r = RedisServer::start();
    let mut cfg = common::redis::test_config(&[r.url()]);
    cfg.read_max_count = 4;
    let n = Node::try_start(cfg).unwrap();
    for i in 1..=10 {
        stored(n.publish("t", &format!("m{i}"), MIN));
    }
    let (mut epoch, mut after, mut got) = (0, 0, Vec::new());
    loop {
        let h = n.read("t", epoch, after).unwrap();
        got.extend(seqs(&h));
        epoch = h.epoch;
        after = h.scanned_to;
        if !h.more() {
            break;
        }
    }
    assert_eq!(got, (1..=10).collect::<Vec<u64>>());
}

#[test]
fn two_nodes_see_each_others_publishes_live_and_in_history() {
    let r = RedisServer::start();
    let a = Node::start(&[r.url()]);
    let b = Node::start(&[r.url()]);
    let topic: Arc<str> = "shared".into();
    // Two workers of node B watch; both get Resync once the subscription is live.
    b.h(0).watch(NS_V2, &topic).unwrap();
    b.h(1).watch(NS_V2, &topic).unwrap();
    for w in [0, 1] {
        b.wait("resync", |wk, e| {
            matches!(e, Event::Engine(Followup::Subscribed { .. }) if wk == w).then_some(())
        });
    }
    let o = Origin { node: 0xA, conn: 3 };
    let (epoch, seq, _) = stored(a.publish_as("shared", data("shared", "hi"), MIN, o, true));
    for w in [0, 1] {
        let (e, s, d, org) = b.wait("live", |wk, e| match e {
            Event::Live { topic, msg } if wk == w => {
                assert_eq!(&**topic, "shared");
                Some((msg.pos.epoch, msg.pos.seq, msg.body.clone(), msg.origin))
            }
            _ => None,
        });
        assert_eq!((e, s, org), (epoch, seq, o));
        assert_eq!(d, data("shared", "hi"));
    }
    assert_eq!(seqs(&b.read("shared", 0, 0).unwrap()), [1]);
    // In order, from both nodes.
    for i in 0..50 {
        let node = if i % 2 == 0 { &a } else { &b };
        stored(node.publish("shared", &format!("m{i}"), MIN));
    }
    for w in [0, 1] {
        let mut got = Vec::new();
        while got.len() < 50 {
            got.push(b.wait("live", |wk, e| match e {
                Event::Live { msg, .. } if wk == w => Some(msg.pos.seq),
                _ => None,
            }));
        }
        assert_eq!(got, (2..=51).collect::<Vec<u64>>());
    }
    assert!(b.drain().is_empty());
    // Unwatched by every worker: no more live messages for node B.
    b.h(0).unwatch(NS_V2, &topic).unwrap();
    b.h(1).unwatch(NS_V2, &topic).unwrap();
    b.h(0).watch(NS_V2, &"marker".into()).unwrap();
    b.wait("marker resync", |_, e| {
        matches!(e, Event::Engine(Followup::Subscribed { topic, .. }) if &**topic == "marker")
            .then_some(())
    });
    stored(a.publish("shared", "after", MIN));
    stored(a.publish("marker", "m", MIN));
    b.wait("marker live", |_, e| {
        matches!(e, Event::Live { topic, .. } if &**topic == "marker").then_some(())
    });
    let late: Vec<_> = b
        .drain()
        .into_iter()
        .filter(|(_, e)| matches!(e, Event::Live { topic, .. } if &**topic == "shared"))
        .collect();
    assert!(late.is_empty(), "live after unwatch: {late:?}");
}

#[test]
fn webhooks_register_once_are_capped_and_come_back_once_per_stored_publish() {
    let r = RedisServer::start();
    let mut cfg = common::redis::test_config(&[r.url()]);
    cfg.max_webhooks = 18;
    let a = Node::try_start(cfg.clone()).unwrap();
    let b = Node::try_start(cfg).unwrap();
    let add = |n: &Node, topic: &str, url: &str| {
        let t = n.ticket();
        n.h(0).add_webhook(t, &topic.into(), url).unwrap();
        n.wait("webhook added", |_, e| match e {
            Event::WebhookAdded { ticket, result } if *ticket == t => Some(*result),
            _ => None,
        })
    };
    // A registration made again is kept once: had b's copy counted, h/16 would be refused.
    assert_eq!(add(&a, "t", "http://h/1"), Ok(()));
    assert_eq!(add(&b, "t", "http://h/1"), Ok(()));
    for i in 2..=16 {
        assert_eq!(add(&b, "t", &format!("http://h/{i}")), Ok(()));
    }
    assert_eq!(
        add(&a, "t", "http://h/17"),
        Err(RelayError::TooManyWebhooksForTopic)
    );
    assert_eq!(add(&a, "u", "http://h/1"), Ok(()));
    assert_eq!(add(&a, "v", "http://h/1"), Ok(()));
    assert_eq!(add(&a, "w", "http://h/1"), Err(RelayError::TooManyWebhooks));
    // (commands of one node to one shard run in order; across nodes they do not)
    a.h(0).remove_webhook(&"v".into(), "http://h/1").unwrap();
    assert_eq!(add(&a, "w", "http://h/1"), Ok(()));

    // The publisher's answer carries the registrations (made on either node); a duplicate
    // and a publish without prompt carry none, and a watching node never gets them.
    let (_, _, hooks) = stored(b.publish("u", "m", MIN));
    assert_eq!(hooks, ["http://h/1"]);
    let (_, _, hooks) = stored(a.publish("t", "m", MIN));
    assert_eq!(hooks.len(), 16);
    assert!(matches!(
        a.publish("t", "m", MIN),
        Ok(PublishOutcome::Duplicate { .. })
    ));
    let (_, _, hooks) =
        stored(a.publish_as("t", data("t", "quiet"), MIN, Origin::default(), false));
    assert!(hooks.is_empty());
    // The same registration applies to the v1 namespace of the topic.
    let t = a.ticket();
    let req = walletrelay::engine::redis::cluster::PublishReq {
        ns: NS_V1,
        topic: "u".into(),
        body: data("u", "v1"),
        ttl: MIN,
        origin: Origin::default(),
        prompt: true,
        publisher: None,
    };
    a.h(0).publish(t, req).unwrap();
    let out = a.wait("v1 publish", |_, e| match e {
        Event::Engine(Followup::Published { ticket, result }) if *ticket == t => {
            Some(result.clone())
        }
        _ => None,
    });
    assert_eq!(stored(out).2, ["http://h/1"]);
}

#[test]
fn topics_spread_over_two_shards_and_each_lives_on_its_own() {
    let r0 = RedisServer::start();
    let r1 = RedisServer::start();
    let urls = [r0.url(), r1.url()];
    let n = Node::start(&urls);
    let watcher = Node::start(&urls);
    let on = |s: usize| {
        (0..)
            .map(|i| format!("topic-{i}"))
            .find(|t| shard_of(t.as_bytes(), 2) == s)
            .unwrap()
    };
    let (t0, t1) = (on(0), on(1));
    for t in [&t0, &t1] {
        watcher.h(0).watch(NS_V2, &t.as_str().into()).unwrap();
        watcher.wait("resync", |_, e| {
            matches!(e, Event::Engine(Followup::Subscribed { topic, .. }) if **topic == **t)
                .then_some(())
        });
        stored(n.publish(t, "x", MIN));
        assert_eq!(seqs(&n.read(t, 0, 0).unwrap()), [1]);
        watcher.wait("live", |_, e| {
            matches!(e, Event::Live { topic, msg } if **topic == **t && msg.pos.seq == 1)
                .then_some(())
        });
    }
    let exists = |r: &RedisServer, t: &str| -> bool {
        redis::cmd("EXISTS")
            .arg(format!("wr:0:2:{t}"))
            .query(&mut r.conn())
            .unwrap()
    };
    assert!(exists(&r0, &t0) && !exists(&r1, &t0));
    assert!(exists(&r1, &t1) && !exists(&r0, &t1));
    let mut m = String::new();
    n.cluster.render_metrics(&mut m);
    assert!(
        m.contains("walletrelay_redis_up{conn=\"command\",shard=\"1\"} 1"),
        "{m}"
    );
    assert!(m.contains("walletrelay_redis_roundtrip_seconds_count{shard=\"0\"}"));
}

#[test]
fn big_messages_travel_whole_in_bounded_rounds() {
    let r = RedisServer::start();
    let mut cfg = common::redis::test_config(&[r.url()]);
    cfg.batch_bytes = 1 << 20;
    cfg.read_max_bytes = 3 << 20;
    let n = Node::try_start(cfg.clone()).unwrap();
    let w = Node::try_start(cfg).unwrap();
    let topic: Arc<str> = "big".into();
    w.h(0).watch(NS_V2, &topic).unwrap();
    w.wait("resync", |_, e| {
        matches!(e, Event::Engine(Followup::Subscribed { .. })).then_some(())
    });
    // Sent without waiting, so several are queued at once and rounds are cut by bytes.
    let msgs: Vec<String> = (0..8).map(|i| format!("{i}").repeat(1 << 20)).collect();
    for (i, m) in msgs.iter().enumerate() {
        let req = walletrelay::engine::redis::cluster::PublishReq {
            ns: NS_V2,
            topic: Arc::clone(&topic),
            body: data("big", m),
            ttl: MIN,
            origin: Origin::default(),
            prompt: false,
            publisher: None,
        };
        n.h(0).publish(i as u64 + 100, req).unwrap();
    }
    for i in 0..8u64 {
        let r = n.wait("big publish", |_, e| match e {
            Event::Engine(Followup::Published { ticket, result }) if *ticket == i + 100 => {
                Some(result.clone())
            }
            _ => None,
        });
        assert_eq!(stored(r).1, i + 1);
        let d = w.wait("big live", |_, e| match e {
            Event::Live { msg, .. } if msg.pos.seq == i + 1 => Some(msg.body.clone()),
            _ => None,
        });
        assert_eq!(d, data("big", &msgs[i as usize]));
    }
    // A read stops at its byte budget and says there is more.
    let h = n.read("big", 0, 0).unwrap();
    assert_eq!((seqs(&h), h.more()), (vec![1, 2, 3], true));
    assert_eq!(
        seqs(&n.read("big", h.epoch, h.scanned_to).unwrap()),
        [4, 5, 6]
    );
}

/// After a failover the new primary may lack the last writes of the old one, whose
/// positions subscribers may already have seen live: a topic written under another
/// replication id jumps its seq (2^20) once, so no position is given to two messages, and
/// the cap still keeps exactly the newest messages across the jump.
#[test]
fn a_new_replication_id_moves_positions_past_any_the_old_primary_gave() {
    const JUMP: u64 = 1 << 20;
    let r = RedisServer::start();
    let mut cfg = common::redis::test_config(&[r.url()]);
    cfg.max_cached_per_topic = 5;
    let (e, _, _) = {
        let n = Node::try_start(cfg.clone()).unwrap();
        for i in 1..=3 {
            stored(n.publish("t", &format!("m{i}"), MIN));
        }
        stored(n.publish("t", "m4", MIN))
    };
    // What a promoted replica looks like to the node: a new replication id.
    let _: () = redis::cmd("DEBUG")
        .arg("CHANGE-REPL-ID")
        .query(&mut r.conn())
        .unwrap();
    let n = Node::try_start(cfg).unwrap();
    let (e2, s, _) = stored(n.publish("t", "m5", MIN));
    assert_eq!((e2, s), (e, 4 + JUMP + 1), "same epoch, seq past the jump");
    assert_eq!(
        stored(n.publish("t", "m6", MIN)).1,
        4 + JUMP + 2,
        "one jump only"
    );
    let h = n.read("t", e, 4).unwrap();
    assert_eq!(
        seqs(&h),
        [4 + JUMP + 1, 4 + JUMP + 2],
        "a reader at 4 finds the rest"
    );
    for i in 7..=9 {
        stored(n.publish("t", &format!("m{i}"), MIN));
    }
    let all = n.read("t", 0, 0).unwrap();
    let want: Vec<u64> = (1..=5).map(|k| 4 + JUMP + k).collect();
    assert_eq!(
        seqs(&all),
        want,
        "the cap keeps the newest 5 across the jump"
    );
    let msgs: Vec<String> = all
        .messages
        .iter()
        .map(|m| String::from_utf8_lossy(m.body.beta_bytes()).into_owned())
        .collect();
    assert!(msgs[0].contains("m5") && msgs[4].contains("m9"), "{msgs:?}");
}
