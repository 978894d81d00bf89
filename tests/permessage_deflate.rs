//! permessage-deflate end to end, against the real binary over raw sockets: negotiation with
//! and without `--permessage-deflate`, compressed echo (whole and fragmented), RSV1 misuse,
//! bad data, a bomb past `--max-message`, and relay pushes that arrive compressed and decode
//! to exactly the push a plain subscriber gets. Frames are built and read by the raw client
//! (`common::raw_ws`) and payloads (de)compressed with flate2 directly, so no `ws::deflate`
//! code checks itself.

mod common;

use common::raw_ws::{OP_CLOSE, OP_PONG, OP_TEXT};
use common::{hex, topic, RawWs, Server};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use serde_json::{json, Value};

const OFFER: &str = "permessage-deflate; client_max_window_bits";
const ANSWER: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// A raw WebSocket upgraded at `path`, offering `extensions` if any.
fn open(server: &Server, path: &str, extensions: Option<&str>) -> RawWs {
    let ext = extensions.map_or(String::new(), |e| {
        format!("Sec-WebSocket-Extensions: {e}\r\n")
    });
    RawWs::upgrade_at(server.tcp(), path, &ext)
}

/// The close code of the next frame, which must be a close frame.
fn close_code(c: &mut RawWs) -> u16 {
    let f = c.frame();
    assert_eq!(f.op, OP_CLOSE, "expected a close frame, got {f:?}");
    f.close_code().expect("a close code")
}

/// The next text message (a whole frame), inflated when it came compressed: (compressed,
/// payload).
fn text(c: &mut RawWs) -> (bool, Vec<u8>) {
    let f = c.frame();
    assert!(
        f.fin && f.op == OP_TEXT,
        "expected a whole text frame, got {f:?}"
    );
    let compressed = f.rsv1();
    let body = if compressed {
        inflate(&f.payload)
    } else {
        f.payload
    };
    (compressed, body)
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
        c.send_b0(0x81, b"plain");
        assert_eq!(text(&mut c), (false, b"plain".to_vec()));
        // RSV1 without the extension is a protocol error.
        c.send_b0(0xC1, &deflate(b"hello"));
        assert_eq!(close_code(&mut c), 1002);
    }
    let off = Server::start(&["--ws-echo"]);
    let mut c = open(&off, "/echo", Some(OFFER));
    assert_eq!(c.extensions(), None);
    c.send_b0(0xC1, &deflate(b"hello"));
    assert_eq!(close_code(&mut c), 1002);
}

#[test]
fn compressed_echo_whole_and_fragmented() {
    let server = Server::start(&["--permessage-deflate", "--ws-echo"]);
    let mut c = open(&server, "/echo", Some(OFFER));
    let big = format!("{{\"message\":\"{}\"}}", "0123456789abcdef".repeat(200));
    // Whole compressed messages; a long one comes back compressed.
    c.send_b0(0xC1, &deflate(b"hi"));
    assert_eq!(text(&mut c).1, b"hi");
    c.send_b0(0xC1, &deflate(big.as_bytes()));
    assert_eq!(text(&mut c), (true, big.clone().into_bytes()));
    // A compressed message in three fragments (RSV1 on the first only), a ping between.
    let z = deflate(big.as_bytes());
    let (a, rest) = z.split_at(z.len() / 3);
    let (b, d) = rest.split_at(rest.len() / 2);
    c.send_b0(0x41, a);
    c.send_b0(0x00, b);
    c.send_b0(0x89, b"p");
    let pong = c.frame();
    assert!(pong.fin && pong.op == OP_PONG && pong.rsv == 0, "{pong:?}");
    assert_eq!(pong.payload, b"p");
    c.send_b0(0x80, d);
    assert_eq!(text(&mut c), (true, big.into_bytes()));
    // Uncompressed messages still work on the same connection.
    c.send_b0(0x81, b"plain");
    assert_eq!(text(&mut c), (false, b"plain".to_vec()));
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
            c.send_b0(*b0, p);
        }
        close_code(&mut c)
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
    // One worker: the subscriptions' history reads are answered within the subscribe, so the
    // publish below reaches them live (compressed). With several workers a publish can reach
    // the topic's home before a subscriber's read does; the message then comes with the
    // history, as a replay, which is sent uncompressed (cached data, queued by reference).
    let server = Server::start(&["--permessage-deflate", "--threads", "1"]);
    let t = topic();
    let message = hex(512, 3);
    let mut zipped = open(&server, "/", Some(OFFER));
    let mut plain = open(&server, "/", None);
    let mut publisher = open(&server, "/", Some(OFFER));
    let mut sub_ids = Vec::new();
    for (i, c) in [&mut zipped, &mut plain].into_iter().enumerate() {
        let req = json!({"id": i + 1, "jsonrpc": "2.0", "method": "waku_subscribe", "params": {"topic": t}});
        c.send_b0(0x81, req.to_string().as_bytes());
        let (_, body) = text(c);
        let v: Value = serde_json::from_slice(&body).unwrap();
        sub_ids.push(v["result"].as_str().unwrap().to_string());
    }
    let publish = json!({"id": 9, "jsonrpc": "2.0", "method": "waku_publish",
        "params": {"topic": t, "message": message, "ttl": 86400}});
    publisher.send_b0(0xC1, &deflate(publish.to_string().as_bytes()));
    let (_, ack) = text(&mut publisher);
    assert_eq!(
        serde_json::from_slice::<Value>(&ack).unwrap()["result"],
        json!(true)
    );
    let (compressed, z) = text(&mut zipped);
    let (was, p) = text(&mut plain);
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
