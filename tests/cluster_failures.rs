//! The Redis side of the cluster when things go wrong (DECISIONS §7), against real
//! `redis-server` processes: Redis killed and restarted under load, a Redis that answers
//! slowly, a full shard queue, a node started with another shard list.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use common::redis::{data, test_config, Node, RedisServer, WAIT};
use common::wait::wait_until;
use walletrelay::engine::redis::cluster::{
    ClusterError, ConnectError, Followup, Origin, PublishOutcome, PublishReq, NS_V2,
};
use walletrelay::event::Event;

const MIN: Duration = Duration::from_secs(60);

fn req(topic: &str, msg: &str) -> PublishReq {
    PublishReq {
        ns: NS_V2,
        topic: topic.into(),
        body: data(topic, msg),
        ttl: MIN,
        origin: Origin { node: 1, conn: 1 },
        prompt: false,
        publisher: None,
    }
}

#[test]
fn a_node_with_another_shard_list_refuses_to_start() {
    let r0 = RedisServer::start();
    let r1 = RedisServer::start();
    let _first = Node::start(&[r0.url(), r1.url()]);
    for urls in [vec![r1.url(), r0.url()], vec![r0.url()]] {
        match Node::try_start(test_config(&urls)) {
            Err(ClusterError::Shard {
                source: ConnectError::Mismatch { ours, theirs },
                ..
            }) => assert_ne!(ours, theirs),
            Err(e) => panic!("wrong refusal: {e}"),
            Ok(_) => panic!("started with another shard list: {urls:?}"),
        }
    }
    // The same list, given as one comma-separated flag value, joins.
    let same = format!(" {} , {} ", r0.url(), r1.url());
    assert!(Node::try_start(test_config(&[same])).is_ok());
    let down = RedisServer::start();
    let url = down.url();
    drop(down);
    let e = Node::try_start(test_config(&[url]))
        .err()
        .expect("unreachable refused");
    assert!(e.to_string().contains("Redis shard 0"), "{e}");
}

#[test]
fn redis_killed_under_load_loses_no_acknowledged_publish_and_resyncs_after_restart() {
    let mut r = RedisServer::start_persistent();
    let mut cfg = test_config(&[r.url()]);
    cfg.max_cached_per_topic = 100_000;
    let publisher = Node::try_start(cfg.clone()).unwrap();
    let follower_node = Node::try_start(cfg).unwrap();
    let topic: Arc<str> = "busy".into();
    follower_node.h(0).watch(NS_V2, &topic).unwrap();
    follower_node.wait("the first resync", |_, e| {
        matches!(e, Event::Engine(Followup::Subscribed { .. })).then_some(())
    });

    // Publish without waiting; once some are answered, kill Redis with many in flight and
    // keep publishing through the outage.
    let mut sent: HashMap<u64, String> = HashMap::new();
    let mut answers: BTreeMap<u64, Result<PublishOutcome, _>> = BTreeMap::new();
    let take_answer = |answers: &mut BTreeMap<u64, _>, sent: &HashMap<u64, String>| {
        let (t, res) = publisher.wait("publish outcome", |_, e| match e {
            Event::Engine(Followup::Published { ticket, result }) => {
                Some((*ticket, result.clone()))
            }
            _ => None,
        });
        assert!(sent.contains_key(&t), "answer for an unknown ticket {t}");
        assert!(
            answers.insert(t, res).is_none(),
            "ticket {t} answered twice"
        );
    };
    for i in 0..6_000u64 {
        if i == 3_000 {
            while answers.len() < 500 {
                take_answer(&mut answers, &sent);
            }
        }
        if i == 4_000 {
            r.kill();
        }
        let msg = format!("m{i}");
        if publisher.h(0).publish(i, req(&topic, &msg)).is_ok() {
            sent.insert(i, msg);
        }
    }
    // Every accepted publish is answered exactly once.
    while answers.len() < sent.len() {
        take_answer(&mut answers, &sent);
    }
    assert!(
        publisher.cluster.healthy().is_err(),
        "healthy while Redis is down"
    );
    let acked: Vec<(u64, u64)> = answers
        .iter()
        .filter_map(|(t, r)| match r {
            Ok(PublishOutcome::Stored { seq, .. }) => Some((*t, *seq)),
            _ => None,
        })
        .collect();
    let unavailable = answers.values().filter(|r| r.is_err()).count();
    assert!(
        !acked.is_empty() && unavailable > 0,
        "acked {} unavailable {unavailable}",
        acked.len()
    );
    // During the outage a publish is answered unavailable.
    assert!(publisher.publish("busy", "during", MIN).is_err());

    r.restart();
    publisher.wait_healthy();
    follower_node.wait_healthy();
    // Every publish answered stored is in the history, at the seq it was given.
    let (mut epoch, mut after, mut stored) = (0, 0, HashMap::new());
    loop {
        let h = publisher.read("busy", epoch, after).unwrap();
        for m in &h.messages {
            stored.insert(m.seq, m.body.clone());
        }
        (epoch, after) = (h.epoch, h.scanned_to);
        if !h.more() {
            break;
        }
    }
    for (t, seq) in &acked {
        assert_eq!(
            stored.get(seq),
            Some(&data("busy", &sent[t])),
            "ticket {t} seq {seq} lost"
        );
    }
    // The watching node subscribed again and says so: its workers read again after their
    // positions (how a worker merges that with live messages is `relay::feed`, exercised
    // with real nodes in `cluster_outage.rs`).
    follower_node.wait("a resync after the restart", |_, e| {
        matches!(e, Event::Engine(Followup::Subscribed { .. })).then_some(())
    });
    let mut m = String::new();
    follower_node.cluster.render_metrics(&mut m);
    assert!(
        !m.contains("walletrelay_redis_resyncs_total{shard=\"0\"} 0"),
        "{m}"
    );
    assert!(!m.contains("walletrelay_redis_reconnects_total{conn=\"pubsub\",shard=\"0\"} 0"));
}

#[test]
fn a_slow_redis_never_blocks_the_caller_and_times_out_to_unavailable() {
    let r = RedisServer::start();
    let n = Node::start(&[r.url()]);
    let topic: Arc<str> = "slow".into();
    n.h(0).watch(NS_V2, &topic).unwrap();
    n.wait("first resync", |_, e| {
        matches!(e, Event::Engine(Followup::Subscribed { .. })).then_some(())
    });
    let sleeper = r.debug_sleep(3);
    // Redis is asleep: every call returns at once, before any answer exists.
    for t in 0..200 {
        n.h(0).publish(t, req(&topic, &format!("m{t}"))).unwrap();
    }
    n.h(0).read(1_000, NS_V2, &topic, 0, 0).unwrap();
    assert!(
        n.drain().iter().all(|(_, e)| !matches!(
            e,
            Event::Engine(Followup::Published { .. }) | Event::Engine(Followup::Page { .. })
        )),
        "an answer came before Redis woke up: a call waited for Redis"
    );
    // Answers come later: unavailable (the read timeout is shorter than the sleep).
    let mut answered = std::collections::HashSet::new();
    while answered.len() < 201 {
        let (t, ok) = n.wait("answer", |_, e| match e {
            Event::Engine(Followup::Published { ticket, result }) => {
                Some((*ticket, result.is_ok()))
            }
            Event::Engine(Followup::Page { ticket, result }) => Some((*ticket, result.is_ok())),
            _ => None,
        });
        assert!(!ok, "ticket {t} answered ok after the read timeout");
        assert!(answered.insert(t), "ticket {t} answered twice");
    }
    sleeper.join().unwrap();
    n.wait_healthy();
    assert!(matches!(
        n.publish("slow", "awake", MIN),
        Ok(PublishOutcome::Stored { .. })
    ));
    // The subscriber timed out too, reconnected and resynced the watched topic.
    n.wait("resync after the stall", |_, e| {
        matches!(e, Event::Engine(Followup::Subscribed { .. })).then_some(())
    });
}

#[test]
fn a_full_shard_queue_refuses_at_once() {
    let r = RedisServer::start();
    let mut cfg = test_config(&[r.url()]);
    cfg.queue = 4;
    cfg.batch = 16;
    cfg.read_timeout = Duration::from_secs(5);
    let n = Node::try_start(cfg).unwrap();
    let sleeper = r.debug_sleep(1);
    let refused = (0..1_000)
        .filter(|t| n.h(0).publish(*t, req("q", &format!("m{t}"))).is_err())
        .count();
    // At most two rounds of 16 in flight (written ahead) and 4 queued.
    assert!(refused >= 1_000 - 2 * 16 - 4, "only {refused} refused");
    sleeper.join().unwrap();
    let mut m = String::new();
    n.cluster.render_metrics(&mut m);
    assert!(
        m.contains(&format!(
            "walletrelay_redis_refused_total{{shard=\"0\"}} {refused}"
        )),
        "{m}"
    );
}

#[test]
fn an_idle_node_notices_redis_gone_by_its_heartbeat_and_comes_back() {
    let mut r = RedisServer::start_persistent();
    let n = Node::start(&[r.url()]);
    stored_ok(&n, "before");
    r.kill();
    // Nothing is sent: only the heartbeats can find out.
    let noticed = wait_until(
        WAIT,
        || matches!(n.cluster.healthy(), Err(e) if e.contains("commands") && e.contains("pub/sub")),
    );
    assert!(noticed, "the outage went unnoticed");
    r.restart();
    n.wait_healthy();
    stored_ok(&n, "after");
    let mut m = String::new();
    n.cluster.render_metrics(&mut m);
    assert!(
        m.contains("walletrelay_redis_reconnects_total{conn=\"command\",shard=\"0\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("walletrelay_redis_up{conn=\"command\",shard=\"0\"} 1"),
        "{m}"
    );
}

fn stored_ok(n: &Node, msg: &str) {
    let r = n.publish("idle", msg, MIN);
    assert!(matches!(r, Ok(PublishOutcome::Stored { .. })), "{r:?}");
}
