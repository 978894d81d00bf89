//! A client that is not the JS SDK (issue 47, DECISIONS 13): the published Rust relay client
//! (`reown-relay-client` 0.1.0 from crates.io and its `reown-relay-rpc` types), built from
//! `tests/rust-client/` (its own Cargo project and lockfile, never linked into the server)
//! into `<target>/rust-client`, once per run of this test binary, then run as
//! `wr-rust-client <scenario>` against the real binary; it prints one JSON line per step.
//! - WebSocket: two clients with their own relay-auth JWTs; subscribe, publish, the message
//!   received byte-exact on the other client, fetched by a third; `irn_batchReceive` and
//!   `irn_unsubscribe {topic}` (no id: what relay_client sends) of the subscriber;
//!   `irn_subscribeBlocking`, `irn_batchSubscribeBlocking`.
//! - HTTP (`POST /rpc`, the JWT without `exp` in the query): a publish reaches a WebSocket
//!   subscriber byte-exact, fetch; subscribe, `irn_watchRegister` with the client's own webhook
//!   on loopback (hence `--webhook-allow-private`), a `queued` event whose JWT verifies against
//!   `GET /public-key`, `irn_batchReceive`, `irn_watchUnregister`, unsubscribe.
//!
//! Needs network access to crates.io on the first build (`cargo build --locked`).

mod common;

use common::{relay_id, topic, Server};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

/// Builds `tests/rust-client` once (release, `--locked`) and returns its binary.
fn client_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let main_target = Path::new(env!("CARGO_BIN_EXE_walletrelay"))
            .parent()
            .and_then(Path::parent)
            .expect("the main target directory")
            .to_path_buf();
        let target = main_target.join("rust-client");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rust-client/Cargo.toml");
        let started = Instant::now();
        let out = Command::new(env!("CARGO"))
            .args(["build", "--release", "--locked", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .expect("run cargo");
        assert!(
            out.status.success(),
            "building tests/rust-client failed\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "rust_client: tests/rust-client built in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        target.join("release/wr-rust-client")
    })
}

/// Runs one scenario; returns its lines by step (a step may repeat: all kept, in order).
fn run(args: &[&str]) -> Vec<Value> {
    let out = Command::new(client_binary())
        .args(args)
        .output()
        .expect("run wr-rust-client");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("wr-rust-client {args:?}:\n{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "wr-rust-client {args:?}: {}",
        out.status
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["step"] == "done"),
        "the scenario stopped early:\n{stdout}"
    );
    lines
}

/// The (first) line of `step`, asserted ok.
fn ok<'a>(lines: &'a [Value], step: &str) -> &'a Value {
    let l = lines
        .iter()
        .find(|l| l["step"] == step)
        .unwrap_or_else(|| panic!("no line for step {step}"));
    assert_eq!(l["ok"], true, "step {step} failed: {l}");
    l
}

fn ws_scenario(server: &Server) -> Vec<Value> {
    run(&["ws", "--relay", &format!("ws://{}", server.addr)])
}

#[test]
fn rust_relay_client_over_websocket_receives_byte_exact_and_fetches() {
    for threads in common::THREADS {
        let server = Server::start(&["--threads", threads]);
        let lines = ws_scenario(&server);
        ok(&lines, "connect");
        ok(&lines, "subscribe");
        let published = ok(&lines, "publish");
        let got = ok(&lines, "receive");
        assert_eq!(got["topic"], published["topic"], "--threads {threads}");
        assert_eq!(
            got["message"], published["message"],
            "byte-exact, --threads {threads}"
        );
        assert_eq!(got["tag"], 1000);
        let fetched = ok(&lines, "fetch");
        let messages = fetched["messages"].as_array().expect("messages");
        assert!(
            messages
                .iter()
                .any(|m| m["message"] == published["message"] && m["tag"] == 1000),
            "the fetch did not return the message: {fetched}"
        );
    }
}

/// `irn_batchReceive`, `irn_unsubscribe` without id, the blocking subscribes.
#[test]
fn rust_relay_client_over_websocket_acknowledges_unsubscribes_by_topic_and_subscribes_blocking() {
    let server = Server::start(&["--threads", "2"]);
    let lines = ws_scenario(&server);
    assert_eq!(ok(&lines, "batch_receive")["result"], true);
    ok(&lines, "unsubscribe");
    let id = &ok(&lines, "subscribe_blocking")["subscription_id"];
    assert!(id.as_str().is_some_and(|s| !s.is_empty()), "{id}");
    let results = ok(&lines, "batch_subscribe_blocking")["results"]
        .as_array()
        .expect("results")
        .clone();
    assert_eq!(results.len(), 2, "one result per topic: {results:?}");
    for r in &results {
        assert!(r["id"].is_string(), "a subscription id, not an error: {r}");
    }
}

/// `POST /rpc`, `GET /public-key`, a watch and its `queued` event (the subscription of the
/// HTTP client's id, which has no socket).
#[test]
fn rust_relay_client_over_http_publishes_to_a_socket_and_gets_a_signed_watch_event() {
    // Built first: the socket below would otherwise sit unread through the client's first
    // build (minutes on a fresh machine) and be closed for missing the server's pings.
    client_binary();
    let server = Server::start(&["--threads", "2", "--webhook-allow-private"]);
    let t = topic();
    let mut ws = server.ws();
    let r = ws.call("irn_subscribe", json!({ "topic": t }));
    assert!(r["result"].is_string(), "{r}");

    let lines = run(&[
        "http",
        "--relay",
        &format!("http://{}", server.addr),
        "--topic",
        &t,
    ]);
    let published = ok(&lines, "publish");
    let push = ws.recv();
    assert_eq!(push["method"], "irn_subscription", "{push}");
    assert_eq!(push["params"]["data"]["topic"], t.as_str());
    assert_eq!(
        push["params"]["data"]["message"], published["message"],
        "the HTTP publish reached the socket byte-exact"
    );
    let fetched = ok(&lines, "fetch");
    assert!(
        fetched["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .any(|m| m["message"] == published["message"]),
        "{fetched}"
    );

    let key = relay_id::public_key_hex(&server);
    let subscribed = ok(&lines, "subscribe");
    let registered = ok(&lines, "watch_register");
    assert_eq!(registered["relay_id"], relay_id::did_key(&key).as_str());
    let watched = ok(&lines, "publish_watched");
    let client = ok(&lines, "client")["service"].clone();
    let queued = lines
        .iter()
        .find(|l| l["step"] == "watch_event" && l["status"] == "queued")
        .unwrap_or_else(|| panic!("no queued event: {lines:?}"));
    assert_eq!(queued["ok"], true, "{queued}");
    assert_eq!(queued["topic"], subscribed["topic"]);
    assert_eq!(queued["message"], watched["message"]);
    assert_eq!(queued["tag"], 1001);
    assert_eq!(queued["path"], "/v1/relay-webhook");
    // The test's own check of the JWT, beside the client's (relay_rpc's try_from_str).
    let claims = relay_id::verify_jwt(queued["jwt"].as_str().expect("jwt"), &key)
        .unwrap_or_else(|e| panic!("event JWT: {e}"));
    assert_eq!(claims["iss"], registered["relay_id"]);
    assert_eq!(claims["aud"], registered["service_url"]);
    assert_eq!(claims["sub"], client, "sub is the watched client id");
    assert_eq!(claims["act"], "irn_watchEvent");
    assert_eq!(claims["typ"], "subscriber");
    assert_eq!(claims["evt"]["messageId"], queued["message_id"]);

    assert_eq!(ok(&lines, "batch_receive")["result"], true);
    let after = ok(&lines, "fetch_after_receive");
    assert_eq!(
        after["messages"],
        json!([]),
        "a received message is not fetched again"
    );
    assert_eq!(ok(&lines, "watch_unregister")["result"], true);
    assert_eq!(ok(&lines, "unsubscribe")["result"], true);
}
