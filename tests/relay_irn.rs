//! Today's WalletConnect protocol through the real binary (DECISIONS §10): `irn_`, `waku_`
//! and `iridium_` as one API over one topic space, the `irn_subscription` shape with
//! `publishedAt`, `tag` and `attestation`, batch subscribe and unsubscribe, fetch with
//! `hasMore`, the two session methods, string ids echoed exactly, the `irn` limits; and
//! relay auth at the upgrade (401/403 before it, close 3000 after it when asked), the
//! client id's own subscription ids, `--require-auth`, `--project-ids`, and the stored
//! fields surviving a `kill -9` of the durable engine.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::durability::Node;
use common::jwt::Client;
use common::raw_ws::{upgrade_request, RFC_KEY};
use common::wait::wait_until;
use common::ws::Ws;
use common::TempDir;
use common::{topic, Server};
use serde_json::{json, Value};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Sends `req` (a JSON-RPC request with its own id) and returns the answer with that id.
fn call_raw(ws: &mut Ws, req: Value) -> Value {
    let id = req["id"].clone();
    ws.send(&req);
    let r = ws.recv();
    assert_eq!(r["id"], id, "answer to another request: {r}");
    r
}

fn push_of(ws: &mut Ws) -> Value {
    let m = ws.recv();
    assert!(m["method"].as_str().is_some(), "not a push: {m}");
    m
}

fn ws_at(server: &Server, query: &str) -> Ws {
    Ws::handshake(server.tcp(), &format!("ws://{}/?{query}", server.addr))
}

/// The raw HTTP answer to an upgrade at `/?{query}` with `extra` header lines.
fn upgrade_answer(server: &Server, query: &str, extra: &str) -> String {
    let req = upgrade_request(&format!("/?{query}"), RFC_KEY, extra);
    String::from_utf8_lossy(&server.raw_exchange(req.as_bytes())).into_owned()
}

#[test]
fn one_topic_space_under_three_prefixes_each_push_in_its_own_shape() {
    common::each_server(&[], |s| {
        let t = topic();
        let mut irn = s.ws();
        let mut waku = s.ws();
        let mut iridium = s.ws();
        let mut publisher = s.ws();
        let r = call_raw(
            &mut irn,
            json!({"id":"1234567890123456789","jsonrpc":"2.0","method":"irn_subscribe","params":{"topic":t}}),
        );
        assert_eq!(
            r["id"], "1234567890123456789",
            "a string id is echoed as it is"
        );
        let irn_id = r["result"].as_str().unwrap().to_string();
        waku.subscribe(&t);
        let r = iridium.call("iridium_subscribe", json!({ "topic": t }));
        assert!(r["result"].is_string(), "{r}");
        let before = now_ms();
        let r = publisher.call(
            "irn_publish",
            json!({"topic": t, "message": "m\"1", "ttl": 300, "tag": 1108, "prompt": true,
                   "attestation": "att", "correlationId": 7, "rpcMethods": ["x"]}),
        );
        assert_eq!(r["result"], true, "{r}");
        let m = push_of(&mut irn);
        assert_eq!(m["method"], "irn_subscription");
        assert_eq!(m["params"]["id"], irn_id.as_str());
        let d = &m["params"]["data"];
        assert_eq!((&d["topic"], &d["message"]), (&json!(t), &json!("m\"1")));
        assert_eq!(d["tag"], 1108);
        assert_eq!(d["attestation"], "att");
        let at = d["publishedAt"].as_u64().unwrap();
        assert!(
            at >= before && at <= now_ms(),
            "publishedAt {at} is the relay's clock"
        );
        assert!(
            m["id"].as_u64().unwrap() <= 1 << 53,
            "push ids stay at most 2^53"
        );
        // The beta shape, exactly: no member the beta client does not know.
        let w = push_of(&mut waku);
        assert_eq!(w["method"], "waku_subscription");
        assert_eq!(w["params"]["data"], json!({"topic": t, "message": "m\"1"}));
        let i = push_of(&mut iridium);
        assert_eq!(i["method"], "iridium_subscription");
        assert_eq!(i["params"]["data"], *d);
        // A waku publish reaches the irn subscription, with tag 0.
        publisher.publish(&t, "beta");
        let m = push_of(&mut irn);
        assert_eq!(m["params"]["data"]["message"], "beta");
        assert_eq!(m["params"]["data"]["tag"], 0);
        assert!(m["params"]["data"].get("attestation").is_none());
        // The same message again is a duplicate, whatever its tag.
        let r = publisher.call(
            "irn_publish",
            json!({"topic": t, "message": "beta", "ttl": 300, "tag": 5}),
        );
        assert_eq!(r["result"], true);
        assert!(
            irn.recv_within(300).is_none(),
            "a duplicate is not delivered"
        );
    });
}

#[test]
fn irn_params_are_checked_as_section_10_says() {
    let s = Server::start(&["--threads", "1"]);
    let mut c = s.ws();
    let t = topic();
    let err = |c: &mut Ws, method: &str, params: Value| {
        let r = c.call(method, params);
        assert_eq!(r["error"]["code"], -32602, "{method}: {r}");
        r["error"]["message"].as_str().unwrap().to_string()
    };
    assert!(err(&mut c, "irn_subscribe", json!({"topic": "short"})).contains("topic"));
    assert!(err(
        &mut c,
        "irn_publish",
        json!({"topic": t, "message": "m", "ttl": 9})
    )
    .contains("ttl"));
    assert!(err(
        &mut c,
        "irn_publish",
        json!({"topic": t, "message": "m", "ttl": 10, "tag": -1})
    )
    .contains("tag"));
    assert!(err(
        &mut c,
        "irn_publish",
        json!({"topic": t, "message": "m", "ttl": 10, "tag": 4294967296u64})
    )
    .contains("tag"));
    let big = "a".repeat(4097);
    assert!(err(
        &mut c,
        "irn_publish",
        json!({"topic": t, "message": "m", "ttl": 10, "attestation": big})
    )
    .contains("attestation"));
    assert!(err(&mut c, "irn_batchSubscribe", json!({"topics": []})).contains("topics"));
    let many: Vec<String> = (0..501).map(|_| topic()).collect();
    assert!(err(&mut c, "irn_batchSubscribe", json!({ "topics": many })).contains("topics"));
    // The beta keeps its own rules: short topics, 1 s ttls.
    let r = c.call(
        "waku_publish",
        json!({"topic": "short", "message": "m", "ttl": 1}),
    );
    assert_eq!(r["result"], true, "{r}");
    let r = c.call("irn_nope", json!({}));
    assert_eq!(r["error"]["code"], -32601);
}

#[test]
fn batch_subscribe_answers_ids_in_order_and_batch_unsubscribe_stops_pushes() {
    common::each_server(&[], |s| {
        let topics: Vec<String> = (0..3).map(|_| topic()).collect();
        let mut sub = s.ws();
        let mut publisher = s.ws();
        let r = sub.call("irn_batchSubscribe", json!({ "topics": topics }));
        let ids: Vec<String> = r["result"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids.len(), 3);
        for (t, id) in topics.iter().zip(&ids) {
            let r = sub.call("irn_subscribe", json!({ "topic": t }));
            assert_eq!(r["result"], id.as_str(), "the same topic keeps its id");
        }
        publisher.publish(&topics[1], "one");
        let m = push_of(&mut sub);
        assert_eq!(m["params"]["id"], ids[1].as_str());
        let subs: Vec<Value> = topics
            .iter()
            .zip(&ids)
            .map(|(t, id)| json!({"topic": t, "id": id}))
            .collect();
        let r = sub.call("irn_batchUnsubscribe", json!({ "subscriptions": subs }));
        assert_eq!(r["result"], true, "{r}");
        publisher.publish(&topics[2], "two");
        assert!(sub.recv_within(300).is_none(), "unsubscribed");
    });
}

#[test]
fn fetch_gives_what_the_connection_has_not_received_500_at_a_time() {
    common::each_server(&[], |s| {
        let (t, quiet) = (topic(), topic());
        let mut publisher = s.ws();
        for i in 0..600 {
            let r = publisher.call(
                "irn_publish",
                json!({"topic": t, "message": format!("m{i}"), "ttl": 300, "tag": 1}),
            );
            assert_eq!(r["result"], true);
        }
        let mut reader = s.ws();
        let r = reader.call("irn_fetchMessages", json!({ "topic": t }));
        let msgs = r["result"]["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 500);
        assert_eq!(r["result"]["hasMore"], true);
        assert_eq!(msgs[0]["message"], "m0");
        assert_eq!(msgs[0]["tag"], 1);
        assert!(msgs[0]["publishedAt"].is_u64());
        let r = reader.call(
            "irn_batchFetchMessages",
            json!({ "topics": [t.clone(), quiet] }),
        );
        let msgs = r["result"]["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 100, "the rest, once");
        assert_eq!(msgs[0]["message"], "m500");
        assert_eq!(r["result"]["hasMore"], false);
        let r = reader.call("irn_fetchMessages", json!({ "topic": t }));
        assert_eq!(r["result"], json!({"messages": [], "hasMore": false}));
        // The publisher's own messages are not given back to it.
        let r = publisher.call("irn_fetchMessages", json!({ "topic": t }));
        assert_eq!(r["result"]["messages"], json!([]));
    });
}

#[test]
fn the_session_methods_publish_with_their_tags_and_subscribe_the_caller() {
    common::each_server(&[], |s| {
        let (pairing, session) = (topic(), topic());
        let mut dapp = s.ws();
        let r = dapp.call(
            "wc_proposeSession",
            json!({"pairingTopic": pairing, "sessionProposal": "proposal", "ttl": 300,
                   "correlationId": 1}),
        );
        assert_eq!(r["result"], true, "{r}");
        assert!(dapp.recv_within(200).is_none(), "not its own proposal");
        let mut wallet = s.ws();
        wallet.call("irn_subscribe", json!({ "topic": pairing }));
        let m = push_of(&mut wallet);
        assert_eq!(m["params"]["data"]["message"], "proposal");
        assert_eq!(m["params"]["data"]["tag"], 1100);
        let r = wallet.call(
            "wc_approveSession",
            json!({"sessionTopic": session, "pairingTopic": pairing,
                   "sessionProposalResponse": "response", "sessionSettlementRequest": "settle",
                   "ttl": 300}),
        );
        assert_eq!(r["result"], true, "{r}");
        let m = push_of(&mut dapp);
        assert_eq!(m["method"], "irn_subscription");
        assert_eq!(m["params"]["data"]["message"], "response");
        assert_eq!(m["params"]["data"]["tag"], 1101);
        dapp.call("irn_subscribe", json!({ "topic": session }));
        let m = push_of(&mut dapp);
        assert_eq!(m["params"]["data"]["message"], "settle");
        assert_eq!(m["params"]["data"]["tag"], 1102);
        // The wallet was subscribed to the session topic by the approve.
        dapp.call(
            "irn_publish",
            json!({"topic": session, "message": "request", "ttl": 300, "tag": 1108}),
        );
        assert_eq!(push_of(&mut wallet)["params"]["data"]["message"], "request");
        let r = dapp.call(
            "wc_approveSession",
            json!({"sessionTopic": "x", "pairingTopic": pairing}),
        );
        assert_eq!(r["error"]["code"], -32602);
    });
}

#[test]
fn a_valid_token_gives_the_client_s_own_subscription_ids() {
    let s = Server::start(&["--threads", "2", "--require-auth"]);
    let c = Client::new();
    let q = format!(
        "auth={}&ua=wc-2%2Fjs-2.25.0&projectId=p&useOnCloseEvent=true",
        c.fresh_token()
    );
    let mut ws = ws_at(&s, &q);
    let t = topic();
    let r = ws.call("irn_subscribe", json!({ "topic": t }));
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    h.update(t.as_bytes());
    h.update(c.id().as_bytes());
    let want: String = h
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(r["result"], want.as_str(), "sha256(topic ‖ client id)");
    // The same token again (a reconnect) and the header form are let in too.
    let mut again = ws_at(&s, &q);
    assert_eq!(
        again.call("irn_subscribe", json!({ "topic": t }))["result"],
        want.as_str()
    );
    let ans = upgrade_answer(
        &s,
        "projectId=p",
        &format!("Authorization: Bearer {}\r\n", c.fresh_token()),
    );
    assert!(ans.starts_with("HTTP/1.1 101"), "{ans}");
}

#[test]
fn bad_tokens_are_refused_with_401_or_close_3000() {
    let s = Server::start(&["--threads", "1"]);
    let c = Client::new();
    let now = now_ms() / 1000;
    let expired = c.token(now - 90_000, now - 3_600);
    let ans = upgrade_answer(&s, &format!("auth={expired}"), "");
    assert!(ans.starts_with("HTTP/1.1 401"), "{ans}");
    assert!(ans.contains(r#"{"error":"token expired"}"#), "{ans}");
    let mut forged = c.fresh_token();
    forged.replace_range(forged.len() - 4.., "AAAA");
    let ans = upgrade_answer(&s, &format!("auth={forged}"), "");
    assert!(ans.starts_with("HTTP/1.1 401"), "{ans}");
    // The SDK asks for close events: upgraded, then closed with 3000 and the reason.
    let q = format!("auth={expired}&useOnCloseEvent=true");
    let (mut sock, _) =
        tungstenite::client::client(format!("ws://{}/?{q}", s.addr), s.tcp()).expect("101");
    match sock.read() {
        Ok(tungstenite::Message::Close(Some(f))) => {
            assert_eq!(u16::from(f.code), 3000);
            assert_eq!(f.reason.as_str(), "token expired");
        }
        other => panic!("expected close 3000: {other:?}"),
    }
    // No token: beta and 1.0 clients are served unless --require-auth.
    assert!(upgrade_answer(&s, "protocol=wc&version=2", "").starts_with("HTTP/1.1 101"));
    let strict = Server::start(&["--threads", "1", "--require-auth"]);
    let ans = upgrade_answer(&strict, "protocol=wc&version=2", "");
    assert!(ans.starts_with("HTTP/1.1 401"), "{ans}");
    let (_, metrics) = strict.get("/metrics");
    let metrics = String::from_utf8_lossy(&metrics);
    let refused: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("walletrelay_auth_refused_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(refused, 1, "counted: {metrics}");
}

#[test]
fn upgrades_that_arrive_together_are_each_answered_as_their_own_token_deserves() {
    use std::io::Write;
    // One worker: the upgrades land in as few rounds as the kernel hands them over, so their
    // new tokens are verified in batches (a reconnect storm's shape); one forged and one
    // expired among them must not change what the others get, nor be let in.
    let s = Server::start(&["--threads", "1"]);
    let now = now_ms() / 1000;
    let n = 48;
    let (forged_at, expired_at, pipelined_at) = (7, 13, 21);
    let mut socks = Vec::new();
    for i in 0..n {
        let c = Client::new();
        let token = if i == forged_at {
            let mut t = c.fresh_token();
            t.replace_range(t.len() - 4.., "AAAA");
            t
        } else if i == expired_at {
            c.token(now - 90_000, now - 3_600)
        } else {
            c.fresh_token()
        };
        let mut req =
            upgrade_request(&format!("/?auth={token}&projectId=p"), RFC_KEY, "").into_bytes();
        if i == pipelined_at {
            // A subscribe right behind the upgrade, in the same write.
            let sub = common::raw_ws::rpc_request(5, "irn_subscribe", json!({"topic": topic()}));
            req.extend(common::raw_ws::client_frame(true, 1, sub.as_bytes()));
        }
        socks.push((s.tcp(), req));
    }
    for (sock, req) in socks.iter_mut() {
        sock.write_all(req).unwrap();
    }
    for (i, (sock, _)) in socks.into_iter().enumerate() {
        if i == forged_at || i == expired_at {
            use std::io::Read;
            let mut sock = sock;
            let mut ans = String::new();
            let _ = sock.read_to_string(&mut ans);
            assert!(ans.starts_with("HTTP/1.1 401"), "{i}: {ans}");
            let why = if i == forged_at {
                "invalid signature"
            } else {
                "token expired"
            };
            assert!(ans.contains(why), "{i}: {ans}");
            continue;
        }
        let mut ws = common::raw_ws::RawWs::expect_101(sock);
        if i == pipelined_at {
            let answer = ws.recv_json();
            assert_eq!(answer["id"], 5, "{answer}");
            assert!(answer["result"].is_string(), "{answer}");
        }
    }
    let (_, metrics) = s.get("/metrics");
    let metrics = String::from_utf8_lossy(&metrics);
    let counted = |name: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    // Each refusal and each request counted once, however often its upgrade was read.
    assert_eq!(counted("walletrelay_auth_refused_total"), 2, "{metrics}");
}

#[test]
fn project_ids_are_an_allow_list_reread_on_sighup() {
    let dir = common::TempDir::new("projects");
    let file = dir.join("ids");
    std::fs::write(&file, "# allowed\np1\n").unwrap();
    let spec = format!("@{}", file.display());
    let s = Server::start(&["--threads", "1", "--project-ids", &spec]);
    assert!(upgrade_answer(&s, "projectId=p1", "").starts_with("HTTP/1.1 101"));
    let ans = upgrade_answer(&s, "projectId=p2", "");
    assert!(ans.starts_with("HTTP/1.1 403"), "{ans}");
    assert!(ans.contains("project not allowed"), "{ans}");
    assert!(upgrade_answer(&s, "", "").starts_with("HTTP/1.1 403"));
    std::fs::write(&file, "p2\n").unwrap();
    s.signal(libc::SIGHUP);
    let allowed = || upgrade_answer(&s, "projectId=p2", "").starts_with("HTTP/1.1 101");
    assert!(
        wait_until(std::time::Duration::from_secs(10), allowed),
        "p2 allowed after SIGHUP"
    );
    assert!(upgrade_answer(&s, "projectId=p1", "").starts_with("HTTP/1.1 403"));
}

#[test]
fn published_at_tag_and_attestation_survive_a_kill_9() {
    let dir = TempDir::new("irn-fields");
    let node = Node::start(&dir, &["--threads", "2"]);
    let t = topic();
    let mut p = node.ws();
    let r = p.call(
        "irn_publish",
        json!({"topic": t, "message": "kept", "ttl": 3600, "tag": 1108, "attestation": "a"}),
    );
    assert_eq!(r["result"], true);
    let mut first = node.ws();
    first.call("irn_subscribe", json!({ "topic": t }));
    let before = push_of(&mut first)["params"]["data"].clone();
    node.kill9();
    let node = Node::start(&dir, &["--threads", "1"]);
    let mut again = node.ws();
    again.call("irn_subscribe", json!({ "topic": t }));
    let after = push_of(&mut again)["params"]["data"].clone();
    assert_eq!(
        after, before,
        "the same message, with its publishedAt, tag, attestation"
    );
}
