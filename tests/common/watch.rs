//! Watch registrations as a service makes them (DECISIONS 13): `registerAuth` /
//! `unregisterAuth` claims signed by the watched client's key, `GET /public-key`, and the
//! `walletrelay_watches` gauge a node shows in `/metrics`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::http::{body_of, status_of};
use super::jwt::Signer;
use super::ws::Ws;
use super::Server;

/// A day in seconds.
pub const DAY: u64 = 24 * 3600;

/// Unix seconds now.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `GET /public-key`: 200, `text/plain`, 64 lowercase hex characters (returned).
pub fn public_key(s: &Server) -> String {
    let raw = s.raw_exchange(b"GET /public-key HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status_of(&raw), Some(200));
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(head.contains("content-type: text/plain"), "{head}");
    let key = String::from_utf8(body_of(&raw).to_vec()).unwrap();
    assert_eq!(key.len(), 64, "{key}");
    assert!(key
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    key
}

/// The webhook URL of registration number `i`.
pub fn webhook(i: usize) -> String {
    format!("https://notify.example/v1/relay-webhook/{i}")
}

/// registerAuth claims of `c` for webhook number `i`, overridden by `extra`.
pub fn register_claims(c: &Signer, i: usize, extra: Value) -> Value {
    let t = now();
    let mut v = json!({
        "iss": c.did(),
        "aud": "https://relay.walletconnect.com",
        "sub": "https://notify.example/",
        "iat": t,
        "exp": t + 30 * DAY,
        "act": "irn_watchRegister",
        "typ": "subscriber",
        "whu": webhook(i),
        "tag": [4000, 4002],
        "sts": ["accepted", "queued"],
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

/// unregisterAuth claims of `c` for its `typ` registration of webhook number `i` (no
/// `exp`, as relay_client sends it).
pub fn unregister_claims(c: &Signer, i: usize, typ: &str) -> Value {
    json!({
        "iss": c.did(), "aud": "https://relay.walletconnect.com", "sub": "https://notify.example/",
        "iat": now(), "act": "irn_watchUnregister", "typ": typ, "whu": webhook(i),
    })
}

/// `irn_watchRegister` of `c`'s subscriber watch number `i`; the whole answer.
pub fn register(ws: &mut Ws, c: &Signer, i: usize) -> Value {
    let t = c.sign(&register_claims(c, i, json!({})));
    ws.call("irn_watchRegister", json!({ "registerAuth": t }))
}

/// `irn_watchUnregister` of `c`'s subscriber watch number `i`; the whole answer.
pub fn unregister(ws: &mut Ws, c: &Signer, i: usize) -> Value {
    let t = c.sign(&unregister_claims(c, i, "subscriber"));
    ws.call("irn_watchUnregister", json!({ "unregisterAuth": t }))
}

/// The node's `walletrelay_watches` gauge.
pub fn watches(s: &Server) -> f64 {
    s.series("walletrelay_watches")
}
