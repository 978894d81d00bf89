//! Watch registrations as a service makes them (DECISIONS 13): `registerAuth` /
//! `unregisterAuth` claims signed by the watched client's key, `GET /public-key`, and the
//! `walletrelay_watches` gauge a node shows in `/metrics`; and the events as a service
//! receives them ([`Service`]: a webhook receiver that checks each POST as relay-api.md (a)
//! says, JWT and claims included), a socket or a `POST /rpc` call as a given client.

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

// ---- Watch events as a service receives them (tests/watch_events.rs) ----

/// How long an event that must come may take (only bounds a wait).
pub const EVENT_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// After the events expected arrived, how long more a repeat or a stray event is given to
/// show up (a "nothing more" check waits this long; passing never depends on it).
pub const STRAGGLERS: std::time::Duration = std::time::Duration::from_millis(800);

/// The service URL every registration here names (`sub`, the events' `aud`).
pub const SERVICE: &str = "https://notify.example/";

/// A WebSocket connected as client `c` (its relay-auth JWT, project `p`).
pub fn connect_as(s: &Server, c: &Signer) -> Ws {
    let url = format!("ws://{}/?auth={}&projectId=p", s.addr, c.fresh_token());
    Ws::handshake(s.tcp(), &url)
}

/// `c`'s request `method(params)` over `POST /rpc` (its JWT without `exp`, as relay_client's
/// HTTP client sends it); the JSON-RPC answer (asserted 200).
pub fn http_call(s: &Server, c: &Signer, method: &str, params: Value) -> Value {
    let body = super::raw_ws::rpc_request(1, method, params);
    let token = c.token_for("https://relay.walletconnect.com", now(), None);
    let raw = format!(
        "POST /rpc?projectId=p&auth={token} HTTP/1.1\r\nHost: x\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = s.request(&raw);
    assert_eq!(r.status, 200, "POST /rpc {method}: {r:?}");
    r.json()
}

/// What a registration asks for: its side, statuses and tags (an empty list: every tag).
#[derive(Clone, Copy, Debug)]
pub struct Filter<'a> {
    /// `typ`.
    pub typ: &'a str,
    /// `sts`.
    pub sts: &'a [&'a str],
    /// `tag`.
    pub tag: &'a [u32],
}

/// Every status of a subscriber's messages, every tag.
pub const SUBSCRIBER_ALL: Filter<'static> = Filter {
    typ: "subscriber",
    sts: &["accepted", "queued", "delivered"],
    tag: &[],
};

/// One verified watch event: its JWT's claims and the path it was POSTed to.
#[derive(Debug, Clone)]
pub struct Event {
    /// The request target the webhook saw.
    pub path: String,
    /// The JWT's claims (signature, `iss`, `act`, `whu` and the claim set checked).
    pub claims: Value,
}

impl Event {
    /// `evt.status`.
    pub fn status(&self) -> &str {
        self.claims["evt"]["status"].as_str().unwrap()
    }
    /// `evt.message`.
    pub fn message(&self) -> &str {
        self.claims["evt"]["message"].as_str().unwrap()
    }
    /// `evt.messageId`.
    pub fn message_id(&self) -> u64 {
        self.claims["evt"]["messageId"].as_u64().unwrap()
    }
    /// `(path, status, message)`, for comparing sets of events.
    pub fn key(&self) -> (String, String, String) {
        (
            self.path.clone(),
            self.status().to_string(),
            self.message().to_string(),
        )
    }
}

fn keys_of(events: &[Event]) -> Vec<(String, String, String)> {
    events.iter().map(Event::key).collect()
}

/// A service that watches clients of one relay: its webhook receiver on loopback (the relay
/// needs `--webhook-allow-private`) and the relay's key from `GET /public-key`.
pub struct Service {
    /// The receiver.
    pub hook: super::webhook::Receiver,
    key: String,
    relay_id: String,
}

impl Service {
    /// A service of relay `s` whose receiver answers its n-th request `reply(n)`.
    pub fn start(
        s: &Server,
        reply: impl Fn(usize) -> super::webhook::Reply + Send + Sync + 'static,
    ) -> Service {
        let key = public_key(s);
        Service {
            hook: super::webhook::Receiver::start(reply),
            relay_id: super::relay_id::did_key(&key),
            key,
        }
    }

    /// A service whose receiver answers every request 204.
    pub fn ok(s: &Server) -> Service {
        Service::start(s, |_| super::webhook::Reply::Status(204))
    }

    /// The path of webhook number `i`.
    pub fn path(i: usize) -> String {
        format!("/v1/relay-webhook/{i}")
    }

    /// registerAuth claims of `c` for webhook `i` with filter `f`, overridden by `extra`.
    pub fn claims(&self, c: &Signer, i: usize, f: Filter<'_>, extra: Value) -> Value {
        let mut v = register_claims(
            c,
            i,
            json!({"sub": SERVICE, "whu": self.hook.url(&Service::path(i)), "typ": f.typ,
                "sts": f.sts, "tag": f.tag}),
        );
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    /// Registers `c`'s watch `i` with filter `f` from `ws` (a socket of anyone); asserts the
    /// relay's did:key answer.
    pub fn register(&self, ws: &mut Ws, c: &Signer, i: usize, f: Filter<'_>) {
        let t = c.sign(&self.claims(c, i, f, json!({})));
        let r = ws.call("irn_watchRegister", json!({ "registerAuth": t }));
        assert_eq!(r["result"]["relayId"], self.relay_id.as_str(), "{r}");
    }

    /// Registers `c`'s watch `i` over `POST /rpc`, sent by `by` (anyone with a token).
    pub fn register_http(&self, s: &Server, by: &Signer, c: &Signer, i: usize, f: Filter<'_>) {
        let t = c.sign(&self.claims(c, i, f, json!({})));
        let r = http_call(s, by, "irn_watchRegister", json!({ "registerAuth": t }));
        assert_eq!(r["result"]["relayId"], self.relay_id.as_str(), "{r}");
    }

    /// Unregisters `c`'s `typ` watch `i` from `ws`; asserts `true`.
    pub fn unregister(&self, ws: &mut Ws, c: &Signer, i: usize, typ: &str) {
        let mut claims = unregister_claims(c, i, typ);
        claims["sub"] = json!(SERVICE);
        claims["whu"] = json!(self.hook.url(&Service::path(i)));
        let r = ws.call(
            "irn_watchUnregister",
            json!({ "unregisterAuth": c.sign(&claims) }),
        );
        assert_eq!(r["result"], true, "{r}");
    }

    /// The next request, checked as a watch event (see [`Service::check`]); panics if none
    /// comes within [`EVENT_WAIT`].
    pub fn event(&self) -> Event {
        let seen = self.hook.next(EVENT_WAIT).expect("a watch event");
        self.check(&seen)
    }

    /// Exactly `n` events: `n` arrive, then none more within [`STRAGGLERS`]; sorted by
    /// [`Event::key`] (the webhook threads may POST them in any order).
    pub fn exactly(&self, n: usize) -> Vec<Event> {
        let mut got: Vec<Event> = Vec::with_capacity(n);
        while got.len() < n {
            match self.hook.next(EVENT_WAIT) {
                Some(seen) => got.push(self.check(&seen)),
                None => panic!("{} of {n} events came: {:#?}", got.len(), keys_of(&got)),
            }
        }
        self.nothing_more();
        got.sort_by_key(Event::key);
        got
    }

    /// No request comes within [`STRAGGLERS`].
    pub fn nothing_more(&self) {
        if let Some(extra) = self.hook.next(STRAGGLERS) {
            let body = String::from_utf8_lossy(&extra.body).to_string();
            let claims = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| Some(super::jwt::claims_of(v["eventAuth"][0].as_str()?)));
            panic!(
                "an unexpected request: {} {body}\n{claims:#?}",
                extra.target
            );
        }
    }

    /// Checks one request as relay-api.md (a) says a watch event is: `POST`, JSON, body
    /// exactly `{"eventAuth":[jwt]}`, the JWT signed by the key of `GET /public-key`, with
    /// exactly the claims of `WatchEventClaims` (`iss` the relayId, `act`, `whu` the URL
    /// POSTed to, `iat`/`exp` sane) and an `evt` of exactly its seven fields.
    pub fn check(&self, seen: &super::webhook::Seen) -> Event {
        assert_eq!(seen.method, "POST");
        let ct = seen.header("content-type");
        assert_eq!(ct, Some("application/json"), "{:?}", seen.headers);
        let body: Value = serde_json::from_slice(&seen.body).expect("a JSON body");
        let obj = body.as_object().expect("an object");
        assert_eq!(obj.len(), 1, "only eventAuth: {body}");
        let list = body["eventAuth"].as_array().expect("eventAuth: an array");
        assert_eq!(list.len(), 1, "exactly one JWT per POST: {body}");
        let jwt = list[0].as_str().expect("a JWT string");
        let claims = super::relay_id::verify_jwt(jwt, &self.key)
            .unwrap_or_else(|e| panic!("event JWT: {e}"));
        let mut names: Vec<&str> = claims
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        let want = [
            "act", "aud", "evt", "exp", "iat", "iss", "sub", "typ", "whu",
        ];
        assert_eq!(names, want, "{claims}");
        assert_eq!(claims["iss"], self.relay_id.as_str(), "{claims}");
        assert_eq!(claims["act"], "irn_watchEvent");
        assert_eq!(claims["whu"], self.hook.url(&seen.target).as_str());
        let (iat, exp) = (claims["iat"].as_u64().unwrap(), claims["exp"].as_u64());
        assert!(iat <= now() + 120 && iat + 120 >= now(), "{claims}");
        assert!(exp.is_some_and(|e| e > iat), "{claims}");
        let evt = claims["evt"].as_object().expect("evt");
        let mut fields: Vec<&str> = evt.keys().map(String::as_str).collect();
        fields.sort_unstable();
        let want = [
            "attestation",
            "message",
            "messageId",
            "publishedAt",
            "status",
            "tag",
            "topic",
        ];
        assert_eq!(fields, want, "{claims}");
        assert!(evt["messageId"].is_u64() && evt["publishedAt"].is_u64());
        assert!(evt["tag"].is_u64() && evt["topic"].is_string());
        assert!(evt["attestation"].is_null() || evt["attestation"].is_string());
        Event {
            path: seen.target.clone(),
            claims,
        }
    }
}
