//! A raw WebSocket client for the tests (RFC 6455 by hand over a `TcpStream`, or a TLS
//! stream to the TLS listener: any [`Stream`]): the upgrade
//! is written here, client frames are built here (masked or not, any bits, fragmented, or
//! arbitrary bytes) and the server's frames are decoded here, so nothing in between forgives
//! a mistake. It reads only when told to and never answers anything on its own (no pong, no
//! close reply): what a client does is the test's choice. It must not judge the server
//! beyond the framing rules every server frame must follow (unmasked, no reserved bits but
//! RSV1 once permessage-deflate was agreed); payloads are given as they came (a test
//! inflates a compressed one itself).

use std::io::{self, ErrorKind};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::http::HttpConn;
use super::tls::Stream;
use super::{Server, READ_TIMEOUT};

/// Opcode of a continuation frame.
pub const OP_CONT: u8 = 0x0;
/// Opcode of a text frame.
pub const OP_TEXT: u8 = 0x1;
/// Opcode of a binary frame.
pub const OP_BINARY: u8 = 0x2;
/// Opcode of a close frame.
pub const OP_CLOSE: u8 = 0x8;
/// Opcode of a ping.
pub const OP_PING: u8 = 0x9;
/// Opcode of a pong.
pub const OP_PONG: u8 = 0xA;

/// The key and accept value from RFC 6455 §1.3 (independent of any implementation).
pub const RFC_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// The accept value for [`RFC_KEY`].
pub const RFC_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// The path and query a WalletConnect client upgrades at.
pub const RELAY_PATH: &str = "/?protocol=wc&version=2";

/// A complete upgrade request for `path` with `key`; `extra_headers` (each line ending in
/// `\r\n`) go after the standard ones.
pub fn upgrade_request(path: &str, key: &str, extra_headers: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra_headers}\r\n"
    )
}

/// One frame: first byte `b0` as given (FIN, RSV, opcode), the payload masked with `mask`
/// (the mask bit set) or sent as is.
pub fn encode_frame(b0: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut v = vec![b0];
    let mbit = if mask.is_some() { 0x80 } else { 0 };
    let n = payload.len();
    if n < 126 {
        v.push(mbit | n as u8);
    } else if n <= 0xFFFF {
        v.push(mbit | 126);
        v.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        v.push(mbit | 127);
        v.extend_from_slice(&(n as u64).to_be_bytes());
    }
    match mask {
        Some(m) => {
            v.extend_from_slice(&m);
            v.extend(payload.iter().enumerate().map(|(i, b)| b ^ m[i % 4]));
        }
        None => v.extend_from_slice(payload),
    }
    v
}

/// A masked client frame with a fixed key, for bytes written before a [`RawWs`] exists
/// (right behind the upgrade request, say).
pub fn client_frame(fin: bool, op: u8, payload: &[u8]) -> Vec<u8> {
    encode_frame(
        if fin { 0x80 } else { 0 } | op,
        payload,
        Some([0x37, 0xfa, 0x21, 0x3d]),
    )
}

/// A JSON-RPC 2.0 request as text.
pub fn rpc_request(id: u64, method: &str, params: Value) -> String {
    json!({"id": id, "jsonrpc": "2.0", "method": method, "params": params}).to_string()
}

/// A server frame as it came off the wire.
#[derive(Debug)]
pub struct Frame {
    /// FIN bit.
    pub fin: bool,
    /// The three reserved bits.
    pub rsv: u8,
    /// Opcode.
    pub op: u8,
    /// Whether the mask bit was set (a server must never set it).
    pub masked: bool,
    /// The payload (unmasked).
    pub payload: Vec<u8>,
}

impl Frame {
    /// The frame must be a text frame holding JSON.
    pub fn json(&self) -> Value {
        assert_eq!(self.op, OP_TEXT, "expected a text frame, got {self:?}");
        serde_json::from_slice(&self.payload).expect("server text is JSON")
    }

    /// RSV1: the payload is compressed (permessage-deflate).
    pub fn rsv1(&self) -> bool {
        self.rsv & 0x4 != 0
    }

    /// The status code of a close frame whose payload holds one.
    pub fn close_code(&self) -> Option<u16> {
        let p = self.payload.get(..2)?;
        (self.op == OP_CLOSE).then(|| u16::from_be_bytes([p[0], p[1]]))
    }
}

/// What reading the next frame gave.
#[derive(Debug)]
pub enum Next {
    /// A whole frame.
    Frame(Frame),
    /// The stream ended (EOF) between frames.
    Eof,
    /// The stream ended inside a frame (`error: None`: EOF), or failed (a reset, ...), with
    /// `buffered` bytes of the unfinished frame read.
    Cut {
        /// Bytes of the unfinished frame read (0: the failure came between frames).
        buffered: usize,
        /// The read error; `None` for EOF.
        error: Option<io::Error>,
    },
    /// Nothing (or only part of a frame, kept for the next read) within the read timeout.
    Timeout,
}

impl Next {
    /// The stream ended between frames: EOF, or a reset with nothing of a frame read.
    pub fn is_end(&self) -> bool {
        match self {
            Next::Eof => true,
            Next::Cut {
                buffered: 0,
                error: Some(e),
            } => e.kind() == ErrorKind::ConnectionReset,
            _ => false,
        }
    }
}

/// A raw WebSocket connection (upgraded), with its unparsed input.
pub struct RawWs<S = TcpStream> {
    /// The socket (for writes a test wants to make by hand, or socket options).
    pub sock: S,
    buf: Vec<u8>,
    /// Where the next frame starts in `buf`.
    pos: usize,
    mask_seed: u32,
    next_id: u64,
    /// The `Sec-WebSocket-Extensions` of the 101, if any.
    extensions: Option<String>,
}

impl RawWs {
    /// Upgrades a fresh connection at [`RELAY_PATH`].
    pub fn open(server: &Server) -> RawWs {
        RawWs::upgrade(server.tcp())
    }

    /// Upgrades a fresh connection at `path`.
    pub fn open_at(server: &Server, path: &str) -> RawWs {
        RawWs::upgrade_at(server.tcp(), path, "")
    }
}

impl<S: Stream> RawWs<S> {
    /// Upgrades `sock` (connected, nothing sent yet) at [`RELAY_PATH`].
    pub fn upgrade(sock: S) -> RawWs<S> {
        RawWs::upgrade_at(sock, RELAY_PATH, "")
    }

    /// Sends an upgrade request for `path` with [`RFC_KEY`] and `extra_headers` on `sock`,
    /// then requires the 101 (see [`RawWs::expect_101`]).
    pub fn upgrade_at(mut sock: S, path: &str, extra_headers: &str) -> RawWs<S> {
        sock.write_all(upgrade_request(path, RFC_KEY, extra_headers).as_bytes())
            .and_then(|()| sock.flush())
            .expect("send the upgrade request");
        RawWs::expect_101(sock)
    }

    /// Reads the answer to an upgrade request sent with [`RFC_KEY`] and requires a 101 with
    /// the RFC 6455 §1.3 accept value, `Upgrade: websocket` and `Connection: upgrade`.
    /// Bytes after the answer (the first frames) are kept.
    pub fn expect_101(sock: S) -> RawWs<S> {
        let mut c = HttpConn::new(sock);
        let r = c.response(false);
        assert_eq!(r.status, 101, "upgrade refused: {r:?}");
        assert_eq!(r.header("Sec-WebSocket-Accept"), Some(RFC_ACCEPT), "{r:?}");
        assert!(
            r.header("Upgrade")
                .is_some_and(|v| v.eq_ignore_ascii_case("websocket")),
            "{r:?}"
        );
        assert!(
            r.header("Connection").is_some_and(|v| v
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))),
            "{r:?}"
        );
        let extensions = r.header("Sec-WebSocket-Extensions").map(str::to_string);
        RawWs {
            sock: c.s,
            buf: c.buf,
            pos: 0,
            mask_seed: 0x9e37_79b9,
            next_id: 1,
            extensions,
        }
    }

    /// The extensions the server agreed to (`Sec-WebSocket-Extensions` of its 101).
    pub fn extensions(&self) -> Option<&str> {
        self.extensions.as_deref()
    }

    /// Whether permessage-deflate was agreed (the server may then set RSV1).
    fn deflate(&self) -> bool {
        self.extensions
            .as_deref()
            .is_some_and(|e| e.starts_with("permessage-deflate"))
    }

    // --------------------------------------------------------------------------------------
    // Sending

    /// The next masking key: a different, never-zero key per frame, so phase bugs in the
    /// server's unmasking show.
    pub fn next_mask(&mut self) -> [u8; 4] {
        self.mask_seed = self
            .mask_seed
            .wrapping_mul(1_664_525)
            .wrapping_add(1_013_904_223);
        let m = self.mask_seed.to_be_bytes();
        if m.iter().all(|&b| b == 0) {
            [1, 2, 3, 4]
        } else {
            m
        }
    }

    /// A masked client frame with first byte `b0` as given (FIN, RSV, opcode), not sent.
    pub fn masked_frame(&mut self, b0: u8, payload: &[u8]) -> Vec<u8> {
        let mask = self.next_mask();
        encode_frame(b0, payload, Some(mask))
    }

    /// Writes `bytes` as they are; the test fails if the write does.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.try_send_raw(bytes).expect("write to the server");
    }

    /// Writes `bytes` as they are, returning the error (the server may have closed).
    pub fn try_send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.sock.write_all(bytes)?;
        self.sock.flush()
    }

    /// Sends one masked frame.
    pub fn send_frame(&mut self, fin: bool, op: u8, payload: &[u8]) {
        self.send_b0(if fin { 0x80 } else { 0 } | op, payload);
    }

    /// Sends one masked frame with first byte `b0` as given (FIN, RSV, opcode).
    pub fn send_b0(&mut self, b0: u8, payload: &[u8]) {
        let f = self.masked_frame(b0, payload);
        self.send_raw(&f);
    }

    /// Sends a message as `parts.len()` frames: the first with `op`, the rest continuations,
    /// FIN on the last.
    pub fn send_fragmented(&mut self, op: u8, parts: &[&[u8]]) {
        for (i, p) in parts.iter().enumerate() {
            let first = if i == 0 { op } else { OP_CONT };
            self.send_frame(i + 1 == parts.len(), first, p);
        }
    }

    /// Sends a text message in one frame.
    pub fn send_text(&mut self, text: &str) {
        self.send_frame(true, OP_TEXT, text.as_bytes());
    }

    /// Sends a binary message in one frame.
    pub fn send_binary(&mut self, payload: &[u8]) {
        self.send_frame(true, OP_BINARY, payload);
    }

    /// Sends a ping.
    pub fn send_ping(&mut self, payload: &[u8]) {
        self.send_frame(true, OP_PING, payload);
    }

    /// Sends a pong.
    pub fn send_pong(&mut self, payload: &[u8]) {
        self.send_frame(true, OP_PONG, payload);
    }

    /// Sends a close frame with `code` and `reason` (no payload at all for `None`).
    pub fn send_close(&mut self, code: Option<u16>, reason: &str) {
        let mut p = Vec::new();
        if let Some(c) = code {
            p.extend_from_slice(&c.to_be_bytes());
            p.extend_from_slice(reason.as_bytes());
        }
        self.send_frame(true, OP_CLOSE, &p);
    }

    /// Sends a JSON value as a text message.
    pub fn send_json(&mut self, v: &Value) {
        self.send_text(&v.to_string());
    }

    /// Sends a JSON-RPC request with the connection's next id (1, 2, ...) and returns that
    /// id; the answer is read when the test says so.
    pub fn call(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_text(&rpc_request(id, method, params));
        id
    }

    /// Subscribes to `topic`, reads the answer (the next frame) and returns the subscription
    /// id it carries.
    pub fn subscribe(&mut self, topic: &str) -> String {
        let id = self.call("waku_subscribe", json!({ "topic": topic }));
        let v = self.recv_json();
        assert_eq!(v["id"], id, "answer to another request: {v}");
        v["result"]
            .as_str()
            .unwrap_or_else(|| panic!("subscribe failed: {v}"))
            .to_string()
    }

    // --------------------------------------------------------------------------------------
    // Reading

    /// Makes sure `n` bytes of the frame at `pos` are buffered.
    fn fill(&mut self, n: usize) -> Result<(), Next> {
        while self.buf.len() - self.pos < n {
            if self.pos > 0 && self.pos * 2 >= self.buf.len() {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + 65536, 0);
            let r = self.sock.read(&mut self.buf[old..]);
            self.buf.truncate(old + *r.as_ref().unwrap_or(&0));
            let buffered = self.buf.len() - self.pos;
            match r {
                Ok(0) if buffered == 0 => return Err(Next::Eof),
                Ok(0) => {
                    return Err(Next::Cut {
                        buffered,
                        error: None,
                    })
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(Next::Timeout)
                }
                Err(e) => {
                    return Err(Next::Cut {
                        buffered,
                        error: Some(e),
                    })
                }
            }
        }
        Ok(())
    }

    /// The next server frame (waiting up to the socket's read timeout). A server frame
    /// must never be masked nor set reserved bits (RFC 6455 §5.1, §5.2), but RSV1 when
    /// permessage-deflate was agreed (RFC 7692).
    pub fn next(&mut self) -> Next {
        match self.parse() {
            Ok(f) => {
                assert!(!f.masked, "server sent a masked frame: {f:?}");
                let allowed = if self.deflate() { 0x4 } else { 0 };
                assert_eq!(f.rsv & !allowed, 0, "server set reserved bits: {f:?}");
                Next::Frame(f)
            }
            Err(n) => n,
        }
    }

    fn parse(&mut self) -> Result<Frame, Next> {
        self.fill(2)?;
        let (b0, b1) = (self.buf[self.pos], self.buf[self.pos + 1]);
        let masked = b1 & 0x80 != 0;
        let (len, mut off) = match b1 & 0x7F {
            126 => {
                self.fill(4)?;
                let b = &self.buf[self.pos + 2..self.pos + 4];
                (u16::from_be_bytes([b[0], b[1]]) as usize, 4)
            }
            127 => {
                self.fill(10)?;
                let mut b = [0u8; 8];
                b.copy_from_slice(&self.buf[self.pos + 2..self.pos + 10]);
                (u64::from_be_bytes(b) as usize, 10)
            }
            l => (l as usize, 2),
        };
        let mut mask = None;
        if masked {
            self.fill(off + 4)?;
            let m = &self.buf[self.pos + off..self.pos + off + 4];
            mask = Some([m[0], m[1], m[2], m[3]]);
            off += 4;
        }
        self.fill(off + len)?;
        let start = self.pos + off;
        let mut payload = self.buf[start..start + len].to_vec();
        if let Some(m) = mask {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= m[i % 4];
            }
        }
        self.pos += off + len;
        Ok(Frame {
            fin: b0 & 0x80 != 0,
            rsv: (b0 >> 4) & 0x7,
            op: b0 & 0x0F,
            masked,
            payload,
        })
    }

    /// The next server frame, waiting at most `timeout` (the socket's usual timeout is put
    /// back afterwards).
    pub fn next_within(&mut self, timeout: Duration) -> Next {
        self.sock.tcp().set_read_timeout(Some(timeout)).unwrap();
        let n = self.next();
        self.sock
            .tcp()
            .set_read_timeout(Some(READ_TIMEOUT))
            .unwrap();
        n
    }

    /// The next thing read must be a frame.
    pub fn frame(&mut self) -> Frame {
        match self.next() {
            Next::Frame(f) => f,
            other => panic!("expected a frame, got {other:?}"),
        }
    }

    /// The next frame must be a text frame holding JSON.
    pub fn recv_json(&mut self) -> Value {
        self.frame().json()
    }

    /// Sends a ping and requires the very next frame to be its pong (so nothing else was
    /// pending, and the connection is open).
    pub fn ping_pong(&mut self) -> Result<(), String> {
        self.send_ping(b"still-there");
        match self.next() {
            Next::Frame(f) if f.op == OP_PONG && f.payload == b"still-there" => Ok(()),
            Next::Frame(f) if f.op == OP_TEXT => Err(format!(
                "a text frame came where the pong was expected: {:?}",
                String::from_utf8_lossy(&f.payload[..f.payload.len().min(100)])
            )),
            Next::Frame(f) if f.op == OP_CLOSE => Err(format!(
                "closed with code {:?} where the pong was expected",
                f.close_code()
            )),
            other => Err(format!("no pong: {other:?}")),
        }
    }

    // --------------------------------------------------------------------------------------
    // Closing

    /// The next frame must be a well-formed close frame (FIN, a status code, a UTF-8 reason,
    /// at most 125 bytes), and then the TCP connection must end; returns the code.
    pub fn close_code_then_eof(&mut self) -> u16 {
        let f = self.frame();
        assert_eq!(f.op, OP_CLOSE, "expected a close frame, got {f:?}");
        assert!(f.fin, "close frame must not be fragmented");
        assert!(f.payload.len() <= 125);
        assert!(
            f.payload.len() >= 2,
            "close frame without a status code: {f:?}"
        );
        assert!(
            std::str::from_utf8(&f.payload[2..]).is_ok(),
            "close reason is not UTF-8"
        );
        self.expect_eof();
        f.close_code().unwrap_or_default()
    }

    /// The server must end the TCP connection, without another frame, within 5 s.
    pub fn expect_eof(&mut self) {
        let start = Instant::now();
        match self.next() {
            Next::Eof => {}
            other => panic!("expected TCP close, got {other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "TCP close too late"
        );
    }

    /// Reads until the server closes, skipping any frames before its close frame: returns
    /// the close code (`None`: the stream ended without a close frame) and how the stream
    /// went on after it (`"EOF"`, or what was read instead, in `Debug` form).
    pub fn close_code_and_end(&mut self) -> (Option<u16>, String) {
        loop {
            match self.next() {
                Next::Frame(f) if f.op == OP_CLOSE => {
                    let end = match self.next() {
                        Next::Eof => "EOF".to_string(),
                        other => format!("{other:?}"),
                    };
                    return (f.close_code(), end);
                }
                Next::Frame(_) => continue,
                other => return (None, format!("{other:?}")),
            }
        }
    }

    /// Reads (skipping frames before it) until the server ends the connection, by EOF or a
    /// reset, no later than `deadline`; returns the close code if a close frame came
    /// first. After a close frame no other frame may come.
    pub fn until_closed(&mut self, deadline: Instant) -> Option<u16> {
        let mut code = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "connection still open at the deadline");
            match self.next_within(left) {
                n if n.is_end() => return code,
                Next::Timeout => panic!("connection still open at the deadline"),
                Next::Frame(f) if f.op == OP_CLOSE => {
                    assert!(code.is_none(), "two close frames");
                    assert!(f.payload.len() >= 2, "close frame without a code");
                    code = f.close_code();
                }
                Next::Frame(f) => {
                    assert!(code.is_none(), "frame after the close frame: {f:?}");
                }
                other => panic!("the stream ended inside a frame: {other:?}"),
            }
        }
    }
}
