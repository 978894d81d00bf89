//! JSON-RPC over HTTP, `POST /rpc`, through the real binary (issue 47, DECISIONS 13,
//! relay-api.md (c)): the relay-auth JWT in the query or as a Bearer token, without `exp`
//! and with the relay's https origin as its audience; 401, 403, 400 and 413 refusals; a
//! publish over HTTP delivered to a WebSocket subscriber byte for byte and fetched over
//! HTTP; two requests (pipelined too) on one keep-alive connection; every `irn_`/`wc_`
//! method; and the per-client limits applying to HTTP requests as to a socket's.

mod common;

use common::http::{HttpConn, Resp};
use common::jwt::{now_s, Client};
use common::raw_ws::{rpc_request, RawWs};
use common::v1::client_frame;
use common::{topic, Server, TempDir};
use std::io::Write as _;

use serde_json::{json, Value};

/// A `POST /rpc` request (HTTP/1.1, keep-alive) with the query `query`, extra header lines
/// `extra` (each ending in CRLF) and `body`.
fn post(query: &str, extra: &str, body: &str) -> String {
    format!(
        "POST /rpc?{query} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         {extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// One request on a fresh connection.
fn rpc(s: &Server, query: &str, extra: &str, body: &str) -> Resp {
    s.request(&post(query, extra, body))
}

/// `client`'s request `method(params)` with id 1, its token (no `exp`) in the query.
fn call(s: &Server, client: &Client, method: &str, params: Value) -> Value {
    let q = format!("projectId=p1&auth={}", http_token(client));
    let r = rpc(s, &q, "", &rpc_request(1, method, params));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("Content-Type"),
        Some("application/json; charset=utf-8")
    );
    r.json()
}

/// What `relay_client`'s HTTP client sends: audience the relay's http origin, no `exp`.
fn http_token(client: &Client) -> String {
    client.token_for("http://relay", now_s(), None)
}

fn publish_params(t: &str, message: &str) -> Value {
    json!({"topic": t, "message": message, "ttl": 300, "tag": 1108, "prompt": true})
}

#[test]
fn a_publish_over_http_reaches_a_websocket_subscriber_and_a_fetch_over_http_returns_it() {
    common::each_server(&[], |s| {
        let t = topic();
        let mut sub = RawWs::open(s);
        sub.send_text(&rpc_request(1, "irn_subscribe", json!({ "topic": t })));
        let id = sub.recv_json()["result"].as_str().unwrap().to_string();
        let publisher = Client::new();
        let q = format!("projectId=p1&auth={}", http_token(&publisher));
        let body = rpc_request(9, "irn_publish", publish_params(&t, "over \"http\""));
        let r = rpc(s, &q, "", &body);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body_str(), r#"{"id":9,"jsonrpc":"2.0","result":true}"#);
        let push = String::from_utf8(sub.frame().payload).unwrap();
        let v: Value = serde_json::from_str(&push).unwrap();
        let want = format!(
            r#"{{"id":{},"jsonrpc":"2.0","method":"irn_subscription","params":{{"id":"{id}","data":{{"topic":"{t}","message":"over \"http\"","publishedAt":{},"tag":1108}}}}}}"#,
            v["id"], v["params"]["data"]["publishedAt"]
        );
        assert_eq!(push, want);
        // Fetched over HTTP by another client: the topic's stored messages.
        let reader = Client::new();
        let f = call(s, &reader, "irn_fetchMessages", json!({ "topic": t }));
        let messages = f["result"]["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 1, "{f}");
        assert_eq!(messages[0]["message"], "over \"http\"");
        assert_eq!(f["result"]["hasMore"], false);
        let f = call(
            s,
            &reader,
            "irn_batchFetchMessages",
            json!({ "topics": [t] }),
        );
        assert_eq!(f["result"]["messages"].as_array().unwrap().len(), 1, "{f}");
    });
}

#[test]
fn the_token_goes_in_the_query_or_as_bearer_may_lack_exp_and_name_the_https_origin() {
    let s = Server::start(&["--auth-audience", "wss://relay.example/ws"]);
    let client = Client::new();
    let t = topic();
    let body = rpc_request(2, "irn_subscribe", json!({ "topic": t }));
    let origin = client.token_for("https://relay.example", now_s(), None);
    let ws_url = client.token_for("wss://relay.example/ws", now_s(), Some(now_s() + 600));
    for (query, header) in [
        (format!("projectId=p1&auth={origin}"), String::new()),
        (
            "projectId=p1".to_string(),
            format!("Authorization: Bearer {origin}\r\n"),
        ),
        (format!("projectId=p1&auth={ws_url}"), String::new()),
    ] {
        let r = rpc(&s, &query, &header, &body);
        assert_eq!(r.status, 200, "{query} {header}: {r:?}");
        let v = r.json();
        assert_eq!(v["result"].as_str().map(str::len), Some(64), "{v}");
    }
    let other = client.token_for("https://elsewhere.example", now_s(), None);
    let r = rpc(&s, &format!("auth={other}"), "", &body);
    assert_eq!(r.status, 401, "{r:?}");
    // The WebSocket upgrade still wants an `exp`.
    let r = s.request(&common::raw_ws::upgrade_request(
        &format!("/?auth={origin}"),
        common::raw_ws::RFC_KEY,
        "",
    ));
    assert_eq!(r.status, 401, "{r:?}");
}

#[test]
fn refusals_401_403_400_and_413() {
    let s = Server::start(&["--project-ids", "p1", "--max-message", "2000"]);
    let client = Client::new();
    let good = rpc_request(1, "irn_subscribe", json!({ "topic": topic() }));
    let token = http_token(&client);
    let now = now_s();
    let expired = client.token(now - 7200, now - 3600);
    let mut forged = token.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    for (query, why) in [
        ("projectId=p1".to_string(), "missing"),
        (format!("projectId=p1&auth={forged}"), "bad signature"),
        (format!("projectId=p1&auth={expired}"), "expired"),
        ("projectId=p1&auth=not.a.jwt".to_string(), "garbage"),
    ] {
        let r = rpc(&s, &query, "", &good);
        assert_eq!(r.status, 401, "{why}: {r:?}");
    }
    for query in [
        format!("projectId=p2&auth={token}"),
        format!("auth={token}"),
    ] {
        assert_eq!(rpc(&s, &query, "", &good).status, 403, "{query}");
    }
    let q = format!("projectId=p1&auth={token}");
    assert_eq!(rpc(&s, &q, "", &good).status, 200);
    let t = topic();
    for body in [
        format!("[{good}]"),
        "not json".to_string(),
        client_frame(&t, "pub", "x", None),
        r#"{"id":1,"jsonrpc":"2.0","result":true}"#.to_string(),
        r#"{"id":1,"method":"irn_subscribe"}"#.to_string(),
    ] {
        let r = rpc(&s, &q, "", &body);
        assert_eq!(r.status, 400, "{body}: {r:?}");
        assert!(r.json()["error"]["code"].is_i64(), "{r:?}");
    }
    // One request at most `--max-message` bytes, as on a socket.
    let long = publish_params(&t, &"a".repeat(2100));
    let r = rpc(&s, &q, "", &rpc_request(1, "irn_publish", long));
    assert_eq!(r.status, 413, "{r:?}");
    let near = publish_params(&t, &"a".repeat(1800));
    let r = rpc(&s, &q, "", &rpc_request(1, "irn_publish", near));
    assert_eq!(r.json()["result"], true, "{r:?}");
    let r = s.request("GET /rpc HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 405, "{r:?}");
}

#[test]
fn two_requests_on_one_keep_alive_connection_also_pipelined() {
    for threads in common::THREADS {
        // In memory, and durable (each publish answered once its record is written).
        let dir = TempDir::new("http-rpc");
        let args = ["--threads", threads, "--data-dir", dir.arg()];
        for s in [Server::start(&args[..2]), Server::start(&args)] {
            keep_alive(&s);
        }
    }
}

fn keep_alive(s: &Server) {
    {
        let client = Client::new();
        let q = format!("projectId=p1&auth={}", http_token(&client));
        let t = topic();
        let mut c = HttpConn::open(s);
        c.send(
            post(
                &q,
                "",
                &rpc_request(1, "irn_publish", publish_params(&t, "a")),
            )
            .as_bytes(),
        );
        assert_eq!(c.response(false).json()["result"], true);
        c.send(
            post(
                &q,
                "",
                &rpc_request(2, "irn_publish", publish_params(&t, "b")),
            )
            .as_bytes(),
        );
        assert_eq!(c.response(false).json()["result"], true);
        let both = [
            post(
                &q,
                "",
                &rpc_request(3, "irn_publish", publish_params(&t, "c")),
            ),
            post(
                &q,
                "",
                &rpc_request(4, "irn_fetchMessages", json!({ "topic": t })),
            ),
        ]
        .concat();
        c.send(both.as_bytes());
        let first = c.response(false).json();
        assert_eq!(
            (first["id"].as_u64(), &first["result"]),
            (Some(3), &json!(true))
        );
        let fetched = c.response(false).json();
        assert_eq!(fetched["id"], 4, "{fetched}");
        // The connection's own publishes are not given back to it; another's fetch has all.
        let other = call(
            s,
            &Client::new(),
            "irn_fetchMessages",
            json!({ "topic": t }),
        );
        let got: Vec<&str> = other["result"]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["message"].as_str().unwrap())
            .collect();
        assert_eq!(got, ["a", "b", "c"]);
        c.expect_open_and_silent(100);
    }
}

#[test]
fn every_irn_and_wc_method_answers_over_http() {
    let s = Server::start(&["--threads", "2"]);
    let client = Client::new();
    let (t1, t2, t3) = (topic(), topic(), topic());
    let r = call(&s, &client, "irn_subscribe", json!({ "topic": t1 }));
    // The id the client computes itself: sha256(topic ‖ client id), hex.
    let mut d = ring::digest::Context::new(&ring::digest::SHA256);
    d.update(t1.as_bytes());
    d.update(client.id().as_bytes());
    let want: String = d
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(r["result"], want.as_str(), "{r}");
    let r = call(&s, &client, "irn_subscribeBlocking", json!({ "topic": t1 }));
    assert_eq!(r["result"].as_str().map(str::len), Some(64), "{r}");
    let r = call(
        &s,
        &client,
        "irn_batchSubscribe",
        json!({ "topics": [t1, t2] }),
    );
    assert_eq!(r["result"].as_array().map(Vec::len), Some(2), "{r}");
    let r = call(
        &s,
        &client,
        "irn_batchSubscribeBlocking",
        json!({ "topics": [t1, t2] }),
    );
    let each = r["result"].as_array().unwrap();
    assert!(each.iter().all(|e| e["id"].is_string()), "{r}");
    for (method, params) in [
        ("wc_createTopic", json!({ "topic": t3 })),
        ("irn_unsubscribe", json!({ "topic": t3 })),
        (
            "irn_batchUnsubscribe",
            json!({"subscriptions": [{ "topic": t2 }]}),
        ),
        ("irn_publish", publish_params(&t1, "m")),
        (
            "irn_batchReceive",
            json!({"receipts": [{"topic": t1, "message_id": 1_000_000_001u64}]}),
        ),
        (
            "wc_proposeSession",
            json!({"pairingTopic": t2, "sessionProposal": "p", "ttl": 300}),
        ),
        (
            "wc_approveSession",
            json!({"pairingTopic": t2, "sessionTopic": t3, "sessionProposalResponse": "r",
                   "sessionSettlementRequest": "s", "ttl": 300}),
        ),
    ] {
        let r = call(&s, &client, method, params);
        assert_eq!(r["result"], true, "{method}: {r}");
    }
    assert_eq!(s.metric("walletrelay_receipts_total"), 1.0);
    let r = call(&s, &client, "irn_nothing", json!({}));
    assert_eq!(r["error"]["code"], -32601, "{r}");
    // A notification is executed and answered with no body.
    let q = format!("projectId=p1&auth={}", http_token(&client));
    let note =
        json!({"jsonrpc": "2.0", "method": "irn_publish", "params": publish_params(&t1, "n")});
    let r = rpc(&s, &q, "", &note.to_string());
    assert_eq!(r.status, 204, "{r:?}");
}

#[test]
fn http_requests_count_against_the_client_s_limits() {
    let s = Server::start_limited(&[
        "--threads",
        "1",
        "--publish-rate",
        "0.001",
        "--publish-burst",
        "3",
    ]);
    let client = Client::new();
    let t = topic();
    // Each on a fresh connection: what counts is the client id and the address.
    for i in 0..3 {
        let r = call(
            &s,
            &client,
            "irn_publish",
            publish_params(&t, &format!("m{i}")),
        );
        assert_eq!(r["result"], true, "{r}");
    }
    let r = call(&s, &client, "irn_publish", publish_params(&t, "refused"));
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert_eq!(r["error"]["message"], "rate limited", "{r}");
    assert!(
        r["error"]["data"]["retryAfterMs"].as_u64().unwrap() > 0,
        "{r}"
    );
    assert_eq!(s.series("walletrelay_limited_total{kind=\"publish\"}"), 1.0);
}

#[test]
fn a_client_that_half_closes_still_gets_its_http_answer() {
    common::each_server(&[], |s| {
        let client = Client::new();
        let q = format!("projectId=p1&auth={}", http_token(&client));
        let t = topic();
        // A fetch's answer always waits for its read.
        let body = rpc_request(1, "irn_fetchMessages", json!({ "topic": t }));
        let mut c = HttpConn::open(s);
        c.send(post(&q, "", &body).as_bytes());
        c.s.shutdown(std::net::Shutdown::Write).unwrap();
        let r = c.response(false);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.json()["result"]["messages"], json!([]), "{r:?}");
        c.expect_closed();
    });
}

#[test]
fn over_tls_a_request_followed_by_close_notify_still_gets_its_answer() {
    let setup = common::tls::TlsSetup::new();
    let server = setup.start(&["--threads", "1"]);
    let client = Client::new();
    let q = format!("projectId=p1&auth={}", http_token(&client));
    let body = rpc_request(1, "irn_fetchMessages", json!({ "topic": topic() }));
    let mut s = server.tls(&setup.client());
    // The request and the close_notify in one flight: the server reads both at once.
    s.conn
        .writer()
        .write_all(post(&q, "", &body).as_bytes())
        .unwrap();
    s.conn.send_close_notify();
    while s.conn.wants_write() {
        s.conn.write_tls(&mut s.sock).unwrap();
    }
    let mut c = HttpConn::new(s);
    let r = c.response(false);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["result"]["messages"], json!([]), "{r:?}");
}

#[test]
fn on_a_redis_cluster_a_publish_over_http_reaches_a_subscriber_on_another_node() {
    let r = common::redis::RedisServer::start();
    let nodes = common::cluster::nodes(2, &[&r], &[]);
    let t = topic();
    let mut sub = RawWs::open(&nodes[0]);
    let ask = rpc_request(1, "irn_subscribeBlocking", json!({ "topic": t }));
    sub.send_text(&ask);
    assert!(sub.recv_json()["result"].is_string());
    let client = Client::new();
    let q = format!("projectId=p1&auth={}", http_token(&client));
    let body = rpc_request(2, "irn_publish", publish_params(&t, "across"));
    let r = rpc(&nodes[1], &q, "", &body);
    assert_eq!(r.body_str(), r#"{"id":2,"jsonrpc":"2.0","result":true}"#);
    let push = sub.recv_json();
    assert_eq!(push["params"]["data"]["message"], "across", "{push}");
    let f = call(
        &nodes[0],
        &Client::new(),
        "irn_fetchMessages",
        json!({ "topic": t }),
    );
    assert_eq!(f["result"]["messages"][0]["message"], "across", "{f}");
}
