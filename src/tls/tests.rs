//! Unit tests of the TLS module against an in-process `rustls` client, over memory.

use std::io::{self, IoSlice, Read, Write};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rustls::{ClientConnection, HandshakeKind, ProtocolVersion, ServerConfig};

use super::session::TlsScratch;
use super::*;
use crate::outbuf::{Flush, OutBuf, Sink};

#[path = "../../tests/common/tls_pki.rs"]
mod tls_pki;
use tls_pki::TestCa;

const V13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
const V12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];

fn loader_with(ca: &TestCa, serial: u64) -> (TlsLoader, Arc<ServerConfig>) {
    let leaf = ca.leaf(serial);
    let loader = TlsLoader::new(TlsFiles {
        cert: "cert.pem".into(),
        key: "key.pem".into(),
    })
    .unwrap();
    let config = load(&loader, &leaf);
    (loader, config)
}

fn load(loader: &TlsLoader, leaf: &tls_pki::Leaf) -> Arc<ServerConfig> {
    let (c, k) = (Path::new("cert.pem"), Path::new("key.pem"));
    loader
        .load_pem(leaf.chain_pem.as_bytes(), c, leaf.key_pem.as_bytes(), k)
        .unwrap()
}

fn client(ca: &TestCa, versions: &[&'static rustls::SupportedProtocolVersion]) -> ClientConnection {
    client_with(ca.client_config(versions))
}

fn client_with(config: Arc<rustls::ClientConfig>) -> ClientConnection {
    ClientConnection::new(config, "localhost".try_into().unwrap()).unwrap()
}

/// A TLS 1.3 client and a server session (certificate serial 1), before the handshake.
fn fresh_pair() -> (ClientConnection, TlsSession) {
    let ca = TestCa::new();
    let (_, config) = loader_with(&ca, 1);
    (client(&ca, V13), TlsSession::new(config).unwrap())
}

/// Everything the client has to send.
fn client_out(c: &mut ClientConnection) -> Vec<u8> {
    let mut ct = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut ct).unwrap();
    }
    ct
}

/// Gives the client `data`; returns the plaintext it decrypted (read as it goes, so the
/// client's own plaintext limit never fills).
fn feed_client(c: &mut ClientConnection, mut data: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    while !data.is_empty() {
        c.read_tls(&mut data).unwrap();
        c.process_new_packets().unwrap();
        got.extend_from_slice(&client_plain(c));
    }
    got
}

/// Moves records both ways until neither side has anything to send; returns the
/// plaintext the server received.
fn exchange(c: &mut ClientConnection, s: &mut TlsSession) -> Result<Vec<u8>, TlsError> {
    let mut plain = Vec::new();
    for _ in 0..20 {
        let mut ct = client_out(c);
        let mut moved = !ct.is_empty();
        if moved {
            s.read_tls(&mut ct, &mut plain)?;
        }
        let mut back = Vec::new();
        assert_eq!(s.send_pending(&mut back).unwrap(), Flush::Done);
        if !back.is_empty() {
            moved = true;
            feed_client(c, &back);
        }
        if !moved {
            return Ok(plain);
        }
    }
    panic!("no end to the exchange");
}

/// Whatever plaintext the client has received.
fn client_plain(c: &mut ClientConnection) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.reader().read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return got,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn handshakes_with_tls13_and_tls12_negotiate_http11_and_carry_data_both_ways() {
    let ca = TestCa::new();
    let (_, config) = loader_with(&ca, 1);
    for (versions, want) in [
        (V13, ProtocolVersion::TLSv1_3),
        (V12, ProtocolVersion::TLSv1_2),
    ] {
        let mut c = client(&ca, versions);
        let mut s = TlsSession::new(Arc::clone(&config)).unwrap();
        assert!(!s.handshake_done());
        exchange(&mut c, &mut s).unwrap();
        assert!(s.handshake_done() && !c.is_handshaking());
        assert_eq!(s.protocol_version(), Some(want));
        assert_eq!(s.alpn_protocol(), Some(&b"http/1.1"[..]));
        assert_eq!(c.alpn_protocol(), Some(&b"http/1.1"[..]));
        assert_eq!(s.handshake_kind(), Some(HandshakeKind::Full));

        c.writer()
            .write_all(b"GET /hello HTTP/1.1\r\n\r\n")
            .unwrap();
        assert_eq!(
            exchange(&mut c, &mut s).unwrap(),
            b"GET /hello HTTP/1.1\r\n\r\n"
        );

        let mut out = OutBuf::default();
        out.extend(b"HTTP/1.1 200 OK\r\n\r\n");
        out.push(Bytes::from(vec![b'z'; 10_000]));
        let mut wire = Vec::new();
        let mut scratch = TlsScratch::default();
        let mut sink = TlsSink::new(&mut s, &mut wire, &mut scratch);
        assert_eq!(out.write_to(&mut sink).unwrap(), Flush::Done);
        assert_eq!(sink.finish().unwrap(), Flush::Done);
        let got = feed_client(&mut c, &wire);
        assert_eq!(got.len(), 19 + 10_000);
        assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n\r\nzzz"));
        // Idle again: the session's own buffers are gone.
        assert_eq!(s.buffered_capacity(), 0);
    }
}

/// Writes `plain` through a `TlsSink` as the worker does; returns the bytes put on the
/// wire.
fn answer(s: &mut TlsSession, plain: &[u8]) -> Vec<u8> {
    let mut out = OutBuf::default();
    out.extend(plain);
    let mut wire = Vec::new();
    let mut scratch = TlsScratch::default();
    let mut sink = TlsSink::new(s, &mut wire, &mut scratch);
    assert_eq!(out.write_to(&mut sink).unwrap(), Flush::Done);
    assert_eq!(sink.finish().unwrap(), Flush::Done);
    wire
}

#[test]
fn a_second_connection_resumes_with_tls13_and_tls12() {
    let ca = TestCa::new();
    let (_, config) = loader_with(&ca, 1);
    for versions in [V13, V12] {
        let cc = ca.client_config(versions);
        let mut first = client_with(Arc::clone(&cc));
        let mut s1 = TlsSession::new(Arc::clone(&config)).unwrap();
        exchange(&mut first, &mut s1).unwrap();
        assert_eq!(s1.handshake_kind(), Some(HandshakeKind::Full));
        // A TLS 1.3 ticket comes with the first answer.
        assert_eq!(feed_client(&mut first, &answer(&mut s1, b"hi")), b"hi");
        let mut second = client_with(cc);
        let mut s2 = TlsSession::new(Arc::clone(&config)).unwrap();
        exchange(&mut second, &mut s2).unwrap();
        assert_eq!(
            s2.handshake_kind(),
            Some(HandshakeKind::Resumed),
            "{versions:?}"
        );
        assert_eq!(second.handshake_kind(), Some(HandshakeKind::Resumed));
    }
}

/// TLS 1.3 session tickets are not sent when the client's `Finished` is read (a client
/// writing its first request from one thread while another reads would receive them in
/// the middle of that write: Python's `websockets` then loses the request), but held and
/// sent in the same write as the first answer, ahead of it; the client resumes with them.
#[test]
fn tls13_tickets_wait_for_the_first_answer_and_go_out_ahead_of_it() {
    let ca = TestCa::new();
    let (_, config) = loader_with(&ca, 1);
    let cc = ca.client_config(V13);
    let mut c = client_with(Arc::clone(&cc));
    let mut s = TlsSession::new(Arc::clone(&config)).unwrap();
    let mut plain = Vec::new();
    // ClientHello in, the server's flight out, the client's Finished in.
    s.read_tls(&mut client_out(&mut c), &mut plain).unwrap();
    let mut flight = Vec::new();
    s.send_pending(&mut flight).unwrap();
    feed_client(&mut c, &flight);
    assert!(!c.is_handshaking());
    s.read_tls(&mut client_out(&mut c), &mut plain).unwrap();
    assert!(s.handshake_done());
    // Nothing to send, though the tickets are made (and counted as outbound bytes).
    assert!(!s.wants_write());
    let mut wire = Vec::new();
    assert_eq!(s.send_pending(&mut wire).unwrap(), Flush::Done);
    assert!(wire.is_empty());
    assert!(s.pending_len() > 0);

    // The request comes; still nothing until the answer, then both in one write.
    c.writer().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    s.read_tls(&mut client_out(&mut c), &mut plain).unwrap();
    assert_eq!(plain, b"GET / HTTP/1.1\r\n\r\n");
    assert!(!s.wants_write());
    let wire = answer(&mut s, b"HTTP/1.1 200 OK\r\n\r\n");
    // Records: the ticket(s) first (handshake messages, encrypted: the client decrypts
    // them before the answer), then the answer.
    assert_eq!(feed_client(&mut c, &wire), b"HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!(s.pending_len(), 0);
    assert_eq!(s.buffered_capacity(), 0);
    let mut again = client_with(Arc::clone(&cc));
    let mut s2 = TlsSession::new(Arc::clone(&config)).unwrap();
    exchange(&mut again, &mut s2).unwrap();
    assert_eq!(again.handshake_kind(), Some(HandshakeKind::Resumed));
}

/// The client's `Finished` and its first request in one read: the handshake ends and the
/// request comes out of that same read (nothing is left in the carry for a readiness
/// event that will not come).
#[test]
fn finished_and_the_first_request_in_one_read_are_both_taken() {
    for versions in [V13, V12] {
        let ca = TestCa::new();
        let (_, config) = loader_with(&ca, 1);
        let mut c = client(&ca, versions);
        let mut s = TlsSession::new(config).unwrap();
        // Written before the handshake ends: `rustls` sends it right after `Finished`.
        c.writer()
            .write_all(b"GET /early HTTP/1.1\r\n\r\n")
            .unwrap();
        let mut plain = Vec::new();
        for _ in 0..4 {
            let mut ct = client_out(&mut c);
            if ct.is_empty() {
                break;
            }
            s.read_tls(&mut ct, &mut plain).unwrap();
            let mut back = Vec::new();
            s.send_pending(&mut back).unwrap();
            feed_client(&mut c, &back);
        }
        assert!(s.handshake_done(), "{versions:?}");
        assert_eq!(plain, b"GET /early HTTP/1.1\r\n\r\n", "{versions:?}");
        assert_eq!(feed_client(&mut c, &answer(&mut s, b"ok")), b"ok");
    }
}

#[test]
fn after_a_reload_new_sessions_show_the_new_certificate_and_old_ones_keep_working() {
    let ca = TestCa::new();
    let (loader, old_config) = loader_with(&ca, 1);
    let mut c_old = client(&ca, V13);
    let mut s_old = TlsSession::new(Arc::clone(&old_config)).unwrap();
    exchange(&mut c_old, &mut s_old).unwrap();

    let new_leaf = ca.leaf(2);
    let new_config = load(&loader, &new_leaf);
    let mut c_new = client(&ca, V13);
    let mut s_new = TlsSession::new(new_config).unwrap();
    exchange(&mut c_new, &mut s_new).unwrap();
    assert_eq!(c_new.peer_certificates().unwrap()[0], new_leaf.der);
    assert_ne!(c_old.peer_certificates().unwrap()[0], new_leaf.der);

    c_old.writer().write_all(b"still here").unwrap();
    assert_eq!(exchange(&mut c_old, &mut s_old).unwrap(), b"still here");
}

#[test]
fn plaintext_http_on_the_tls_side_fails_the_session_with_at_most_an_alert() {
    let (_, mut s) = fresh_pair();
    let mut req = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    let mut plain = Vec::new();
    let err = s.read_tls(&mut req, &mut plain).unwrap_err();
    assert!(matches!(err, TlsError::Protocol(_)), "{err}");
    assert!(plain.is_empty());
    let mut wire = Vec::new();
    s.send_pending(&mut wire).unwrap();
    // Nothing, or one alert record (content type 21).
    assert!(wire.is_empty() || wire[0] == 21, "{wire:?}");
    assert!(wire.len() <= 7 + 24);
    // The session stays failed.
    assert!(s.read_tls(&mut b"more".to_vec(), &mut plain).is_err());
}

#[test]
fn an_oversized_record_fails_the_session() {
    let (_, mut s) = fresh_pair();
    // A handshake record header announcing 60,000 bytes (the limit is 16 KiB + 2 KiB).
    let mut rec = vec![22, 3, 3, 0xea, 0x60];
    rec.extend_from_slice(&[0; 100]);
    let err = s.read_tls(&mut rec, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, TlsError::Protocol(_)), "{err}");
}

/// A client requesting key update after key update and never reading the answers fails
/// its session (`rustls` counts the requests; `MAX_PENDING` would stop it otherwise)
/// instead of growing it without bound.
#[test]
fn unread_key_update_answers_are_bounded() {
    let (mut c, mut s) = fresh_pair();
    exchange(&mut c, &mut s).unwrap();
    let mut plain = Vec::new();
    let mut failed = None;
    for _ in 0..20_000 {
        c.refresh_traffic_keys().unwrap();
        let mut ct = client_out(&mut c);
        if let Err(e) = s.read_tls(&mut ct, &mut plain) {
            failed = Some(e);
            break;
        }
    }
    assert!(
        matches!(
            failed,
            Some(TlsError::TooMuchOutput(_) | TlsError::Protocol(_))
        ),
        "{failed:?}"
    );
    assert!(s.pending_len() <= MAX_PENDING + 1024);
}

#[test]
fn a_handshake_arriving_a_byte_at_a_time_completes() {
    let (mut c, mut s) = fresh_pair();
    let mut plain = Vec::new();
    for _ in 0..10 {
        for b in client_out(&mut c) {
            s.read_tls(&mut [b], &mut plain).unwrap();
            assert!(s.buffered_capacity() <= MAX_CARRY + (64 << 10));
        }
        let mut back = Vec::new();
        s.send_pending(&mut back).unwrap();
        if back.is_empty() {
            break;
        }
        feed_client(&mut c, &back);
    }
    assert!(s.handshake_done() && !c.is_handshaking());
}

/// 300 KB of requests fed in reads that cut records anywhere arrive whole and in order,
/// and the session carries at most one record between reads.
#[test]
fn records_cut_across_reads_arrive_whole() {
    let (mut c, mut s) = fresh_pair();
    exchange(&mut c, &mut s).unwrap();
    // The held tickets go out with a first answer: what stays after is carry only.
    feed_client(&mut c, &answer(&mut s, b"go"));
    let want: Vec<u8> = (0..300_000u32).map(|i| (i % 239) as u8).collect();
    c.set_buffer_limit(None);
    c.writer().write_all(&want).unwrap();
    let mut ct = client_out(&mut c);
    let mut plain = Vec::new();
    for piece in ct.chunks_mut(7_777) {
        s.read_tls(piece, &mut plain).unwrap();
        assert!(s.buffered_capacity() <= 2 * (16 << 10) + 7_777 + 1024);
    }
    assert!(plain == want, "plaintext differs");
    assert_eq!(s.buffered_capacity(), 0);
}

#[test]
fn a_truncated_handshake_leaves_the_session_waiting_not_done() {
    let (mut c, mut s) = fresh_pair();
    let mut hello = client_out(&mut c);
    let half = hello.len() / 2;
    assert_eq!(s.read_tls(&mut hello[..half], &mut Vec::new()).unwrap(), 0);
    assert!(!s.handshake_done() && !s.wants_write());
}

#[test]
fn close_notify_goes_both_ways() {
    let (mut c, mut s) = fresh_pair();
    exchange(&mut c, &mut s).unwrap();
    c.send_close_notify();
    exchange(&mut c, &mut s).unwrap();
    assert!(s.peer_closed());
    s.queue_close_notify();
    let mut wire = Vec::new();
    s.send_pending(&mut wire).unwrap();
    assert!(!wire.is_empty());
    c.read_tls(&mut &wire[..]).unwrap();
    assert!(c.process_new_packets().unwrap().peer_has_closed());
}

/// A socket that takes at most `cap` bytes per write and refuses every other call.
struct Trickle {
    got: Vec<u8>,
    cap: usize,
    block_next: bool,
}

impl Write for Trickle {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.block_next = !self.block_next;
        if !self.block_next {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.cap);
        self.got.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Copies, shared bodies and file ranges (read with `pread` and encrypted) go through
/// `OutBuf::write_to` over TLS to a socket that takes a little at a time and often
/// blocks; the client decrypts exactly the bytes queued, in order.
#[test]
fn big_writes_through_outbuf_survive_partial_writes_and_would_block() {
    let (mut c, mut s) = fresh_pair();
    exchange(&mut c, &mut s).unwrap();

    let path = std::env::temp_dir().join(format!("tls-outbuf-{}", std::process::id()));
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&path, &content).unwrap();
    let file = Arc::new(std::fs::File::open(&path).unwrap());
    let _ = std::fs::remove_file(&path);
    let whole = crate::outbuf::FileRange {
        file,
        offset: 0,
        len: content.len(),
    };

    let mut out = OutBuf::default();
    let mut want = Vec::new();
    for i in 0..50u32 {
        let head = format!("head {i};");
        out.extend(head.as_bytes());
        want.extend_from_slice(head.as_bytes());
        let body = Bytes::from(vec![(i % 250) as u8; 700 * i as usize]);
        out.push_shared(&body, 256);
        want.extend_from_slice(&body);
    }
    out.push_file(whole.slice(1000, 250_000));
    want.extend_from_slice(&content[1000..251_000]);
    out.extend(b"end");
    want.extend_from_slice(b"end");

    let mut sock = Trickle {
        got: Vec::new(),
        cap: 3_001,
        block_next: false,
    };
    let mut scratch = TlsScratch::default();
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 100_000);
        let mut sink = TlsSink::new(&mut s, &mut sock, &mut scratch);
        if out.write_to(&mut sink).unwrap() == Flush::Blocked {
            continue;
        }
        if sink.finish().unwrap() == Flush::Done {
            break;
        }
    }
    assert!(s.pending_len() <= PLAIN_MAX + 1024);
    let got = feed_client(&mut c, &sock.got);
    assert_eq!(got.len(), want.len());
    assert!(got == want, "plaintext differs");
    assert_eq!(s.buffered_capacity(), 0);
}

#[test]
fn a_write_before_the_handshake_takes_nothing() {
    let (_, mut s) = fresh_pair();
    let mut wire = Vec::new();
    let mut scratch = TlsScratch::default();
    let mut sink = TlsSink::new(&mut s, &mut wire, &mut scratch);
    let err = sink
        .write_parts(&[IoSlice::new(b"early")], false)
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    assert!(wire.is_empty());
}

#[test]
fn bad_files_give_clear_errors() {
    let ca = TestCa::new();
    let leaf = ca.leaf(1);
    let other = ca.leaf(2);
    let dir = std::env::temp_dir().join(format!("tls-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = leaf.write_to(&dir);
    let files = |cert: &Path, key: &Path| {
        TlsLoader::new(TlsFiles {
            cert: cert.into(),
            key: key.into(),
        })
        .unwrap()
    };

    assert!(files(&cert, &key).load().is_ok());
    let missing = dir.join("missing.pem");
    let e = files(&missing, &key).load().unwrap_err();
    assert!(
        matches!(e, TlsError::Read { .. }) && e.to_string().contains("missing.pem"),
        "{e}"
    );
    // The key file has no certificate, the certificate file no key.
    assert!(matches!(
        files(&key, &key).load().unwrap_err(),
        TlsError::NoCertificate { .. }
    ));
    assert!(matches!(
        files(&cert, &cert).load().unwrap_err(),
        TlsError::NoKey { .. }
    ));
    // A key that is not the leaf's.
    let wrong = dir.join("wrong-key.pem");
    std::fs::write(&wrong, &other.key_pem).unwrap();
    let e = files(&cert, &wrong).load().unwrap_err();
    assert!(matches!(e, TlsError::KeyMismatch(_)), "{e}");
    // Broken PEM.
    let broken = dir.join("broken.pem");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\n%%%%\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let e = files(&broken, &key).load().unwrap_err();
    assert!(matches!(e, TlsError::Pem { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
