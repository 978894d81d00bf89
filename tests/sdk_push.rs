//! A sleeping wallet woken by its push server, and the SDK's reconnect flows (issue 47,
//! DECISIONS 13), with the real WalletConnect SDK from npm (`tests/e2e-sdk/push.mjs`) against
//! the real binary and the push-server stand-in of `common::push_server`:
//! - `push`: the wallet registers its client id with the push server through the SDK's own
//!   `echoClient.registerDeviceToken`, goes offline, the dApp's session request (tag 1108,
//!   `prompt: true`) is pushed to it, signed by the relay (the stand-in checks the signature
//!   with the key of `GET /public-key`, as push-server with `RELAY_PUBLIC_KEY`), in the half
//!   the wallet's `always_raw` picks; the woken wallet fetches the request and answers; no
//!   push while it was online. Started with `--push-url` and `--webhook-allow-private`.
//! - `reconnect-2.25.0`, `reconnect-2.17.1`: after an offline period each request reaches the
//!   wallet exactly once (2.17.1: `irn_batchFetchMessages` then `irn_batchSubscribe`).
//!
//! Also the stand-in's own tests: what push-server answers to a signed, a tampered, an
//! unsigned push, to an unknown client, a repeat, each body half, and registrations.
//!
//! Needs Node.js 18+ and npm (`npm ci` of tests/e2e-sdk on first use).

mod common;

use common::push_server::{sha256_hex, sign, Half, PushServer};
use common::{node, relay_id, Server};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};
use std::time::Duration;

/// Upper bound for one run of the script (it has its own timeout of 120 s).
const SCRIPT_DEADLINE: Duration = Duration::from_secs(180);
/// How long the test waits for the push once the relay acknowledged the request.
const PUSH_WAIT: Duration = Duration::from_secs(30);
/// The package whose presence means `npm ci` has run with the 2.17.1 alias.
const MARKER: &str = "sign-client-2.17.1";

/// What the script's `AWAIT_PUSH` line says the push must carry.
struct Expected {
    client_id: String,
    topic: String,
    message: String,
}

/// Runs `push.mjs` for the wallet's push; returns what the script announced, the push the
/// stand-in got for it (if any), and the wallet's pushes counted when it was online.
fn run_push(push: &PushServer, server: &Server, always_raw: bool) -> (Expected, Option<Half>) {
    node::ensure_node_modules("e2e-sdk", MARKER);
    let relay = format!("ws://{}", server.addr);
    let push_url = push.url();
    let raw = if always_raw { "1" } else { "0" };
    let mut expected: Option<Expected> = None;
    let mut got: Option<Half> = None;
    let mut online_pushes: Option<usize> = None;
    node::run_script_interactive(
        "e2e-sdk",
        "push.mjs",
        &[
            ("SCENARIO", "push"),
            ("RELAY_URL", relay.as_str()),
            ("PUSH_URL", push_url.as_str()),
            ("ALWAYS_RAW", raw),
        ],
        SCRIPT_DEADLINE,
        &format!("SCENARIO=push, relay {relay}, push server {push_url}, always_raw {always_raw}"),
        |line| {
            if let Some(j) = line.strip_prefix("ONLINE_DONE ") {
                let v: Value = serde_json::from_str(j).expect("ONLINE_DONE json");
                let id = v["client_id"].as_str().expect("client_id");
                let id = id.trim_start_matches("did:key:");
                online_pushes = Some(push.pushes().iter().filter(|p| p.client_id == id).count());
                return None;
            }
            let j = line.strip_prefix("AWAIT_PUSH ")?;
            let v: Value = serde_json::from_str(j).expect("AWAIT_PUSH json");
            let e = Expected {
                client_id: v["client_id"].as_str().expect("client_id").to_string(),
                topic: v["topic"].as_str().expect("topic").to_string(),
                message: v["message"].as_str().expect("message").to_string(),
            };
            let p = push.wait_push(&e.client_id, PUSH_WAIT);
            expected = Some(e);
            let reply = if p.is_some() { "PUSHED" } else { "NO_PUSH" };
            if let Some(p) = p {
                assert_eq!(
                    p.headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                        .map(|(_, v)| v.as_str()),
                    Some("application/json"),
                    "{p:?}"
                );
                got = Some(p.half);
            }
            Some(reply.to_string())
        },
    );
    let e = expected.expect("the script never announced the request (AWAIT_PUSH)");
    assert_eq!(
        online_pushes,
        Some(0),
        "a wallet with its socket open is not pushed (proposal, online request)"
    );
    let id = e.client_id.trim_start_matches("did:key:");
    let all: Vec<_> = push
        .pushes()
        .into_iter()
        .filter(|p| p.client_id == id)
        .collect();
    assert!(all.len() <= 1, "one push for one request: {all:?}");
    (e, got)
}

/// The relay with `--push-url` at the stand-in, which gets the relay's key.
fn relay_and_push(threads: &str) -> (PushServer, Server) {
    let push = PushServer::start();
    let server = Server::start(&[
        "--threads",
        threads,
        "--push-url",
        &push.url(),
        "--webhook-allow-private",
    ]);
    push.set_relay_public_key(&relay_id::public_key_hex(&server));
    (push, server)
}

/// `--push-url`, `GET /public-key`, the signed push; the wallet's subscription outlives its
/// socket (its client id's).
#[test]
fn sdk_sleeping_wallet_is_pushed_the_raw_half_and_answers_when_woken() {
    let (push, server) = relay_and_push("2");
    let (e, got) = run_push(&push, &server, true);
    let half = got.expect("no push reached the push server for the sleeping wallet");
    assert_eq!(
        half,
        Half::Raw {
            topic: e.topic.clone(),
            tag: 1108,
            message: e.message.clone()
        }
    );
}

/// As above; the legacy half (`always_raw` false, the SDK's default).
#[test]
fn sdk_sleeping_wallet_is_pushed_the_legacy_half_and_answers_when_woken() {
    let (push, server) = relay_and_push("1");
    let (e, got) = run_push(&push, &server, false);
    let half = got.expect("no push reached the push server for the sleeping wallet");
    assert_eq!(
        half,
        Half::Legacy {
            id: sha256_hex(e.message.as_bytes()),
            topic: e.topic.clone(),
            flags: 3,
            blob: e.message.clone()
        }
    );
}

fn run_reconnect(version: &str) {
    node::ensure_node_modules("e2e-sdk", MARKER);
    let server = Server::start(&["--threads", "2"]);
    let relay = format!("ws://{}", server.addr);
    let scenario = format!("reconnect-{version}");
    node::run_script(
        "e2e-sdk",
        "push.mjs",
        &[
            ("SCENARIO", scenario.as_str()),
            ("RELAY_URL", relay.as_str()),
        ],
        SCRIPT_DEADLINE,
        &format!("SCENARIO={scenario}, relay {relay}"),
    );
}

/// 2.25.0 comes back with `irn_batchSubscribe` alone.
#[test]
fn sdk_2_25_0_wallet_gets_each_message_once_after_an_offline_period() {
    run_reconnect("2.25.0");
}

/// 2.17.1 comes back with `irn_batchFetchMessages` then `irn_batchSubscribe`: the wire
/// check asserts each offline message reaches it once (a fetched message is not pushed
/// again by the subscription that follows).
#[test]
fn sdk_2_17_1_wallet_gets_each_message_once_after_an_offline_period() {
    run_reconnect("2.17.1");
}

// ---------------------------------------------------------------------------------------------
// The stand-in itself

fn relay_key() -> Ed25519KeyPair {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A push server knowing `key` as the relay's, with a raw and a legacy client.
fn stand_in(key: &Ed25519KeyPair) -> PushServer {
    let p = PushServer::start();
    p.set_relay_public_key(&hex(key.public_key().as_ref()));
    p.register("did:key:z6MkRaw", "noop", "token-raw", true);
    p.register("did:key:z6MkLegacy", "noop", "token-legacy", false);
    p
}

fn body(message: &str) -> String {
    json!({"topic": "ab".repeat(32), "tag": 1108, "message": message,
        "id": sha256_hex(message.as_bytes()),
        "payload": {"topic": "ab".repeat(32), "flags": 3, "blob": message}})
    .to_string()
}

fn send(p: &PushServer, path: &str, ts: &str, sig: &str, body: &str) -> u16 {
    let headers = [
        ("Content-Type", "application/json"),
        ("X-Ed25519-Timestamp", ts),
        ("X-Ed25519-Signature", sig),
    ];
    p.post(path, &headers, body).0
}

#[test]
fn push_stand_in_accepts_what_the_relay_key_signed_and_refuses_tampering() {
    let key = relay_key();
    let p = stand_in(&key);
    let b = body("bWVzc2FnZQ==");
    let sig = sign(&key, "1700000000", &b);
    assert_eq!(send(&p, "/clients/z6MkRaw", "1700000000", &sig, &b), 202);
    let pushes = p.pushes();
    assert_eq!(pushes.len(), 1);
    assert_eq!(pushes[0].client_id, "z6MkRaw");
    assert_eq!(pushes[0].half.message(), "bWVzc2FnZQ==");

    // The same signature over another body, another timestamp, or by another key: 401.
    let tampered = b.replace("bWVzc2FnZQ==", "bWVzc2FnZR==");
    assert_eq!(
        send(&p, "/clients/z6MkRaw", "1700000000", &sig, &tampered),
        401
    );
    assert_eq!(send(&p, "/clients/z6MkRaw", "1700000001", &sig, &b), 401);
    let other = sign(&relay_key(), "1700000000", &b);
    assert_eq!(send(&p, "/clients/z6MkRaw", "1700000000", &other, &b), 401);
    // Missing headers: 401; a signature that is not hex or not 64 bytes: 500.
    let no_sig = [
        ("Content-Type", "application/json"),
        ("X-Ed25519-Timestamp", "1"),
    ];
    assert_eq!(p.post("/clients/z6MkRaw", &no_sig, &b).0, 401);
    assert_eq!(
        p.post(
            "/clients/z6MkRaw",
            &[("Content-Type", "application/json")],
            &b
        )
        .0,
        401
    );
    assert_eq!(send(&p, "/clients/z6MkRaw", "1700000000", "zz", &b), 500);
    assert_eq!(
        send(&p, "/clients/z6MkRaw", "1700000000", &sig[..64], &b),
        500
    );
    // The signature is checked before the client is looked up.
    assert_eq!(
        send(&p, "/clients/z6MkNobody", "1700000000", &other, &b),
        401
    );
    assert_eq!(p.pushes().len(), 1, "nothing refused was pushed");
}

#[test]
fn push_stand_in_picks_the_half_dedups_and_answers_as_push_server() {
    let key = relay_key();
    let p = stand_in(&key);
    let signed = |b: &str| sign(&key, "1", b);
    let b = body("first");
    // An unknown client: 202 and nothing pushed (ClientNotFound); did:key: in the path is
    // looked up verbatim, so it is unknown too.
    assert_eq!(send(&p, "/clients/z6MkNobody", "1", &signed(&b), &b), 202);
    assert_eq!(
        send(&p, "/clients/did:key:z6MkRaw", "1", &signed(&b), &b),
        202
    );
    assert!(p.pushes().is_empty());
    // Each client gets its half; a repeat is 200 and not pushed again.
    assert_eq!(send(&p, "/clients/z6MkLegacy", "1", &signed(&b), &b), 202);
    assert_eq!(send(&p, "/clients/z6MkLegacy", "1", &signed(&b), &b), 200);
    assert_eq!(send(&p, "/clients/z6MkRaw", "1", &signed(&b), &b), 202);
    let pushes = p.pushes();
    assert_eq!(pushes.len(), 2);
    let legacy = Half::Legacy {
        id: sha256_hex(b"first"),
        topic: "ab".repeat(32),
        flags: 3,
        blob: "first".into(),
    };
    assert_eq!(pushes[0].half, legacy);
    let raw = Half::Raw {
        topic: "ab".repeat(32),
        tag: 1108,
        message: "first".into(),
    };
    assert_eq!(pushes[1].half, raw);
    // The half the client needs is missing: 400; not JSON: 500.
    let only_raw = json!({"topic": "t", "tag": 1, "message": "m"}).to_string();
    assert_eq!(
        send(
            &p,
            "/clients/z6MkLegacy",
            "1",
            &signed(&only_raw),
            &only_raw
        ),
        400
    );
    let only_legacy =
        json!({"id": "x", "payload": {"topic": "t", "flags": 3, "blob": "m"}}).to_string();
    assert_eq!(
        send(
            &p,
            "/clients/z6MkRaw",
            "1",
            &signed(&only_legacy),
            &only_legacy
        ),
        400
    );
    assert_eq!(send(&p, "/clients/z6MkRaw", "1", &signed("{"), "{"), 500);
    assert_eq!(p.pushes().len(), 2);
    assert!(p.wait_push("did:key:z6MkRaw", Duration::ZERO).is_some());
}

#[test]
fn push_stand_in_registers_clients_as_push_server() {
    let p = PushServer::start();
    let json_ct = [("Content-Type", "application/json")];
    let reg = |v: Value| p.post("/clients", &json_ct, &v.to_string()).0;
    assert_eq!(
        reg(json!({"client_id": "did:key:z6MkA", "type": "noop", "token": "t"})),
        200
    );
    assert_eq!(
        reg(json!({"client_id": "z6MkA", "type": "fcm", "token": "t"})),
        400,
        "not enabled"
    );
    assert_eq!(
        reg(json!({"client_id": "z6MkA", "type": "carrier-pigeon", "token": "t"})),
        400
    );
    assert_eq!(
        reg(json!({"client_id": "z6MkA", "type": "noop", "token": ""})),
        400
    );
    assert_eq!(reg(json!({"client_id": "z6MkA", "type": "noop"})), 422);
    assert_eq!(p.post("/clients", &json_ct, "{").0, 400);
    assert_eq!(p.post("/clients", &[], "{}").0, 415);
    let ok: Value = serde_json::from_str(
        &p.post(
            "/clients",
            &json_ct,
            &json!({"client_id": "z6MkB", "type": "NOOP", "token": "u", "always_raw": true})
                .to_string(),
        )
        .1,
    )
    .unwrap();
    assert_eq!(ok["status"], "SUCCESS");
}

#[test]
fn relay_id_did_key_is_the_issuer_the_relay_names() {
    let key = relay_key();
    let pk: [u8; 32] = key.public_key().as_ref().try_into().unwrap();
    assert_eq!(
        relay_id::did_key(&hex(&pk)),
        walletrelay::auth::issuer_of(&pk)
    );
    assert!(relay_id::did_key(&hex(&pk)).starts_with("did:key:z6Mk"));
}

#[test]
fn relay_id_verify_jwt_accepts_the_relay_signature_only() {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let key = relay_key();
    let pk = hex(key.public_key().as_ref());
    let signed = format!(
        "{}.{}",
        b64(br#"{"typ":"JWT","alg":"EdDSA"}"#),
        b64(br#"{"act":"irn_watchEvent"}"#)
    );
    let jwt = format!("{signed}.{}", b64(key.sign(signed.as_bytes()).as_ref()));
    let claims = relay_id::verify_jwt(&jwt, &pk).expect("verifies");
    assert_eq!(claims["act"], "irn_watchEvent");
    let other = hex(relay_key().public_key().as_ref());
    assert!(relay_id::verify_jwt(&jwt, &other).is_err(), "another key");
    let forged = format!(
        "{}.{}.{}",
        b64(br#"{"typ":"JWT","alg":"EdDSA"}"#),
        b64(br#"{"act":"irn_watchRegister"}"#),
        jwt.rsplit('.').next().unwrap()
    );
    assert!(relay_id::verify_jwt(&forged, &pk).is_err(), "other claims");
}

#[test]
fn push_stand_in_checks_a_registration_jwt_and_fetches_a_noop_url_token() {
    use base64::Engine;
    use common::webhook::{Receiver, Reply};
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let wallet = relay_key();
    let did = relay_id::did_key(&hex(wallet.public_key().as_ref()));
    let p = PushServer::start();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let jwt = |aud: &str| {
        let claims = json!({"iss": did, "aud": aud, "sub": "x", "iat": now}).to_string();
        let signed = format!(
            "{}.{}",
            b64(br#"{"alg":"EdDSA","typ":"JWT"}"#),
            b64(claims.as_bytes())
        );
        format!("{signed}.{}", b64(wallet.sign(signed.as_bytes()).as_ref()))
    };
    let reg = |id: &str, auth: &str| {
        let body = json!({"client_id": id, "type": "noop", "token": "t"}).to_string();
        let h = [
            ("Content-Type", "application/json"),
            ("Authorization", auth),
        ];
        p.post("/clients", &h, &body).0
    };
    assert_eq!(reg(&did, &jwt(&p.url())), 200);
    assert_eq!(
        reg("did:key:z6MkSomeoneElse", &jwt(&p.url())),
        401,
        "iss is not the client"
    );
    assert_eq!(
        reg(&did, &jwt("https://echo.walletconnect.com")),
        401,
        "another aud"
    );
    assert_eq!(reg(&did, "garbage"), 401);

    // The noop provider GETs a URL token: 2xx, pushed; otherwise no answer and no push.
    let key = relay_key();
    p.set_relay_public_key(&hex(key.public_key().as_ref()));
    let device = Receiver::start(|n| Reply::Status(if n == 0 { 200 } else { 500 }));
    p.register("did:key:z6MkDevice", "noop", &device.url("/wake"), true);
    let b = body("wake up");
    assert_eq!(
        send(&p, "/clients/z6MkDevice", "1", &sign(&key, "1", &b), &b),
        202
    );
    let seen = device
        .next(Duration::from_secs(5))
        .expect("the GET of the token");
    assert_eq!(
        (seen.method.as_str(), seen.target.as_str()),
        ("GET", "/wake")
    );
    let b = body("again");
    assert_eq!(
        send(&p, "/clients/z6MkDevice", "1", &sign(&key, "1", &b), &b),
        0
    );
    assert_eq!(p.pushes().len(), 1);
}
