//! The TLS listener serves exactly what the plain one serves (DECISIONS §9): the registry
//! (byte for byte, ETags and gzip included), `/hello`, `/health`, `/metrics`,
//! `POST /subscribe`, pipelined keep-alive requests, and the relay over `wss://`
//! (subscribe, publish, pushes, between TLS and plain clients, on one worker and across
//! four), with TLS 1.3 and 1.2, ALPN `http/1.1` and session resumption. `--listen none`
//! leaves only the TLS listener; at least one listener is required.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::http::HttpConn;
use common::skip::skip;
use common::tls::{Stream, TlsSetup};
use common::{checks, topic, Resp, Server};
use rustls::{HandshakeKind, ProtocolVersion};
use serde_json::json;

/// One request on a fresh connection over `stream`; the answer (a HEAD answer for HEAD).
fn ask<S: Stream>(stream: S, raw: &str) -> Resp {
    let mut c = HttpConn::new(stream);
    c.send(raw.as_bytes());
    c.response(raw.starts_with("HEAD "))
}

fn get_req(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n")
}

#[test]
fn the_tls_listener_answers_http_byte_for_byte_like_the_plain_one() {
    let tls = TlsSetup::new();
    let s = tls.start(&["--threads", "2"]);
    let client = tls.client();
    for (path, extra) in [
        ("/hello", ""),
        ("/health", ""),
        ("/api/v1/wallets?entries=5&page=2", ""),
        ("/api/v1/all", ""),
        ("/api/v1/all", "Accept-Encoding: gzip\r\n"),
        ("/api/v1/all?search=wallet", ""),
        ("/api/v1/dapps?entries=abc", ""),
        ("/nope", ""),
    ] {
        let raw = get_req(path, extra);
        let plain = ask(s.tcp(), &raw);
        let over_tls = ask(s.tls(&client), &raw);
        assert_eq!(over_tls.status, plain.status, "{path} {extra}");
        assert_eq!(over_tls.body, plain.body, "{path} {extra}");
        assert_eq!(
            over_tls.header("ETag"),
            plain.header("ETag"),
            "{path} {extra}"
        );
    }
    // A conditional request over TLS gets its 304.
    let all = ask(s.tls(&client), &get_req("/api/v1/all", ""));
    let tag = all.header("ETag").expect("ETag").to_string();
    let nm = ask(
        s.tls(&client),
        &get_req("/api/v1/all", &format!("If-None-Match: {tag}\r\n")),
    );
    assert_eq!(nm.status, 304);

    // POST /subscribe over TLS registers the webhook like over TCP.
    let body = json!({"topic": topic(), "webhook": "https://hooks.example.com/tls"}).to_string();
    let r = ask(
        s.tls(&client),
        &format!(
            "POST /subscribe HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!((r.status, r.body_str()), (200, "{\"success\":true}"));

    // /metrics over TLS, counting the handshakes made so far.
    let m = ask(s.tls(&client), &get_req("/metrics", ""));
    assert_eq!(m.status, 200);
    let handshakes = common::metrics::sum(m.body_str(), "walletrelay_tls_handshakes_total");
    assert!(handshakes >= 12.0, "{handshakes} handshakes counted");
    assert_eq!(
        common::metrics::sum(m.body_str(), "walletrelay_tls_failures_total"),
        0.0
    );
}

#[test]
fn keep_alive_and_pipelined_requests_over_tls_are_answered_in_order() {
    let tls = TlsSetup::new();
    let s = tls.start(&["--threads", "1"]);
    let paths = [
        "/api/v1/all?search=rainbow",
        "/hello",
        "/api/v1/all",
        "/api/v1/dapps?entries=3&page=2",
    ];
    let want: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| ask(s.tcp(), &get_req(p, "")).body)
        .collect();
    let mut c = HttpConn::new(s.tls(&tls.client()));
    // One at a time on one connection, then all four in one write.
    for (p, w) in paths.iter().zip(&want) {
        c.send(get_req(p, "").as_bytes());
        assert_eq!(&c.response(false).body, w, "{p}");
    }
    let all: String = paths.iter().map(|p| get_req(p, "")).collect();
    c.send(all.as_bytes());
    for (p, w) in paths.iter().zip(&want) {
        assert_eq!(&c.response(false).body, w, "{p} pipelined");
    }
}

#[test]
fn rustls_clients_get_tls13_and_tls12_with_alpn_and_resume() {
    let tls = TlsSetup::new();
    let s = tls.start(&["--threads", "2"]);
    for (versions, want) in [
        (&[&rustls::version::TLS13][..], ProtocolVersion::TLSv1_3),
        (&[&rustls::version::TLS12][..], ProtocolVersion::TLSv1_2),
    ] {
        let config = tls.ca.client_config(versions);
        let c = s.tls(&config);
        assert_eq!(c.conn.protocol_version(), Some(want));
        assert_eq!(c.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
        assert_eq!(c.conn.handshake_kind(), Some(HandshakeKind::Full));
        assert_eq!(c.conn.peer_certificates().unwrap()[0], tls.leaf.der);
        let r = ask(c, &get_req("/hello", ""));
        assert_eq!(r.body_str(), checks::HELLO);
        // A later connection resumes (whichever worker takes it: tickets and the session
        // cache are shared by all of them).
        for _ in 0..4 {
            let again = s.tls(&config);
            assert_eq!(
                again.conn.handshake_kind(),
                Some(HandshakeKind::Resumed),
                "{want:?}"
            );
            assert_eq!(ask(again, &get_req("/hello", "")).status, 200);
        }
    }
}

/// Subscribe, publish and pushes over `wss://`, mixed with plain `ws://` clients, on one
/// worker and across four; a 200 KB message crosses TLS in many records.
#[test]
fn the_relay_works_over_wss_as_over_ws() {
    let tls = TlsSetup::new();
    for threads in common::THREADS {
        let s = tls.start(&["--threads", threads]);
        let client = tls.client();
        let (mut a, mut b) = (s.wss(&client), s.wss(&client));
        checks::relay_round_trip(&mut a, &mut b, 1);
        let mut plain = s.ws();
        checks::relay_round_trip(&mut a, &mut plain, 2);
        checks::relay_round_trip(&mut plain, &mut b, 3);

        // A big message and its push, TLS to TLS.
        let tp = topic();
        a.subscribe(&tp);
        let big = "x".repeat(200_000);
        b.publish(&tp, &big);
        let (_, t, m) = a.next_push();
        assert_eq!((t.as_str(), m.len()), (tp.as_str(), big.len()));
        assert!(m == big);

        // The raw client: the exact frames, over TLS.
        let mut raw = s.raw_wss(&client);
        let tp = topic();
        let sub = raw.subscribe(&tp);
        b.publish(&tp, "raw over tls");
        let push = raw.recv_json();
        assert_eq!(push["method"], "waku_subscription", "{push}");
        assert_eq!(push["params"]["id"], sub.as_str());
        assert_eq!(push["params"]["data"]["message"], "raw over tls");
        raw.ping_pong().expect("ping over TLS");
        raw.send_close(Some(1000), "");
        assert_eq!(raw.close_code_then_eof(), 1000);
    }
}

/// A client whose `Finished` and first request leave in one TCP write (the server reads
/// them in one read): the request is answered, and the session ticket, which the server
/// holds until its first answer, comes with it, so the next connection resumes.
#[test]
fn finished_and_the_first_request_in_one_write_are_answered_with_the_ticket() {
    let tls = TlsSetup::new();
    let s = tls.start(&["--threads", "1"]);
    let config = tls.ca.client_config(&[&rustls::version::TLS13]);
    let name = "localhost".try_into().unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::clone(&config), name).unwrap();
    // Written before the handshake ends: `rustls` sends it right behind its `Finished`.
    conn.writer()
        .write_all(get_req("/hello", "").as_bytes())
        .unwrap();
    let mut sock = s.tls_tcp();
    let mut flights = 0;
    while conn.wants_write() {
        // Each flight in one write: the ClientHello, then `Finished` and the request.
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        sock.write_all(&out).unwrap();
        flights += 1;
        while conn.is_handshaking() && !conn.wants_write() {
            conn.read_tls(&mut sock).unwrap();
            conn.process_new_packets().unwrap();
        }
    }
    assert_eq!(flights, 2);
    let mut http = HttpConn::new(rustls::StreamOwned::new(conn, sock));
    assert_eq!(http.response(false).body_str(), checks::HELLO);
    let again = s.tls(&config);
    assert_eq!(again.conn.handshake_kind(), Some(HandshakeKind::Resumed));
    assert_eq!(ask(again, &get_req("/hello", "")).body_str(), checks::HELLO);
}

#[test]
fn curl_with_the_test_ca_gets_the_registry_and_hello_over_tls13_and_tls12() {
    if Command::new("curl").arg("--version").output().is_err() {
        let test = "curl_with_the_test_ca_gets_the_registry_and_hello_over_tls13_and_tls12";
        skip(test, "curl is not installed");
        return;
    }
    let tls = TlsSetup::new();
    let s = tls.start(&["--threads", "2"]);
    let port = s.tls_addr().port();
    let want_all = ask(s.tcp(), &get_req("/api/v1/all", "")).body;
    for (flags, want) in [
        (&["--tlsv1.3"][..], "TLSv1.3"),
        (&["--tlsv1.2", "--tls-max", "1.2"][..], "TLSv1.2"),
    ] {
        for (path, body) in [
            ("/hello", checks::HELLO.as_bytes().to_vec()),
            ("/api/v1/all", want_all.clone()),
        ] {
            let out = Command::new("curl")
                .args(["-sS", "-v", "--compressed", "--max-time", "10", "--cacert"])
                .arg(&tls.ca_file)
                .args(flags)
                .arg(format!("https://localhost:{port}{path}"))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{err}");
            assert!(out.stdout == body, "{path} body differs");
            assert!(err.contains(want), "{err}");
            assert!(
                err.contains("ALPN: server accepted http/1.1")
                    || err.contains("ALPN, server accepted to use http/1.1"),
                "{err}"
            );
        }
    }
}

/// Python's `ssl` (OpenSSL): TLS 1.3 and 1.2, ALPN, the certificate checked against the
/// CA, session reuse, registry answers (`tests/tls-py/ssl_get.py`).
#[test]
fn python_ssl_clients_negotiate_resume_and_get_answers() {
    if Command::new("python3").arg("--version").output().is_err() {
        let test = "python_ssl_clients_negotiate_resume_and_get_answers";
        skip(test, "python3 is not installed");
        return;
    }
    let tls = TlsSetup::new();
    let s = tls.start(&["--threads", "1"]);
    let all_len = ask(s.tcp(), &get_req("/api/v1/all", "")).body.len();
    for (tls12, want) in [("0", "TLSv1.3"), ("1", "TLSv1.2")] {
        let out = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/tls-py/ssl_get.py"
            ))
            .arg(s.tls_addr().port().to_string())
            .arg(&tls.ca_file)
            .args([tls12, "/hello", "/api/v1/all"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                format!("{want} http/1.1 False 200 {}", checks::HELLO.len()),
                format!("{want} http/1.1 True 200 {all_len}")
            ]
        );
    }
}

#[test]
fn listen_none_serves_tls_only_and_no_listener_at_all_is_refused() {
    let tls = TlsSetup::new();
    let s = tls.start(&["--listen", "none", "--threads", "2"]);
    assert!(s.tls_addr.is_some());
    let r = ask(s.tls(&tls.client()), &get_req("/hello", ""));
    assert_eq!(r.body_str(), checks::HELLO);
    let mut a = s.wss(&tls.client());
    let mut b = s.wss(&tls.client());
    checks::relay_round_trip(&mut a, &mut b, 0);

    // No listener at all: a clear error and a failed start.
    let out = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .args(["--listen", "none"])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen none needs --tls-listen"), "{err}");
    // A TLS listener without its files is refused by the flag parser.
    let out = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .args(["--listen", "none", "--tls-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tls-cert"), "{err}");
}

#[test]
fn a_missing_or_bad_certificate_stops_the_start_naming_the_file() {
    let tls = TlsSetup::new();
    let missing = tls.dir.join("missing.pem");
    std::fs::write(tls.dir.join("garbage.pem"), "not a certificate").unwrap();
    let garbage = tls.dir.join("garbage.pem");
    for (cert, key, named) in [
        (&tls.cert, &missing, &missing),
        (&garbage, &tls.key, &garbage),
        // A key file holding no key.
        (&tls.cert, &tls.ca_file, &tls.ca_file),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
            .args(["--listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0"])
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&named.display().to_string()), "{err}");
    }
}

#[test]
fn server_is_plain_only_without_tls_flags() {
    let s = Server::start(&["--threads", "1"]);
    assert!(s.tls_addr.is_none());
    s.assert_serving("start without TLS");
}

/// The Python of a virtualenv with `tests/tls-py/requirements.txt` installed
/// (`$WALLETRELAY_PY_VENV`, default `~/.cache/walletrelay/tls-py3`), made on first use as
/// `scripts/autobahn` makes its own; `Err(why)` when that is not possible here.
fn websockets_python() -> Result<std::path::PathBuf, String> {
    let req =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls-py/requirements.txt");
    let venv = match std::env::var_os("WALLETRELAY_PY_VENV") {
        Some(v) => std::path::PathBuf::from(v),
        None => std::path::PathBuf::from(std::env::var_os("HOME").ok_or("no HOME")?)
            .join(".cache/walletrelay/tls-py3"),
    };
    common::pyvenv::python(&req, &venv)
}

/// Python's `websockets` client over `wss://` (`tests/tls-py/wss_pubsub.py`): subscribe,
/// publish, push. Skipped, saying why, when the package cannot be installed.
///
/// That client reads its socket from a thread while writing from another, which OpenSSL
/// does not support: a TLS 1.3 session ticket arriving while it writes its upgrade
/// request lost the request about one time in a hundred (a hang, "timed out during
/// handshake"). The server holds its tickets until its first answer (`tls::session`), and
/// the client is waiting for that answer, not writing, when they arrive.
#[test]
fn python_websockets_client_uses_the_relay_over_wss() {
    let python = match websockets_python() {
        Ok(p) => p,
        Err(why) => {
            let test = "python_websockets_client_uses_the_relay_over_wss";
            skip(test, &format!("python websockets is not available ({why})"));
            return;
        }
    };
    let tls = TlsSetup::new();
    for threads in common::THREADS {
        let s = tls.start(&["--threads", threads]);
        let out = Command::new(&python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/tls-py/wss_pubsub.py"
            ))
            .arg(s.tls_addr().port().to_string())
            .arg(&tls.ca_file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.starts_with("ok "),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
