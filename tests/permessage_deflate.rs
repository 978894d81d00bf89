//! permessage-deflate end to end, against the real binary over raw sockets: negotiation with
//! and without `--permessage-deflate`, compressed echo (whole and fragmented), RSV1 misuse,
//! bad data, a bomb past `--max-message`, and relay pushes that arrive compressed and decode
//! to exactly the push a plain subscriber gets. Frames are built and read here and payloads
//! (de)compressed with flate2 directly, so no `ws::deflate` code checks itself.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use common::{hex, topic, Server};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use serde_json::{json, Value};

const OFFER: &str = "permessage-deflate; client_max_window_bits";
const ANSWER: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// A raw client: the socket and what was read past the last frame.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
    /// The upgrade answer's head.
    head: String,
}

/// A server frame: its first byte (FIN, RSV, opcode) and payload.
struct Frame {
    b0: u8,
    payload: Vec<u8>,
}

impl Frame {
    fn rsv1(&self) -> bool {
        self.b0 & 0x40 != 0
    }

    fn close_code(&self) -> u16 {
        assert_eq!(
            self.b0 & 0x0f,
            0x8,
            "expected a close frame, got {:#x}",
            self.b0
        );
        u16::from_be_bytes([self.payload[0], self.payload[1]])
    }
}

fn open(server: &Server, path: &str, extensions: Option<&str>) -> Client {
    let mut s = server.tcp();
    let ext = extensions.map_or(String::new(), |e| {
        format!("Sec-WebSocket-Extensions: {e}\r\n")
    });
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{ext}\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let head = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf[..p].to_vec()).unwrap();
            buf.drain(..p + 4);
            break head;
        }
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0, "EOF during the upgrade");
        buf.extend_from_slice(&tmp[..n]);
    };
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    Client { s, buf, head }
}

impl Client {
    /// The `Sec-WebSocket-Extensions` answer, if any.
    fn extensions(&self) -> Option<&str> {
        self.head
            .split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim().eq_ignore_ascii_case("sec-websocket-extensions"))
            .map(|(_, v)| v.trim())
    }

    /// Sends a masked frame with first byte `b0`.
    fn send(&mut self, b0: u8, payload: &[u8]) {
        let mask = [0x12, 0x34, 0x56, 0x78];
        let mut f = vec![b0];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n < 65536 => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.s.write_all(&f).unwrap();
    }

    fn fill(&mut self, want: usize) {
        while self.buf.len() < want {
            let mut tmp = [0u8; 65536];
            let n = self.s.read(&mut tmp).unwrap();
            assert!(n > 0, "EOF while waiting for a frame");
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }

    fn recv(&mut self) -> Frame {
        self.fill(2);
        let (b0, len7) = (self.buf[0], (self.buf[1] & 0x7f) as usize);
        assert_eq!(self.buf[1] & 0x80, 0, "server frames are not masked");
        let (len, off) = match len7 {
            126 => {
                self.fill(4);
                (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
            }
            127 => {
                self.fill(10);
                let mut b = [0u8; 8];
                b.copy_from_slice(&self.buf[2..10]);
                (u64::from_be_bytes(b) as usize, 10)
            }
            n => (n, 2),
        };
        self.fill(off + len);
        let payload = self.buf[off..off + len].to_vec();
        self.buf.drain(..off + len);
        Frame { b0, payload }
    }

    /// The next text message, inflated when it came compressed.
    fn text(&mut self) -> (bool, Vec<u8>) {
        let f = self.recv();
        assert_eq!(
            f.b0 & 0x8f,
            0x81,
            "expected a whole text frame, got {:#x}",
            f.b0
        );
        let compressed = f.rsv1();
        let body = if compressed {
            inflate(&f.payload)
        } else {
            f.payload
        };
        (compressed, body)
    }
}

/// RFC 7692 sender side, with flate2 (no context takeover: a fresh compressor).
fn deflate(msg: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(msg.len() + 64);
    c.compress_vec(msg, &mut out, FlushCompress::Sync).unwrap();
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

/// RFC 7692 receiver side, with flate2.
fn inflate(payload: &[u8]) -> Vec<u8> {
    let mut d = Decompress::new(false);
    let mut input = payload.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::new();
    while (d.total_in() as usize) < input.len() || out.len() == out.capacity() {
        out.reserve(out.capacity().max(4096));
        let rest = &input[d.total_in() as usize..];
        d.decompress_vec(rest, &mut out, FlushDecompress::Sync)
            .unwrap();
    }
    out
}

#[test]
fn offers_are_answered_only_with_the_flag() {
    let on = Server::start(&["--permessage-deflate", "--ws-echo"]);
    assert_eq!(open(&on, "/", Some(OFFER)).extensions(), Some(ANSWER));
    assert_eq!(
        open(
            &on,
            "/",
            Some("permessage-deflate; server_max_window_bits=10")
        )
        .extensions(),
        Some(&*format!("{ANSWER}; server_max_window_bits=10"))
    );
    // Declined offers: no header, and the connection works uncompressed.
    for ext in [
        None,
        Some("x-webkit-deflate-frame"),
        Some("permessage-deflate; server_max_window_bits=8"),
    ] {
        let mut c = open(&on, "/echo", ext);
        assert_eq!(c.extensions(), None, "{ext:?}");
        c.send(0x81, b"plain");
        assert_eq!(c.text(), (false, b"plain".to_vec()));
        // RSV1 without the extension is a protocol error.
        c.send(0xC1, &deflate(b"hello"));
        assert_eq!(c.recv().close_code(), 1002);
    }
    let off = Server::start(&["--ws-echo"]);
    let mut c = open(&off, "/echo", Some(OFFER));
    assert_eq!(c.extensions(), None);
    c.send(0xC1, &deflate(b"hello"));
    assert_eq!(c.recv().close_code(), 1002);
}

#[test]
fn compressed_echo_whole_and_fragmented() {
    let server = Server::start(&["--permessage-deflate", "--ws-echo"]);
    let mut c = open(&server, "/echo", Some(OFFER));
    let big = format!("{{\"message\":\"{}\"}}", "0123456789abcdef".repeat(200));
    // Whole compressed messages; a long one comes back compressed.
    c.send(0xC1, &deflate(b"hi"));
    assert_eq!(c.text().1, b"hi");
    c.send(0xC1, &deflate(big.as_bytes()));
    assert_eq!(c.text(), (true, big.clone().into_bytes()));
    // A compressed message in three fragments (RSV1 on the first only), a ping between.
    let z = deflate(big.as_bytes());
    let (a, rest) = z.split_at(z.len() / 3);
    let (b, d) = rest.split_at(rest.len() / 2);
    c.send(0x41, a);
    c.send(0x00, b);
    c.send(0x89, b"p");
    let pong = c.recv();
    assert_eq!((pong.b0, &pong.payload[..]), (0x8A, &b"p"[..]));
    c.send(0x80, d);
    assert_eq!(c.text(), (true, big.into_bytes()));
    // Uncompressed messages still work on the same connection.
    c.send(0x81, b"plain");
    assert_eq!(c.text(), (false, b"plain".to_vec()));
}

#[test]
fn misuse_bad_data_and_bombs_close_the_connection() {
    let server = Server::start(&[
        "--permessage-deflate",
        "--ws-echo",
        "--max-message",
        "65536",
    ]);
    let close_after = |b0s: &[(u8, Vec<u8>)]| {
        let mut c = open(&server, "/echo", Some(OFFER));
        for (b0, p) in b0s {
            c.send(*b0, p);
        }
        c.recv().close_code()
    };
    let z = deflate(b"hello");
    // RSV1 on a ping, on a continuation.
    assert_eq!(close_after(&[(0xC9, b"x".to_vec())]), 1002);
    assert_eq!(
        close_after(&[(0x01, b"a".to_vec()), (0xC0, z.clone())]),
        1002
    );
    // Not DEFLATE.
    assert_eq!(close_after(&[(0xC1, vec![0xff; 32])]), 1007);
    // Compressed text that is not UTF-8.
    assert_eq!(close_after(&[(0xC1, deflate(&[0xc3, 0x28]))]), 1007);
    // 8 KB that inflates to 8 MB, past --max-message.
    assert_eq!(close_after(&[(0xC2, deflate(&vec![0u8; 8 << 20]))]), 1009);
}

#[test]
fn pushes_arrive_compressed_and_decode_to_the_plain_push() {
    let server = Server::start(&["--permessage-deflate"]);
    let t = topic();
    let message = hex(512, 3);
    let mut zipped = open(&server, "/", Some(OFFER));
    let mut plain = open(&server, "/", None);
    let mut publisher = open(&server, "/", Some(OFFER));
    let mut sub_ids = Vec::new();
    for (i, c) in [&mut zipped, &mut plain].into_iter().enumerate() {
        let req = json!({"id": i + 1, "jsonrpc": "2.0", "method": "waku_subscribe", "params": {"topic": t}});
        c.send(0x81, req.to_string().as_bytes());
        let (_, body) = c.text();
        let v: Value = serde_json::from_slice(&body).unwrap();
        sub_ids.push(v["result"].as_str().unwrap().to_string());
    }
    let publish = json!({"id": 9, "jsonrpc": "2.0", "method": "waku_publish",
        "params": {"topic": t, "message": message, "ttl": 86400}});
    publisher.send(0xC1, &deflate(publish.to_string().as_bytes()));
    let (_, ack) = publisher.text();
    assert_eq!(
        serde_json::from_slice::<Value>(&ack).unwrap()["result"],
        json!(true)
    );
    let (compressed, z) = zipped.text();
    let (was, p) = plain.text();
    assert!(
        compressed,
        "a 512-hex push to a deflate client is compressed"
    );
    assert!(!was);
    let (z, p): (Value, Value) = (
        serde_json::from_slice(&z).unwrap(),
        serde_json::from_slice(&p).unwrap(),
    );
    for (v, sub) in [(&z, &sub_ids[0]), (&p, &sub_ids[1])] {
        assert_eq!(v["method"], "waku_subscription");
        assert_eq!(v["params"]["id"], json!(sub));
        assert_eq!(v["params"]["data"], json!({"topic": t, "message": message}));
    }
}
