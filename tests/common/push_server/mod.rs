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
//!   per client: a repeat is 200 and not pushed; else sent by the client's provider,
//!   recorded and 202;
//! - the `noop` provider (the only one enabled by default): a token that is a URL is fetched
//!   with `GET` (2xx expected: otherwise no answer, as push-server's `assert!` panics);
//! - a registration's optional `Authorization` (a relay JWT for `aud` = PUBLIC_URL, the
//!   stand-in's URL, whose `iss` is the `client_id`): invalid, 401.
//!
//! Not modelled: Ed25519 `verify_strict`'s extra small-order checks (ring's verification is
//! used), the 100 MiB body cap (1 MiB here: a bigger body is 400 as a body that cannot be
//! read), the tenant store (single tenant), analytics and metrics.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

mod handlers;

// Each test binary uses some of these, none uses all.
use handlers::{failure, route, unhex};
#[allow(unused_imports)]
pub use handlers::{sha256_hex, sign, signature_is_valid};

/// The largest request body read.
const MAX_BODY: usize = 1 << 20;
/// The providers a debug build of push-server offers a tenant with no APNs or FCM credentials.
const DEFAULT_PROVIDERS: [&str; 1] = ["noop"];

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
    /// PUBLIC_URL: the stand-in's own URL (a registration JWT's `aud`).
    public_url: String,
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
                public_url: format!("http://{addr}"),
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

    /// Sends one request to it and returns the status (0: no answer) and body (for its tests).
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
            .unwrap_or(0); // 0: closed without an answer
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
        if status == 0 {
            return; // push-server's handler panicked: no answer
        }
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
