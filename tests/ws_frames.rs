//! RFC 6455 framing against the real server, byte by byte, with the raw client of
//! `common::raw_ws` (the upgrade written by hand, frames built and decoded there), so nothing
//! in between forgives a mistake.

mod common;

use common::raw_ws::{
    encode_frame, rpc_request, upgrade_request, OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG,
    OP_TEXT, RELAY_PATH, RFC_KEY,
};
use common::{each_server, topic, HttpConn, RawWs, Resp, Server};
use serde_json::{json, Value};

fn subscribe_req(id: u64, topic: &str) -> String {
    rpc_request(id, "waku_subscribe", json!({ "topic": topic }))
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

// ------------------------------------------------------------------------------------------
// The handshake

#[test]
fn upgrade_answers_101_with_the_rfc_accept_key() {
    each_server(&[], |s| {
        // `RawWs::open_at` checks status 101, Upgrade, Connection and the RFC 6455 §1.3
        // example.
        let mut c = RawWs::open_at(s, "/");
        // And the connection works afterwards.
        c.send_text(&subscribe_req(1, &topic()));
        assert_sub_result(&c.recv_json(), 1);
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
        let mut c = HttpConn::open(&s);
        c.send(upgrade_request("/", key, "").as_bytes());
        let r = c.response(false);
        assert_eq!(r.status, 101, "{r:?}");
        let want = tungstenite::handshake::derive_accept_key(key.as_bytes());
        assert_eq!(r.header("Sec-WebSocket-Accept"), Some(want.as_str()));
    }
}

#[test]
fn upgrade_with_the_wallet_query_string_is_accepted() {
    let s = Server::start(&[]);
    let mut c = RawWs::open_at(&s, "/?protocol=wc&version=2&env=browser");
    c.send_text(&subscribe_req(7, &topic()));
    assert_sub_result(&c.recv_json(), 7);
}

/// DECISIONS §3 (issue 14 §7): the relay upgrades at `/` only, with or without a query;
/// an upgrade request on any other path is refused with the JSON 404 before upgrading,
/// also on a path that answers a plain GET (the registry, the greeting).
#[test]
fn only_the_root_path_upgrades_and_every_other_path_is_404_json() {
    each_server(&[], |s| {
        for path in ["/", RELAY_PATH] {
            let mut c = RawWs::open_at(s, path);
            c.send_text(&subscribe_req(1, &topic()));
            assert_sub_result(&c.recv_json(), 1);
        }
        let mut wrong = Vec::new();
        for path in ["/api/v1/wallets", "/hello", "/nope"] {
            let r = refused(s, &upgrade_request(path, RFC_KEY, ""));
            if r.status != 404 || r.header("Sec-WebSocket-Accept").is_some() {
                wrong.push(format!(
                    "{path}: {} {:?} {:?}",
                    r.status,
                    r.headers,
                    String::from_utf8_lossy(&r.body[..r.body.len().min(80)])
                ));
                continue;
            }
            r.assert_json_error();
        }
        assert!(
            wrong.is_empty(),
            "an upgrade request on these paths did not get the 404 (DECISIONS §3):\n{}",
            wrong.join("\n")
        );
    });
}

#[test]
fn frames_sent_right_behind_the_upgrade_request_are_processed() {
    each_server(&[], |s| {
        let mut bytes = upgrade_request("/", RFC_KEY, "").into_bytes();
        bytes.extend(encode_frame(
            0x81,
            subscribe_req(3, &topic()).as_bytes(),
            Some([1, 2, 3, 4]),
        ));
        let mut sock = s.tcp();
        std::io::Write::write_all(&mut sock, &bytes).unwrap();
        let mut c = RawWs::expect_101(sock);
        assert_sub_result(&c.recv_json(), 3);
    });
}

/// Sends `req` on a fresh connection and reads the one answer to it.
fn refused(s: &Server, req: &str) -> Resp {
    s.request(req)
}

#[test]
fn upgrade_on_another_path_is_404_without_upgrading() {
    let s = Server::start(&[]);
    let r = refused(&s, &upgrade_request("/other", RFC_KEY, ""));
    assert_eq!(r.status, 404, "{r:?}");
    assert!(r.header("Sec-WebSocket-Accept").is_none(), "{r:?}");
    let v: Value = serde_json::from_slice(&r.body).expect("JSON body");
    assert!(v["error"].is_string(), "{v}");
}

#[test]
fn upgrade_with_websocket_version_8_is_426_naming_version_13() {
    let s = Server::start(&[]);
    let req = upgrade_request("/", RFC_KEY, "")
        .replace("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 8");
    let r = refused(&s, &req);
    assert_eq!(r.status, 426, "{r:?}");
    assert_eq!(r.header("Sec-WebSocket-Version"), Some("13"), "{r:?}");
    assert!(r.header("Sec-WebSocket-Accept").is_none(), "{r:?}");
}

#[test]
fn plain_get_of_the_relay_path_is_426() {
    let s = Server::start(&[]);
    let r = refused(
        &s,
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 426, "{r:?}");
    assert!(r.header("Sec-WebSocket-Accept").is_none(), "{r:?}");
}

#[test]
fn upgrade_without_a_key_is_400() {
    let s = Server::start(&[]);
    let req = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
               Sec-WebSocket-Version: 13\r\n\r\n";
    let r = refused(&s, req);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.header("Sec-WebSocket-Accept").is_none(), "{r:?}");
}

#[test]
fn a_key_that_is_not_16_bytes_in_base64_is_400() {
    let s = Server::start(&[]);
    let base64_of_17_bytes = "AAAAAAAAAAAAAAAAAAAAAAA=";
    for key in [
        "!!!!!!!!!!!!!!!!!!!!!!==",
        base64_of_17_bytes,
        "dGhlIHNhbXBsZSBub25jZQ",
    ] {
        let r = refused(&s, &upgrade_request("/", key, ""));
        assert_eq!(r.status, 400, "{key}: {r:?}");
        assert!(r.header("Sec-WebSocket-Accept").is_none(), "{r:?}");
    }
    // RFC 6455 §11.3.1: the key appears once.
    let twice = upgrade_request("/", RFC_KEY, &format!("Sec-WebSocket-Key: {RFC_KEY}\r\n"));
    assert_eq!(refused(&s, &twice).status, 400);
}

#[test]
fn an_upgrade_needs_http_1_1_and_get() {
    let s = Server::start(&[]);
    let r = refused(
        &s,
        &upgrade_request("/", RFC_KEY, "").replace("HTTP/1.1", "HTTP/1.0"),
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.header("Sec-WebSocket-Accept").is_none(), "{r:?}");
    // HEAD works wherever GET does (DECISIONS §1): GET's 426, without the body.
    let r = s.request("HEAD / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    assert_eq!(r.status, 426, "{r:?}");
    assert_eq!(r.header("Upgrade"), Some("websocket"), "{r:?}");
    assert!(r.body.is_empty(), "{r:?}");
    let r = s.request(&upgrade_request("/", RFC_KEY, "").replacen("GET", "HEAD", 1));
    assert_eq!(r.status, 426, "{r:?}");
    assert!(r.header("Sec-WebSocket-Accept").is_none(), "{r:?}");
}

// ------------------------------------------------------------------------------------------
// Frames: protocol errors

#[test]
fn unmasked_client_frame_is_closed_with_1002() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        let f = encode_frame(0x81, subscribe_req(1, "t").as_bytes(), None);
        c.send_raw(&f);
        assert_eq!(c.close_code_then_eof(), 1002);
    });
}

#[test]
fn continuation_without_a_started_message_is_closed_with_1002() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        c.send_frame(true, OP_CONT, b"{}");
        assert_eq!(c.close_code_then_eof(), 1002);
    });
}

#[test]
fn new_text_frame_inside_a_fragmented_message_is_closed_with_1002() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        c.send_frame(false, OP_TEXT, b"{\"id\":1,");
        c.send_frame(true, OP_TEXT, b"{}");
        assert_eq!(c.close_code_then_eof(), 1002);
    });
}

#[test]
fn reserved_bits_are_closed_with_1002() {
    each_server(&[], |s| {
        for rsv in [0x40u8, 0x20, 0x10] {
            let mut c = RawWs::open_at(s, "/");
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
            let mut c = RawWs::open_at(s, "/");
            c.send_frame(true, op, b"x");
            assert_eq!(c.close_code_then_eof(), 1002, "opcode {op:#x}");
        }
    });
}

#[test]
fn fragmented_or_oversized_control_frames_are_closed_with_1002() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        c.send_frame(false, OP_PING, b"a");
        assert_eq!(c.close_code_then_eof(), 1002, "fragmented ping");

        let mut c = RawWs::open_at(s, "/");
        c.send_frame(true, OP_PING, &[b'p'; 126]);
        assert_eq!(c.close_code_then_eof(), 1002, "ping with 126-byte payload");
    });
}

#[test]
fn text_with_invalid_utf8_is_closed_with_1007() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        c.send_frame(true, OP_TEXT, b"{\"id\":1,\"x\":\"\xc3\x28\"}");
        assert_eq!(c.close_code_then_eof(), 1007);

        // Invalid only once reassembled: a truncated sequence at the very end.
        let mut c = RawWs::open_at(s, "/");
        c.send_fragmented(OP_TEXT, &[b"\"ab", b"c\xe2\x82"]);
        assert_eq!(c.close_code_then_eof(), 1007);
    });
}

#[test]
fn utf8_sequence_split_across_fragments_is_accepted() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        // "é" (c3 a9) and "€" (e2 82 ac) cut in the middle by fragment boundaries.
        let t = format!("{}-\u{e9}\u{20ac}", topic());
        let req = subscribe_req(5, &t);
        let bytes = req.as_bytes();
        let cut1 = req.find('\u{e9}').unwrap() + 1;
        let cut2 = req.find('\u{20ac}').unwrap() + 2;
        c.send_fragmented(
            OP_TEXT,
            &[&bytes[..cut1], &bytes[cut1..cut2], &bytes[cut2..]],
        );
        assert_sub_result(&c.recv_json(), 5);
    });
}

#[test]
fn single_frame_over_max_message_is_closed_with_1009() {
    each_server(&["--max-message", "1024"], |s| {
        let mut c = RawWs::open_at(s, "/");
        let mut payload = subscribe_req(1, "t").into_bytes();
        payload.resize(2000, b' ');
        c.send_frame(true, OP_TEXT, &payload);
        assert_eq!(c.close_code_then_eof(), 1009);
    });
}

#[test]
fn fragmented_message_over_max_message_is_closed_with_1009() {
    each_server(&["--max-message", "1024"], |s| {
        let mut c = RawWs::open_at(s, "/");
        // Each fragment is small; together they are 1200 bytes.
        let chunk = [b' '; 400];
        c.send_fragmented(OP_TEXT, &[&chunk, &chunk, &chunk]);
        assert_eq!(c.close_code_then_eof(), 1009);
    });
}

#[test]
fn message_of_exactly_max_message_bytes_is_accepted() {
    each_server(&["--max-message", "1024"], |s| {
        let mut c = RawWs::open_at(s, "/");
        // Whitespace after the JSON value pads it to the limit; one frame, then fragmented.
        let mut payload = subscribe_req(1, &topic()).into_bytes();
        payload.resize(1024, b' ');
        c.send_frame(true, OP_TEXT, &payload);
        assert_sub_result(&c.recv_json(), 1);

        let mut payload = subscribe_req(2, &topic()).into_bytes();
        payload.resize(1024, b' ');
        c.send_fragmented(OP_TEXT, &[&payload[..500], &payload[500..]]);
        assert_sub_result(&c.recv_json(), 2);
    });
}

// ------------------------------------------------------------------------------------------
// Frames: what works

#[test]
fn fragmented_subscribe_with_a_ping_between_fragments_gets_pong_then_result() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        let req = subscribe_req(42, &topic());
        let b = req.as_bytes();
        let (a, rest) = b.split_at(b.len() / 3);
        let (m, z) = rest.split_at(rest.len() / 2);
        c.send_frame(false, OP_TEXT, a);
        c.send_ping(b"between fragments");
        c.send_frame(false, OP_CONT, m);
        c.send_frame(true, OP_CONT, z);
        let pong = c.frame();
        assert_eq!(pong.op, OP_PONG, "{pong:?}");
        assert!(pong.fin);
        assert_eq!(pong.payload, b"between fragments");
        assert_sub_result(&c.recv_json(), 42);
    });
}

#[test]
fn request_dribbled_one_byte_per_write_is_answered() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        let f = c.masked_frame(0x81, subscribe_req(9, &topic()).as_bytes());
        for b in f {
            c.send_raw(&[b]);
        }
        assert_sub_result(&c.recv_json(), 9);
    });
}

#[test]
fn several_frames_in_one_write_are_answered_in_order() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        let mut bytes = Vec::new();
        for id in 1..=5u64 {
            bytes.extend(c.masked_frame(0x81, subscribe_req(id, &topic()).as_bytes()));
        }
        c.send_raw(&bytes);
        for id in 1..=5u64 {
            assert_sub_result(&c.recv_json(), id);
        }
    });
}

#[test]
fn ping_gets_a_pong_echoing_the_payload() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        let max: Vec<u8> = (0..125u8).collect();
        for payload in [&b""[..], b"hello", &[0u8, 0xFF, 0x80, 1], &max[..]] {
            c.send_ping(payload);
            let f = c.frame();
            assert_eq!(f.op, OP_PONG, "{f:?}");
            assert!(f.fin);
            assert_eq!(f.payload, payload);
        }
        // An unsolicited pong is ignored and the connection keeps working.
        c.send_pong(b"unsolicited");
        c.send_text(&subscribe_req(1, &topic()));
        assert_sub_result(&c.recv_json(), 1);
    });
}

#[test]
fn client_close_1000_is_echoed_and_tcp_closed() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        c.send_close(Some(1000), "bye");
        assert_eq!(c.close_code_then_eof(), 1000);
    });
}

#[test]
fn client_close_with_an_application_code_is_echoed() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        c.send_close(Some(4000), "");
        assert_eq!(c.close_code_then_eof(), 4000);
    });
}

#[test]
fn client_close_with_empty_payload_is_answered_with_1000() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        c.send_close(None, "");
        assert_eq!(c.close_code_then_eof(), 1000);
    });
}

#[test]
fn client_close_with_an_invalid_code_is_closed_with_1002() {
    each_server(&[], |s| {
        for code in [1005u16, 999, 1006, 1015, 2000] {
            let mut c = RawWs::open_at(s, "/");
            c.send_close(Some(code), "");
            assert_eq!(
                c.close_code_then_eof(),
                1002,
                "close code {code} on the wire"
            );
        }
        // A one-byte close payload cannot hold a code.
        let mut c = RawWs::open_at(s, "/");
        c.send_frame(true, OP_CLOSE, &[0x03]);
        assert_eq!(c.close_code_then_eof(), 1002, "one-byte close payload");
    });
}

#[test]
fn binary_frame_with_a_json_rpc_request_is_answered_like_text() {
    each_server(&[], |s| {
        let mut c = RawWs::open_at(s, "/");
        c.send_binary(subscribe_req(11, &topic()).as_bytes());
        assert_sub_result(&c.recv_json(), 11);
        // Fragmented binary too.
        let req = subscribe_req(12, &topic());
        let (a, b) = req.as_bytes().split_at(10);
        c.send_fragmented(OP_BINARY, &[a, b]);
        assert_sub_result(&c.recv_json(), 12);
    });
}

#[test]
fn server_frames_are_never_masked() {
    each_server(&[], |s| {
        let tp = topic();
        let mut sub = RawWs::open_at(s, "/");
        let mut publ = RawWs::open_at(s, "/");
        sub.send_text(&subscribe_req(1, &tp));
        let mut frames = vec![sub.frame()];
        publ.send_text(
            &json!({"id": 2, "jsonrpc": "2.0", "method": "waku_publish",
                    "params": {"topic": tp, "message": "m", "ttl": 60}})
            .to_string(),
        );
        frames.push(publ.frame());
        frames.push(sub.frame()); // the push
        sub.send_ping(b"p");
        frames.push(sub.frame());
        sub.send_close(Some(1000), "");
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
        let mut sub = RawWs::open_at(s, "/");
        let mut publ = RawWs::open_at(s, "/");
        sub.send_text(&subscribe_req(1, &tp));
        assert_sub_result(&sub.recv_json(), 1);
        let msg = "z".repeat(70_000);
        publ.send_text(
            &json!({"id": 2, "jsonrpc": "2.0", "method": "waku_publish",
                    "params": {"topic": tp, "message": msg, "ttl": 60}})
            .to_string(),
        );
        assert_eq!(publ.recv_json()["result"], true);
        let push = sub.recv_json();
        assert_eq!(push["params"]["data"]["message"], msg);
    });
}
