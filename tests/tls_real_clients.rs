//! TLS with real clients over loopback: a small `mio` loop drives `walletrelay::tls`
//! exactly as a worker will (read into a scratch buffer, `TlsSession::read_tls`, answer
//! into an `OutBuf`, flush with `OutBuf::write_to` through a `TlsSink`), and `rustls`
//! clients talk to it. The certificates come from a CA the test
//! makes. It does not start the real server: the real binary is tested with the same
//! clients (and curl and Python's `ssl`) in `tls_serving.rs`.

mod common;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use rustls::{ClientConfig, HandshakeKind, ProtocolVersion, ServerConfig};
use slab::Slab;
use walletrelay::outbuf::{FileRange, Flush, OutBuf};
use walletrelay::tls::{TlsFiles, TlsLoader, TlsScratch, TlsSession, TlsSink};

use common::tls_pki::{Leaf, TestCa};
use common::wait::wait_until;
use common::TempDir;

const LISTENER: Token = Token(usize::MAX);
/// Shared part of the `/big` body.
const BIG_SHARED: usize = 1 << 20;
/// File part of the `/big` body.
const BIG_FILE: usize = 2 << 20;

/// The `/big` body: a shared 1 MiB buffer, then 2 MiB of a file, then `end`.
fn big_body() -> (Bytes, FileRange, Vec<u8>) {
    let shared = Bytes::from((0..BIG_SHARED).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    let content: Vec<u8> = (0..BIG_FILE).map(|i| (i % 241) as u8).collect();
    let dir = TempDir::new("tls-big");
    let path = dir.join("big");
    std::fs::write(&path, &content).unwrap();
    let file = Arc::new(std::fs::File::open(&path).unwrap());
    let _ = std::fs::remove_file(&path);
    let mut all = shared.to_vec();
    all.extend_from_slice(&content);
    all.extend_from_slice(b"end");
    (
        shared,
        FileRange {
            file,
            offset: 0,
            len: BIG_FILE,
        },
        all,
    )
}

/// What the test server counts.
#[derive(Default)]
struct Stats {
    /// Connections open now.
    open: AtomicUsize,
    /// Flushes that ended with the socket full (ciphertext left pending, or plaintext
    /// left in the `OutBuf`).
    blocked: AtomicUsize,
}

struct Conn {
    sock: mio::net::TcpStream,
    tls: TlsSession,
    out: OutBuf,
    req: Vec<u8>,
}

/// The test server: a thread with a `mio` loop on `127.0.0.1:0`. New connections take
/// the config current at accept (`set_config` stands in for the SIGHUP mailbox message).
struct TlsServer {
    addr: SocketAddr,
    config: Arc<Mutex<Arc<ServerConfig>>>,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    thread: Option<JoinHandle<()>>,
}

impl TlsServer {
    fn start(config: Arc<ServerConfig>) -> TlsServer {
        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let config = Arc::new(Mutex::new(config));
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let (c, s, o) = (Arc::clone(&config), Arc::clone(&stop), Arc::clone(&stats));
        let thread = std::thread::spawn(move || serve(listener, c, s, o));
        TlsServer {
            addr,
            config,
            stop,
            stats,
            thread: Some(thread),
        }
    }

    fn set_config(&self, config: Arc<ServerConfig>) {
        *self.config.lock().unwrap() = config;
    }

    /// Waits (bounded) until the server holds `n` connections.
    fn wait_open(&self, n: usize) -> bool {
        let open = || self.stats.open.load(Ordering::SeqCst) == n;
        wait_until(Duration::from_secs(5), open)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    mut listener: TcpListener,
    config: Arc<Mutex<Arc<ServerConfig>>>,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
) {
    let mut poll = Poll::new().unwrap();
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .unwrap();
    let mut conns: Slab<Conn> = Slab::new();
    let mut events = Events::with_capacity(256);
    let mut scratch = vec![0u8; 64 << 10];
    let mut plain = Vec::new();
    let mut wbufs = TlsScratch::default();
    let big = big_body();
    while !stop.load(Ordering::SeqCst) {
        poll.poll(&mut events, Some(Duration::from_millis(20)))
            .unwrap();
        for ev in events.iter() {
            if ev.token() == LISTENER {
                while let Ok((mut sock, _)) = listener.accept() {
                    // A small send buffer, so big answers meet partial writes and WouldBlock.
                    socket2::SockRef::from(&sock)
                        .set_send_buffer_size(16 << 10)
                        .unwrap();
                    let entry = conns.vacant_entry();
                    poll.registry()
                        .register(
                            &mut sock,
                            Token(entry.key()),
                            Interest::READABLE | Interest::WRITABLE,
                        )
                        .unwrap();
                    let tls = TlsSession::new(config.lock().unwrap().clone()).unwrap();
                    entry.insert(Conn {
                        sock,
                        tls,
                        out: OutBuf::default(),
                        req: Vec::new(),
                    });
                    stats.open.fetch_add(1, Ordering::SeqCst);
                }
                continue;
            }
            let key = ev.token().0;
            let Some(c) = conns.get_mut(key) else {
                continue;
            };
            let alive = on_event(c, &mut scratch, &mut plain, &mut wbufs, &big);
            if c.tls.wants_write() || !c.out.is_empty() {
                stats.blocked.fetch_add(1, Ordering::SeqCst);
            }
            if !alive {
                conns.remove(key);
                stats.open.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Read path, then write path, as a worker does; `false` closes the connection.
fn on_event(
    c: &mut Conn,
    scratch: &mut [u8],
    plain: &mut Vec<u8>,
    wbufs: &mut TlsScratch,
    big: &(Bytes, FileRange, Vec<u8>),
) -> bool {
    loop {
        match c.sock.read(scratch) {
            Ok(0) => return false,
            Ok(n) => {
                plain.clear();
                if c.tls.read_tls(&mut scratch[..n], plain).is_err() {
                    // Send the alert once, best effort, and close.
                    let _ = c.tls.send_pending(&mut c.sock);
                    return false;
                }
                c.req.extend_from_slice(plain);
                answer(c, big);
                if c.tls.peer_closed() {
                    c.tls.queue_close_notify();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    let mut sink = TlsSink::new(&mut c.tls, &mut c.sock, wbufs);
    match c.out.write_to(&mut sink) {
        Ok(Flush::Done) => sink.finish().is_ok(),
        Ok(Flush::Blocked) => true,
        Err(_) => false,
    }
}

/// Answers every complete request head in `c.req`: `/hello`, `/big`, or 404.
fn answer(c: &mut Conn, big: &(Bytes, FileRange, Vec<u8>)) {
    while let Some(end) = c.req.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&c.req[..end]).to_string();
        c.req.drain(..end + 4);
        let path = head.split(' ').nth(1).unwrap_or("");
        match path {
            "/hello" => c
                .out
                .extend(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello\n"),
            "/big" => {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", big.2.len());
                c.out.extend(head.as_bytes());
                c.out.push(big.0.clone());
                c.out.push_file(big.1.clone());
                c.out.extend(b"end");
            }
            _ => c
                .out
                .extend(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
        }
    }
}

fn server_for(ca: &TestCa, serial: u64) -> (TlsLoader, TlsServer, TempDir) {
    let dir = TempDir::new("tls-test");
    let (cert, key) = ca.leaf(serial).write_to(&dir.0);
    let loader = TlsLoader::new(TlsFiles { cert, key }).unwrap();
    let server = TlsServer::start(loader.load().unwrap());
    (loader, server, dir)
}

/// A blocking `rustls` client connection to the server.
fn connect(
    server: &TlsServer,
    config: &Arc<ClientConfig>,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let sock = TcpStream::connect(server.addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let conn =
        rustls::ClientConnection::new(Arc::clone(config), "localhost".try_into().unwrap()).unwrap();
    let mut s = rustls::StreamOwned::new(conn, sock);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    s
}

/// Sends `GET path` and reads one answer (head and `Content-Length` body).
fn get<S: Read + Write>(s: &mut S, path: &str) -> (String, Vec<u8>) {
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    s.flush().unwrap();
    let mut buf = Vec::new();
    let mut tmp = vec![0u8; 64 << 10];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            while buf.len() < end + 4 + len {
                let n = s.read(&mut tmp).unwrap();
                assert!(n > 0, "EOF in the body");
                buf.extend_from_slice(&tmp[..n]);
            }
            return (head, buf[end + 4..end + 4 + len].to_vec());
        }
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0, "EOF before the head");
        buf.extend_from_slice(&tmp[..n]);
    }
}

#[test]
fn rustls_clients_with_tls13_and_tls12_get_http11_answers_and_resume() {
    let ca = TestCa::new();
    let (_loader, server, _dir) = server_for(&ca, 1);
    for (versions, want) in [
        (&[&rustls::version::TLS13][..], ProtocolVersion::TLSv1_3),
        (&[&rustls::version::TLS12][..], ProtocolVersion::TLSv1_2),
    ] {
        let config = ca.client_config(versions);
        let mut s = connect(&server, &config);
        assert_eq!(s.conn.protocol_version(), Some(want));
        assert_eq!(s.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
        assert_eq!(s.conn.handshake_kind(), Some(HandshakeKind::Full));
        let (head, body) = get(&mut s, "/hello");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, b"hello\n");
        // A second request on the same connection, then a new connection that resumes.
        assert_eq!(get(&mut s, "/hello").1, b"hello\n");
        let mut again = connect(&server, &config);
        assert_eq!(
            again.conn.handshake_kind(),
            Some(HandshakeKind::Resumed),
            "{want:?}"
        );
        assert_eq!(get(&mut again, "/hello").1, b"hello\n");
    }
}

#[test]
fn a_big_answer_arrives_whole_through_a_small_socket_buffer() {
    let ca = TestCa::new();
    let (_loader, server, _dir) = server_for(&ca, 1);
    let mut s = connect(&server, &ca.client_config(&[&rustls::version::TLS13]));
    let want = big_body().2;
    let blocked = server.stats.blocked.load(Ordering::SeqCst);
    for _ in 0..2 {
        let (head, body) = get(&mut s, "/big");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body.len(), want.len());
        assert!(body == want, "body differs");
    }
    // The path under test was taken: the socket was full with bytes still to send.
    assert!(server.stats.blocked.load(Ordering::SeqCst) > blocked);
}

#[test]
fn after_a_reload_new_connections_see_the_new_certificate_and_old_ones_keep_working() {
    let ca = TestCa::new();
    let (loader, server, dir) = server_for(&ca, 1);
    let config = ca.client_config(&[&rustls::version::TLS13]);
    let mut old = connect(&server, &config);
    let old_cert = old.conn.peer_certificates().unwrap()[0].clone();

    let new_leaf: Leaf = ca.leaf(2);
    new_leaf.write_to(&dir.0);
    server.set_config(loader.load().unwrap());
    // A client without saved sessions makes a full handshake and is shown the new leaf.
    let mut fresh = connect(&server, &ca.client_config(&[&rustls::version::TLS13]));
    assert_eq!(fresh.conn.peer_certificates().unwrap()[0], new_leaf.der);
    assert_ne!(old_cert, new_leaf.der);
    assert_eq!(get(&mut fresh, "/hello").1, b"hello\n");
    assert_eq!(get(&mut old, "/big").1.len(), big_body().2.len());
    // Tickets from before the reload still resume.
    let resumed = connect(&server, &config);
    assert_eq!(resumed.conn.handshake_kind(), Some(HandshakeKind::Resumed));
}

#[test]
fn plaintext_http_and_a_truncated_handshake_cost_one_connection_each() {
    let ca = TestCa::new();
    let (_loader, server, _dir) = server_for(&ca, 1);
    let config = ca.client_config(&[&rustls::version::TLS13]);
    let mut good = connect(&server, &config);

    // Plaintext HTTP: at most a TLS alert (content type 21), then the server closes.
    let mut plain = TcpStream::connect(server.addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain
        .write_all(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    plain.read_to_end(&mut got).unwrap();
    assert!(got.is_empty() || got[0] == 21, "{got:?}");
    assert!(!String::from_utf8_lossy(&got).contains("hello"));

    // Half a ClientHello, then the client gives up: the server closes that one only.
    let mut c = rustls::ClientConnection::new(Arc::clone(&config), "localhost".try_into().unwrap())
        .unwrap();
    let mut hello = Vec::new();
    c.write_tls(&mut hello).unwrap();
    let mut cut = TcpStream::connect(server.addr).unwrap();
    cut.write_all(&hello[..hello.len() / 2]).unwrap();
    assert!(
        server.wait_open(2),
        "the server did not take the truncated connection"
    );
    cut.shutdown(Shutdown::Write).unwrap();
    assert!(
        server.wait_open(1),
        "the truncated connection was not closed"
    );

    assert_eq!(get(&mut good, "/hello").1, b"hello\n");
    assert_eq!(get(&mut connect(&server, &config), "/hello").1, b"hello\n");
}
