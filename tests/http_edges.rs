//! Edges of HTTP routing and request lines (DECISIONS §1, §2): an unknown path is 404 for
//! every method, even below `/api/v1/`; 505 only for a foreign HTTP version; the parts of a
//! logo path are percent-decoded alike; the reason phrase of every status the server sends.

mod common;

use common::http::get;
use common::{HttpConn, Server};

#[test]
fn unknown_registry_paths_are_404_for_every_method() {
    let s = Server::start(&[]);
    for path in [
        "/api/v1/nope",
        "/api/v1/",
        "/api/v1/wallets/",
        "/api/v1/logo/sm",
        "/api/v1/anything/deep",
    ] {
        for method in ["GET", "HEAD", "POST", "DELETE", "OPTIONS"] {
            let r = s.request(&format!(
                "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            ));
            assert_eq!(r.status, 404, "{method} {path}: {r:?}");
            assert!(r.header("Allow").is_none(), "{method} {path}: {r:?}");
            if method != "HEAD" {
                r.assert_json_error();
            }
        }
    }
    // A known registry path with another method is 405 with `Allow`, as before.
    let r = s.request("POST /api/v1/wallets HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(r.status, 405, "{r:?}");
    assert_eq!(r.header("Allow"), Some("GET, HEAD, OPTIONS"));
}

#[test]
fn a_space_in_the_target_is_400_and_only_a_foreign_version_is_505() {
    let s = Server::start(&[]);
    for (raw, status) in [
        (
            "GET /api/v1/wallets?entries= 1&page=1 HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
        ("GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        ("GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505),
    ] {
        let mut c = HttpConn::open(&s);
        c.send(raw.as_bytes());
        let r = c.response(false);
        assert_eq!(r.status, status, "{raw:?}: {r:?}");
        r.assert_json_error();
        c.expect_closed();
    }
}

#[test]
fn both_parts_of_a_logo_path_are_percent_decoded() {
    let s = Server::start(&[]);
    let list = s.request(&get("/api/v1/wallets?entries=1&page=1"));
    let v: serde_json::Value = serde_json::from_slice(&list.body).expect("json");
    let id = v["listings"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .expect("an id");
    let plain = s.request(&get(&format!("/api/v1/logo/sm/{id}")));
    assert_eq!(plain.status, 200, "{plain:?}");
    let encoded = s.request(&get(&format!("/api/v1/logo/%73m/{id}")));
    assert_eq!(encoded.status, 200, "{encoded:?}");
    assert_eq!(encoded.body, plain.body);
}

#[test]
fn refusals_of_relay_auth_carry_their_reason_phrase() {
    use std::io::{Read, Write};
    let s = Server::start(&["--require-auth"]);
    let mut sock = std::net::TcpStream::connect(s.addr).expect("connect");
    sock.write_all(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .expect("write");
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let mut got = Vec::new();
    let _ = sock.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    let first = text.split("\r\n").next().unwrap_or_default();
    assert_eq!(first, "HTTP/1.1 401 Unauthorized", "{text}");
}
