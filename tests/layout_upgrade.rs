//! An offline upgrade keeps the data (issue 55; docs/UPGRADING.md): what the previous data
//! layout's build (`layout::PREVIOUS_REDIS_COMMIT`, Redis layout 4, journal layout 1) left
//! in Redis and in its data directory is read by this build, so that a later layout change
//! cannot forget the rule "build N reads N-1".
//!
//! The fixtures under `tests/fixtures/` were written by that build itself (the ignored test
//! `write_fixtures` below, run by `scripts/layout-fixtures`):
//! - `layout-4/redis.json`: every key it left in Redis, dumped key by key (type, value,
//!   time to live), replayed here into a fresh `redis-server`. The absolute times inside
//!   (a cached message's expiry, field `x` of the stream entries and of the meta hash; the
//!   expiry in front of each v1 pending frame) are moved by the time since the dump, as if
//!   the upgrade happened a minute after the old nodes stopped.
//! - `journal-1/`: its data directory (segments, relay key, watch registrations), read by
//!   this build under `libfaketime` a minute after the old node stopped (the segments hold
//!   absolute expiries, and a binary format is not rewritten by a test).
//!
//! Each test checks what a user depends on after the upgrade: late subscribers (irn and
//! waku) get the cached messages, the v1 bridge's pending frame is delivered, a webhook
//! registered with `POST /subscribe` is called, the relay's key (`GET /public-key`) is the
//! same, and on the journal a client id's mailbox and a watch registration survive.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use common::jwt::Signer;
use common::raw_ws::RawWs;
use common::redis::RedisServer;
use common::relay_auth::AuthClient;
use common::v1::sent_pub;
use common::webhook::{Receiver, Reply};
use common::{Server, TempDir};
use serde_json::{json, Value};

/// The topics the fixtures hold, one per thing checked.
const T_IRN: &str = "4a00000000000000000000000000000000000000000000000000000000000001";
const T_WAKU: &str = "4a00000000000000000000000000000000000000000000000000000000000002";
const T_HOOK: &str = "4a00000000000000000000000000000000000000000000000000000000000003";
const T_V1: &str = "4a00000000000000000000000000000000000000000000000000000000000004";
const T_MAILBOX: &str = "4a00000000000000000000000000000000000000000000000000000000000005";

/// Where the fixtures' webhook receiver listens (the URL is stored in them).
const HOOK_AT: &str = "127.0.0.77:18433";

/// The seed of the client id whose mailbox the journal fixture holds.
const MAILBOX_SEED: [u8; 32] = [7; 32];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn unb64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("a base64 string"))
        .expect("base64")
}

/// The webhook URL the fixtures registered.
fn hook_url() -> String {
    format!("http://{HOOK_AT}/hook")
}

// ---- what the previous build is given (write_fixtures) and what this one must show ----

/// The messages and registrations both fixtures get from the old build, on `s`.
fn give(s: &Server) {
    let mut ws = s.ws();
    let r = ws.call(
        "irn_publish",
        json!({"topic": T_IRN, "message": "irn-before-the-upgrade", "ttl": 86400, "tag": 1100}),
    );
    assert_eq!(r["result"], true, "{r}");
    let r = ws.call(
        "waku_publish",
        json!({"topic": T_WAKU, "message": "waku-before-the-upgrade", "ttl": 86400}),
    );
    assert_eq!(r["result"], true, "{r}");
    let (status, body) = s.register_webhook(T_HOOK, &hook_url());
    assert_eq!(status, 200, "{body}");
    let mut v1 = RawWs::open(s);
    v1.v1_pub(T_V1, "v1-before-the-upgrade", Some(true));
    v1.settled("the v1 publisher");
}

/// What both fixtures must show on this build (`s`), the relay's key being `key`.
fn check_common(s: &Server, key: &str) {
    assert_eq!(common::watch::public_key(s), key, "the relay's key changed");
    let mut ws = s.ws();
    let r = ws.call("irn_subscribe", json!({ "topic": T_IRN }));
    assert!(r["result"].is_string(), "{r}");
    let m = ws.recv();
    assert_eq!(m["method"], "irn_subscription", "{m}");
    assert_eq!(
        m["params"]["data"]["message"], "irn-before-the-upgrade",
        "{m}"
    );
    assert_eq!(m["params"]["data"]["tag"], 1100, "{m}");
    ws.send(&json!({"id": m["id"], "jsonrpc": "2.0", "result": true}));

    let mut waku = s.ws();
    waku.subscribe(T_WAKU);
    let (_, topic, message) = waku.next_push();
    assert_eq!(
        (topic.as_str(), message.as_str()),
        (T_WAKU, "waku-before-the-upgrade")
    );

    let mut v1 = RawWs::open(s);
    v1.v1_sub(T_V1);
    v1.expect_text(
        &sent_pub(T_V1, "v1-before-the-upgrade", true),
        "the v1 subscriber",
    );

    // Both fixtures name the one address: one receiver for the process, used by one test
    // at a time.
    static HOOKS: std::sync::OnceLock<std::sync::Mutex<Receiver>> = std::sync::OnceLock::new();
    let hooks = HOOKS
        .get_or_init(|| std::sync::Mutex::new(Receiver::start_on(HOOK_AT, |_| Reply::Status(200))))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    while hooks.next(Duration::ZERO).is_some() {}
    ws.publish(T_HOOK, "after-the-upgrade");
    let seen = hooks
        .next(Duration::from_secs(20))
        .expect("the webhook registered on the old build was not called");
    let body: Value = serde_json::from_slice(&seen.body).expect("a JSON body");
    assert_eq!(body, json!({ "topic": T_HOOK }));
}

// ---- Redis: a key-by-key dump, replayed ----

/// Every key of `conn`'s database as JSON (binary-safe: base64).
fn dump(conn: &mut redis::Connection) -> Vec<Value> {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(conn).unwrap();
    let mut out = Vec::new();
    for k in keys {
        let kind: String = redis::cmd("TYPE").arg(&k).query(conn).unwrap();
        let pttl: i64 = redis::cmd("PTTL").arg(&k).query(conn).unwrap();
        let value = match kind.as_str() {
            "string" => {
                let v: Vec<u8> = redis::cmd("GET").arg(&k).query(conn).unwrap();
                json!(b64(&v))
            }
            "hash" => {
                let v: Vec<Vec<u8>> = redis::cmd("HGETALL").arg(&k).query(conn).unwrap();
                json!(v.iter().map(|x| b64(x)).collect::<Vec<_>>())
            }
            "set" => {
                let v: Vec<Vec<u8>> = redis::cmd("SMEMBERS").arg(&k).query(conn).unwrap();
                json!(v.iter().map(|x| b64(x)).collect::<Vec<_>>())
            }
            "list" => {
                let v: Vec<Vec<u8>> = redis::cmd("LRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .query(conn)
                    .unwrap();
                json!(v.iter().map(|x| b64(x)).collect::<Vec<_>>())
            }
            "zset" => {
                let v: Vec<Vec<u8>> = redis::cmd("ZRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query(conn)
                    .unwrap();
                json!(v.iter().map(|x| b64(x)).collect::<Vec<_>>())
            }
            "stream" => {
                let v: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
                    .arg(&k)
                    .arg("-")
                    .arg("+")
                    .query(conn)
                    .unwrap();
                json!(v
                    .iter()
                    .map(|(id, f)| json!({"id": id, "fields": f.iter().map(|x| b64(x)).collect::<Vec<_>>()}))
                    .collect::<Vec<_>>())
            }
            other => panic!("a key of type {other} in the dump"),
        };
        out.push(json!({"key": b64(&k), "type": kind, "pttl": pttl, "value": value}));
    }
    out.sort_by(|a, b| a["key"].as_str().cmp(&b["key"].as_str()));
    out
}

/// Moves an absolute time in ms (decimal text) by `shift` ms.
fn moved(v: &[u8], shift: u64) -> Vec<u8> {
    let t: u64 = std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a time: {v:?}"));
    (t + shift).to_string().into_bytes()
}

/// Replays `keys` (from [`dump`]) into `conn`, layout 4's absolute times moved by `shift`
/// ms: field `x` (expiry) of a topic's stream entries and of its meta hash, and the expiry
/// in front of each v1 pending frame.
fn replay(conn: &mut redis::Connection, keys: &[Value], shift: u64) {
    for k in keys {
        let key = unb64(&k["key"]);
        let strings =
            |v: &Value| -> Vec<Vec<u8>> { v.as_array().unwrap().iter().map(unb64).collect() };
        match k["type"].as_str().unwrap() {
            "string" => {
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(unb64(&k["value"]))
                    .query(conn)
                    .unwrap();
            }
            "hash" => {
                let mut f = strings(&k["value"]);
                for pair in f.chunks_mut(2) {
                    if pair[0] == b"x" {
                        pair[1] = moved(&pair[1], shift);
                    }
                }
                let _: () = redis::cmd("HSET").arg(&key).arg(f).query(conn).unwrap();
            }
            "set" => {
                let _: () = redis::cmd("SADD")
                    .arg(&key)
                    .arg(strings(&k["value"]))
                    .query(conn)
                    .unwrap();
            }
            "list" => {
                let mut items = strings(&k["value"]);
                if key.starts_with(b"wr:1:p:") {
                    // The v1 pending frames: `<expiry ms>:<frame>` each (`cluster::v1`).
                    for item in items.iter_mut() {
                        let colon = item.iter().position(|&b| b == b':').expect("expiry:frame");
                        let mut m = moved(&item[..colon], shift);
                        m.extend_from_slice(&item[colon..]);
                        *item = m;
                    }
                }
                let _: () = redis::cmd("RPUSH")
                    .arg(&key)
                    .arg(items)
                    .query(conn)
                    .unwrap();
            }
            "zset" => {
                let f = strings(&k["value"]);
                let mut c = redis::cmd("ZADD");
                c.arg(&key);
                for pair in f.chunks(2) {
                    c.arg(&pair[1]).arg(&pair[0]);
                }
                let _: () = c.query(conn).unwrap();
            }
            "stream" => {
                for e in k["value"].as_array().unwrap() {
                    let mut f = strings(&e["fields"]);
                    for pair in f.chunks_mut(2) {
                        if pair[0] == b"x" {
                            pair[1] = moved(&pair[1], shift);
                        }
                    }
                    let _: String = redis::cmd("XADD")
                        .arg(&key)
                        .arg(e["id"].as_str().unwrap())
                        .arg(f)
                        .query(conn)
                        .unwrap();
                }
            }
            other => panic!("a key of type {other} in the fixture"),
        }
        let pttl = k["pttl"].as_i64().unwrap();
        if pttl > 0 {
            let _: () = redis::cmd("PEXPIRE")
                .arg(&key)
                .arg(pttl)
                .query(conn)
                .unwrap();
        }
    }
}

/// The node's flags on Redis `url`.
fn redis_args(url: &str) -> Vec<String> {
    ["--redis", url, "--threads", "2", "--webhook-allow-private"]
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The `Walletrelay-Layouts` header of `s`'s `/health`.
fn layouts_header(s: &Server) -> String {
    let raw = s.raw_exchange(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let text = String::from_utf8_lossy(&raw).to_string();
    text.lines()
        .find_map(|l| l.strip_prefix("Walletrelay-Layouts: "))
        .unwrap_or_else(|| panic!("no Walletrelay-Layouts header in {text}"))
        .trim()
        .to_string()
}

#[test]
fn what_the_previous_build_left_in_redis_is_read_and_kept_across_the_switch() {
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(fixtures().join("layout-4/redis.json")).expect("the Redis fixture"),
    )
    .expect("JSON");
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let written = manifest["written_ms"].as_u64().unwrap();
    // As if this build started a minute after the old nodes stopped.
    let shift = unix_ms().saturating_sub(written + 60_000);
    replay(&mut conn, manifest["keys"].as_array().unwrap(), shift);
    // The fingerprint names the Redis the old node used; this one is on another port (in a
    // real upgrade the address stays): its layout is kept, its list is this server's.
    let ring: String = redis::cmd("GET").arg("wr:ring").query(&mut conn).unwrap();
    let old = ring
        .strip_prefix("walletrelay-ring v4:")
        .unwrap_or_else(|| panic!("{ring}"));
    assert_eq!(old.split(',').count(), 1, "{ring}");
    let _: () = redis::cmd("SET")
        .arg("wr:ring")
        .arg(format!("walletrelay-ring v4:127.0.0.1:{}/0", redis.port))
        .query(&mut conn)
        .unwrap();

    let args = redis_args(&redis.url());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut with_admin = argv.clone();
    with_admin.extend(["--admin-listen", "127.0.0.1:0"]);
    let node = Server::start(&with_admin);
    assert_eq!(
        layouts_header(&node),
        "redis reads 4-5 writes 4; journal reads 1 writes 1",
        "a node on a layout-4 cluster writes layout 4"
    );
    let key = manifest["relay_key"].as_str().unwrap();
    check_common(&node, key);

    // Every node runs this build: the switch. The data stays readable after it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .arg("switch-layout")
        .arg(node.admin_addr.unwrap().to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"redis":{"before":[4],"writes":5}}"#
    );
    let ring: String = redis::cmd("GET").arg("wr:ring").query(&mut conn).unwrap();
    assert!(ring.starts_with("walletrelay-ring v5:"), "{ring}");
    assert_eq!(
        layouts_header(&node),
        "redis reads 4-5 writes 5; journal reads 1 writes 1"
    );
    drop(node);
    // A fresh node (the offline case again, after the switch): the cache is still served.
    let node = Server::start(&argv);
    assert_eq!(
        layouts_header(&node),
        "redis reads 4-5 writes 5; journal reads 1 writes 1"
    );
    let mut ws = node.ws();
    ws.call("irn_subscribe", json!({ "topic": T_IRN }));
    let m = ws.recv();
    assert_eq!(
        m["params"]["data"]["message"], "irn-before-the-upgrade",
        "{m}"
    );
    assert_eq!(common::watch::public_key(&node), key);
}

// ---- the journal: a data directory, read at the time it was left ----

/// `libfaketime`, installed from Debian's package when missing.
fn libfaketime() -> PathBuf {
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1");
    if !lib.exists() {
        common::apt::tool("faketime", "faketime").expect("faketime (apt-get install faketime)");
    }
    assert!(lib.exists(), "{} is missing", lib.display());
    lib.to_path_buf()
}

/// `FAKETIME` for a clock at Unix ms `at` now, ticking from there: an offset from this
/// clock in seconds (libfaketime's `-N` form).
fn faketime_at(at_ms: u64) -> String {
    format!("-{}", unix_ms().saturating_sub(at_ms) / 1000)
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_name() == "manifest.json" {
            continue;
        }
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn the_previous_builds_data_directory_is_read_with_its_mailbox_and_watch() {
    let from = fixtures().join("journal-1");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(from.join("manifest.json")).expect("manifest"))
            .expect("JSON");
    let dir = TempDir::new("layout-journal");
    copy_dir(&from, dir.path());
    let written = manifest["written_ms"].as_u64().unwrap();
    let at = written + 60_000;
    let lib = libfaketime();
    let fake = faketime_at(at);
    let env = [
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("FAKETIME", fake.as_str()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let node = Server::start_binary(
        Path::new(env!("CARGO_BIN_EXE_walletrelay")),
        &[
            "--data-dir",
            dir.arg(),
            "--threads",
            "2",
            "--webhook-allow-private",
        ],
        &env,
    );
    assert_eq!(
        layouts_header(&node),
        "redis reads 4-5 writes none; journal reads 1 writes 1"
    );
    check_common(&node, manifest["relay_key"].as_str().unwrap());
    assert_eq!(common::watch::watches(&node), 1.0, "the watch registration");
    // The client id that went away before the upgrade: what was published meanwhile
    // reaches it when it subscribes again (sign-client 2.25.0's reconnect).
    let wallet = AuthClient::from_seed(&MAILBOX_SEED);
    let mut w = wallet.connect_with(node.addr, &wallet.token_at(at / 1000));
    let r = w.call("irn_subscribe", json!({ "topic": T_MAILBOX }));
    assert!(r["result"].is_string(), "{r}");
    let m = w.recv();
    assert_eq!(m["method"], "irn_subscription", "{m}");
    assert_eq!(
        m["params"]["data"]["message"], "while-the-wallet-was-away",
        "{m}"
    );
}

// ---- writing the fixtures with the previous build ----

/// Writes `tests/fixtures/layout-4/redis.json` and `tests/fixtures/journal-1/` with the
/// binary `WALLETRELAY_PREVIOUS_BIN` (`scripts/layout-fixtures` builds it and runs this).
#[test]
#[ignore = "writes the fixtures with the previous build: scripts/layout-fixtures"]
fn write_fixtures() {
    let bin =
        PathBuf::from(std::env::var("WALLETRELAY_PREVIOUS_BIN").expect("WALLETRELAY_PREVIOUS_BIN"));
    let base = ["--threads", "2", "--webhook-allow-private"];

    // Redis layout 4.
    let redis = RedisServer::start();
    let url = redis.url();
    let mut args = vec!["--redis", url.as_str(), "--data-dir", "none"];
    args.extend(base);
    let node = Server::start_binary(&bin, &args, &[]);
    give(&node);
    let key = common::watch::public_key(&node);
    node.signal(libc::SIGTERM);
    let mut node = node;
    let _ = node.child.wait();
    let mut conn = redis.conn();
    let mut keys = dump(&mut conn);
    // A node's liveness keys are the old node's own business (they expire in a minute).
    keys.retain(|k| !String::from_utf8_lossy(&unb64(&k["key"])).starts_with("wr:node:"));
    let out = fixtures().join("layout-4");
    std::fs::create_dir_all(&out).unwrap();
    let manifest = json!({
        "written_by": std::env::var("WALLETRELAY_PREVIOUS_COMMIT").unwrap_or_default(),
        "written_ms": unix_ms(),
        "relay_key": key,
        "keys": keys,
    });
    std::fs::write(
        out.join("redis.json"),
        serde_json::to_string_pretty(&manifest).unwrap() + "\n",
    )
    .unwrap();

    // Journal layout 1.
    let dir = TempDir::new("layout-fixture");
    let mut args = vec!["--data-dir", dir.arg()];
    args.extend(base);
    let node = Server::start_binary(&bin, &args, &[]);
    give(&node);
    let wallet = AuthClient::from_seed(&MAILBOX_SEED);
    let mut w = wallet.connect(node.addr);
    let r = w.call("irn_subscribe", json!({ "topic": T_MAILBOX }));
    assert!(r["result"].is_string(), "{r}");
    drop(w);
    common::wait::wait_until(Duration::from_secs(10), || {
        node.series("walletrelay_websockets_open") <= 0.0
    });
    let mut dapp = node.ws();
    let r = dapp.call(
        "irn_publish",
        json!({"topic": T_MAILBOX, "message": "while-the-wallet-was-away", "ttl": 86400, "tag": 1108}),
    );
    assert_eq!(r["result"], true, "{r}");
    let watched = Signer::random();
    let r = common::watch::register(&mut dapp, &watched, 0);
    assert!(r["result"]["relayId"].is_string(), "{r}");
    let key = common::watch::public_key(&node);
    drop(dapp);
    let mut node = node;
    node.signal(libc::SIGTERM);
    let _ = node.child.wait();
    let out = fixtures().join("journal-1");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let e = e.unwrap();
        if e.file_name() == "LOCK" {
            continue;
        }
        std::fs::copy(e.path(), out.join(e.file_name())).unwrap();
    }
    let manifest = json!({
        "written_by": std::env::var("WALLETRELAY_PREVIOUS_COMMIT").unwrap_or_default(),
        "written_ms": unix_ms(),
        "relay_key": key,
    });
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap() + "\n",
    )
    .unwrap();
}

// ---- the fingerprint as the cluster's record of its layout ----

fn set_ring(conn: &mut redis::Connection, version: u32, port: u16) {
    let _: () = redis::cmd("SET")
        .arg("wr:ring")
        .arg(format!("walletrelay-ring v{version}:127.0.0.1:{port}/0"))
        .query(conn)
        .unwrap();
}

/// A node follows the layout the shards name while it runs (another node's switch), fails
/// `/health` on one it does not read (and starts serving again when that is undone), and
/// refuses to start on one.
#[test]
fn the_shards_fingerprint_decides_what_a_node_writes_and_whether_it_runs() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    set_ring(&mut conn, 4, redis.port);
    let args = redis_args(&redis.url());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let node = Server::start(&argv);
    assert!(layouts_header(&node).contains("writes 4"));

    // Another node's switch, read with the heartbeat.
    set_ring(&mut conn, 5, redis.port);
    let followed = common::wait::wait_until(Duration::from_secs(10), || {
        layouts_header(&node).contains("writes 5")
    });
    assert!(followed, "{}", layouts_header(&node));

    // A layout this build does not read: /health fails, naming it.
    set_ring(&mut conn, 6, redis.port);
    let health = |s: &Server| {
        let raw = s.raw_exchange(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        String::from_utf8_lossy(&raw).to_string()
    };
    let failed = common::wait::poll(Duration::from_secs(10), || {
        let h = health(&node);
        h.starts_with("HTTP/1.1 503").then_some(h)
    })
    .expect("/health stayed 204 with a shard on layout 6");
    assert!(failed.contains("writes Redis data layout 6"), "{failed}");
    assert!(failed.contains("reads layouts 4-5"), "{failed}");
    set_ring(&mut conn, 5, redis.port);
    let healthy = common::wait::wait_until(Duration::from_secs(10), || {
        health(&node).starts_with("HTTP/1.1 204")
    });
    assert!(healthy, "{}", health(&node));
    drop(node);

    // Starting on a layout it does not read (older than the previous one) is refused.
    set_ring(&mut conn, 3, redis.port);
    let refused = common::cluster::refused_start(&["--redis".to_string(), redis.url()], &[]);
    assert!(!refused.status.success());
    assert!(
        refused
            .stderr
            .contains("this shard's cluster writes Redis data layout 3"),
        "{}",
        refused.stderr
    );
}

/// `POST /layout/switch` on a node without Redis: 409, said why; `GET` is 405.
#[test]
fn a_node_without_redis_has_no_layout_to_switch() {
    let node = Server::start(&["--admin-listen", "127.0.0.1:0"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .arg("switch-layout")
        .arg(node.admin_addr.unwrap().to_string())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("409"), "{err}");
    assert!(err.contains("no Redis"), "{err}");
    let mut s = node.admin_tcp();
    use std::io::{Read, Write};
    s.write_all(b"GET /layout/switch HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    assert!(raw.starts_with("HTTP/1.1 405"), "{raw}");
    assert!(raw.contains("Allow: POST"), "{raw}");
}
