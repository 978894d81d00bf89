//! Limits per client (DECISIONS §11) through the real binary. Several loopback source
//! addresses (127.0.0.2, 127.0.0.3, ...) stand for several clients. Every rate here is so
//! low that no bucket refills during a test (0.001 a second), so every count is exact and
//! nothing depends on timing.

#[path = "limits/auth.rs"]
mod auth;
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use serde_json::{json, Value};

use common::{raw_ws::RELAY_PATH, topic, Server, Ws, READ_TIMEOUT};

/// A TCP connection to `server` from source address `src`.
fn tcp_from(server: &Server, src: &str) -> std::io::Result<TcpStream> {
    tcp_to_from(server.addr, src)
}

/// A TCP connection to `to` from source address `src`.
fn tcp_to_from(to: SocketAddr, src: &str) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    let from: SocketAddr = format!("{src}:0").parse().expect("source address");
    sock.bind(&from.into())?;
    sock.connect(&to.into())?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// A WebSocket from `src` (with extra headers), or why the upgrade failed.
fn ws_with(server: &Server, src: &str, headers: &[(&str, &str)]) -> Result<Ws, String> {
    let s = tcp_from(server, src).map_err(|e| e.to_string())?;
    Ws::try_handshake(s, &format!("ws://{}{}", server.addr, RELAY_PATH), headers)
}

fn ws_from(server: &Server, src: &str) -> Result<Ws, String> {
    ws_with(server, src, &[])
}

fn limited(server: &Server, kind: &str) -> f64 {
    server.series(&format!("walletrelay_limited_total{{kind=\"{kind}\"}}"))
}

fn publish(ws: &mut Ws, topic: &str, message: &str) -> Value {
    ws.call(
        "waku_publish",
        json!({"topic": topic, "message": message, "ttl": 21600}),
    )
}

/// Asserts a -32000 `rate limited` answer with a positive `retryAfterMs`.
fn assert_rate_limited(r: &Value) {
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert_eq!(r["error"]["message"], "rate limited", "{r}");
    let ms = r["error"]["data"]["retryAfterMs"].as_u64();
    assert!(ms.is_some_and(|ms| ms > 0), "retryAfterMs: {r}");
}

/// A plain HTTP request from `src`: the status line's code, or `None` when the connection
/// was closed (or reset) without an answer.
fn http_status_from(server: &Server, src: &str) -> Option<u16> {
    let mut s = tcp_from(server, src).ok()?;
    let _ = s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

#[test]
fn connections_per_address_are_capped_and_other_addresses_still_connect() {
    let server = Server::start_limited(&["--threads", "1", "--max-connections-per-ip", "3"]);
    let mut held: Vec<Ws> = (0..3)
        .map(|_| ws_from(&server, "127.0.0.2").expect("within the cap"))
        .collect();
    let e = ws_from(&server, "127.0.0.2")
        .err()
        .expect("the 4th is refused");
    assert!(!e.contains("no worker header"), "{e}");
    // Plain HTTP from the same address: 429 (or closed at accept), never served.
    let status = http_status_from(&server, "127.0.0.2");
    assert!(matches!(status, None | Some(429)), "{status:?}");
    // Another address is not affected.
    let mut other = ws_from(&server, "127.0.0.3").expect("another address");
    other.subscribe(&topic());
    assert!(limited(&server, "connections") >= 2.0);
    // A place freed is a place taken again (once the server has seen the close).
    drop(held.pop());
    let mut again = None;
    for _ in 0..100 {
        if let Ok(w) = ws_from(&server, "127.0.0.2") {
            again = Some(w);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(again.is_some(), "a freed place was never given again");
}

/// The cap counts one address's connections on every worker together: whatever the
/// number of workers and however the kernel spreads the connections over their listeners,
/// the N-th is let in and the N+1-th refused, and a close anywhere is a place anywhere.
#[test]
fn the_connection_cap_is_exact_whatever_the_number_of_workers() {
    for (threads, src) in [("2", "127.0.0.40"), ("4", "127.0.0.41")] {
        let server =
            Server::start_limited(&["--threads", threads, "--max-connections-per-ip", "20"]);
        let mut held: Vec<Ws> = (1..=20)
            .map(|i| {
                ws_from(&server, src)
                    .unwrap_or_else(|e| panic!("--threads {threads}: #{i} refused: {e}"))
            })
            .collect();
        assert!(ws_from(&server, src).is_err(), "--threads {threads}: #21");
        // One closes: once the server has seen it, one more is let in, and only one.
        drop(held.swap_remove(7));
        let again = common::wait::poll(common::wait::WAIT, || ws_from(&server, src).ok());
        held.push(again.expect("a freed place was never given again"));
        assert!(
            ws_from(&server, src).is_err(),
            "--threads {threads}: 20 open again"
        );
        // Every WebSocket held is still served.
        for ws in held.iter_mut() {
            ws.subscribe(&topic());
        }
        assert_eq!(server.metric("walletrelay_limit_split_accepts_total"), 0.0);
    }
}

/// Everything the server sends until it closes (or resets) the connection.
fn read_to_close(s: &mut impl Read) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// What the server answers `bytes` from `src` with, until it closes.
fn raw(server: &Server, src: &str, bytes: &[u8]) -> Vec<u8> {
    let mut t = tcp_from(server, src).expect("connect");
    let _ = t.write_all(bytes);
    read_to_close(&mut t)
}

/// A TLS connection from `src` to the server's TLS listener, handshake done.
fn tls_from(
    server: &Server,
    src: &str,
    config: &std::sync::Arc<rustls::ClientConfig>,
) -> common::tls::TlsStream {
    let tcp = tcp_to_from(server.tls_addr(), src).expect("connect to the TLS listener");
    let name = "localhost".try_into().expect("a server name");
    let conn = rustls::ClientConnection::new(config.clone(), name).expect("client connection");
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).expect("TLS handshake");
    }
    s
}

/// A connection ended some way from `src` (the third of its address): whether the server
/// showed it was let in.
type End = fn(&Server, &str, &std::sync::Arc<rustls::ClientConfig>) -> bool;

/// Every way a connection ends gives its place back, once: with two held and a cap of
/// three, each of these is let in as the third, and afterwards exactly one more is.
#[test]
fn every_way_a_connection_ends_gives_its_place_back_once() {
    let pki = common::tls::TlsSetup::new();
    let mut args = pki.args();
    for a in ["--threads", "2", "--max-connections-per-ip", "3"] {
        args.push(a.into());
    }
    args.extend(["--head-timeout".into(), "0.3".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start_limited(&args);
    let client = pki.client();
    let src = "127.0.0.44";
    let held: Vec<Ws> = (0..2).map(|_| ws_from(&server, src).unwrap()).collect();
    let ends: [(&str, End); 10] = [
        ("a head answered 400", |s, src, _| {
            raw(s, src, b"NONSENSE\r\n\r\n").starts_with(b"HTTP/1.1 400")
        }),
        ("an upgrade refused", |s, src, _| {
            let head = format!(
                "GET {RELAY_PATH} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n"
            );
            raw(s, src, head.as_bytes()).starts_with(b"HTTP/1.1 4")
        }),
        ("a head that never ends (timeout)", |s, src, _| {
            raw(s, src, b"GET /hello HTTP/1.1\r\nHost: x\r\n").starts_with(b"HTTP/1.1 408")
        }),
        ("keep-alive, then the client's close", |s, src, _| {
            let mut t = tcp_from(s, src).expect("connect");
            let _ = t.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
            let mut head = [0u8; 12];
            t.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
        }),
        ("a WebSocket closed cleanly", |s, src, _| {
            let Ok(mut ws) = ws_from(s, src) else {
                return false;
            };
            let _ = ws.sock.close(None);
            while ws.sock.read().is_ok() {}
            true
        }),
        ("a WebSocket protocol error", |s, src, _| {
            let Ok(mut ws) = ws_from(s, src) else {
                return false;
            };
            // An unmasked frame from a client: closed with 1002.
            let _ = ws.sock.get_mut().write_all(&[0x81, 0x01, b'x']);
            read_to_close(ws.sock.get_mut());
            true
        }),
        ("a WebSocket reset by its client", |s, src, _| {
            let Ok(ws) = ws_from(s, src) else {
                return false;
            };
            common::reset_on_close(ws.sock.get_ref());
            true
        }),
        ("plaintext on the TLS port (a TLS failure)", |s, src, _| {
            let mut t = tcp_to_from(s.tls_addr(), src).expect("connect");
            let _ = t.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
            read_to_close(&mut t);
            true
        }),
        ("a TLS handshake, then the client's close", |s, src, c| {
            drop(tls_from(s, src, c));
            true
        }),
        ("a WebSocket over TLS", |s, src, c| {
            let url = format!("wss://localhost:{}{RELAY_PATH}", s.tls_addr().port());
            let ws = Ws::try_handshake(tls_from(s, src, c), &url, &[]);
            ws.is_ok()
        }),
    ];
    // The two held and this scrape: every other connection reaped.
    let settled = || {
        common::wait::wait_for("the server to reap", || {
            server.metric("walletrelay_connections_open") == 3.0
        })
    };
    for (what, end) in ends {
        settled();
        assert!(end(&server, src, &client), "{what}: not let in");
    }
    settled();
    let third = ws_from(&server, src).expect("the third place is free");
    assert!(ws_from(&server, src).is_err(), "and only it");
    assert_eq!(limited(&server, "connections"), 1.0);
    drop((held, third));
}

/// The accept burst is one bucket per address across the workers: a burst of B lets
/// exactly B through, whatever the number of workers.
#[test]
fn the_accept_burst_is_exact_whatever_the_number_of_workers() {
    for (threads, src) in [("2", "127.0.0.42"), ("4", "127.0.0.43")] {
        let server = Server::start_limited(&[
            "--threads",
            threads,
            "--accept-rate-per-ip",
            "0.001",
            "--accept-burst-per-ip",
            "20",
        ]);
        // Ten held open, ten closed after their answer: both count.
        let mut held = Vec::new();
        for i in 1..=20 {
            if i % 2 == 0 {
                let ws = ws_from(&server, src);
                held.push(ws.unwrap_or_else(|e| panic!("--threads {threads}: #{i}: {e}")));
            } else {
                let status = http_status_from(&server, src);
                assert_eq!(status, Some(200), "--threads {threads}: #{i}");
            }
        }
        let status = http_status_from(&server, src);
        assert!(
            matches!(status, None | Some(429)),
            "--threads {threads}: #21: {status:?}"
        );
        drop(held);
        assert!(
            ws_from(&server, src).is_err(),
            "closing gives no token back"
        );
        assert_eq!(limited(&server, "accept_rate"), 2.0);
    }
}

#[test]
fn new_connections_per_address_are_rate_limited() {
    let server = Server::start_limited(&[
        "--threads",
        "1",
        "--accept-rate-per-ip",
        "0.001",
        "--accept-burst-per-ip",
        "3",
    ]);
    for _ in 0..3 {
        assert_eq!(http_status_from(&server, "127.0.0.4"), Some(200));
    }
    let status = http_status_from(&server, "127.0.0.4");
    assert!(matches!(status, None | Some(429)), "{status:?}");
    assert!(ws_from(&server, "127.0.0.4").is_err());
    assert_eq!(http_status_from(&server, "127.0.0.5"), Some(200));
    assert_eq!(limited(&server, "accept_rate"), 2.0);
}

/// Whether a TCP handshake from `src` completes within `wait` (a blocked address's SYN
/// gets no answer at all; a refused-at-accept one completes and is then reset, which the
/// connect may already report).
fn handshake_from(server: &Server, src: &str, wait: std::time::Duration) -> bool {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
    let from: SocketAddr = format!("{src}:0").parse().expect("source address");
    sock.bind(&from.into()).expect("bind");
    match sock.connect_timeout(&server.addr.into(), wait) {
        Ok(()) => true,
        // Accepted and reset (refused at accept) before the connect was seen complete.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => false,
        Err(e) => panic!("connect from {src}: {e}"),
    }
}

#[test]
fn a_storm_of_refused_connections_is_blocked_at_the_listener_then_let_go() {
    let server = Server::start_limited(&[
        "--threads",
        "1",
        "--accept-rate-per-ip",
        "0.001",
        "--accept-burst-per-ip",
        "1",
        "--accept-block-after",
        "10",
        "--accept-block-ms",
        "3000",
        // The metrics are read from here.
        "--limit-exempt",
        "127.0.0.1",
    ]);
    let metric = |name: &str| server.try_metric(name).expect("/metrics answers");
    let blocks = || metric("walletrelay_accept_blocks_total");
    assert_eq!(http_status_from(&server, "127.0.0.30"), Some(200));
    // Refused at accept: the handshake completes, the connection is reset unanswered.
    for _ in 0..9 {
        assert_eq!(http_status_from(&server, "127.0.0.30"), None);
    }
    assert_eq!(blocks(), 0.0);
    assert_eq!(http_status_from(&server, "127.0.0.30"), None);
    // The 10th refusal in a second blocked the address: its SYNs go unanswered.
    assert_eq!(blocks(), 1.0);
    assert_eq!(metric("walletrelay_blocked_addresses"), 1.0);
    let refused = limited(&server, "accept_rate");
    assert_eq!(refused, 10.0);
    let short = std::time::Duration::from_millis(300);
    assert!(!handshake_from(&server, "127.0.0.30", short));
    // Nothing reached the worker: no accept, no refusal counted.
    assert_eq!(limited(&server, "accept_rate"), refused);
    // Another address is served as before.
    assert_eq!(http_status_from(&server, "127.0.0.31"), Some(200));
    // The block ends: the address is refused at accept again (its bucket is still empty).
    let mut let_go = false;
    for _ in 0..40 {
        if handshake_from(&server, "127.0.0.30", short) {
            let_go = true;
            break;
        }
    }
    assert!(let_go, "the block never ended");
    assert_eq!(metric("walletrelay_blocked_addresses"), 0.0);
    assert_eq!(blocks(), 1.0);
}

#[test]
fn a_refused_publish_is_neither_delivered_nor_stored() {
    let server = Server::start_limited(&[
        "--threads",
        "1",
        "--publish-rate",
        "0.001",
        "--publish-burst",
        "3",
    ]);
    let t = topic();
    let mut sub = ws_from(&server, "127.0.0.6").unwrap();
    sub.subscribe(&t);
    let mut publisher = ws_from(&server, "127.0.0.7").unwrap();
    for i in 0..3 {
        let r = publish(&mut publisher, &t, &format!("m{i}"));
        assert_eq!(r["result"], true, "{r}");
    }
    let r = publish(&mut publisher, &t, "refused");
    assert_rate_limited(&r);
    // A marker from someone else, after the refusal: the next thing after the three.
    let mut marker = ws_from(&server, "127.0.0.8").unwrap();
    assert_eq!(publish(&mut marker, &t, "marker")["result"], true);
    for want in ["m0", "m1", "m2", "marker"] {
        assert_eq!(sub.next_push().2, want);
    }
    let mut late = ws_from(&server, "127.0.0.9").unwrap();
    late.subscribe(&t);
    for want in ["m0", "m1", "m2", "marker"] {
        assert_eq!(late.next_push().2, want, "the refused message was stored");
    }
    assert_eq!(limited(&server, "publish"), 1.0);
}

#[test]
fn published_bytes_are_rate_limited() {
    let server = Server::start_limited(&[
        "--threads",
        "1",
        "--publish-bytes-rate",
        "0.001",
        "--publish-bytes-burst",
        "100",
    ]);
    let t = topic();
    let mut ws = ws_from(&server, "127.0.0.10").unwrap();
    assert_eq!(publish(&mut ws, &t, &"a".repeat(60))["result"], true);
    assert_rate_limited(&publish(&mut ws, &t, &"b".repeat(60)));
    // What is left still passes: the refusal took nothing.
    assert_eq!(publish(&mut ws, &t, &"c".repeat(40))["result"], true);
    assert_eq!(limited(&server, "bytes"), 1.0);
}

#[test]
fn subscriptions_are_rate_limited_and_a_batch_counts_each_topic() {
    let server = Server::start_limited(&[
        "--threads",
        "1",
        "--subscribe-rate",
        "0.001",
        "--subscribe-burst",
        "5",
    ]);
    let mut ws = ws_from(&server, "127.0.0.11").unwrap();
    let three = || json!({"topics": [topic(), topic(), topic()]});
    let r = ws.call("irn_batchSubscribe", three());
    assert_eq!(r["result"].as_array().map(Vec::len), Some(3), "{r}");
    assert_rate_limited(&ws.call("irn_batchSubscribe", three()));
    ws.subscribe(&topic());
    ws.subscribe(&topic());
    assert_rate_limited(&ws.call("waku_subscribe", json!({"topic": topic()})));
    assert_eq!(limited(&server, "subscribe"), 2.0);
}

#[test]
fn a_hundred_refusals_in_a_row_close_with_1013() {
    let server = Server::start_limited(&[
        "--threads",
        "1",
        "--publish-rate",
        "0.001",
        "--publish-burst",
        "1",
    ]);
    let t = topic();
    let mut ws = ws_from(&server, "127.0.0.12").unwrap();
    assert_eq!(publish(&mut ws, &t, "ok")["result"], true);
    for i in 0..100 {
        let req = json!({"id": 1000 + i, "jsonrpc": "2.0", "method": "waku_publish",
            "params": {"topic": t, "message": "x", "ttl": 21600}});
        ws.send(&req);
    }
    let mut refused = 0;
    let code = loop {
        match ws.sock.read() {
            Ok(tungstenite::Message::Text(text)) => {
                let v: Value = serde_json::from_str(text.as_str()).unwrap();
                assert_rate_limited(&v);
                refused += 1;
            }
            Ok(tungstenite::Message::Close(c)) => break c.map(|c| u16::from(c.code)),
            Ok(_) => continue,
            Err(e) => panic!("no close frame: {e}"),
        }
    };
    assert_eq!((refused, code), (100, Some(1013)));
    assert_eq!(server.metric("walletrelay_limit_closes_total"), 1.0);
    assert_eq!(limited(&server, "publish"), 100.0);
}

#[test]
fn exempt_addresses_skip_every_limit() {
    let server = Server::start_limited(&[
        "--threads",
        "1",
        "--max-connections-per-ip",
        "1",
        "--publish-rate",
        "0.001",
        "--publish-burst",
        "1",
        "--limit-exempt",
        "127.0.0.13/32,10.0.0.0/8",
    ]);
    let t = topic();
    let mut held: Vec<Ws> = (0..4)
        .map(|_| ws_from(&server, "127.0.0.13").expect("exempt"))
        .collect();
    for i in 0..5 {
        assert_eq!(publish(&mut held[0], &t, &format!("{i}"))["result"], true);
    }
    let _one = ws_from(&server, "127.0.0.14").unwrap();
    assert!(ws_from(&server, "127.0.0.14").is_err(), "not exempt");
}

#[test]
fn forwarded_for_counts_only_behind_trusted_proxies() {
    let server = Server::start_limited(&[
        "--threads",
        "1",
        "--max-connections-per-ip",
        "1",
        "--trusted-proxies",
        "127.0.0.15",
    ]);
    let via = |client: &str| vec![("X-Forwarded-For", client.to_string())];
    let call = |src: &str, h: Vec<(&str, String)>| {
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        ws_with(&server, src, &h)
    };
    // Through the proxy: each forwarded client has its own cap, the proxy none.
    let _a = call("127.0.0.15", via("203.0.113.7")).expect("first of its client");
    let e = call("127.0.0.15", via("198.51.100.1, 203.0.113.7")).err();
    assert_eq!(e.as_deref(), Some("status 429"));
    let _b = call("127.0.0.15", via("203.0.113.8")).expect("another client");
    let _c = call("127.0.0.15", vec![]).expect("no header: the proxy itself, unlimited");
    let _d = call("127.0.0.15", vec![]).expect("again");
    // From anyone else the header means nothing: counted under the peer.
    let _e = call("127.0.0.16", via("203.0.113.9")).expect("first from the peer");
    assert!(call("127.0.0.16", via("203.0.113.10")).is_err());
    assert!(limited(&server, "connections") >= 2.0);
}

#[test]
fn the_defaults_let_a_normal_client_through() {
    let server = Server::start_limited(&["--threads", "2"]);
    let t = topic();
    let mut sub = ws_from(&server, "127.0.0.17").unwrap();
    sub.subscribe(&t);
    let mut p = ws_from(&server, "127.0.0.18").unwrap();
    for i in 0..200 {
        assert_eq!(publish(&mut p, &t, &format!("{i}"))["result"], true);
    }
    for i in 0..200 {
        assert_eq!(sub.next_push().2, format!("{i}"));
    }
    let text = server.metrics_text().unwrap();
    for kind in [
        "publish",
        "bytes",
        "subscribe",
        "connections",
        "accept_rate",
    ] {
        let s = format!("walletrelay_limited_total{{kind=\"{kind}\"}} 0");
        assert!(text.contains(&s), "{s}");
    }
}
