//! The relay's identity and watch registrations through the real binary (DECISIONS 13):
//! `GET /public-key` (stable across a restart on a data directory, one key for the nodes of
//! a Redis cluster), `irn_watchRegister` answered with the relay's did:key, renewed,
//! unregistered, refused with the right `data` tag (forged, expired, wrong `act`, too long,
//! bad webhook URL, the 65th of a client), registrations kept across `kill -9` right after
//! their answer (WebSocket and `POST /rpc`), in Redis when answered, `StorageError` when
//! the disk or Redis does not take them.

mod common;

use std::time::Duration;

use common::durability::Node;
use common::jwt::{did_key, unhex, Signer};
use common::redis::RedisServer;
use common::tempdir::TempDir;
use common::wait::wait_until;
use common::watch::{
    now, public_key, register, register_claims, unregister, unregister_claims, watches, DAY,
};
use common::Server;
use serde_json::json;

#[test]
fn register_renew_unregister_and_every_refusal() {
    let s = Server::start(&["--threads", "2"]);
    let relay_id = did_key(&unhex(&public_key(&s)));
    let c = Signer::random();
    let mut ws = s.ws();
    let r = ws.call(
        "irn_watchRegister",
        json!({"registerAuth": c.sign(&register_claims(&c, 0, json!({})))}),
    );
    assert_eq!(r["result"]["relayId"], relay_id, "{r}");
    // The same again renews it (also under iridium_); another typ is another registration.
    let again = c.sign(&register_claims(&c, 0, json!({"exp": now() + DAY})));
    let r = ws.call("iridium_watchRegister", json!({ "registerAuth": again }));
    assert_eq!(r["result"]["relayId"], relay_id, "{r}");
    assert_eq!(watches(&s), 1.0);
    let publisher = c.sign(&register_claims(&c, 0, json!({"typ": "publisher"})));
    let r = ws.call("irn_watchRegister", json!({ "registerAuth": publisher }));
    assert_eq!(r["result"]["relayId"], relay_id, "{r}");
    assert_eq!(watches(&s), 2.0);

    // Unregister (no exp, as relay_client sends it) from another connection.
    let token = c.sign(&unregister_claims(&c, 0, "publisher"));
    let mut other = s.ws();
    let r = other.call("irn_watchUnregister", json!({ "unregisterAuth": token }));
    assert_eq!(r["result"], true, "{r}");
    assert_eq!(watches(&s), 1.0);

    // Refusals: -32000 with data the tag.
    let refused = |ws: &mut common::ws::Ws, token: String, tag: &str| {
        let r = ws.call("irn_watchRegister", json!({ "registerAuth": token }));
        assert_eq!(r["error"]["code"], -32000, "{tag}: {r}");
        assert_eq!(r["error"]["data"], tag, "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("Request handler error: "),
            "{r}"
        );
    };
    let mut forged = c.sign(&register_claims(&c, 1, json!({})));
    let sig_start = forged.rfind('.').unwrap() + 1;
    let flipped = if &forged[sig_start..sig_start + 1] == "A" {
        "B"
    } else {
        "A"
    };
    forged.replace_range(sig_start..sig_start + 1, flipped);
    refused(&mut ws, forged, "InvalidJwt");
    // Signed by another key than iss.
    let mallory = Signer::random();
    refused(
        &mut ws,
        mallory.sign(&register_claims(&c, 1, json!({}))),
        "InvalidJwt",
    );
    let expired = json!({"iat": now() - 2 * DAY, "exp": now() - DAY});
    refused(
        &mut ws,
        c.sign(&register_claims(&c, 1, expired)),
        "InvalidJwt",
    );
    let act = json!({"act": "irn_watchUnregister"});
    refused(
        &mut ws,
        c.sign(&register_claims(&c, 1, act)),
        "InvalidAction",
    );
    let long = json!({"exp": now() + 30 * DAY + 10});
    refused(&mut ws, c.sign(&register_claims(&c, 1, long)), "InvalidTtl");
    let whu = json!({"whu": format!("https://notify.example/{}", "x".repeat(250))});
    refused(
        &mut ws,
        c.sign(&register_claims(&c, 1, whu)),
        "InvalidWebhookUrl",
    );
    let whu = json!({"whu": "notify.example/hook"});
    refused(
        &mut ws,
        c.sign(&register_claims(&c, 1, whu)),
        "InvalidWebhookUrl",
    );
    assert_eq!(watches(&s), 1.0, "nothing refused was kept");

    // 64 registrations per watched client: the 65th is refused, a renewal still passes.
    for i in 1..64 {
        let r = ws.call(
            "irn_watchRegister",
            json!({"registerAuth": c.sign(&register_claims(&c, i, json!({})))}),
        );
        assert_eq!(r["result"]["relayId"], relay_id, "{i}: {r}");
    }
    refused(
        &mut ws,
        c.sign(&register_claims(&c, 64, json!({}))),
        "WatchLimitExceeded",
    );
    let r = ws.call(
        "irn_watchRegister",
        json!({"registerAuth": c.sign(&register_claims(&c, 63, json!({})))}),
    );
    assert_eq!(r["result"]["relayId"], relay_id, "{r}");
    // Another client has its own 64.
    let d = Signer::random();
    let r = ws.call(
        "irn_watchRegister",
        json!({"registerAuth": d.sign(&register_claims(&d, 64, json!({})))}),
    );
    assert_eq!(r["result"]["relayId"], relay_id, "{r}");
    assert_eq!(watches(&s), 65.0);
}

#[test]
fn an_audience_is_checked_when_configured_with_https_and_wss_both_accepted() {
    let s = Server::start(&["--threads", "1", "--auth-audience", "wss://relay.example"]);
    let c = Signer::random();
    let mut ws = s.ws();
    for (aud, ok) in [
        ("https://relay.example", true),
        ("wss://relay.example/", true),
        ("https://elsewhere.example", false),
    ] {
        let t = c.sign(&register_claims(&c, 0, json!({ "aud": aud })));
        let r = ws.call("irn_watchRegister", json!({ "registerAuth": t }));
        assert_eq!(r["result"].is_object(), ok, "{aud}: {r}");
    }
}

#[test]
fn the_key_and_the_registrations_survive_kill_9() {
    let dir = TempDir::new("watch-restart");
    let node = Node::start(&dir, &["--threads", "2"]);
    let key = public_key(&node);
    let c = Signer::random();
    let mut ws = node.ws();
    for i in 0..3 {
        let r = register(&mut ws, &c, i);
        assert!(r["result"].is_object(), "{r}");
    }
    let mode = std::fs::metadata(dir.path().join("relay-key.hex")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    // An answer waits for the file's fsync: killed right after the last answer, nothing is
    // lost.
    drop(ws);
    node.kill9();
    let node = Node::start(&dir, &["--threads", "2"]);
    assert_eq!(public_key(&node), key);
    assert_eq!(node.series("walletrelay_watches"), 3.0);
    // The renewal of a restored registration replaces it rather than adding one.
    let mut ws = node.ws();
    let r = register(&mut ws, &c, 2);
    assert!(r["result"].is_object(), "{r}");
    assert_eq!(node.series("walletrelay_watches"), 3.0);
    // An unregistration answered is on disk too.
    let r = unregister(&mut ws, &c, 1);
    assert_eq!(r["result"], true, "{r}");
    drop(ws);
    node.kill9();
    let node = Node::start(&dir, &["--threads", "2"]);
    assert_eq!(node.series("walletrelay_watches"), 2.0);
}

#[test]
fn a_registration_on_redis_is_in_redis_when_answered() {
    let r = RedisServer::start();
    let s = common::cluster::node(&[&r], &[]);
    let c = Signer::random();
    let mut ws = s.ws();
    let key = format!("walletrelay:watch:{{{}}}", c.did());
    let mut redis = r.conn();
    for i in 0..5 {
        let res = register(&mut ws, &c, i);
        assert!(res["result"].is_object(), "{res}");
        // Looked at right after the answer, no waiting: the answer came after Redis had it.
        let n: usize = redis::cmd("HLEN").arg(&key).query(&mut redis).unwrap();
        assert_eq!(n, i + 1, "registration {i} answered before Redis held it");
    }
    let res = unregister(&mut ws, &c, 0);
    assert_eq!(res["result"], true, "{res}");
    let n: usize = redis::cmd("HLEN").arg(&key).query(&mut redis).unwrap();
    assert_eq!(n, 4, "unregistration answered before Redis dropped it");
}

#[test]
fn a_registration_redis_does_not_take_answers_storage_error_then_works_again() {
    let mut r = RedisServer::start();
    let s = common::cluster::node(&[&r], &[]);
    let c = Signer::random();
    let mut ws = s.ws();
    assert!(register(&mut ws, &c, 0)["result"].is_object());
    r.kill();
    // The writer keeps trying for a while (a failover takes seconds), then gives up.
    let res = register(&mut ws, &c, 1);
    assert_eq!(res["error"]["code"], -32000, "{res}");
    assert_eq!(res["error"]["data"], "StorageError", "{res}");
    r.restart();
    let key = format!("walletrelay:watch:{{{}}}", c.did());
    assert!(wait_until(Duration::from_secs(15), || {
        register(&mut ws, &c, 2)["result"].is_object()
    }));
    let n: usize = redis::cmd("HLEN").arg(&key).query(&mut r.conn()).unwrap();
    assert!(n >= 1, "the registration after the restart is in Redis");
}

#[test]
fn a_failing_data_directory_answers_storage_error() {
    let dir = TempDir::new("watch-diskfail");
    let node = Node::start(&dir, &["--threads", "1"]);
    let c = Signer::random();
    let mut ws = node.ws();
    let r = register(&mut ws, &c, 0);
    assert!(r["result"].is_object(), "{r}");
    // The file's place taken by a directory: the persister's rename fails.
    let file = dir.path().join("watches.jsonl");
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    std::fs::write(file.join("x"), "keeps the directory from being replaced").unwrap();
    let r = register(&mut ws, &c, 1);
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert_eq!(r["error"]["data"], "StorageError", "{r}");
}

/// `irn_watchRegister` of `c`'s watch `i` over `POST /rpc` (relay-auth token of a
/// service's own key in the query); the JSON-RPC answer.
fn register_over_http(s: &Server, c: &Signer, i: usize) -> serde_json::Value {
    let service = Signer::random();
    let auth = service.token_for("http://relay", now(), None);
    let body = json!({"id": 1, "jsonrpc": "2.0", "method": "irn_watchRegister",
        "params": {"registerAuth": c.sign(&register_claims(c, i, json!({})))}})
    .to_string();
    let raw = format!(
        "POST /rpc?projectId=p1&auth={auth} HTTP/1.1\r\nHost: x\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = s.request(&raw);
    assert_eq!(r.status, 200, "{r:?}");
    r.json()
}

#[test]
fn over_http_the_answer_waits_for_the_disk_too() {
    let dir = TempDir::new("watch-http");
    let node = Node::start(&dir, &["--threads", "2"]);
    let c = Signer::random();
    for i in 0..2 {
        let r = register_over_http(&node, &c, i);
        assert!(r["result"]["relayId"].is_string(), "{r}");
    }
    node.kill9();
    let node = Node::start(&dir, &["--threads", "2"]);
    assert_eq!(watches(&node), 2.0);
    let file = dir.path().join("watches.jsonl");
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir_all(file.join("x")).unwrap();
    let r = register_over_http(&node, &c, 2);
    assert_eq!(r["error"]["data"], "StorageError", "{r}");
}

#[test]
fn a_damaged_key_file_stops_the_start() {
    let dir = TempDir::new("watch-badkey");
    std::fs::create_dir_all(dir.path()).unwrap();
    std::fs::write(dir.path().join("relay-key.hex"), "zz").unwrap();
    let (status, log) = common::durability::run_to_exit(&dir, &["--threads", "1"]);
    assert!(!status.success());
    assert!(log.contains("relay-key.hex"), "{log}");
}

#[test]
fn relay_key_flag_wins_and_nodes_sharing_redis_share_one_key() {
    let dir = TempDir::new("watch-keyfile");
    std::fs::create_dir_all(dir.path()).unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, format!("{}\n", "11".repeat(32))).unwrap();
    let s = Server::start(&["--threads", "1", "--relay-key", file.to_str().unwrap()]);
    let given = public_key(&s);
    let s2 = Server::start(&["--threads", "1", "--relay-key", file.to_str().unwrap()]);
    assert_eq!(public_key(&s2), given);
    // Two processes without a data directory nor Redis: a key each.
    let (a, b) = (
        Server::start(&["--threads", "1"]),
        Server::start(&["--threads", "1"]),
    );
    assert_ne!(public_key(&a), public_key(&b));

    let r = RedisServer::start();
    let nodes = common::cluster::nodes(2, &[&r], &[]);
    let k = public_key(&nodes[0]);
    assert_eq!(public_key(&nodes[1]), k);
    assert_ne!(k, given);
}

#[test]
fn on_redis_every_node_sees_every_registration() {
    let r = RedisServer::start();
    let nodes = common::cluster::nodes(2, &[&r], &[]);
    let c = Signer::random();
    let mut ws = nodes[0].ws();
    for i in 0..2 {
        let t = c.sign(&register_claims(&c, i, json!({})));
        let res = ws.call("irn_watchRegister", json!({ "registerAuth": t }));
        assert!(res["result"].is_object(), "{res}");
    }
    let two = |s: &Server| wait_until(Duration::from_secs(10), || watches(s) == 2.0);
    assert!(
        two(&nodes[1]),
        "node 2 never saw them: {}",
        watches(&nodes[1])
    );
    // Unregistered on the other node: gone from both.
    let res = unregister(&mut nodes[1].ws(), &c, 0);
    assert_eq!(res["result"], true, "{res}");
    let one = |s: &Server| wait_until(Duration::from_secs(10), || watches(s) == 1.0);
    assert!(one(&nodes[0]) && one(&nodes[1]));
    // A node started later reads them at start.
    let late = common::cluster::node(&[&r], &[]);
    assert_eq!(watches(&late), 1.0);
    // The 64 per client count across nodes: 63 more on node 2, the next refused on node 1.
    let mut ws2 = nodes[1].ws();
    for i in 2..65 {
        let t = c.sign(&register_claims(&c, i, json!({})));
        let res = ws2.call("irn_watchRegister", json!({ "registerAuth": t }));
        assert!(res["result"].is_object(), "{i}: {res}");
    }
    assert!(wait_until(Duration::from_secs(10), || watches(&nodes[0]) == 64.0));
    let t = c.sign(&register_claims(&c, 99, json!({})));
    let res = ws.call("irn_watchRegister", json!({ "registerAuth": t }));
    assert_eq!(res["error"]["data"], "WatchLimitExceeded", "{res}");
}
