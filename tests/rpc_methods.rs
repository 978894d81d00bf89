//! The methods of today's relay beyond the SDK's session flow, over a socket through the real
//! binary (issue 47, DECISIONS 13, relay-api.md (b)): `irn_unsubscribe {topic}` and
//! `irn_batchUnsubscribe` without ids, `irn_subscribeBlocking` answered before the
//! subscription's history, `irn_batchSubscribeBlocking`'s `[{id}|{error}]` in order,
//! `wc_createTopic`, and `irn_batchReceive`'s 1 to 500 receipts; each answer byte for byte
//! where relay-api.md pins its shape.

mod common;

use common::jwt::Client;
use common::raw_ws::{rpc_request, RawWs};
use common::redis::RedisServer;
use common::{cluster, topic, Server, TempDir};
use serde_json::{json, Value};

/// The next frame's text, exactly as the server wrote it.
fn text(ws: &mut RawWs) -> String {
    String::from_utf8(ws.frame().payload).expect("UTF-8 text")
}

/// Sends a request with id `id` and returns the answer's text.
fn exchange(ws: &mut RawWs, id: u64, method: &str, params: Value) -> String {
    ws.send_text(&rpc_request(id, method, params));
    text(ws)
}

/// A connection authenticated as `client` (its subscription ids are the ones it computes).
fn authed(s: &Server, client: &Client) -> RawWs {
    let path = format!("/?auth={}&projectId=p1", client.fresh_token());
    RawWs::upgrade_at(s.tcp(), &path, "")
}

/// The id an authenticated client computes for its subscription to `topic` (DECISIONS §10).
fn sub_id(topic: &str, client: &Client) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(topic.as_bytes());
    ctx.update(client.id().as_bytes());
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn publish(ws: &mut RawWs, id: u64, topic: &str, message: &str) {
    let p = json!({"topic": topic, "message": message, "ttl": 300, "tag": 1108});
    let r = exchange(ws, id, "irn_publish", p);
    assert_eq!(r, format!(r#"{{"id":{id},"jsonrpc":"2.0","result":true}}"#));
}

/// The next frame must be an `irn_subscription` push of `message`.
fn expect_push(ws: &mut RawWs, message: &str) {
    let m = ws.recv_json();
    assert_eq!(m["method"], "irn_subscription", "{m}");
    assert_eq!(m["params"]["data"]["message"], message, "{m}");
}

#[test]
fn unsubscribe_by_topic_alone_and_batch_unsubscribe_without_ids_stop_the_pushes() {
    common::each_server(&[], |s| {
        let (t1, t2, marker) = (topic(), topic(), topic());
        let mut sub = RawWs::open(s);
        for (i, t) in [&t1, &t2, &marker].into_iter().enumerate() {
            let r: Value = serde_json::from_str(&exchange(
                &mut sub,
                i as u64 + 1,
                "irn_subscribe",
                json!({ "topic": t }),
            ))
            .unwrap();
            assert!(r["result"].is_string(), "{r}");
        }
        let r = exchange(&mut sub, 10, "irn_unsubscribe", json!({ "topic": t1 }));
        assert_eq!(r, r#"{"id":10,"jsonrpc":"2.0","result":true}"#);
        let r = exchange(
            &mut sub,
            11,
            "irn_batchUnsubscribe",
            json!({"subscriptions": [{ "topic": t2 }]}),
        );
        assert_eq!(r, r#"{"id":11,"jsonrpc":"2.0","result":true}"#);
        // The beta prefix keeps its rule: an id is required there.
        let r: Value = serde_json::from_str(&exchange(
            &mut sub,
            12,
            "waku_unsubscribe",
            json!({ "topic": marker }),
        ))
        .unwrap();
        assert_eq!(r["error"]["code"], -32602, "{r}");
        let mut publisher = RawWs::open(s);
        publish(&mut publisher, 1, &t1, "gone-1");
        publish(&mut publisher, 2, &t2, "gone-2");
        publish(&mut publisher, 3, &marker, "marker");
        // Messages of one publisher reach a worker in order: the marker comes first only
        // when neither earlier one came at all.
        expect_push(&mut sub, "marker");
    });
}

#[test]
fn subscribe_blocking_answers_the_id_before_the_history() {
    for threads in common::THREADS {
        let dir = TempDir::new("subscribe-blocking");
        let durable = ["--threads", threads, "--data-dir", dir.arg()];
        for args in [&durable[..2], &durable[..]] {
            let s = Server::start(args);
            let t = topic();
            let client = Client::new();
            let mut publisher = RawWs::open(&s);
            publish(&mut publisher, 1, &t, "before");
            let mut sub = authed(&s, &client);
            let r = exchange(&mut sub, 7, "irn_subscribeBlocking", json!({ "topic": t }));
            let id = sub_id(&t, &client);
            assert_eq!(r, format!(r#"{{"id":7,"jsonrpc":"2.0","result":"{id}"}}"#));
            expect_push(&mut sub, "before");
            // In place: what is published now reaches it.
            publish(&mut publisher, 2, &t, "after");
            expect_push(&mut sub, "after");
            // Again on the same topic: the same id.
            let r = exchange(
                &mut sub,
                8,
                "iridium_subscribeBlocking",
                json!({ "topic": t }),
            );
            assert_eq!(r, format!(r#"{{"id":8,"jsonrpc":"2.0","result":"{id}"}}"#));
        }
    }
}

#[test]
fn batch_subscribe_blocking_answers_an_id_or_an_error_per_topic_in_order() {
    common::each_server(&["--max-subscriptions", "2"], |s| {
        let client = Client::new();
        let mut ws = authed(s, &client);
        let topics = [topic(), topic(), topic()];
        let r = exchange(
            &mut ws,
            3,
            "irn_batchSubscribeBlocking",
            json!({ "topics": topics }),
        );
        let (a, b) = (sub_id(&topics[0], &client), sub_id(&topics[1], &client));
        let want = format!(
            r#"{{"id":3,"jsonrpc":"2.0","result":[{{"id":"{a}"}},{{"id":"{b}"}},{{"error":{{"code":-32000,"message":"Subscription limit reached (2 per connection)","data":"SubscriberLimitExceeded"}}}}]}}"#
        );
        assert_eq!(r, want);
        // Both subscriptions are in place.
        let mut publisher = RawWs::open(s);
        publish(&mut publisher, 1, &topics[1], "second");
        expect_push(&mut ws, "second");
    });
}

#[test]
fn create_topic_subscribes_the_caller() {
    common::each_server(&[], |s| {
        let t = topic();
        let mut ws = RawWs::open(s);
        let r = exchange(&mut ws, 4, "wc_createTopic", json!({ "topic": t }));
        assert_eq!(r, r#"{"id":4,"jsonrpc":"2.0","result":true}"#);
        let mut publisher = RawWs::open(s);
        publish(&mut publisher, 1, &t, "hello");
        expect_push(&mut ws, "hello");
        let r: Value = serde_json::from_str(&exchange(
            &mut ws,
            5,
            "wc_createTopic",
            json!({ "topic": "short" }),
        ))
        .unwrap();
        assert_eq!(r["error"]["code"], -32602, "{r}");
    });
}

#[test]
fn batch_receive_takes_1_to_500_receipts() {
    let s = Server::start(&["--threads", "2"]);
    let t = topic();
    let mut ws = RawWs::open(&s);
    let receipts = json!({"receipts": [
        {"topic": t, "message_id": 1_700_000_000_000_000u64},
        {"topic": t, "messageId": 1_700_000_000_000_001u64},
        {"topic": t, "message_id": "1700000000000000002"}
    ]});
    let r = exchange(&mut ws, 1, "irn_batchReceive", receipts);
    assert_eq!(r, r#"{"id":1,"jsonrpc":"2.0","result":true}"#);
    assert_eq!(s.metric("walletrelay_receipts_total"), 3.0);
    let r = exchange(&mut ws, 2, "irn_batchReceive", json!({"receipts": []}));
    assert_eq!(
        r,
        r#"{"id":2,"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid payload: Batch is empty","data":"BatchEmpty"}}"#
    );
    let many: Vec<Value> = (0..501)
        .map(|i| json!({"topic": t, "message_id": 1_000_000_000u64 + i}))
        .collect();
    let r = exchange(&mut ws, 3, "irn_batchReceive", json!({ "receipts": many }));
    assert_eq!(
        r,
        r#"{"id":3,"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid payload: Batch size limit exceeded","data":"BatchLimitExceeded"}}"#
    );
    let five_hundred = json!({ "receipts": many[..500] });
    let r = exchange(&mut ws, 4, "irn_batchReceive", five_hundred);
    assert_eq!(r, r#"{"id":4,"jsonrpc":"2.0","result":true}"#);
    for bad in [
        json!({"receipts": [{"topic": "x", "message_id": 1}]}),
        json!({"receipts": [{"topic": t}]}),
        json!({"receipts": [{"topic": t, "message_id": -1}]}),
        json!({"receipts": "no"}),
    ] {
        let r: Value =
            serde_json::from_str(&exchange(&mut ws, 5, "irn_batchReceive", bad)).unwrap();
        assert_eq!(r["error"]["code"], -32602, "{r}");
    }
    assert_eq!(s.metric("walletrelay_receipts_total"), 503.0);
    // Not a method of the beta prefix.
    let r: Value =
        serde_json::from_str(&exchange(&mut ws, 6, "waku_batchReceive", json!({}))).unwrap();
    assert_eq!(r["error"]["code"], -32601, "{r}");
}

#[test]
fn subscribe_blocking_on_redis_answers_once_the_node_has_subscribed() {
    let r = RedisServer::start();
    let nodes = cluster::nodes(2, &[&r], &[]);
    for i in 0..10 {
        let t = topic();
        let mut sub = RawWs::open(&nodes[0]);
        let ans: Value = serde_json::from_str(&exchange(
            &mut sub,
            1,
            "irn_subscribeBlocking",
            json!({ "topic": t }),
        ))
        .unwrap();
        assert!(ans["result"].is_string(), "{ans}");
        // Answered only once the node's SUBSCRIBE was confirmed.
        assert!(
            cluster::channel_subscribers(&r, &t) >= 1,
            "#{i}: answered before the node subscribed"
        );
        let mut publisher = RawWs::open(&nodes[1]);
        publish(&mut publisher, 1, &t, "across");
        expect_push(&mut sub, "across");
    }
}
