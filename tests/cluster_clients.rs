//! Subscriptions that belong to the client id on Redis (DECISIONS 13), through real nodes on
//! real `redis-server`s, on a standalone shard and on a 3+3 Redis Cluster (the mailbox on a
//! Sentinel group too): a client id subscribes on node A, its socket closes, a message is
//! published on node B; the client comes back on B (fetch) or A (subscribe) and gets it
//! exactly once; an explicit unsubscribe ends its subscription; `--max-mailbox-topics`
//! counts its topics over the nodes. A watch registered on node A hears of a message
//! published on node B exactly once (`accepted`, `queued`; the event JWT verifies against
//! `GET /public-key`), and a `prompt` message is pushed once in the cluster to the client
//! with no socket. Receipts (`irn_batchReceive`) and subscriptions over HTTP (`POST /rpc`,
//! no socket) likewise; a node killed with its socket open stops counting once its
//! liveness key is stale; the SDK's reconnect flows on Redis.

mod common;

use std::time::Duration;

use common::cluster::{nodes_args, publish_raw};
use common::jwt::Signer;
use common::push_server::PushServer;
use common::redis_topo::{key_slot, RedisKind, RedisSetup, Topology};
use common::webhook::{Receiver, Reply};
use common::ws::Ws;
use common::{relay_id, topic, Server};
use serde_json::{json, Value};

/// A WebSocket to `s` as client `c` (project `p`).
fn connect(c: &Signer, s: &Server) -> Ws {
    let now = common::jwt::now_s();
    let url = format!(
        "ws://{}/?auth={}&projectId=p",
        s.addr,
        c.token(now, now + 3600)
    );
    Ws::handshake(common::tcp_to(s.addr), &url)
}

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

fn fetch(ws: &mut Ws, topic: &str) -> Vec<String> {
    let r = ws.call("irn_fetchMessages", json!({ "topic": topic }));
    r["result"]["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no messages: {r}"))
        .iter()
        .map(|m| m["message"].as_str().unwrap().to_string())
        .collect()
}

/// Closes `ws` and waits until `s` let its connection go.
fn close(s: &Server, ws: Ws, open_after: f64) {
    drop(ws);
    let n = s.wait_metric(
        "walletrelay_websockets_open",
        Duration::from_secs(10),
        |v| v <= open_after,
    );
    assert!(n <= open_after, "the connection is still open ({n})");
}

/// `client`'s record in `t`'s clients hash (`cluster::clients`), as Redis holds it.
fn record(setup: &RedisSetup, t: &str, client: &str) -> Option<String> {
    let (mut conn, key) = match &setup.shards[0] {
        Topology::Standalone(r) => (r.conn(), format!("wr:c:{t}")),
        Topology::Sentinel(g) => (
            common::redis_topo::conn(g.primary_port()),
            format!("wr:c:{t}"),
        ),
        Topology::Cluster(c) => (
            c.conn(c.slot_owner(key_slot(t.as_bytes()))),
            format!("wr:c:{{{t}}}"),
        ),
        _ => panic!("standalone, sentinel and cluster only"),
    };
    redis::cmd("HGET")
        .arg(key)
        .arg(client)
        .query(&mut conn)
        .ok()?
}

/// Waits until a socket's close reached Redis (the node sends it there before the
/// connection counts as closed, but another node may be faster): the client's mailbox
/// runs, or `gone` (it has none).
fn close_reached_redis(setup: &RedisSetup, t: &str, client: &str, gone: bool) {
    let reached = common::wait::poll(Duration::from_secs(10), || {
        let r = record(setup, t, client);
        let ok = match (&r, gone) {
            (None, true) => true,
            (Some(v), false) => !v.starts_with("0|"),
            _ => false,
        };
        ok.then_some(())
    });
    assert!(reached.is_some(), "{:?}", record(setup, t, client));
}

fn nothing_more(ws: &mut Ws) {
    if let Some(m) = ws.recv_within(500) {
        panic!("unexpected: {m}");
    }
}

/// The mailbox behaviours across two nodes of one cluster.
fn across_nodes(setup: &RedisSetup) {
    let args = setup.redis_args();
    let n = nodes_args(2, &args, &["--max-mailbox-topics", "3"]);
    let (a, b) = (&n[0], &n[1]);
    let wallet = Signer::random();
    let t = topic();
    let mut dapp = b.ws();
    let mut w = connect(&wallet, a);
    w.call("irn_subscribe", json!({ "topic": t }));
    publish(&mut dapp, &t, "m1");
    assert_eq!(next_message(&mut w), "m1");
    close(a, w, 0.0);
    let me = wallet.did();
    close_reached_redis(setup, &t, &me, false);
    publish(&mut dapp, &t, "m2");
    // Back on B: fetched once, not pushed again.
    let mut w = connect(&wallet, b);
    assert_eq!(fetch(&mut w, &t), ["m2"], "only what it missed");
    assert_eq!(fetch(&mut w, &t), Vec::<String>::new(), "once");
    w.call("irn_batchSubscribe", json!({ "topics": [t] }));
    nothing_more(&mut w);
    publish(&mut dapp, &t, "m3");
    assert_eq!(next_message(&mut w), "m3");
    close(b, w, 1.0);
    close_reached_redis(setup, &t, &me, false);
    // Away again; back on A by subscribing.
    publish(&mut dapp, &t, "m4");
    let mut w = connect(&wallet, a);
    w.call("irn_subscribe", json!({ "topic": t }));
    assert_eq!(next_message(&mut w), "m4");
    nothing_more(&mut w);
    // An explicit unsubscribe ends it: its next fetch reads the topic from its start.
    let r = w.call("irn_unsubscribe", json!({ "topic": t }));
    assert_eq!(r["result"], true, "{r}");
    close(a, w, 0.0);
    close_reached_redis(setup, &t, &me, true);
    publish(&mut dapp, &t, "m5");
    let mut w = connect(&wallet, b);
    assert_eq!(fetch(&mut w, &t).first().map(String::as_str), Some("m1"));
    // --max-mailbox-topics over the nodes: three topics on A, then B refuses more.
    let mut on_a = connect(&wallet, a);
    let kept: Vec<String> = (0..3).map(|_| topic()).collect();
    for k in &kept {
        let r = on_a.call("irn_subscribe", json!({ "topic": k }));
        assert!(r["result"].is_string(), "{r}");
    }
    let refused = common::wait::poll(Duration::from_secs(10), || {
        let r = w.call("irn_subscribe", json!({ "topic": topic() }));
        (r["error"]["code"] == -32000).then_some(r)
    });
    assert!(refused.is_some(), "B never refused a fourth topic");
    // The node answers a subscription before the cluster's count has ruled on it: the
    // topics B took in the loop above count on B until their refusals come back from
    // Redis, so a topic the client keeps is admitted once they have (not always at once).
    let mut last = Value::Null;
    let kept_again = common::wait::poll(Duration::from_secs(10), || {
        last = w.call("irn_subscribe", json!({ "topic": kept[0] }));
        last["result"].is_string().then_some(())
    });
    assert!(
        kept_again.is_some(),
        "a topic it keeps is not one more: {last}"
    );
    // The cluster's count holds the three topics made on A, not the one B took back.
    let key = match &setup.shards[0] {
        Topology::Cluster(_) => format!("wr:mb:{{{me}}}"),
        _ => format!("wr:mb:{me}"),
    };
    let kept: i64 = match &setup.shards[0] {
        Topology::Standalone(r) => redis::cmd("ZCARD").arg(&key).query(&mut r.conn()),
        Topology::Sentinel(g) => {
            let mut c = common::redis_topo::conn(g.primary_port());
            redis::cmd("ZCARD").arg(&key).query(&mut c)
        }
        Topology::Cluster(c) => {
            let port = c.slot_owner(key_slot(me.as_bytes()));
            redis::cmd("ZCARD").arg(&key).query(&mut c.conn(port))
        }
        _ => panic!("standalone, sentinel and cluster only"),
    }
    .unwrap();
    assert_eq!(kept, 3);
}

/// `client`'s request `method(params)` over `POST /rpc` on `s`.
fn http_call(s: &Server, client: &Signer, method: &str, params: Value) -> Value {
    let token = client.token_for("http://relay", common::jwt::now_s(), None);
    let body = common::raw_ws::rpc_request(1, method, params);
    let req = format!(
        "POST /rpc?projectId=p&auth={token} HTTP/1.1\r\nHost: x\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = s.request(&req);
    assert_eq!(r.status, 200, "{r:?}");
    r.json()
}

fn messages(r: &Value) -> Vec<String> {
    r["result"]["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no messages: {r}"))
        .iter()
        .map(|m| m["message"].as_str().unwrap().to_string())
        .collect()
}

/// A subscription over HTTP on A (no socket) keeps a mailbox, fetched once by the client
/// on B (over a WebSocket: over HTTP a fetch reads the topic, `conn/fetch.rs`); a receipt
/// sent on A
/// keeps a message the socket never acknowledged from being fetched on B.
fn receipts_and_http(setup: &RedisSetup) {
    let args = setup.redis_args();
    let n = nodes_args(2, &args, &[]);
    let (a, b) = (&n[0], &n[1]);
    let mut dapp = b.ws();
    // Over HTTP: no socket, a mailbox from the start.
    let svc = Signer::random();
    let t = topic();
    let r = http_call(a, &svc, "irn_subscribe", json!({ "topic": t }));
    assert!(r["result"].is_string(), "{r}");
    publish(&mut dapp, &t, "h1");
    publish(&mut dapp, &t, "h2");
    let mut on_b = connect(&svc, b);
    assert_eq!(fetch(&mut on_b, &t), ["h1", "h2"]);
    assert_eq!(fetch(&mut on_b, &t), Vec::<String>::new(), "once");
    drop(on_b);
    // Receipts: m2 pushed on A and not acknowledged, but received.
    let wallet = Signer::random();
    let t2 = topic();
    let mut w = connect(&wallet, a);
    w.call("irn_subscribe", json!({ "topic": t2 }));
    publish(&mut dapp, &t2, "m1");
    assert_eq!(next_message(&mut w), "m1");
    publish(&mut dapp, &t2, "m2");
    let m = w.recv();
    assert_eq!(m["params"]["data"]["message"], "m2", "{m}");
    let r = w.call(
        "irn_batchReceive",
        json!({"receipts": [{"topic": t2, "message_id": m["id"]}]}),
    );
    assert_eq!(r["result"], true, "{r}");
    close(a, w, 0.0);
    close_reached_redis(setup, &t2, &wallet.did(), false);
    publish(&mut dapp, &t2, "m3");
    let mut w = connect(&wallet, b);
    let r = w.call("irn_fetchMessages", json!({ "topic": t2 }));
    assert_eq!(messages(&r), ["m3"], "m2 was received");
}

#[test]
fn receipts_and_http_subscriptions_across_nodes_on_a_standalone_shard() {
    receipts_and_http(&RedisSetup::start(RedisKind::Standalone));
}

#[test]
fn receipts_and_http_subscriptions_across_nodes_on_a_redis_cluster() {
    receipts_and_http(&RedisSetup::start(RedisKind::Cluster));
}

#[test]
fn a_client_s_mailbox_works_across_nodes_on_a_standalone_shard() {
    across_nodes(&RedisSetup::start(RedisKind::Standalone));
}

#[test]
fn a_client_s_mailbox_works_across_nodes_on_a_redis_cluster() {
    across_nodes(&RedisSetup::start(RedisKind::Cluster));
}

#[test]
fn a_client_s_mailbox_works_across_nodes_on_a_sentinel_group() {
    across_nodes(&RedisSetup::start(RedisKind::Sentinel));
}

/// The events a receiver got for `client`, as (status, claims), checked against `key`.
fn events(hooks: &Receiver, key: &str, within: Duration) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    while let Some(seen) = hooks.next(within) {
        let body: Value = serde_json::from_slice(&seen.body).unwrap();
        for jwt in body["eventAuth"].as_array().unwrap() {
            let c = relay_id::verify_jwt(jwt.as_str().unwrap(), key)
                .unwrap_or_else(|e| panic!("event JWT: {e}"));
            let status = c["evt"]["status"].as_str().unwrap_or("").to_string();
            out.push((status, c));
        }
    }
    out
}

/// A watch on A, the message published on B: one `accepted` and one `queued`; a push once.
fn watch_and_push(setup: &RedisSetup) {
    let hooks = Receiver::start(|_| Reply::Status(204));
    let push = PushServer::start();
    let args = setup.redis_args();
    let purl = push.url();
    let n = nodes_args(2, &args, &["--push-url", &purl]);
    let (a, b) = (&n[0], &n[1]);
    let key = relay_id::public_key_hex(a);
    assert_eq!(relay_id::public_key_hex(b), key, "one identity per cluster");
    push.set_relay_public_key(&key);
    let wallet = Signer::random();
    push.register(&wallet.did(), "noop", "token", true);
    let whu = hooks.url("/hook");
    let t0 = common::watch::now();
    let claims = json!({
        "iss": wallet.did(), "aud": "https://relay.walletconnect.com",
        "sub": "https://notify.example/", "iat": t0, "exp": t0 + 24 * 3600,
        "act": "irn_watchRegister", "typ": "subscriber", "whu": whu,
        "tag": [1100], "sts": ["accepted", "queued"],
    });
    let mut svc = a.ws();
    let r = svc.call(
        "irn_watchRegister",
        json!({ "registerAuth": wallet.sign(&claims) }),
    );
    assert!(r["error"].is_null(), "{r}");
    let t = topic();
    let mut w = connect(&wallet, a);
    w.call("irn_subscribe", json!({ "topic": t }));
    close(a, w, 1.0);
    close_reached_redis(setup, &t, &wallet.did(), false);
    let mut dapp = b.ws();
    let r = dapp.call(
        "irn_publish",
        json!({"topic": t, "message": "hello", "ttl": 3600, "tag": 1100, "prompt": true}),
    );
    assert_eq!(r["result"], true, "{r}");
    let got = push.wait_push(&wallet.did(), Duration::from_secs(10));
    assert!(got.is_some(), "no push");
    let evs = events(&hooks, &key, Duration::from_secs(3));
    let count = |s: &str| evs.iter().filter(|(st, _)| st == s).count();
    assert_eq!((count("accepted"), count("queued")), (1, 1), "{evs:?}");
    let pushes: Vec<_> = push
        .pushes()
        .into_iter()
        .filter(|p| wallet.did().ends_with(&p.client_id))
        .collect();
    assert_eq!(pushes.len(), 1, "one push in the cluster: {pushes:?}");
    // With a socket subscribed (on either node): accepted only, no push.
    let mut w = connect(&wallet, b);
    w.call("irn_subscribe", json!({ "topic": t }));
    assert_eq!(next_message(&mut w), "hello");
    let r = publish_raw(&mut dapp, &t, "again", Some(true));
    assert_eq!(r["result"], true, "{r}");
    assert_eq!(next_message(&mut w), "again");
    let evs = events(&hooks, &key, Duration::from_secs(3));
    assert!(evs.iter().all(|(s, _)| s != "queued"), "{evs:?}");
    assert_eq!(
        push.pushes()
            .iter()
            .filter(|p| wallet.did().ends_with(&p.client_id))
            .count(),
        1
    );
}

#[test]
fn a_watch_and_a_push_across_nodes_on_a_standalone_shard() {
    watch_and_push(&RedisSetup::start(RedisKind::Standalone));
}

#[test]
fn a_watch_and_a_push_across_nodes_on_a_redis_cluster() {
    watch_and_push(&RedisSetup::start(RedisKind::Cluster));
}

/// A connection to the Redis server holding `t`'s keys, and how its keys name `t`.
fn topic_conn(setup: &RedisSetup, t: &str) -> (redis::Connection, String) {
    match &setup.shards[0] {
        Topology::Standalone(r) => (r.conn(), t.to_string()),
        Topology::Cluster(c) => (
            c.conn(c.slot_owner(key_slot(t.as_bytes()))),
            format!("{{{t}}}"),
        ),
        _ => panic!("standalone and cluster only"),
    }
}

/// A node killed with its socket open (no close sent): once its liveness key is stale, a
/// message published on another node is `queued` for the client and pushed, once.
fn crashed_node(setup: &RedisSetup) {
    let hooks = Receiver::start(|_| Reply::Status(204));
    let push = PushServer::start();
    let purl = push.url();
    let mut n = nodes_args(2, &setup.redis_args(), &["--push-url", &purl]);
    let key = relay_id::public_key_hex(&n[1]);
    push.set_relay_public_key(&key);
    let wallet = Signer::random();
    push.register(&wallet.did(), "noop", "token", true);
    let t0 = common::watch::now();
    let claims = json!({
        "iss": wallet.did(), "aud": "https://relay.walletconnect.com",
        "sub": "https://notify.example/", "iat": t0, "exp": t0 + 24 * 3600,
        "act": "irn_watchRegister", "typ": "subscriber", "whu": hooks.url("/hook"),
        "tag": [1100], "sts": ["accepted", "queued"],
    });
    let r = n[1].ws().call(
        "irn_watchRegister",
        json!({ "registerAuth": wallet.sign(&claims) }),
    );
    assert!(r["error"].is_null(), "{r}");
    let t = topic();
    let mut w = connect(&wallet, &n[0]);
    w.call("irn_subscribe", json!({ "topic": t }));
    // The record names node A's sockets: `...|<node hex>:<worker>=1|p`.
    let rec = common::wait::poll(Duration::from_secs(10), || {
        record(setup, &t, &wallet.did()).filter(|r| r.contains("=1|"))
    })
    .expect("no record of the socket");
    let node = rec
        .rsplit('|')
        .nth(1)
        .unwrap()
        .split([':', '='])
        .next()
        .unwrap()
        .to_string();
    drop(n.remove(0)); // SIGKILL: its socket never closes properly
                       // Wait until A's liveness key in the topic's slot was not refreshed for 4 s.
    let (mut conn, tag) = topic_conn(setup, &t);
    let alive_key = match tag.starts_with('{') {
        false => format!("wr:node:{node}"),
        true => {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("wr:node:{node}:*"))
                .query(&mut conn)
                .unwrap();
            keys.into_iter()
                .find(|k| key_slot(k.as_bytes()) == key_slot(t.as_bytes()))
                .expect("no liveness key in the topic's slot")
        }
    };
    let stale = common::wait::poll(Duration::from_secs(20), || {
        let ms: i64 = redis::cmd("PTTL").arg(&alive_key).query(&mut conn).unwrap();
        (ms < 56_000).then_some(())
    });
    assert!(stale.is_some(), "node A's key is still refreshed");
    let mut dapp = n[0].ws();
    let r = dapp.call(
        "irn_publish",
        json!({"topic": t, "message": "wake", "ttl": 3600, "tag": 1100, "prompt": true}),
    );
    assert_eq!(r["result"], true, "{r}");
    assert!(push
        .wait_push(&wallet.did(), Duration::from_secs(10))
        .is_some());
    let evs = events(&hooks, &key, Duration::from_secs(3));
    let count = |s: &str| evs.iter().filter(|(st, _)| st == s).count();
    assert_eq!((count("accepted"), count("queued")), (1, 1), "{evs:?}");
    assert_eq!(push.pushes().len(), 1);
}

#[test]
fn a_crashed_node_s_sockets_stop_counting_on_a_standalone_shard() {
    crashed_node(&RedisSetup::start(RedisKind::Standalone));
}

#[test]
fn a_crashed_node_s_sockets_stop_counting_on_a_redis_cluster() {
    crashed_node(&RedisSetup::start(RedisKind::Cluster));
}

/// A socket closed while Redis is away: the close does not reach Redis then, and the
/// node sends its count again once Redis is back (no socket left behind for good).
#[test]
fn a_close_while_redis_is_away_is_made_good_when_it_is_back() {
    let mut r = common::redis::RedisServer::start_persistent();
    let n = nodes_args(1, &["--redis".to_string(), r.url()], &[]);
    let wallet = Signer::random();
    let t = topic();
    let hget = |r: &common::redis::RedisServer| -> Option<String> {
        redis::cmd("HGET")
            .arg(format!("wr:c:{t}"))
            .arg(wallet.did())
            .query(&mut r.conn())
            .ok()?
    };
    let mut w = connect(&wallet, &n[0]);
    w.call("irn_subscribe", json!({ "topic": t }));
    let held = common::wait::poll(Duration::from_secs(10), || {
        hget(&r).filter(|v| v.contains("=1|"))
    });
    assert!(held.is_some(), "no socket counted");
    r.kill();
    let down = common::wait::poll(Duration::from_secs(20), || {
        (common::cluster::health(&n[0]) == 503).then_some(())
    });
    assert!(down.is_some(), "the node never saw Redis go");
    close(&n[0], w, 0.0);
    r.restart();
    let made_good = common::wait::poll(Duration::from_secs(20), || {
        hget(&r).filter(|v| !v.starts_with("0|") && !v.contains("=1|"))
    });
    assert!(
        made_good.is_some(),
        "the socket is still counted: {:?}",
        hget(&r)
    );
}

/// The SDK's own reconnect flows (`tests/e2e-sdk/push.mjs`: 2.17.1's `batchFetchMessages`
/// then `batchSubscribe`, 2.25.0's `batchSubscribe`) against a node on Redis: each message
/// once. Needs Node.js and npm (as `sdk_push.rs`).
fn sdk_reconnect_on_redis(version: &str) {
    common::node::ensure_node_modules("e2e-sdk", "sign-client-2.17.1");
    let setup = RedisSetup::start(RedisKind::Standalone);
    let n = nodes_args(1, &setup.redis_args(), &[]);
    let relay = format!("ws://{}", n[0].addr);
    let scenario = format!("reconnect-{version}");
    common::node::run_script(
        "e2e-sdk",
        "push.mjs",
        &[
            ("SCENARIO", scenario.as_str()),
            ("RELAY_URL", relay.as_str()),
        ],
        Duration::from_secs(180),
        &format!("SCENARIO={scenario} on Redis, relay {relay}"),
    );
}

#[test]
fn sdk_2_25_0_wallet_gets_each_message_once_on_redis() {
    sdk_reconnect_on_redis("2.25.0");
}

#[test]
fn sdk_2_17_1_wallet_gets_each_message_once_on_redis() {
    sdk_reconnect_on_redis("2.17.1");
}

/// A cluster still on layout 4 (a rolling upgrade: docs/UPGRADING.md): a layout-4 node's
/// publish that starts a new epoch drops the meta's field `c` (it knows no client ids), so a
/// node of this build looks for the clients hash itself while the cluster writes layout 4,
/// and the client id with no socket is still pushed and `queued`.
#[test]
fn a_client_is_still_pushed_after_a_layout_4_node_rewrote_the_topic_s_meta() {
    let setup = RedisSetup::start(RedisKind::Standalone);
    let Topology::Standalone(r) = &setup.shards[0] else {
        unreachable!()
    };
    let mut conn = r.conn();
    let _: () = redis::cmd("SET")
        .arg("wr:ring")
        .arg(format!("walletrelay-ring v4:127.0.0.1:{}/0", r.port))
        .query(&mut conn)
        .unwrap();
    let push = PushServer::start();
    let args = setup.redis_args();
    let purl = push.url();
    let n = nodes_args(2, &args, &["--push-url", &purl]);
    let (a, b) = (&n[0], &n[1]);
    let key = relay_id::public_key_hex(a);
    push.set_relay_public_key(&key);
    let wallet = Signer::random();
    push.register(&wallet.did(), "noop", "token", true);
    let t = topic();
    let mut w = connect(&wallet, a);
    w.call("irn_subscribe", json!({ "topic": t }));
    let mut dapp = b.ws();
    publish(&mut dapp, &t, "m1");
    assert_eq!(next_message(&mut w), "m1");
    close(a, w, 1.0);
    close_reached_redis(&setup, &t, &wallet.did(), false);
    // What a layout-4 node's new epoch leaves: the meta without `c`.
    let meta = format!("wr:2:m:{t}");
    let _: i64 = redis::cmd("HDEL")
        .arg(&meta)
        .arg("c")
        .query(&mut conn)
        .unwrap();
    let r = publish_raw(&mut dapp, &t, "m2", Some(true));
    assert_eq!(r["result"], true, "{r}");
    let got = push.wait_push(&wallet.did(), Duration::from_secs(10));
    assert!(got.is_some(), "the client id with no socket was not pushed");
    let c: Option<String> = redis::cmd("HGET")
        .arg(&meta)
        .arg("c")
        .query(&mut conn)
        .unwrap();
    assert_eq!(c.as_deref(), Some("1"), "the meta's field c is mended");
}
