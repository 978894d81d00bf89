//! Subscriptions that belong to the client id (DECISIONS 13), through the real binary: a
//! client id's subscription outlives its socket, and what was published while it was away
//! reaches it exactly once, by `irn_fetchMessages` (sign-client 2.17.1's reconnect) or by a
//! new `irn_subscribe` (2.25.0's); an explicit unsubscribe ends it; `--mailbox-ttl` expires
//! it; `--max-mailbox-topics` refuses one topic too many; a `kill -9` of a durable node
//! keeps it. On one worker and on four (a socket's close reaches the topic's home before
//! the connection counts as closed in `/metrics`, which the tests wait for).

mod common;

use std::time::Duration;

use common::durability::Node;
use common::relay_auth::AuthClient;
use common::ws::Ws;
use common::{topic, Server, TempDir};
use serde_json::json;

/// Publishes `message` on `topic` from `ws` (an `irn_publish` answered `true`).
fn publish(ws: &mut Ws, topic: &str, message: &str) {
    let r = ws.call(
        "irn_publish",
        json!({"topic": topic, "message": message, "ttl": 3600, "tag": 1100}),
    );
    assert_eq!(r["result"], true, "{r}");
}

/// The next push's message, acknowledged as the SDK does.
fn next_message(ws: &mut Ws) -> String {
    let m = ws.recv();
    assert_eq!(m["method"], "irn_subscription", "not a push: {m}");
    ws.send(&json!({"id": m["id"], "jsonrpc": "2.0", "result": true}));
    m["params"]["data"]["message"].as_str().unwrap().to_string()
}

/// The messages `irn_fetchMessages` gives for `topic`.
fn fetch(ws: &mut Ws, topic: &str) -> Vec<String> {
    let r = ws.call("irn_fetchMessages", json!({ "topic": topic }));
    assert_eq!(r["result"]["hasMore"], false, "{r}");
    r["result"]["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no messages: {r}"))
        .iter()
        .map(|m| m["message"].as_str().unwrap().to_string())
        .collect()
}

/// Closes `ws` and waits until the server has let its connection go (its subscriptions
/// ended with it).
fn close(server: &Server, ws: Ws, open_after: f64) {
    drop(ws);
    let n = server.wait_metric(
        "walletrelay_websockets_open",
        Duration::from_secs(10),
        |v| v <= open_after,
    );
    assert!(n <= open_after, "the connection is still open ({n})");
}

/// Asserts nothing more comes on `ws` (a push after the ones expected would be a repeat).
fn nothing_more(ws: &mut Ws) {
    if let Some(m) = ws.recv_within(500) {
        panic!("unexpected: {m}");
    }
}

/// The wallet subscribes, receives `m1`, goes away; the dApp publishes `m2`: returns the
/// dApp's socket.
fn away_while_published(s: &Server, wallet: &AuthClient, t: &str) -> Ws {
    let mut dapp = s.ws();
    let mut w = wallet.connect(s.addr);
    w.call("irn_subscribe", json!({ "topic": t }));
    publish(&mut dapp, t, "m1");
    assert_eq!(next_message(&mut w), "m1");
    close(s, w, 1.0);
    publish(&mut dapp, t, "m2");
    dapp
}

#[test]
fn what_was_published_while_away_is_fetched_once_then_not_pushed_again() {
    for threads in common::THREADS {
        let s = Server::start(&["--threads", threads]);
        let wallet = AuthClient::new();
        let t = topic();
        let mut dapp = away_while_published(&s, &wallet, &t);
        // 2.17.1: batchFetchMessages, then batchSubscribe.
        let mut w = wallet.connect(s.addr);
        assert_eq!(fetch(&mut w, &t), ["m2"], "only what it missed");
        assert_eq!(fetch(&mut w, &t), Vec::<String>::new(), "once");
        w.call("irn_batchSubscribe", json!({ "topics": [t] }));
        nothing_more(&mut w);
        publish(&mut dapp, &t, "m3");
        assert_eq!(next_message(&mut w), "m3");
        nothing_more(&mut w);
    }
}

#[test]
fn what_was_published_while_away_is_pushed_once_to_a_new_subscription() {
    for threads in common::THREADS {
        let s = Server::start(&["--threads", threads]);
        let wallet = AuthClient::new();
        let t = topic();
        let mut dapp = away_while_published(&s, &wallet, &t);
        // 2.25.0: batchSubscribe only.
        let mut w = wallet.connect(s.addr);
        w.call("irn_batchSubscribe", json!({ "topics": [t] }));
        assert_eq!(next_message(&mut w), "m2");
        nothing_more(&mut w);
        assert_eq!(fetch(&mut w, &t), Vec::<String>::new(), "not fetched again");
        // The next reconnect starts after m2 too.
        close(&s, w, 1.0);
        publish(&mut dapp, &t, "m3");
        let mut w = wallet.connect(s.addr);
        w.call("irn_subscribe", json!({ "topic": t }));
        assert_eq!(next_message(&mut w), "m3");
        nothing_more(&mut w);
    }
}

#[test]
fn an_explicit_unsubscribe_ends_the_client_s_subscription() {
    for threads in common::THREADS {
        let s = Server::start(&["--threads", threads, "--max-mailbox-topics", "1"]);
        let wallet = AuthClient::new();
        let (t1, t2) = (topic(), topic());
        let mut w = wallet.connect(s.addr);
        let id = w.call("irn_subscribe", json!({ "topic": t1 }))["result"].clone();
        let refused = w.call("irn_subscribe", json!({ "topic": t2 }));
        assert_eq!(
            refused["error"]["code"], -32000,
            "one topic too many: {refused}"
        );
        w.call("irn_unsubscribe", json!({ "topic": t1, "id": id }));
        close(&s, w, 0.0);
        // Its mailbox of t1 is gone: t2 has room, and t1 starts from the topic's start again.
        let mut dapp = s.ws();
        publish(&mut dapp, &t1, "m1");
        let mut w = wallet.connect(s.addr);
        let r = w.call("irn_subscribe", json!({ "topic": t2 }));
        assert!(r["result"].is_string(), "{r}");
        assert_eq!(fetch(&mut w, &t1), ["m1"]);
    }
}

#[test]
fn a_closed_socket_keeps_the_topic_counted_until_the_mailbox_ttl_ends_it() {
    for threads in common::THREADS {
        let s = Server::start(&[
            "--threads",
            threads,
            "--max-mailbox-topics",
            "1",
            "--mailbox-ttl",
            "1",
        ]);
        let wallet = AuthClient::new();
        let (t1, t2) = (topic(), topic());
        let mut w = wallet.connect(s.addr);
        w.call("irn_subscribe", json!({ "topic": t1 }));
        close(&s, w, 0.0);
        let mut w = wallet.connect(s.addr);
        let refused = w.call("irn_subscribe", json!({ "topic": t2 }));
        assert_eq!(refused["error"]["code"], -32000, "t1 still kept: {refused}");
        // Another client id has its own count.
        let other = AuthClient::new();
        let mut o = other.connect(s.addr);
        assert!(o.call("irn_subscribe", json!({ "topic": t2 }))["result"].is_string());
        let taken = common::wait::poll(Duration::from_secs(15), || {
            let r = w.call("irn_subscribe", json!({ "topic": t2 }));
            r["result"].is_string().then_some(r)
        });
        assert!(taken.is_some(), "t1's mailbox never expired");
    }
}

#[test]
fn a_client_s_subscription_survives_a_kill_9_of_a_durable_node() {
    for threads in common::THREADS {
        let dir = TempDir::new("client-mailbox");
        let node = Node::start(&dir, &["--threads", threads]);
        let wallet = AuthClient::new();
        let t = topic();
        let _dapp = away_while_published(&node, &wallet, &t);
        node.kill9();
        let node = Node::start(&dir, &["--threads", threads]);
        let mut w = wallet.connect(node.addr);
        w.call("irn_subscribe", json!({ "topic": t }));
        assert_eq!(
            next_message(&mut w),
            "m2",
            "m1 was delivered before the kill"
        );
        nothing_more(&mut w);
        // A fetch's position is kept too, and a restart on another number of workers (every
        // record rewritten where its topic lives now) keeps it.
        close(&node, w, 0.0);
        let mut dapp = node.ws();
        publish(&mut dapp, &t, "m3");
        let mut w = wallet.connect(node.addr);
        assert_eq!(fetch(&mut w, &t), ["m3"]);
        node.kill9();
        let node = Node::start(&dir, &["--threads", "2"]);
        let mut w = wallet.connect(node.addr);
        assert_eq!(fetch(&mut w, &t), Vec::<String>::new());
    }
}

#[test]
fn every_subscriber_gets_a_message_under_one_id_made_of_its_accept_time() {
    for threads in common::THREADS {
        let s = Server::start(&["--threads", threads]);
        let t = topic();
        let (mut a, mut b) = (s.ws(), AuthClient::new().connect(s.addr));
        a.call("irn_subscribe", json!({ "topic": t }));
        b.call("irn_subscribe", json!({ "topic": t }));
        let mut dapp = s.ws();
        publish(&mut dapp, &t, "m1");
        publish(&mut dapp, &t, "m2");
        let (pa, pb) = ((a.recv(), a.recv()), (b.recv(), b.recv()));
        for (x, y) in [(&pa.0, &pb.0), (&pa.1, &pb.1)] {
            assert_eq!(x["id"], y["id"], "one id per message: {x} {y}");
            let at = x["params"]["data"]["publishedAt"].as_u64().unwrap();
            assert_eq!(
                x["id"].as_u64().unwrap() >> 8,
                at,
                "notice::message_id: {x}"
            );
        }
        assert_ne!(pa.0["id"], pa.1["id"]);
    }
}

#[test]
fn connections_without_a_client_id_keep_their_own_subscriptions() {
    for threads in common::THREADS {
        let s = Server::start(&["--threads", threads, "--max-mailbox-topics", "1"]);
        let t = topic();
        let mut dapp = s.ws();
        let mut a = s.ws();
        a.call("irn_subscribe", json!({ "topic": t }));
        a.call("irn_subscribe", json!({ "topic": topic() }));
        publish(&mut dapp, &t, "m1");
        assert_eq!(next_message(&mut a), "m1");
        close(&s, a, 1.0);
        // A new socket without a client id starts from the topic's start, as before.
        let mut b = s.ws();
        b.call("irn_subscribe", json!({ "topic": t }));
        assert_eq!(next_message(&mut b), "m1");
    }
}

#[test]
fn a_push_the_socket_did_not_acknowledge_is_given_again_after_a_reconnect() {
    for threads in common::THREADS {
        let s = Server::start(&["--threads", threads]);
        let wallet = AuthClient::new();
        let t = topic();
        let mut dapp = s.ws();
        let mut w = wallet.connect(s.addr);
        w.call("irn_subscribe", json!({ "topic": t }));
        publish(&mut dapp, &t, "m1");
        publish(&mut dapp, &t, "m2");
        assert_eq!(next_message(&mut w), "m1");
        // m2 arrives but the socket dies before it acknowledges it.
        let m2 = w.recv();
        assert_eq!(m2["params"]["data"]["message"], "m2");
        close(&s, w, 1.0);
        let mut w = wallet.connect(s.addr);
        w.call("irn_subscribe", json!({ "topic": t }));
        assert_eq!(next_message(&mut w), "m2", "given again, m1 not");
        nothing_more(&mut w);
        close(&s, w, 1.0);
        let mut w = wallet.connect(s.addr);
        assert_eq!(fetch(&mut w, &t), Vec::<String>::new(), "acknowledged now");
    }
}

#[test]
fn a_client_s_subscription_is_copied_forward_when_its_segment_is_compacted() {
    let dir = TempDir::new("client-compaction");
    let args = [
        "--threads",
        "1",
        "--segment-bytes",
        "4096",
        "--max-cached-per-topic",
        "2",
    ];
    let node = Node::start(&dir, &args);
    let wallet = AuthClient::new();
    let t = topic();
    let mut dapp = away_while_published(&node, &wallet, &t);
    // The segments written so far hold the client's record; other traffic, mostly evicted
    // at once, makes them fall below half live until compaction retires every one of them.
    let first = dir.files_with_ext("log");
    let u = topic();
    let body = common::hex(400, 7);
    let retired = common::wait::poll(Duration::from_secs(30), || {
        for i in 0..20 {
            publish(&mut dapp, &u, &format!("{i}{body}"));
        }
        first.iter().all(|f| !f.exists()).then_some(())
    });
    assert!(retired.is_some(), "the first segments were never compacted");
    node.kill9();
    let node = Node::start(&dir, &args);
    let mut w = wallet.connect(node.addr);
    w.call("irn_subscribe", json!({ "topic": t }));
    assert_eq!(next_message(&mut w), "m2", "still after m1");
    nothing_more(&mut w);
}
