//! The relay's publish/subscribe rules (DECISIONS §3), over real WebSockets, at one worker
//! and at four (where publisher and subscriber are placed on different workers on purpose).

mod common;
use common::wait::poll_every;
use common::{topic, Server, Ws, THREADS};
use serde_json::json;

/// Publisher and subscriber on different workers when there are several.
fn pair(s: &Server, threads: &str) -> (Ws, Ws) {
    let a = s.ws();
    let b = if threads == "1" {
        s.ws()
    } else {
        s.ws_not_on(a.worker)
    };
    if threads != "1" {
        assert_ne!(a.worker, b.worker, "the pair must straddle two workers");
    }
    (a, b)
}

#[test]
fn subscriber_receives_publish_from_another_connection() {
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let (mut sub, mut publ) = pair(&s, t);
        let tp = topic();
        let id = sub.subscribe(&tp);
        assert_eq!(id.len(), 64);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        publ.publish(&tp, "hello");
        assert_eq!(sub.next_push(), (id, tp.clone(), "hello".to_string()));
    }
}

#[test]
fn cross_worker_topics_are_delivered_whatever_their_home() {
    // Many topics: their homes spread over all four workers, so every combination of
    // subscriber worker, publisher worker and home worker occurs.
    let s = Server::start(&["--threads", "4"]);
    let (mut sub, mut publ) = pair(&s, "4");
    let topics: Vec<String> = (0..24).map(|_| topic()).collect();
    let ids: Vec<String> = topics.iter().map(|t| sub.subscribe(t)).collect();
    for (i, t) in topics.iter().enumerate() {
        publ.publish(t, &format!("m{i}"));
        let (id, tp, msg) = sub.next_push();
        assert_eq!((id, tp, msg), (ids[i].clone(), t.clone(), format!("m{i}")));
    }
    assert!(
        s.metric("walletrelay_core_messages_total") > 0.0,
        "no cross-worker traffic seen"
    );
}

#[test]
fn publisher_does_not_receive_its_own_message() {
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let (mut a, mut b) = pair(&s, t);
        let tp = topic();
        let ida = a.subscribe(&tp);
        let idb = b.subscribe(&tp);
        a.publish(&tp, "from-a");
        assert_eq!(b.next_push(), (idb, tp.clone(), "from-a".into()));
        // Per-topic order is FIFO: had a's own message come back, it would precede this.
        b.publish(&tp, "from-b");
        assert_eq!(a.next_push(), (ida, tp.clone(), "from-b".into()));
    }
}

#[test]
fn late_subscriber_gets_cached_messages_oldest_first() {
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let (mut publ, mut late) = pair(&s, t);
        let tp = topic();
        for i in 0..5 {
            publ.publish(&tp, &format!("m{i}"));
        }
        let id = late.subscribe(&tp);
        for i in 0..5 {
            assert_eq!(late.next_push(), (id.clone(), tp.clone(), format!("m{i}")));
        }
        // And live messages follow the replay.
        publ.publish(&tp, "live");
        assert_eq!(late.next_push().2, "live");
    }
}

#[test]
fn a_connection_is_not_replayed_its_own_cached_messages() {
    let s = Server::start(&["--threads", "1"]);
    let mut a = s.ws();
    let mut b = s.ws();
    let tp = topic();
    a.publish(&tp, "mine");
    b.publish(&tp, "theirs");
    a.subscribe(&tp);
    assert_eq!(a.next_push().2, "theirs");
}

#[test]
fn duplicate_message_is_acknowledged_but_not_delivered_again() {
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let (mut sub, mut publ) = pair(&s, t);
        let tp = topic();
        sub.subscribe(&tp);
        publ.publish(&tp, "same");
        publ.publish(&tp, "same");
        publ.publish(&tp, "next");
        assert_eq!(sub.next_push().2, "same");
        assert_eq!(sub.next_push().2, "next");
        // A late subscriber sees the duplicate once in the cache too.
        let mut late = s.ws();
        late.subscribe(&tp);
        assert_eq!(late.next_push().2, "same");
        assert_eq!(late.next_push().2, "next");
        assert!(s.metric("walletrelay_messages_dropped_total") >= 1.0);
    }
}

#[test]
fn a_message_evicted_from_the_cache_is_new_again_and_one_still_cached_is_a_duplicate() {
    // With room for two messages per topic: "a" is evicted by "c", so publishing "a" again
    // delivers it (and evicts "b"); "c" is still cached, so it is a duplicate; "d" evicts
    // "c", and the second "a" again is a duplicate.
    for t in THREADS {
        let s = Server::start(&["--threads", t, "--max-cached-per-topic", "2"]);
        let (mut sub, mut publ) = pair(&s, t);
        let tp = topic();
        sub.subscribe(&tp);
        for m in ["a", "b", "c", "a", "c", "d", "a"] {
            publ.publish(&tp, m);
        }
        let got: Vec<String> = (0..5).map(|_| sub.next_push().2).collect();
        assert_eq!(got, ["a", "b", "c", "a", "d"], "threads {t}");
        assert!(
            sub.recv_within(100).is_none(),
            "threads {t}: a duplicate was delivered"
        );
        assert_eq!(
            s.dropped("duplicate"),
            2.0,
            "threads {t}: duplicates counted"
        );
    }
}

#[test]
fn resubscribing_returns_the_same_id_and_delivers_once() {
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let (mut sub, mut publ) = pair(&s, t);
        let tp = topic();
        let id1 = sub.subscribe(&tp);
        let id2 = sub.subscribe(&tp);
        assert_eq!(id1, id2);
        publ.publish(&tp, "one");
        publ.publish(&tp, "two");
        assert_eq!(sub.next_push().2, "one");
        assert_eq!(sub.next_push().2, "two");
    }
}

#[test]
fn unsubscribe_stops_delivery_for_that_subscription_only() {
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let (mut a, mut publ) = pair(&s, t);
        let mut b = s.ws();
        let tp = topic();
        let ida = a.subscribe(&tp);
        b.subscribe(&tp);
        let r = a.call("waku_unsubscribe", json!({"topic": tp, "id": ida}));
        assert_eq!(r["result"], true);
        publ.publish(&tp, "after");
        assert_eq!(b.next_push().2, "after");
        assert_eq!(
            a.recv_within(500),
            None,
            "unsubscribed connection got a message"
        );
    }
}

#[test]
fn unsubscribe_with_id_alone_works() {
    let s = Server::start(&["--threads", "4"]);
    let mut a = s.ws();
    let mut publ = s.ws();
    let tp = topic();
    let id = a.subscribe(&tp);
    assert_eq!(
        a.call("waku_unsubscribe", json!({"id": id}))["result"],
        true
    );
    publ.publish(&tp, "x");
    assert_eq!(a.recv_within(500), None);
    // Subscribing again gives a new id and replays the cache.
    let id2 = a.subscribe(&tp);
    assert_ne!(id, id2);
    assert_eq!(a.next_push(), (id2, tp.clone(), "x".into()));
}

#[test]
fn unsubscribe_of_unknown_or_foreign_id_is_true_and_harmless() {
    let s = Server::start(&["--threads", "1"]);
    let mut a = s.ws();
    let mut b = s.ws();
    let mut publ = s.ws();
    let tp = topic();
    let ida = a.subscribe(&tp);
    let unknown = "0".repeat(64);
    assert_eq!(
        b.call("waku_unsubscribe", json!({"topic": tp, "id": unknown}))["result"],
        true
    );
    assert_eq!(
        b.call("waku_unsubscribe", json!({"topic": tp, "id": "not-hex"}))["result"],
        true
    );
    // b cannot remove a's subscription.
    assert_eq!(
        b.call("waku_unsubscribe", json!({"topic": tp, "id": ida}))["result"],
        true
    );
    publ.publish(&tp, "still");
    assert_eq!(a.next_push(), (ida, tp.clone(), "still".into()));
}

#[test]
fn closing_a_connection_drops_its_subscriptions() {
    let s = Server::start(&["--threads", "4"]);
    let tp = topic();
    {
        let mut a = s.ws();
        a.subscribe(&tp);
        a.sock.close(None).unwrap();
        let _ = a.sock.flush();
        // Read until the server's close answer.
        while a.sock.read().is_ok() {}
    }
    let every = std::time::Duration::from_millis(20);
    let dropped = poll_every(every, std::time::Duration::from_secs(5), || {
        (s.metric("walletrelay_subscriptions") == 0.0).then_some(())
    });
    assert!(dropped.is_some(), "subscription not dropped");
}

#[test]
fn messages_expire_after_their_ttl() {
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let mut publ = s.ws();
        let tp = topic();
        let r = publ.call(
            "waku_publish",
            json!({"topic": tp, "message": "short", "ttl": 1}),
        );
        assert_eq!(r["result"], true);
        publ.publish(&tp, "long");
        std::thread::sleep(std::time::Duration::from_millis(2500));
        let mut late = s.ws();
        late.subscribe(&tp);
        assert_eq!(
            late.next_push().2,
            "long",
            "the expired message was replayed"
        );
        let mut other = s.ws();
        let tp2 = topic();
        other.call(
            "waku_publish",
            json!({"topic": tp2, "message": "x", "ttl": 1}),
        );
        std::thread::sleep(std::time::Duration::from_millis(2500));
        assert!(s.metric("walletrelay_cached_messages") <= 1.0);
    }
}

#[test]
fn per_topic_cache_keeps_the_newest_messages() {
    let s = Server::start(&["--threads", "4", "--max-cached-per-topic", "3"]);
    let mut publ = s.ws();
    let tp = topic();
    for i in 0..6 {
        publ.publish(&tp, &format!("m{i}"));
    }
    let mut late = s.ws();
    late.subscribe(&tp);
    for i in 3..6 {
        assert_eq!(late.next_push().2, format!("m{i}"));
    }
    assert_eq!(late.recv_within(300), None);
}

#[test]
fn push_ids_are_unique_numbers_on_a_connection() {
    let s = Server::start(&["--threads", "4"]);
    let mut sub = s.ws();
    let mut publ = s.ws();
    let tp = topic();
    sub.subscribe(&tp);
    let mut seen = std::collections::HashSet::new();
    for i in 0..20 {
        publ.publish(&tp, &format!("m{i}"));
        let m = sub.recv();
        let id = m["id"].as_u64().expect("numeric id");
        assert!(seen.insert(id), "push id {id} repeated");
        sub.send(&json!({"id": id, "jsonrpc": "2.0", "result": true}));
    }
}

#[test]
fn escaped_strings_survive_the_round_trip() {
    let s = Server::start(&["--threads", "4"]);
    let mut sub = s.ws();
    let mut publ = s.ws();
    let tp = format!("{}-\"quoted\"-é", topic());
    let msg = "line1\nline2\t\"q\" \\ \u{1F600} \u{0001}";
    let id = sub.subscribe(&tp);
    publ.publish(&tp, msg);
    assert_eq!(sub.next_push(), (id, tp.clone(), msg.to_string()));
}

/// `n` connections subscribed to `tp`, each with its subscription id.
fn subscribers(s: &Server, tp: &str, n: usize) -> Vec<(Ws, String)> {
    (0..n)
        .map(|_| {
            let mut w = s.ws();
            let id = w.subscribe(tp);
            (w, id)
        })
        .collect()
}

/// Publishes `messages` to `tp` from a new connection in one write (request ids 1000, 1001,
/// ...) and checks that every one is acknowledged, in order; returns the publisher.
fn publish_burst(s: &Server, tp: &str, messages: &[String]) -> Ws {
    let mut publ = s.ws();
    for (i, m) in messages.iter().enumerate() {
        let req = json!({"id": 1000 + i, "jsonrpc": "2.0", "method": "waku_publish",
                         "params": {"topic": tp, "message": m, "ttl": 600}});
        publ.sock
            .write(tungstenite::Message::text(req.to_string()))
            .expect("queue publish");
    }
    publ.sock.flush().expect("send burst");
    for i in 0..messages.len() {
        let r = publ.recv();
        assert_eq!(r["id"], 1000 + i, "acks out of order at {i}: {r}");
        assert_eq!(r["result"], true, "{r}");
    }
    publ
}

/// Receives the next push on `w` and checks that it is `want` on topic `tp` for subscription
/// `id` (`who` names the subscriber and the push in a failure); returns the whole push.
fn expect_push(
    w: &mut Ws,
    id: &str,
    tp: &str,
    want: &str,
    who: std::fmt::Arguments<'_>,
) -> serde_json::Value {
    let m = w.recv();
    let got = &m["params"];
    assert_eq!(got["id"], id, "{who}: {m}");
    assert_eq!(got["data"]["topic"], tp, "{who}");
    assert!(
        got["data"]["message"] == want,
        "{who}: missing, reordered or altered"
    );
    m
}

#[test]
fn a_pipelined_burst_bigger_than_one_round_of_fan_out_arrives_whole_and_in_order() {
    // 400 publishes sent in one write to a topic with 200 subscribers: 80,000 pushes, more
    // than a worker queues before it stops reading to deliver and flush (FANOUT_MIN);
    // the rest of the burst waits in the connection's buffer and must resume by itself.
    const SUBS: usize = 200;
    const MSGS: usize = 400;
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let tp = topic();
        let mut subs = subscribers(&s, &tp, SUBS);
        let burst: Vec<String> = (0..MSGS).map(|i| format!("burst-{i}")).collect();
        let _publ = publish_burst(&s, &tp, &burst);
        for (n, (w, id)) in subs.iter_mut().enumerate() {
            for i in 0..MSGS {
                let m = w.recv();
                let p = &m["params"];
                assert_eq!(p["id"], id.as_str(), "subscriber {n}: {m}");
                assert_eq!(
                    p["data"]["message"],
                    format!("burst-{i}"),
                    "threads {t}, subscriber {n}: push {i} out of order or missing"
                );
            }
            assert!(
                w.recv_within(50).is_none(),
                "subscriber {n}: more than {MSGS} pushes"
            );
        }
    }
}

#[test]
fn a_big_fan_out_shares_each_body_and_every_subscriber_gets_its_own_exact_bytes() {
    // 700 subscribers of 3,800-character messages (under the 4 KiB from which any payload
    // is shared): the copies would add up to more than 1 MiB per publish on each worker
    // (about 350 subscribers per worker with two: the kernel spreads connections over the
    // workers' listeners), so each connection queues the body by reference between its own
    // frame head (subscription id, push id) and tail. A burst of publishes in one write
    // gives every connection several such pushes to write at once; with two workers, the
    // subscribers on the non-home worker get that worker's own copy of each body.
    const SUBS: usize = 700;
    const MSGS: usize = 12;
    let body = |i: usize| -> String {
        let c = (b'a' + (i % 26) as u8) as char;
        format!("{i:04}:{}", c.to_string().repeat(3_800))
    };
    for t in ["1", "2"] {
        let s = Server::start(&["--threads", t]);
        let tp = topic();
        let mut subs = subscribers(&s, &tp, SUBS);
        let burst: Vec<String> = (0..MSGS).map(body).collect();
        let _publ = publish_burst(&s, &tp, &burst);
        for (n, (w, id)) in subs.iter_mut().enumerate() {
            let mut push_ids = Vec::new();
            for i in 0..MSGS {
                let who = format_args!("threads {t}, subscriber {n}, push {i}");
                let m = expect_push(w, id, &tp, &body(i), who);
                push_ids.push(m["id"].as_u64().expect("push id"));
            }
            assert!(
                push_ids.windows(2).all(|w| w[0] < w[1]),
                "subscriber {n}: push ids not increasing: {push_ids:?}"
            );
            if n < 4 {
                assert!(
                    w.recv_within(50).is_none(),
                    "subscriber {n}: more than {MSGS} pushes"
                );
            }
        }
    }
}

#[test]
fn a_round_written_before_its_end_loses_and_reorders_nothing() {
    // Four publishers send 48 publishes of 6,000 characters each in one write, at once, to
    // a topic with one subscriber each: one worker reads more pushes in a loop iteration
    // than FLUSH_WITHIN_ROUND_BYTES (384 KiB), and writes every socket between two
    // connections' events instead of at the iteration's end (`Worker::flush_within_round`).
    // Bursts repeat until the metric shows that happened at least once (the kernel decides
    // how much of each write one iteration sees). Every subscriber must get all of its
    // publisher's messages, exact and in order, and every publisher its answers in order.
    const PUBLISHERS: usize = 4;
    const MSGS: usize = 48;
    const MOST_BURSTS: usize = 30;
    let body =
        |p: usize, burst: usize, i: usize| format!("{p}:{burst}:{i:02}:{}", "m".repeat(6_000));
    let s = Server::start(&["--threads", "1"]);
    let topics: Vec<String> = (0..PUBLISHERS).map(|_| topic()).collect();
    let mut subs: Vec<(Ws, String)> = topics
        .iter()
        .map(|tp| {
            let mut w = s.ws();
            let id = w.subscribe(tp);
            (w, id)
        })
        .collect();
    let mut bursts = 0;
    while s.metric("walletrelay_round_flushes_total") == 0.0 {
        assert!(
            bursts < MOST_BURSTS,
            "{MOST_BURSTS} bursts of {PUBLISHERS} x {MSGS} publishes never wrote a round early"
        );
        std::thread::scope(|scope| {
            for (p, ((w, id), tp)) in subs.iter_mut().zip(&topics).enumerate() {
                let s = &s;
                scope.spawn(move || {
                    let burst: Vec<String> = (0..MSGS).map(|i| body(p, bursts, i)).collect();
                    publish_burst(s, tp, &burst);
                });
                scope.spawn(move || {
                    for i in 0..MSGS {
                        let who = format_args!("subscriber {p}, burst {bursts}, push {i}");
                        expect_push(w, id, tp, &body(p, bursts, i), who);
                    }
                });
            }
        });
        bursts += 1;
    }
    for (p, (w, _)) in subs.iter_mut().enumerate() {
        assert!(
            w.recv_within(50).is_none(),
            "subscriber {p}: a push too many"
        );
    }
}
