//! RFC 6455 framing against the real server, byte by byte: the upgrade is done by hand over a
//! raw `TcpStream`, frames are built here (masked or not, any bits) and the server's frames
//! are decoded here, so nothing in between forgives a mistake.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{topic, Server, THREADS};
use serde_json::{json, Value};

/// The key and accept value from RFC 6455 §1.3 (independent of any implementation).
const RFC_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const RFC_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

const OP_CONT: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

// ------------------------------------------------------------------------------------------
// HTTP head helpers

/// Reads from `s` until a full HTTP head is in `buf`; returns the head (without the blank
/// line) and leaves any bytes after it in `buf`.
fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> String {
    loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf[..p].to_vec()).expect("head is UTF-8");
            buf.drain(..p + 4);
            return head;
        }
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).expect("read HTTP head");
        assert!(
            n > 0,
            "EOF before a full HTTP head; got {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// The value of header `name` (case-insensitive) in a head, if present exactly once.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    let found: Vec<&str> = head
        .split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
        .collect();
    assert!(found.len() <= 1, "header {name} repeated in {head:?}");
    found.first().copied()
}

fn status(head: &str) -> u16 {
    let line = head.split("\r\n").next().unwrap();
    assert!(line.starts_with("HTTP/1.1 "), "status line: {line:?}");
    line[9..12].parse().expect("status code")
}

fn upgrade_request(path: &str, key: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
}

// ------------------------------------------------------------------------------------------
// Raw WebSocket client

/// A server frame as it came off the wire.
#[derive(Debug)]
struct Frame {
    fin: bool,
    rsv: u8,
    op: u8,
    masked: bool,
    payload: Vec<u8>,
}

impl Frame {
    fn json(&self) -> Value {
        assert_eq!(self.op, OP_TEXT, "expected a text frame, got {self:?}");
        serde_json::from_slice(&self.payload).expect("server text is JSON")
    }
}

/// What reading the next frame gave.
#[derive(Debug)]
enum Next {
    Frame(Frame),
    /// Clean EOF between frames.
    Eof,
}

struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
    mask_seed: u32,
}

impl Raw {
    /// Upgrades at `path` by hand and checks the 101 answer byte for byte where the RFC is
    /// exact.
    fn open(server: &Server, path: &str) -> Raw {
        let mut s = server.tcp();
        s.write_all(upgrade_request(path, RFC_KEY).as_bytes())
            .unwrap();
        let mut buf = Vec::new();
        let head = read_head(&mut s, &mut buf);
        assert_eq!(status(&head), 101, "upgrade refused: {head}");
        assert_eq!(
            header(&head, "Sec-WebSocket-Accept"),
            Some(RFC_ACCEPT),
            "{head}"
        );
        assert!(
            header(&head, "Upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket")),
            "{head}"
        );
        assert!(
            header(&head, "Connection").is_some_and(|v| v
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))),
            "{head}"
        );
        Raw {
            s,
            buf,
            mask_seed: 0x9e37_79b9,
        }
    }

    fn next_mask(&mut self) -> [u8; 4] {
        // A different, never-zero key per frame, so phase bugs in unmasking show.
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

    /// A masked client frame: first byte `b0` as given (FIN, RSV, opcode).
    fn masked_frame(&mut self, b0: u8, payload: &[u8]) -> Vec<u8> {
        let mask = self.next_mask();
        build_frame(b0, payload, Some(mask))
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("write");
    }

    /// Sends one masked frame.
    fn send(&mut self, fin: bool, op: u8, payload: &[u8]) {
        let f = self.masked_frame(if fin { 0x80 } else { 0 } | op, payload);
        self.send_raw(&f);
    }

    fn send_text(&mut self, text: &str) {
        self.send(true, OP_TEXT, text.as_bytes());
    }

    fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            let mut tmp = [0u8; 65536];
            match self.s.read(&mut tmp) {
                Ok(0) => return false,
                Ok(k) => self.buf.extend_from_slice(&tmp[..k]),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => panic!(
                    "reading from the server failed ({e}) with {} bytes buffered",
                    self.buf.len()
                ),
            }
        }
        true
    }

    /// Reads the next server frame. A server frame must never be masked (RFC 6455 §5.1).
    fn next(&mut self) -> Next {
        if !self.fill(2) {
            assert!(
                self.buf.is_empty(),
                "EOF inside a frame header: {:?}",
                self.buf
            );
            return Next::Eof;
        }
        let (b0, b1) = (self.buf[0], self.buf[1]);
        let masked = b1 & 0x80 != 0;
        let (len, mut off) = match b1 & 0x7F {
            126 => {
                assert!(self.fill(4), "EOF inside a frame header");
                (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
            }
            127 => {
                assert!(self.fill(10), "EOF inside a frame header");
                let mut b = [0u8; 8];
                b.copy_from_slice(&self.buf[2..10]);
                (u64::from_be_bytes(b) as usize, 10)
            }
            l => (l as usize, 2),
        };
        let mut mask = None;
        if masked {
            assert!(self.fill(off + 4), "EOF inside a frame header");
            mask = Some([
                self.buf[off],
                self.buf[off + 1],
                self.buf[off + 2],
                self.buf[off + 3],
            ]);
            off += 4;
        }
        assert!(
            self.fill(off + len),
            "EOF inside a frame payload ({} of {len} bytes)",
            self.buf.len() - off
        );
        let mut payload = self.buf[off..off + len].to_vec();
        if let Some(m) = mask {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= m[i % 4];
            }
        }
        self.buf.drain(..off + len);
        let f = Frame {
            fin: b0 & 0x80 != 0,
            rsv: (b0 >> 4) & 0x7,
            op: b0 & 0x0F,
            masked,
            payload,
        };
        assert!(!f.masked, "server sent a masked frame: {f:?}");
        assert_eq!(f.rsv, 0, "server set reserved bits: {f:?}");
        Next::Frame(f)
    }

    fn frame(&mut self) -> Frame {
        match self.next() {
            Next::Frame(f) => f,
            Next::Eof => panic!("connection closed, expected a frame"),
        }
    }

    /// The next frame must be a text frame holding JSON.
    fn json(&mut self) -> Value {
        self.frame().json()
    }

    /// The next frame must be a close frame; returns its code after checking its reason is
    /// UTF-8 and the control frame is well formed, then requires the TCP connection to end.
    fn close_code_then_eof(&mut self) -> u16 {
        let f = self.frame();
        assert_eq!(f.op, OP_CLOSE, "expected a close frame, got {f:?}");
        assert!(f.fin, "close frame must not be fragmented");
        assert!(f.payload.len() <= 125);
        assert!(
            f.payload.len() >= 2,
            "close frame without a status code: {f:?}"
        );
        let code = u16::from_be_bytes([f.payload[0], f.payload[1]]);
        assert!(
            std::str::from_utf8(&f.payload[2..]).is_ok(),
            "close reason is not UTF-8"
        );
        self.expect_eof();
        code
    }

    /// The server must end the TCP connection (within the stream's read timeout).
    fn expect_eof(&mut self) {
        let start = Instant::now();
        match self.next() {
            Next::Eof => {}
            Next::Frame(f) => panic!("expected TCP close, got another frame {f:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "TCP close too late"
        );
    }
}

fn build_frame(b0: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
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

fn subscribe_req(id: u64, topic: &str) -> String {
    json!({"id": id, "jsonrpc": "2.0", "method": "waku_subscribe", "params": {"topic": topic}})
        .to_string()
}

/// A subscription id: 64 lowercase hex characters.
fn assert_sub_result(v: &Value, id: u64) -> String {
    assert_eq!(v["id"], id, "answer to another request: {v}");
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    let r = v["result"]
        .as_str()
        .unwrap_or_else(|| panic!("no result: {v}"));
    assert_eq!(r.len(), 64, "{v}");
    assert!(
        r.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{v}"
    );
    r.to_string()
}

/// Runs `f` against a fresh server at each worker count of `THREADS`, with extra flags.
fn each_server(extra: &[&str], f: impl Fn(&Server)) {
    for t in THREADS {
        let mut args = vec!["--threads", t];
        args.extend_from_slice(extra);
        let s = Server::start(&args);
        f(&s);
    }
}

// ------------------------------------------------------------------------------------------
// The handshake

#[test]
fn upgrade_answers_101_with_the_rfc_accept_key() {
    each_server(&[], |s| {
        // `Raw::open` checks status 101, Upgrade, Connection and the RFC 6455 §1.3 example.
        let mut c = Raw::open(s, "/");
        // And the connection works afterwards.
        c.send_text(&subscribe_req(1, &topic()));
        assert_sub_result(&c.json(), 1);
    });
}

#[test]
fn accept_key_is_derived_from_each_clients_own_key() {
    let s = Server::start(&[]);
    for key in [
        "AAAAAAAAAAAAAAAAAAAAAA==",
        "x3JJHMbDL1EzLkh9GBhXDw==",
        "/+/+/+/+/+/+/+/+/+/+/w==",
    ] {
        let mut c = s.tcp();
        c.write_all(upgrade_request("/", key).as_bytes()).unwrap();
        let mut buf = Vec::new();
        let head = read_head(&mut c, &mut buf);
        assert_eq!(status(&head), 101, "{head}");
        let want = tungstenite::handshake::derive_accept_key(key.as_bytes());
        assert_eq!(header(&head, "Sec-WebSocket-Accept"), Some(want.as_str()));
    }
}

#[test]
fn upgrade_with_the_wallet_query_string_is_accepted() {
    let s = Server::start(&[]);
    let mut c = Raw::open(&s, "/?protocol=wc&version=2&env=browser");
    c.send_text(&subscribe_req(7, &topic()));
    assert_sub_result(&c.json(), 7);
}

#[test]
fn frames_sent_right_behind_the_upgrade_request_are_processed() {
    each_server(&[], |s| {
        let mut c = s.tcp();
        let mut bytes = upgrade_request("/", RFC_KEY).into_bytes();
        bytes.extend(build_frame(
            0x81,
            subscribe_req(3, &topic()).as_bytes(),
            Some([1, 2, 3, 4]),
        ));
        c.write_all(&bytes).unwrap();
        let mut buf = Vec::new();
        let head = read_head(&mut c, &mut buf);
        assert_eq!(status(&head), 101, "{head}");
        let mut raw = Raw {
            s: c,
            buf,
            mask_seed: 1,
        };
        assert_sub_result(&raw.json(), 3);
    });
}

/// Sends `req` on a fresh connection and returns the answer head and body (the server must
/// close the connection after a refused upgrade).
fn refused(s: &Server, req: &str) -> (String, Vec<u8>) {
    let raw = s.raw_exchange(req.as_bytes());
    let p = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8(raw[..p].to_vec()).unwrap();
    (head, raw[p + 4..].to_vec())
}

#[test]
fn upgrade_on_another_path_is_404_without_upgrading() {
    let s = Server::start(&[]);
    let (head, body) = refused(&s, &upgrade_request("/other", RFC_KEY));
    assert_eq!(status(&head), 404, "{head}");
    assert!(header(&head, "Sec-WebSocket-Accept").is_none(), "{head}");
    let v: Value = serde_json::from_slice(&body).expect("JSON body");
    assert!(v["error"].is_string(), "{v}");
}

#[test]
fn upgrade_with_websocket_version_8_is_426_naming_version_13() {
    let s = Server::start(&[]);
    let req = upgrade_request("/", RFC_KEY)
        .replace("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 8");
    let (head, _) = refused(&s, &req);
    assert_eq!(status(&head), 426, "{head}");
    assert_eq!(header(&head, "Sec-WebSocket-Version"), Some("13"), "{head}");
    assert!(header(&head, "Sec-WebSocket-Accept").is_none(), "{head}");
}

#[test]
fn plain_get_of_the_relay_path_is_426() {
    let s = Server::start(&[]);
    let (head, _) = refused(
        &s,
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&head), 426, "{head}");
    assert!(header(&head, "Sec-WebSocket-Accept").is_none(), "{head}");
}

#[test]
fn upgrade_without_a_key_is_400() {
    let s = Server::start(&[]);
    let req = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
               Sec-WebSocket-Version: 13\r\n\r\n";
    let (head, _) = refused(&s, req);
    assert_eq!(status(&head), 400, "{head}");
    assert!(header(&head, "Sec-WebSocket-Accept").is_none(), "{head}");
}

// ------------------------------------------------------------------------------------------
// Frames: protocol errors

#[test]
fn unmasked_client_frame_is_closed_with_1002() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        let f = build_frame(0x81, subscribe_req(1, "t").as_bytes(), None);
        c.send_raw(&f);
        assert_eq!(c.close_code_then_eof(), 1002);
    });
}

#[test]
fn continuation_without_a_started_message_is_closed_with_1002() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        c.send(true, OP_CONT, b"{}");
        assert_eq!(c.close_code_then_eof(), 1002);
    });
}

#[test]
fn new_text_frame_inside_a_fragmented_message_is_closed_with_1002() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        c.send(false, OP_TEXT, b"{\"id\":1,");
        c.send(true, OP_TEXT, b"{}");
        assert_eq!(c.close_code_then_eof(), 1002);
    });
}

#[test]
fn reserved_bits_are_closed_with_1002() {
    each_server(&[], |s| {
        for rsv in [0x40u8, 0x20, 0x10] {
            let mut c = Raw::open(s, "/");
            let f = c.masked_frame(0x80 | rsv | OP_TEXT, subscribe_req(1, "t").as_bytes());
            c.send_raw(&f);
            assert_eq!(c.close_code_then_eof(), 1002, "rsv bit {rsv:#x}");
        }
    });
}

#[test]
fn unknown_opcodes_are_closed_with_1002() {
    each_server(&[], |s| {
        for op in [0x3u8, 0x7, 0xB, 0xF] {
            let mut c = Raw::open(s, "/");
            c.send(true, op, b"x");
            assert_eq!(c.close_code_then_eof(), 1002, "opcode {op:#x}");
        }
    });
}

#[test]
fn fragmented_or_oversized_control_frames_are_closed_with_1002() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        c.send(false, OP_PING, b"a");
        assert_eq!(c.close_code_then_eof(), 1002, "fragmented ping");

        let mut c = Raw::open(s, "/");
        c.send(true, OP_PING, &[b'p'; 126]);
        assert_eq!(c.close_code_then_eof(), 1002, "ping with 126-byte payload");
    });
}

#[test]
fn text_with_invalid_utf8_is_closed_with_1007() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        c.send(true, OP_TEXT, b"{\"id\":1,\"x\":\"\xc3\x28\"}");
        assert_eq!(c.close_code_then_eof(), 1007);

        // Invalid only once reassembled: a truncated sequence at the very end.
        let mut c = Raw::open(s, "/");
        c.send(false, OP_TEXT, b"\"ab");
        c.send(true, OP_CONT, b"c\xe2\x82");
        assert_eq!(c.close_code_then_eof(), 1007);
    });
}

#[test]
fn utf8_sequence_split_across_fragments_is_accepted() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        // "é" (c3 a9) and "€" (e2 82 ac) cut in the middle by fragment boundaries.
        let t = format!("{}-\u{e9}\u{20ac}", topic());
        let req = subscribe_req(5, &t);
        let bytes = req.as_bytes();
        let cut1 = req.find('\u{e9}').unwrap() + 1;
        let cut2 = req.find('\u{20ac}').unwrap() + 2;
        c.send(false, OP_TEXT, &bytes[..cut1]);
        c.send(false, OP_CONT, &bytes[cut1..cut2]);
        c.send(true, OP_CONT, &bytes[cut2..]);
        assert_sub_result(&c.json(), 5);
    });
}

#[test]
fn single_frame_over_max_message_is_closed_with_1009() {
    each_server(&["--max-message", "1024"], |s| {
        let mut c = Raw::open(s, "/");
        let mut payload = subscribe_req(1, "t").into_bytes();
        payload.resize(2000, b' ');
        c.send(true, OP_TEXT, &payload);
        assert_eq!(c.close_code_then_eof(), 1009);
    });
}

#[test]
fn fragmented_message_over_max_message_is_closed_with_1009() {
    each_server(&["--max-message", "1024"], |s| {
        let mut c = Raw::open(s, "/");
        // Each fragment is small; together they are 1200 bytes.
        let chunk = [b' '; 400];
        c.send(false, OP_TEXT, &chunk);
        c.send(false, OP_CONT, &chunk);
        c.send(true, OP_CONT, &chunk);
        assert_eq!(c.close_code_then_eof(), 1009);
    });
}

#[test]
fn message_of_exactly_max_message_bytes_is_accepted() {
    each_server(&["--max-message", "1024"], |s| {
        let mut c = Raw::open(s, "/");
        // Whitespace after the JSON value pads it to the limit; one frame, then fragmented.
        let mut payload = subscribe_req(1, &topic()).into_bytes();
        payload.resize(1024, b' ');
        c.send(true, OP_TEXT, &payload);
        assert_sub_result(&c.json(), 1);

        let mut payload = subscribe_req(2, &topic()).into_bytes();
        payload.resize(1024, b' ');
        c.send(false, OP_TEXT, &payload[..500]);
        c.send(true, OP_CONT, &payload[500..]);
        assert_sub_result(&c.json(), 2);
    });
}

// ------------------------------------------------------------------------------------------
// Frames: what works

#[test]
fn fragmented_subscribe_with_a_ping_between_fragments_gets_pong_then_result() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        let req = subscribe_req(42, &topic());
        let b = req.as_bytes();
        let (a, rest) = b.split_at(b.len() / 3);
        let (m, z) = rest.split_at(rest.len() / 2);
        c.send(false, OP_TEXT, a);
        c.send(true, OP_PING, b"between fragments");
        c.send(false, OP_CONT, m);
        c.send(true, OP_CONT, z);
        let pong = c.frame();
        assert_eq!(pong.op, OP_PONG, "{pong:?}");
        assert!(pong.fin);
        assert_eq!(pong.payload, b"between fragments");
        assert_sub_result(&c.json(), 42);
    });
}

#[test]
fn request_dribbled_one_byte_per_write_is_answered() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        let f = c.masked_frame(0x81, subscribe_req(9, &topic()).as_bytes());
        for b in f {
            c.send_raw(&[b]);
        }
        assert_sub_result(&c.json(), 9);
    });
}

#[test]
fn several_frames_in_one_write_are_answered_in_order() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        let mut bytes = Vec::new();
        for id in 1..=5u64 {
            bytes.extend(c.masked_frame(0x81, subscribe_req(id, &topic()).as_bytes()));
        }
        c.send_raw(&bytes);
        for id in 1..=5u64 {
            assert_sub_result(&c.json(), id);
        }
    });
}

#[test]
fn ping_gets_a_pong_echoing_the_payload() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        let max: Vec<u8> = (0..125u8).collect();
        for payload in [&b""[..], b"hello", &[0u8, 0xFF, 0x80, 1], &max[..]] {
            c.send(true, OP_PING, payload);
            let f = c.frame();
            assert_eq!(f.op, OP_PONG, "{f:?}");
            assert!(f.fin);
            assert_eq!(f.payload, payload);
        }
        // An unsolicited pong is ignored and the connection keeps working.
        c.send(true, OP_PONG, b"unsolicited");
        c.send_text(&subscribe_req(1, &topic()));
        assert_sub_result(&c.json(), 1);
    });
}

#[test]
fn client_close_1000_is_echoed_and_tcp_closed() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        let mut p = 1000u16.to_be_bytes().to_vec();
        p.extend_from_slice(b"bye");
        c.send(true, OP_CLOSE, &p);
        assert_eq!(c.close_code_then_eof(), 1000);
    });
}

#[test]
fn client_close_with_an_application_code_is_echoed() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        c.send(true, OP_CLOSE, &4000u16.to_be_bytes());
        assert_eq!(c.close_code_then_eof(), 4000);
    });
}

#[test]
fn client_close_with_empty_payload_is_answered_with_1000() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        c.send(true, OP_CLOSE, b"");
        assert_eq!(c.close_code_then_eof(), 1000);
    });
}

#[test]
fn client_close_with_an_invalid_code_is_closed_with_1002() {
    each_server(&[], |s| {
        for code in [1005u16, 999, 1006, 1015, 2000] {
            let mut c = Raw::open(s, "/");
            c.send(true, OP_CLOSE, &code.to_be_bytes());
            assert_eq!(
                c.close_code_then_eof(),
                1002,
                "close code {code} on the wire"
            );
        }
        // A one-byte close payload cannot hold a code.
        let mut c = Raw::open(s, "/");
        c.send(true, OP_CLOSE, &[0x03]);
        assert_eq!(c.close_code_then_eof(), 1002, "one-byte close payload");
    });
}

#[test]
fn binary_frame_with_a_json_rpc_request_is_answered_like_text() {
    each_server(&[], |s| {
        let mut c = Raw::open(s, "/");
        c.send(true, OP_BINARY, subscribe_req(11, &topic()).as_bytes());
        assert_sub_result(&c.json(), 11);
        // Fragmented binary too.
        let req = subscribe_req(12, &topic());
        let (a, b) = req.as_bytes().split_at(10);
        c.send(false, OP_BINARY, a);
        c.send(true, OP_CONT, b);
        assert_sub_result(&c.json(), 12);
    });
}

#[test]
fn server_frames_are_never_masked() {
    each_server(&[], |s| {
        let tp = topic();
        let mut sub = Raw::open(s, "/");
        let mut publ = Raw::open(s, "/");
        sub.send_text(&subscribe_req(1, &tp));
        let mut frames = vec![sub.frame()];
        publ.send_text(
            &json!({"id": 2, "jsonrpc": "2.0", "method": "waku_publish",
                    "params": {"topic": tp, "message": "m", "ttl": 60}})
            .to_string(),
        );
        frames.push(publ.frame());
        frames.push(sub.frame()); // the push
        sub.send(true, OP_PING, b"p");
        frames.push(sub.frame());
        sub.send(true, OP_CLOSE, &1000u16.to_be_bytes());
        frames.push(sub.frame());
        let ops: Vec<u8> = frames.iter().map(|f| f.op).collect();
        assert_eq!(ops, [OP_TEXT, OP_TEXT, OP_TEXT, OP_PONG, OP_CLOSE]);
        for f in &frames {
            assert!(!f.masked, "{f:?}");
            assert!(f.fin, "{f:?}");
        }
        assert_eq!(frames[2].json()["method"], "waku_subscription");
    });
}

#[test]
fn large_message_in_a_64_bit_length_frame_is_delivered() {
    each_server(&[], |s| {
        let tp = topic();
        let mut sub = Raw::open(s, "/");
        let mut publ = Raw::open(s, "/");
        sub.send_text(&subscribe_req(1, &tp));
        assert_sub_result(&sub.json(), 1);
        let msg = "z".repeat(70_000);
        publ.send_text(
            &json!({"id": 2, "jsonrpc": "2.0", "method": "waku_publish",
                    "params": {"topic": tp, "message": msg, "ttl": 60}})
            .to_string(),
        );
        assert_eq!(publ.json()["result"], true);
        let push = sub.json();
        assert_eq!(push["params"]["data"]["message"], msg);
    });
}
