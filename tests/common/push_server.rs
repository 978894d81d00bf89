//! A stand-in for `reown-com/push-server` (39bac20, single tenant), the push server a wallet
//! company runs (it cannot be built here: four git dependencies and Postgres): a loopback
//! HTTP/1.1 server on its own threads that does with a request what push-server does, read
//! from its source, and records each push it accepts for the test to read.
//! - `POST /clients` (`register_client.rs` via `single_tenant_wrappers.rs`): JSON
//!   `{client_id, type, token, always_raw?}`; 415 without a JSON content type, 400 bad JSON,
//!   422 a missing or mistyped field (axum's `Json` rejections), 400 an unknown `type` or one
//!   not configured, 400 an empty token; the id is stored without `did:key:` (a known token
//!   moves to the new id, as `stores/client.rs` does); 200 `{"status":"SUCCESS",..}`.
//! - `POST /clients/{id}` (`push_message.rs`, `middleware/validate_signature.rs`): the
//!   signature first: `X-Ed25519-Signature` = hex Ed25519 of
//!   `"{X-Ed25519-Timestamp}.{body length}.{body}"` under `RELAY_PUBLIC_KEY` (missing or
//!   invalid: 401; not hex or not 64 bytes: 500); then the JSON body (unparsable or not JSON:
//!   500); an unknown client (the path id looked up verbatim): 202; the half the client's
//!   `always_raw` picks (raw `{topic, tag, message}`, legacy `{id, payload:{topic, flags,
//!   blob}}`), missing: 400; dedup by message id (raw: sha256 hex of `message`, legacy: `id`)
//!   per client: a repeat is 200 and not pushed; else recorded and 202.
//!
//! Not modelled: the optional `Authorization` JWT of a registration (the JS SDK sends none;
//! a request carrying one is refused with 401 here rather than verified), the `noop`
//! provider's `GET` of a URL token (read [`PushServer::wait_push`] instead), Ed25519
//! `verify_strict`'s extra small-order checks (ring's verification is used), the 100 MiB
//! body cap (1 MiB here: a bigger body is 400 as a body that cannot be read).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The largest request body read.
const MAX_BODY: usize = 1 << 20;
/// The providers a debug build of push-server offers a tenant with no APNs or FCM credentials.
const DEFAULT_PROVIDERS: [&str; 1] = ["noop"];
/// Every provider name push-server knows (`ProviderKind::try_from`).
const KNOWN_PROVIDERS: [&str; 4] = ["apns", "apns-sandbox", "fcm", "noop"];

/// Which half of the body push-server used for a push.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Half {
    /// `{topic, tag, message}`: the client registered with `always_raw: true`.
    Raw {
        topic: String,
        tag: u32,
        message: String,
    },
    /// `{id, payload: {topic, flags, blob}}`: the client registered without `always_raw`.
    Legacy {
        id: String,
        topic: String,
        flags: u32,
        blob: String,
    },
}

impl Half {
    /// The message's topic.
    pub fn topic(&self) -> &str {
        match self {
            Half::Raw { topic, .. } | Half::Legacy { topic, .. } => topic,
        }
    }

    /// The message (the raw half's `message`, the legacy half's `blob`).
    pub fn message(&self) -> &str {
        match self {
            Half::Raw { message, .. } => message,
            Half::Legacy { blob, .. } => blob,
        }
    }
}

/// A push the stand-in accepted (answered 202 and handed to the client's provider).
#[derive(Clone, Debug)]
pub struct Push {
    /// The client id as stored (without `did:key:`), from the path.
    pub client_id: String,
    /// The provider (`type`) and device token the client registered.
    pub provider: String,
    pub token: String,
    /// The half of the body used.
    pub half: Half,
    /// The dedup id (raw: sha256 hex of the message; legacy: `id`).
    pub message_id: String,
    /// The whole body as sent.
    pub body: Vec<u8>,
    /// Header fields in order.
    pub headers: Vec<(String, String)>,
}

/// A request and the status it was answered with (every request, accepted or not).
#[derive(Clone, Debug)]
pub struct Answered {
    pub method: String,
    pub path: String,
    pub status: u16,
}

#[derive(Clone, Debug)]
struct Client {
    provider: String,
    token: String,
    always_raw: bool,
}

#[derive(Default)]
struct State {
    relay_key: Option<Vec<u8>>,
    providers: Vec<String>,
    clients: HashMap<String, Client>,
    /// (message id, client id) pairs pushed (push-server's `notifications` table).
    seen: HashSet<(String, String)>,
    pushes: Vec<Push>,
    answered: Vec<Answered>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// The stand-in, listening on 127.0.0.1; stops when dropped.
pub struct PushServer {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    acceptor: Option<thread::JoinHandle<()>>,
}

impl PushServer {
    /// Starts a push server whose tenant offers the `noop` provider only. Its
    /// `RELAY_PUBLIC_KEY` is set with [`PushServer::set_relay_public_key`] (the relay that
    /// calls it is started after it, with its URL); until then every push is 500.
    pub fn start() -> PushServer {
        PushServer::with_providers(&DEFAULT_PROVIDERS)
    }

    /// Starts one whose tenant offers `providers` (e.g. `["fcm", "noop"]`).
    pub fn with_providers(providers: &[&str]) -> PushServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind push server");
        let addr = listener.local_addr().expect("push server address");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                providers: providers.iter().map(|p| p.to_string()).collect(),
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (shared.clone(), stop.clone());
        let acceptor = thread::spawn(move || {
            for stream in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let s = s.clone();
                thread::spawn(move || serve(stream, &s));
            }
        });
        PushServer {
            addr,
            shared,
            stop,
            acceptor: Some(acceptor),
        }
    }

    /// `RELAY_PUBLIC_KEY`: the hex of the relay's `GET /public-key` (any case).
    pub fn set_relay_public_key(&self, hex_key: &str) {
        let key = unhex(hex_key.trim()).expect("RELAY_PUBLIC_KEY is hex");
        assert_eq!(key.len(), 32, "RELAY_PUBLIC_KEY is 32 bytes");
        self.lock().relay_key = Some(key);
    }

    /// Its base URL, `http://127.0.0.1:PORT` (what `--push-url` names).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Registers a client as the wallet's `POST /clients` would, and asserts the 200.
    pub fn register(&self, client_id: &str, provider: &str, token: &str, always_raw: bool) {
        let body = json!({"client_id": client_id, "type": provider, "token": token,
            "always_raw": always_raw})
        .to_string();
        let (status, answer) =
            self.post("/clients", &[("Content-Type", "application/json")], &body);
        assert_eq!(status, 200, "POST /clients: {answer}");
    }

    /// Sends one request to it and returns the status and body (for its own tests).
    pub fn post(&self, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(self.addr).expect("connect push server");
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let mut req = format!("POST {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        s.write_all(req.as_bytes()).expect("send to push server");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("push server answer");
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status line");
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, body.to_string())
    }

    /// The pushes accepted so far, in order.
    pub fn pushes(&self) -> Vec<Push> {
        self.lock().pushes.clone()
    }

    /// Every request answered so far, in order.
    pub fn answered(&self) -> Vec<Answered> {
        self.lock().answered.clone()
    }

    /// The first push accepted for `client_id` (with or without `did:key:`), waiting up to
    /// `within` for it.
    pub fn wait_push(&self, client_id: &str, within: Duration) -> Option<Push> {
        let id = client_id.trim_start_matches("did:key:");
        let deadline = Instant::now() + within;
        let mut st = self.lock();
        loop {
            if let Some(p) = st.pushes.iter().find(|p| p.client_id == id) {
                return Some(p.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for PushServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// Serves one connection's requests (keep-alive) until it closes or sends garbage.
fn serve(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let len = header(&headers, "content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let (status, answer) = if len > MAX_BODY {
            let a = failure("body", "Failed to read the request body");
            write_answer(&mut writer, 400, &a);
            return;
        } else {
            let mut body = vec![0; len];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            let answer = route(shared, &method, &path, &headers, body);
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.answered.push(Answered {
                method,
                path,
                status: answer.0,
            });
            drop(st);
            shared.changed.notify_all();
            answer
        };
        let close = header(&headers, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        if !write_answer(&mut writer, status, &answer) || close {
            return;
        }
    }
}

fn write_answer(w: &mut TcpStream, status: u16, body: &str) -> bool {
    let ctype = if body.is_empty() {
        ""
    } else {
        "Content-Type: application/json\r\n"
    };
    let head = format!(
        "HTTP/1.1 {status} X\r\n{ctype}Content-Length: {}\r\nConnection: keep-alive\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes()).is_ok() && w.write_all(body.as_bytes()).is_ok()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// push-server's failure body (`handlers::Response::new_failure`).
fn failure(name: &str, message: &str) -> String {
    json!({"status": "FAILURE", "errors": [{"name": name, "message": message}], "fields": []})
        .to_string()
}

fn success() -> String {
    json!({"status": "SUCCESS", "errors": null, "fields": null}).to_string()
}

/// axum's `Json` extractor's content-type test: `application/json` or `application/*+json`.
fn is_json(headers: &[(String, String)]) -> bool {
    let Some(ct) = header(headers, "content-type") else {
        return false;
    };
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

fn route(
    shared: &Shared,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> (u16, String) {
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/health") => (200, String::new()),
        ("POST", "/clients") => register(shared, headers, &body),
        ("POST", p) if p.starts_with("/clients/") && p.len() > "/clients/".len() => {
            let id = &p["/clients/".len()..];
            if id.contains('/') {
                return (404, String::new());
            }
            push(shared, id, headers, body)
        }
        _ => (404, String::new()),
    }
}

fn register(shared: &Shared, headers: &[(String, String)], body: &[u8]) -> (u16, String) {
    if header(headers, "authorization").is_some() {
        return (
            401,
            failure("authentication", "not modelled by the stand-in"),
        );
    }
    if !is_json(headers) {
        return (
            415,
            "Expected request with `Content-Type: application/json`".into(),
        );
    }
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return (
                400,
                format!("Failed to parse the request body as JSON: {e}"),
            )
        }
    };
    let (Some(client_id), Some(kind), Some(token)) = (
        v["client_id"].as_str(),
        v["type"].as_str(),
        v["token"].as_str(),
    ) else {
        return (
            422,
            "Failed to deserialize the JSON body into the target type".into(),
        );
    };
    let always_raw = match &v["always_raw"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => {
            return (
                422,
                "Failed to deserialize the JSON body into the target type".into(),
            )
        }
    };
    let kind = kind.to_lowercase();
    if !KNOWN_PROVIDERS.contains(&kind.as_str()) {
        let m = format!("{kind} is an invalid push provider as it cannot be not found");
        return (400, failure("provider", &m));
    }
    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    if !st.providers.contains(&kind) {
        let m = format!("{kind} is an invalid push provider as it has not been enabled");
        return (400, failure("provider", &m));
    }
    if token.is_empty() {
        return (400, failure("token", "the `token` field must not be empty"));
    }
    let id = client_id.trim_start_matches("did:key:").to_string();
    let client = Client {
        provider: kind,
        token: token.to_string(),
        always_raw,
    };
    // stores/client.rs: the same id is updated; a token known under another id moves to
    // this id, and that id's notifications are forgotten.
    if !st.clients.contains_key(&id) {
        let old = st
            .clients
            .iter()
            .find(|(_, c)| c.token == token)
            .map(|(k, _)| k.clone());
        if let Some(old) = old {
            st.clients.remove(&old);
            st.seen.retain(|(_, c)| *c != old);
        }
    }
    st.clients.insert(id, client);
    (200, success())
}

fn push(shared: &Shared, id: &str, headers: &[(String, String)], body: Vec<u8>) -> (u16, String) {
    let key = shared
        .state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .relay_key
        .clone();
    let Some(key) = key else {
        return (500, failure("ed25519", "RELAY_PUBLIC_KEY is not set"));
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let sig = header(headers, "x-ed25519-signature");
    let ts = header(headers, "x-ed25519-timestamp");
    match (sig, ts) {
        (Some(sig), Some(ts)) => match signature_is_valid(sig, ts, &text, &key) {
            Ok(true) => {}
            Ok(false) => return (401, failure("webhook_validation_failed", "invalid")),
            Err(e) => return (500, failure("ed25519", e)),
        },
        _ => return (401, failure("webhook_validation_failed", "missing headers")),
    }
    if !is_json(headers) {
        return (
            500,
            failure("from_request", "middleware T::from_request failed"),
        );
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (
            500,
            failure("from_request", "middleware T::from_request failed"),
        );
    };
    if !v.is_object() {
        return (
            500,
            failure("from_request", "middleware T::from_request failed"),
        );
    }
    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    let Some(client) = st.clients.get(id).cloned() else {
        return (202, success()); // Error::ClientNotFound answers 202
    };
    let half = if client.always_raw {
        match raw_half(&v) {
            Some(h) => h,
            None => {
                let m = "the `missing topic, tag, or message field` field must not be empty";
                return (400, failure("field", m));
            }
        }
    } else {
        match legacy_half(&v) {
            Some(h) => h,
            None => {
                let m = "the `missing id or payload field` field must not be empty";
                return (400, failure("field", m));
            }
        }
    };
    let message_id = match &half {
        Half::Raw { message, .. } => sha256_hex(message.as_bytes()),
        Half::Legacy { id, .. } => id.clone(),
    };
    let client_id = id.trim_start_matches("did:key:").to_string();
    if !st.seen.insert((message_id.clone(), client_id.clone())) {
        return (200, String::new()); // "notification has already been received"
    }
    st.pushes.push(Push {
        client_id,
        provider: client.provider,
        token: client.token,
        half,
        message_id,
        body,
        headers: headers.to_vec(),
    });
    (202, String::new())
}

/// `RawPushMessage`, as serde's flattened `Option` reads it: all three fields, right types.
fn raw_half(v: &Value) -> Option<Half> {
    Some(Half::Raw {
        topic: v["topic"].as_str()?.to_string(),
        tag: u32::try_from(v["tag"].as_u64()?).ok()?,
        message: v["message"].as_str()?.to_string(),
    })
}

/// `LegacyPushMessage`: `id` and a `payload` of `{topic, flags, blob}`.
fn legacy_half(v: &Value) -> Option<Half> {
    let p = &v["payload"];
    Some(Half::Legacy {
        id: v["id"].as_str()?.to_string(),
        topic: p["topic"].as_str()?.to_string(),
        flags: u32::try_from(p["flags"].as_u64()?).ok()?,
        blob: p["blob"].as_str()?.to_string(),
    })
}

/// `validate_signature::signature_is_valid`: Ed25519 over `"{timestamp}.{len}.{body}"`, the
/// signature in hex. `Err` where push-server fails with 500 (not hex, not 64 bytes).
pub fn signature_is_valid(
    signature: &str,
    timestamp: &str,
    body: &str,
    public_key: &[u8],
) -> Result<bool, &'static str> {
    let signed = format!("{}.{}.{}", timestamp, body.len(), body);
    let sig = unhex(signature).ok_or("signature is not hex")?;
    if sig.len() != 64 {
        return Err("signature is not 64 bytes");
    }
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public_key);
    Ok(key.verify(signed.as_bytes(), &sig).is_ok())
}

/// The signature headers' value as the relay must make it (for tests that sign requests).
pub fn sign(key: &ring::signature::Ed25519KeyPair, timestamp: &str, body: &str) -> String {
    let signed = format!("{}.{}.{}", timestamp, body.len(), body);
    to_hex(key.sign(signed.as_bytes()).as_ref())
}

/// `relay_rpc::rpc::msg_id::get_message_id`: sha256 hex of the message.
pub fn sha256_hex(b: &[u8]) -> String {
    to_hex(ring::digest::digest(&ring::digest::SHA256, b).as_ref())
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    // hex::decode: pairs of hex digits of either case, nothing else
    let digits: Option<Vec<u8>> = s.chars().map(|c| c.to_digit(16).map(|d| d as u8)).collect();
    let digits = digits?;
    if digits.len() % 2 != 0 {
        return None;
    }
    Some(digits.chunks(2).map(|p| p[0] << 4 | p[1]).collect())
}
