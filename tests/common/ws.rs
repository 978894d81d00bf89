//! A blocking tungstenite WebSocket client for tests that act like a normal relay client:
//! it answers pings on its own and speaks JSON-RPC (`call`, `subscribe`, `publish`, pushes).
//! Tests that must control every byte use [`super::raw_ws::RawWs`] instead. Both work over
//! plain TCP or TLS (any [`Stream`]).

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::tls::Stream;
use super::{Server, READ_TIMEOUT};

/// A blocking WebSocket client (tungstenite) connected to the relay.
pub struct Ws<S = TcpStream> {
    /// The socket.
    pub sock: tungstenite::WebSocket<S>,
    /// The worker that accepted it (from the `X-Walletrelay-Worker` header).
    pub worker: usize,
    next_id: u64,
}

impl Ws {
    /// Opens a WebSocket to the relay at `addr` (for threads that hold an address, not a
    /// [`Server`]).
    pub fn connect(addr: SocketAddr) -> Ws {
        let url = format!("ws://{addr}{}", super::raw_ws::RELAY_PATH);
        Ws::handshake(super::tcp_to(addr), &url)
    }
}

impl Server {
    /// Opens a WebSocket to the relay at `/` (with the query real clients send).
    pub fn ws(&self) -> Ws {
        Ws::connect(self.addr)
    }

    /// Opens a WebSocket at `path`.
    pub fn ws_path(&self, path: &str) -> Ws {
        Ws::handshake(self.tcp(), &format!("ws://{}{}", self.addr, path))
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
}

impl<S: Stream> Ws<S> {
    /// Upgrades `stream` (connected, nothing sent yet) to a WebSocket at `url`.
    pub fn handshake(stream: S, url: &str) -> Ws<S> {
        let (sock, resp) = tungstenite::client::client(url, stream).expect("handshake");
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

    /// Like [`Ws::handshake`] with extra request headers; the error says why the upgrade
    /// failed (`status 429`, a reset, ...) instead of panicking.
    pub fn try_handshake(stream: S, url: &str, headers: &[(&str, &str)]) -> Result<Ws<S>, String> {
        use tungstenite::client::IntoClientRequest;
        let mut req = url.into_client_request().map_err(|e| e.to_string())?;
        for (k, v) in headers {
            let name = tungstenite::http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| e.to_string())?;
            let value = tungstenite::http::HeaderValue::from_str(v).map_err(|e| e.to_string())?;
            req.headers_mut().append(name, value);
        }
        let (sock, resp) = tungstenite::client::client(req, stream).map_err(|e| match e {
            tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r)) => {
                format!("status {}", r.status().as_u16())
            }
            other => other.to_string(),
        })?;
        let worker = resp
            .headers()
            .get("x-walletrelay-worker")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or("no worker header")?;
        Ok(Ws {
            sock,
            worker,
            next_id: 1,
        })
    }

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

    /// Receives the next message if one comes within `ms` (in all: the server's pings on
    /// the way do not extend the wait).
    pub fn recv_within(&mut self, ms: u64) -> Option<serde_json::Value> {
        let end = Instant::now() + Duration::from_millis(ms);
        let r = loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break None;
            }
            self.sock
                .get_ref()
                .tcp()
                .set_read_timeout(Some(left))
                .unwrap();
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
            .tcp()
            .set_read_timeout(Some(READ_TIMEOUT))
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

    /// Reads until the server's close frame (other messages are skipped) and returns its
    /// code, then completes the close handshake and reads until the connection ends.
    pub fn close_code(&mut self) -> u16 {
        use std::io::ErrorKind;
        self.sock
            .get_ref()
            .tcp()
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let code = loop {
            match self.sock.read() {
                Ok(tungstenite::Message::Close(Some(f))) => break u16::from(f.code),
                Ok(tungstenite::Message::Close(None)) => panic!("close frame without a code"),
                Ok(tungstenite::Message::Text(t)) => panic!("unexpected message {t}"),
                Ok(_) => continue,
                Err(e) => panic!("no close frame: {e}"),
            }
        };
        // tungstenite answers the close; the server then ends the connection.
        loop {
            match self.sock.read() {
                Ok(_) => continue,
                Err(tungstenite::Error::ConnectionClosed) => break,
                Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) => panic!("after the close handshake: {e}"),
            }
        }
        code
    }
}
