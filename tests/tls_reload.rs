//! SIGHUP re-reads the TLS certificate and key without dropping a connection
//! (DECISIONS §9): connections made before keep working (HTTP keep-alive and `wss://`
//! subscriptions), new connections see the new certificate, sessions from before still
//! resume; a reload that fails (a broken file) keeps the old certificate and logs why.

mod common;

use std::time::Duration;

use common::http::HttpConn;
use common::tls::TlsSetup;
use common::{checks, topic};
use rustls::HandshakeKind;

const RELOAD_WAIT: Duration = Duration::from_secs(10);

#[test]
fn after_sighup_new_connections_see_the_new_certificate_and_old_ones_keep_working() {
    let mut tls = TlsSetup::new();
    let s = tls.start_logged(&["--threads", "2"]);
    let client = tls.client();
    let old_leaf = tls.leaf.der.clone();

    // Before: an HTTP keep-alive connection and a wss:// subscriber.
    let mut http = HttpConn::new(s.tls(&client));
    http.send(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(http.response(false).body_str(), checks::HELLO);
    assert_eq!(http.s.conn.peer_certificates().unwrap()[0], old_leaf);
    let mut sub = s.wss(&client);
    let tp = topic();
    sub.subscribe(&tp);

    tls.rotate(2);
    let mark = s.log().len();
    s.signal(libc::SIGHUP);
    s.wait_log(mark, "reload: TLS certificate", RELOAD_WAIT)
        .expect("the reload was not logged");

    // New connections (full handshakes) get the new certificate, on every worker: the
    // workers apply the reload on their next round, so wait for it, boundedly.
    let fresh = || s.tls(&tls.ca.client_config(&[&rustls::version::TLS13]));
    let mut in_a_row = 0;
    for _ in 0..500 {
        if fresh().conn.peer_certificates().unwrap()[0] == tls.leaf.der {
            in_a_row += 1;
            if in_a_row == 8 {
                break;
            }
        } else {
            in_a_row = 0;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert_eq!(
        in_a_row, 8,
        "new connections did not all see the new certificate"
    );
    assert_ne!(old_leaf, tls.leaf.der);

    // The old connections still work, on their old session.
    http.send(b"GET /api/v1/wallets?entries=1&page=1 HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(http.response(false).status, 200);
    let mut publ = s.wss(&client);
    publ.publish(&tp, "after the reload");
    let (_, t, m) = sub.next_push();
    assert_eq!((t, m.as_str()), (tp, "after the reload"));
    // A session from before the reload still resumes (ticket keys are kept).
    let resumed = s.tls(&client);
    assert_eq!(resumed.conn.handshake_kind(), Some(HandshakeKind::Resumed));
}

#[test]
fn a_broken_certificate_on_sighup_keeps_the_old_one_and_logs_why() {
    let tls = TlsSetup::new();
    let s = tls.start_logged(&["--threads", "1"]);
    let config = || tls.ca.client_config(&[&rustls::version::TLS13]);
    let mut old = HttpConn::new(s.tls(&config()));
    old.send(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(old.response(false).status, 200);

    for (what, cert, key) in [
        (
            "garbage",
            "not PEM at all".to_string(),
            tls.leaf.key_pem.clone(),
        ),
        ("no key", tls.leaf.chain_pem.clone(), String::new()),
        (
            "another key",
            tls.leaf.chain_pem.clone(),
            tls.ca.leaf(3).key_pem,
        ),
    ] {
        std::fs::write(&tls.cert, cert).unwrap();
        std::fs::write(&tls.key, key).unwrap();
        let mark = s.log().len();
        s.signal(libc::SIGHUP);
        let line = s
            .wait_log(mark, "TLS not reloaded", RELOAD_WAIT)
            .unwrap_or_else(|| panic!("{what}: the failed reload was not logged"));
        assert!(line.contains("old certificate stays"), "{what}: {line}");
        // New connections get the old certificate; the old one still works.
        let c = s.tls(&config());
        assert_eq!(
            c.conn.peer_certificates().unwrap()[0],
            tls.leaf.der,
            "{what}"
        );
        old.send(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n");
        assert_eq!(old.response(false).body_str(), checks::HELLO, "{what}");
    }
    // The log names the file at fault.
    let log = s.log();
    assert!(log.contains(&tls.key.display().to_string()), "{log}");
}
