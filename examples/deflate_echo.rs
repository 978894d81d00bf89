//! A blocking WebSocket echo server that negotiates permessage-deflate through
//! `walletrelay::ws::deflate`: the reference for wiring that module into the connection
//! code (every call the server needs, in order), and the server Autobahn sections 12 and 13
//! run against until the real `/echo` route negotiates compression. Not the server: one
//! thread per connection, loopback only, at most 16 connections.
//!
//! `cargo run --release --example deflate_echo -- 127.0.0.1:9002 [--no-deflate]
//! [--max-message N]`

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use walletrelay::config::Limits;
use walletrelay::http;
use walletrelay::ws::deflate::{self, Agreement, Deflater, Inflater};
use walletrelay::ws::{self, Opcode, Reassembly};

/// Default `--max-message`: Autobahn section 9 sends up to 16 MiB (as `scripts/autobahn`
/// allows the real server).
const MAX_MESSAGE: usize = 20_000_000;
const MAX_CONNS: usize = 16;

fn main() {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9002".into())
        .parse()
        .expect("a socket address");
    assert!(
        addr.ip().is_loopback(),
        "deflate_echo listens on loopback only"
    );
    let rest: Vec<String> = args.collect();
    let enabled = !rest.iter().any(|a| a == "--no-deflate");
    let max = rest
        .iter()
        .position(|a| a == "--max-message")
        .and_then(|i| rest.get(i + 1)?.parse().ok())
        .unwrap_or(MAX_MESSAGE);
    let listener = TcpListener::bind(addr).expect("bind");
    eprintln!(
        "deflate_echo: ws://{}/ permessage-deflate {}",
        listener.local_addr().expect("address"),
        if enabled { "on" } else { "off" }
    );
    let live = Arc::new(AtomicUsize::new(0));
    for s in listener.incoming().flatten() {
        if live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNS {
            live.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let live = live.clone();
        std::thread::spawn(move || {
            let _ = serve(s, enabled, max);
            live.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// One connection: the upgrade, then frames until a close.
fn serve(mut s: TcpStream, enabled: bool, max: usize) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    s.set_nodelay(true)?;
    let mut buf = Vec::new();
    let Some(agreement) = upgrade(&mut s, &mut buf, enabled)? else {
        return Ok(());
    };
    let mut c = Session {
        max,
        agreement,
        frag: Reassembly::default(),
        compressed: None,
        inflater: Inflater::new(),
        deflater: Deflater::new(),
        msg: Vec::new(),
        z: Vec::new(),
        out: Vec::new(),
        closing: false,
    };
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let mut pos = 0;
        let closed = loop {
            let head = match deflate::parse_head(&buf[pos..], max, c.agreement.is_some()) {
                Ok(Some(h)) => h,
                Ok(None) => break false,
                Err(e) => {
                    c.close(e.close_code(), "protocol error");
                    break true;
                }
            };
            let (h, rsv1) = head;
            if buf.len() - pos < h.frame_len() {
                break false;
            }
            let payload = &mut buf[pos + h.header_len..pos + h.frame_len()];
            pos += h.frame_len();
            ws::unmask(payload, h.mask, 0);
            if let Err((code, reason)) = c.frame(h.fin, h.opcode, rsv1, payload) {
                c.close(code, reason);
                break true;
            }
            if c.closing {
                break true;
            }
        };
        buf.drain(..pos);
        s.write_all(&c.out)?;
        c.out.clear();
        if closed {
            return linger(s);
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Reads the upgrade request and answers it; the agreement (`None` inside: declined) or
/// `None` when the request was refused.
fn upgrade(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    enabled: bool,
) -> io::Result<Option<Option<Agreement>>> {
    let limits = Limits::default();
    let mut chunk = [0u8; 4096];
    loop {
        match http::parse(buf, &limits) {
            Ok(Some((n, req))) => {
                let Some(key) = req.ws_key.filter(|_| req.upgrade_websocket) else {
                    s.write_all(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n")?;
                    return Ok(None);
                };
                // The flag decides; the parser only recorded what it would accept.
                let agreement = req.ws_deflate.filter(|_| enabled);
                let mut head = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                     Connection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n",
                    ws::accept_key(key)
                )
                .into_bytes();
                if let Some(a) = agreement {
                    a.write_header(&mut head);
                }
                head.extend_from_slice(b"\r\n");
                s.write_all(&head)?;
                buf.drain(..n);
                return Ok(Some(agreement));
            }
            Ok(None) => {}
            Err(e) => {
                let status = format!("HTTP/1.1 {} x\r\nContent-Length: 0\r\n\r\n", e.status());
                s.write_all(status.as_bytes())?;
                return Ok(None);
            }
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// After our close frame: wait (briefly) for the peer to hang up.
fn linger(mut s: TcpStream) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let _ = s.shutdown(Shutdown::Write);
    let mut sink = [0u8; 4096];
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

/// What a connection keeps in the WebSocket phase, and what a core shares (here: the
/// thread): the inflater, the compressor and scratch buffers.
struct Session {
    /// `--max-message`.
    max: usize,
    /// Negotiated permessage-deflate, if any (per connection).
    agreement: Option<Agreement>,
    /// A fragmented message in flight (per connection).
    frag: Reassembly,
    /// The real opcode of a fragmented compressed message in `frag`, which reassembles it as
    /// binary so that its compressed bytes are not checked as UTF-8 (per connection).
    compressed: Option<Opcode>,
    /// Per core.
    inflater: Inflater,
    /// Per core.
    deflater: Deflater,
    /// Per core: the inflated message.
    msg: Vec<u8>,
    /// Per core: a compressed answer.
    z: Vec<u8>,
    /// The connection's output.
    out: Vec<u8>,
    /// A close frame is queued: nothing more is read.
    closing: bool,
}

type Fail = (u16, &'static str);

fn ws_fail(e: ws::WsError) -> Fail {
    let reason = match e {
        ws::WsError::Protocol(r) => r,
        ws::WsError::TooBig => "message too big",
        ws::WsError::InvalidUtf8 => "invalid UTF-8",
    };
    (e.close_code(), reason)
}

fn deflate_fail(e: deflate::DeflateError) -> Fail {
    (e.close_code(), e.reason())
}

impl Session {
    fn frame(&mut self, fin: bool, op: Opcode, rsv1: bool, payload: &[u8]) -> Result<(), Fail> {
        match op {
            Opcode::Text | Opcode::Binary => {
                if self.frag.opcode.is_some() {
                    return Err((1002, "new message inside a fragmented one"));
                }
                match (fin, rsv1) {
                    (true, compressed) => self.message(op, payload, compressed),
                    (false, false) => self.frag.start(op, payload).map_err(ws_fail),
                    (false, true) => {
                        self.compressed = Some(op);
                        self.frag.start(Opcode::Binary, payload).map_err(ws_fail)
                    }
                }
            }
            Opcode::Continuation => {
                if self.frag.opcode.is_none() {
                    return Err((1002, "continuation without a message"));
                }
                self.frag.push(payload, self.max).map_err(ws_fail)?;
                if !fin {
                    return Ok(());
                }
                let (op, whole) = self.frag.finish();
                match self.compressed.take() {
                    // Reassembled as binary; the first frame said what it is.
                    Some(real) => self.message(real, &whole, true),
                    None => self.message(op, &whole, false),
                }
            }
            Opcode::Ping => {
                self.frame_out(Opcode::Pong, payload);
                Ok(())
            }
            Opcode::Pong => Ok(()),
            Opcode::Close => {
                let code = ws::check_close_payload(payload).map_err(ws_fail)?;
                self.close(if code == 1005 { 1000 } else { code }, "");
                Ok(())
            }
        }
    }

    /// A whole message (inflated first when `compressed`): echoed, compressed when the
    /// connection negotiated it and compressing pays.
    fn message(&mut self, op: Opcode, payload: &[u8], compressed: bool) -> Result<(), Fail> {
        let mut msg = std::mem::take(&mut self.msg);
        let body = if compressed {
            self.inflater
                .inflate(payload, self.max, &mut msg)
                .map_err(deflate_fail)?;
            &msg[..]
        } else {
            payload
        };
        if op == Opcode::Text && std::str::from_utf8(body).is_err() {
            return Err((1007, "invalid UTF-8"));
        }
        let bits = self.agreement.map(|a| a.window_bits());
        if bits.is_some_and(|b| self.deflater.compress(body, b, &mut self.z)) {
            let mut h = [0u8; 10];
            let n = deflate::write_head(&mut h, op, self.z.len());
            self.out.extend_from_slice(&h[..n]);
            self.out.extend_from_slice(&self.z);
        } else {
            self.frame_out(op, body);
        }
        self.msg = msg;
        Ok(())
    }

    fn frame_out(&mut self, op: Opcode, payload: &[u8]) {
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, op, payload.len());
        self.out.extend_from_slice(&h[..n]);
        self.out.extend_from_slice(payload);
    }

    fn close(&mut self, code: u16, reason: &str) {
        self.out.extend_from_slice(&ws::close_frame(code, reason));
        self.closing = true;
    }
}
