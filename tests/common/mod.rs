//! Test support: runs the real `walletrelay` binary on a loopback port and talks to it over
//! real sockets.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A WebSocket upgrade request for the relay (the RFC 6455 sample key).
pub const WS_UPGRADE: &[u8] = b"GET /?protocol=wc&version=2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\
    Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
    Sec-WebSocket-Version: 13\r\n\r\n";

/// Sends [`WS_UPGRADE`] on `s`, reads the answer up to its blank line, asserts a 101 and
/// returns the bytes that came after it (the first frames, if any).
pub fn ws_upgrade(s: &mut TcpStream) -> Vec<u8> {
    s.write_all(WS_UPGRADE).expect("send the upgrade");
    let mut buf = Vec::new();
    loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..p]).to_string();
            assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
            buf.drain(..p + 4);
            return buf;
        }
        let mut tmp = [0u8; 1024];
        let n = s.read(&mut tmp).expect("read the upgrade answer");
        assert!(n > 0, "EOF during the upgrade");
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// Lifts this test process's soft open-file limit to the hard one (tests that hold
/// thousands of sockets).
pub fn raise_nofile_limit() {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both calls only read or write the struct on this stack frame.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
}

/// A running server process, killed on drop.
pub struct Server {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The process.
    pub child: Child,
}

impl Server {
    /// Starts the binary on `127.0.0.1:0` with extra `args` and waits until it listens.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn walletrelay");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("server exited before listening")
                .expect("read stdout");
            if let Some(rest) = line.strip_prefix("walletrelay listening on ") {
                break rest.trim().parse().expect("address");
            }
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server { addr, child }
    }

    /// A raw TCP connection with generous timeouts.
    pub fn tcp(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// Sends `raw` on a fresh connection and reads until the server closes it.
    pub fn raw_exchange(&self, raw: &[u8]) -> Vec<u8> {
        let mut s = self.tcp();
        s.write_all(raw).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking WebSocket client (tungstenite) connected to the relay.
pub struct Ws {
    /// The socket.
    pub sock: tungstenite::WebSocket<TcpStream>,
    /// The worker that accepted it (from the `X-Walletrelay-Worker` header).
    pub worker: usize,
    next_id: u64,
}

impl Server {
    /// Opens a WebSocket to the relay at `/`.
    pub fn ws(&self) -> Ws {
        self.ws_path("/?protocol=wc&version=2")
    }

    /// Opens a WebSocket at `path`.
    pub fn ws_path(&self, path: &str) -> Ws {
        let stream = self.tcp();
        let url = format!("ws://{}{}", self.addr, path);
        let (sock, resp) = tungstenite::client::client(url.as_str(), stream).expect("handshake");
        let worker = resp
            .headers()
            .get("x-walletrelay-worker")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .expect("worker header");
        Ws {
            sock,
            worker,
            next_id: 1,
        }
    }

    /// Opens WebSockets until one lands on a worker other than `worker` (needs >1 worker).
    pub fn ws_not_on(&self, worker: usize) -> Ws {
        for _ in 0..200 {
            let w = self.ws();
            if w.worker != worker {
                return w;
            }
        }
        panic!("every connection landed on worker {worker}");
    }

    /// Opens WebSockets until one lands on `worker`.
    pub fn ws_on(&self, worker: usize) -> Ws {
        for _ in 0..200 {
            let w = self.ws();
            if w.worker == worker {
                return w;
            }
        }
        panic!("no connection landed on worker {worker}");
    }

    /// `walletrelay_messages_dropped_total{reason="<reason>"}` from `/metrics`.
    pub fn dropped(&self, reason: &str) -> f64 {
        let raw =
            self.raw_exchange(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let text = String::from_utf8_lossy(&raw).to_string();
        let want = format!("reason=\"{reason}\"");
        text.lines()
            .filter(|l| l.starts_with("walletrelay_messages_dropped_total{") && l.contains(&want))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// GETs `/metrics` and returns the sum of a metric over all its series.
    pub fn metric(&self, name: &str) -> f64 {
        let raw =
            self.raw_exchange(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let text = String::from_utf8_lossy(&raw).to_string();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                let n = l.split(['{', ' ']).next().unwrap_or("");
                n == name
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Ws {
    /// Sends a text message.
    pub fn send_text(&mut self, text: &str) {
        self.sock
            .send(tungstenite::Message::text(text))
            .expect("send");
    }

    /// Sends a JSON value.
    pub fn send(&mut self, v: &serde_json::Value) {
        self.send_text(&v.to_string());
    }

    /// Receives the next text message as JSON (skipping control frames).
    pub fn recv(&mut self) -> serde_json::Value {
        loop {
            match self.sock.read().expect("read") {
                tungstenite::Message::Text(t) => {
                    return serde_json::from_str(t.as_str()).expect("json from server")
                }
                tungstenite::Message::Binary(_) => panic!("unexpected binary message"),
                tungstenite::Message::Close(c) => panic!("closed: {c:?}"),
                _ => continue,
            }
        }
    }

    /// Receives the next message if one comes within `ms`.
    pub fn recv_within(&mut self, ms: u64) -> Option<serde_json::Value> {
        self.sock
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(ms)))
            .unwrap();
        let r = loop {
            match self.sock.read() {
                Ok(tungstenite::Message::Text(t)) => {
                    break Some(serde_json::from_str(t.as_str()).unwrap())
                }
                Ok(tungstenite::Message::Close(c)) => panic!("closed: {c:?}"),
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    break None
                }
                Err(e) => panic!("read: {e}"),
            }
        };
        self.sock
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        r
    }

    /// Sends a request and returns its response (pushes that arrive first are an error).
    pub fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(
            &serde_json::json!({"id": id, "jsonrpc": "2.0", "method": method, "params": params}),
        );
        let r = self.recv();
        assert_eq!(r["id"], id, "response to another request: {r}");
        r
    }

    /// Subscribes and returns the subscription id.
    pub fn subscribe(&mut self, topic: &str) -> String {
        let r = self.call("waku_subscribe", serde_json::json!({ "topic": topic }));
        r["result"]
            .as_str()
            .unwrap_or_else(|| panic!("subscribe failed: {r}"))
            .to_string()
    }

    /// Publishes and asserts the `true` result.
    pub fn publish(&mut self, topic: &str, message: &str) {
        let r = self.call(
            "waku_publish",
            serde_json::json!({ "topic": topic, "message": message, "ttl": 21600 }),
        );
        assert_eq!(r["result"], true, "publish failed: {r}");
    }

    /// Receives the next push and returns `(subscription id, topic, message)`, acking it.
    pub fn next_push(&mut self) -> (String, String, String) {
        let m = self.recv();
        assert_eq!(m["method"], "waku_subscription", "not a push: {m}");
        assert_eq!(m["jsonrpc"], "2.0");
        assert!(m["id"].is_u64(), "push id must be a number: {m}");
        self.send(&serde_json::json!({"id": m["id"], "jsonrpc": "2.0", "result": true}));
        let p = &m["params"];
        (
            p["id"].as_str().unwrap().to_string(),
            p["data"]["topic"].as_str().unwrap().to_string(),
            p["data"]["message"].as_str().unwrap().to_string(),
        )
    }
}

/// A fresh 64-hex topic, like real clients use.
pub fn topic() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:032x}{:016x}{:016x}", t, n, std::process::id())
}

/// `n` lowercase hex characters of pseudo-random bytes from `seed` (xorshift): what the
/// encrypted payloads of real clients look like, reproducibly.
pub fn hex(n: usize, mut seed: u64) -> String {
    let mut s = String::with_capacity(n + 16);
    while s.len() < n {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        s.push_str(&format!("{seed:016x}"));
    }
    s.truncate(n);
    s
}

/// Worker counts every relay test runs at: one worker, and four (cross-worker routing).
pub const THREADS: [&str; 2] = ["1", "4"];
