//! Hostile clients on the TLS listener cost one connection each and are bounded by the
//! limits that bound plain clients (DECISIONS §9): plaintext HTTP and garbage get at most
//! an alert and a close, a handshake that stalls is closed at `--head-timeout` like a
//! stalled head, a TLS client that stalls mid-request gets its 408, stalled handshakes
//! count against `--max-connections`; meanwhile every other connection is served.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

use common::http::HttpConn;
use common::tls::TlsSetup;
use common::{checks, Rng};

/// The first half of a real ClientHello.
fn half_hello(config: &Arc<rustls::ClientConfig>) -> Vec<u8> {
    let mut c =
        rustls::ClientConnection::new(Arc::clone(config), "localhost".try_into().unwrap()).unwrap();
    let mut hello = Vec::new();
    c.write_tls(&mut hello).unwrap();
    hello.truncate(hello.len() / 2);
    hello
}

/// Reads until the server ends the connection (EOF or reset); returns what it sent.
fn until_closed(mut s: TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the server kept the connection open ({e})"),
        }
    }
}

/// At most a TLS alert record (content type 21), nothing of an HTTP answer.
fn assert_alert_or_nothing(got: &[u8], what: &str) {
    assert!(got.is_empty() || got[0] == 21, "{what}: {got:?}");
    assert!(got.len() <= 64, "{what}: {} bytes", got.len());
}

#[test]
fn plaintext_garbage_and_stalled_handshakes_cost_one_connection_each() {
    let tls = TlsSetup::new();
    let s = tls.start(&["--threads", "1", "--head-timeout", "1"]);
    let client = tls.client();
    // A client with a request answered: from then on the keep-alive timeout is its limit.
    let mut good = HttpConn::new(s.tls(&client));
    good.send(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(good.response(false).body_str(), checks::HELLO);

    // Plaintext HTTP on the TLS port.
    let mut plain = s.tls_tcp();
    plain
        .write_all(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert_alert_or_nothing(&until_closed(plain), "plaintext HTTP");

    // Random bytes.
    let mut garbage = s.tls_tcp();
    let mut rng = Rng::new(18);
    let bytes: Vec<u8> = (0..65536).map(|_| rng.next() as u8).collect();
    let _ = garbage.write_all(&bytes);
    assert_alert_or_nothing(&until_closed(garbage), "garbage");

    // Half a ClientHello, then silence: closed at the head timeout.
    let mut stalled = s.tls_tcp();
    stalled.write_all(&half_hello(&client)).unwrap();
    assert_alert_or_nothing(&until_closed(stalled), "stalled handshake");

    // Half a ClientHello, then the client's FIN: closed at once.
    let mut cut = s.tls_tcp();
    cut.write_all(&half_hello(&client)).unwrap();
    cut.shutdown(Shutdown::Write).unwrap();
    assert_alert_or_nothing(&until_closed(cut), "cut handshake");

    // A finished handshake and no request: closed like an idle plain connection.
    // It is told so with close_notify (a clean end of stream for the client).
    let mut idle = s.tls(&client);
    let mut rest = Vec::new();
    idle.read_to_end(&mut rest)
        .expect("close_notify before the TCP close");
    assert!(rest.is_empty(), "{rest:?}");

    // The good connection and new ones are served; the failures were counted.
    good.send(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(good.response(false).body_str(), checks::HELLO);
    s.assert_serving("hostile TLS clients");
    let failures = s.metric("walletrelay_tls_failures_total");
    assert!(failures >= 2.0, "{failures} TLS failures counted");
}

#[test]
fn a_tls_client_stalling_mid_request_gets_408_and_a_clean_close() {
    let tls = TlsSetup::new();
    let s = tls.start(&["--threads", "1", "--head-timeout", "1"]);
    let mut c = HttpConn::new(s.tls(&tls.client()));
    c.send(b"GET /hello HTTP/1.1\r\nHost: loc");
    let r = c.response(false);
    assert_eq!(r.status, 408, "{r:?}");
    // The server closes with close_notify: a clean end of stream, not a truncation.
    let mut rest = Vec::new();
    c.s.read_to_end(&mut rest)
        .expect("close_notify before the TCP close");
    assert!(rest.is_empty(), "{rest:?}");
}

#[test]
fn a_client_close_notify_ends_the_connection_cleanly() {
    let tls = TlsSetup::new();
    let s = tls.start(&["--threads", "1"]);
    let mut c = HttpConn::new(s.tls(&tls.client()));
    c.send(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(c.response(false).status, 200);
    c.s.conn.send_close_notify();
    c.s.flush().unwrap();
    let mut rest = Vec::new();
    c.s.read_to_end(&mut rest).expect("a clean close");
    assert!(rest.is_empty());
}

/// Stalled handshakes hold connection slots like any connection: past
/// `--max-connections` new ones are refused at accept; once the head timeout closed the
/// stalled ones, TLS clients are served again.
#[test]
fn stalled_handshakes_are_bounded_by_max_connections() {
    let tls = TlsSetup::new();
    let s = tls.start(&[
        "--threads",
        "1",
        "--max-connections",
        "8",
        "--head-timeout",
        "3",
    ]);
    let client = tls.client();
    let hello = half_hello(&client);
    let stalled: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut t = s.tls_tcp();
            t.write_all(&hello).unwrap();
            t
        })
        .collect();
    // The ninth is accepted after them (one worker, in order) and refused.
    let mut ninth = s.tls_tcp();
    let _ = ninth.write_all(&hello);
    assert!(until_closed(ninth).is_empty(), "the ninth was served");
    for t in stalled {
        assert_alert_or_nothing(&until_closed(t), "stalled handshake at the limit");
    }
    let mut c = HttpConn::new(s.tls(&client));
    c.send(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(c.response(false).body_str(), checks::HELLO);
    assert!(s.metric("walletrelay_connections_refused_total") >= 1.0);
}
