//! TLS costs, measured in one thread over memory (no sockets, so only TLS work is timed):
//! the server's CPU per handshake (TLS 1.3 and 1.2; ECDSA P-256 and RSA 2048 leaves;
//! full and resumed), heap per idle session (walletrelay's `TlsSession` against
//! `rustls`'s buffered `ServerConnection`), and the server's cost per small request and
//! answer and per MiB of bulk data.
//!
//! `cargo bench --bench tls` measures (bounded: a few thousand handshakes, about a
//! minute); without `--bench` (as `cargo test` runs it) each case runs a few times, as a
//! smoke test. RSA needs the `openssl` command to make the key, and is skipped without it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::Resumption;
use rustls::{
    ClientConfig, ClientConnection, HandshakeKind, ServerConfig, SupportedProtocolVersion,
};
use walletrelay::outbuf::{Flush, OutBuf};
use walletrelay::tls::{TlsFiles, TlsLoader, TlsScratch, TlsSession, TlsSink};

#[path = "../tests/common/tls_pki.rs"]
mod tls_pki;
use tls_pki::{Leaf, TestCa};

/// Heap bytes live in the process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting live bytes.
struct Counting;

// SAFETY: every call is forwarded unchanged to `System`, which upholds the `GlobalAlloc`
// contract; the counter is only arithmetic on an atomic and allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System.alloc` with this layout (every allocation does).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; `new` is the caller's valid new size.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// CPU time this thread has used (not wall time: the machine is shared, and a thread
/// that waits for a core is not charged).
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec on this stack frame for the whole call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const V13: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
const V12: &[&SupportedProtocolVersion] = &[&rustls::version::TLS12];

fn server_config(leaf: &Leaf) -> Arc<ServerConfig> {
    let loader = TlsLoader::new(TlsFiles {
        cert: "cert.pem".into(),
        key: "key.pem".into(),
    })
    .unwrap();
    let (c, k) = (
        std::path::Path::new("cert.pem"),
        std::path::Path::new("key.pem"),
    );
    loader
        .load_pem(leaf.chain_pem.as_bytes(), c, leaf.key_pem.as_bytes(), k)
        .unwrap()
}

fn no_resumption(config: &Arc<ClientConfig>) -> Arc<ClientConfig> {
    let mut c = (**config).clone();
    c.resumption = Resumption::disabled();
    Arc::new(c)
}

fn client(config: &Arc<ClientConfig>) -> ClientConnection {
    ClientConnection::new(Arc::clone(config), "localhost".try_into().unwrap()).unwrap()
}

/// Gives the client `data`, draining its plaintext as it goes.
fn feed_client(c: &mut ClientConnection, mut data: &[u8]) -> usize {
    let mut got = 0;
    let mut buf = vec![0u8; 64 << 10];
    while !data.is_empty() {
        c.read_tls(&mut data).unwrap();
        c.process_new_packets().unwrap();
        loop {
            match c.reader().read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
    }
    got
}

fn client_out(c: &mut ClientConnection) -> Vec<u8> {
    let mut ct = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut ct).unwrap();
    }
    ct
}

/// Runs the handshake (and whatever the client queued); adds the server's CPU time to
/// `spent`.
fn exchange(c: &mut ClientConnection, s: &mut TlsSession, spent: &mut Duration) {
    let mut plain = Vec::new();
    loop {
        let mut ct = client_out(c);
        let mut back = Vec::new();
        let t0 = cpu_now();
        if !ct.is_empty() {
            s.read_tls(&mut ct, &mut plain).unwrap();
        }
        assert_eq!(s.send_pending(&mut back).unwrap(), Flush::Done);
        *spent += cpu_now() - t0;
        if ct.is_empty() && back.is_empty() {
            return;
        }
        feed_client(c, &back);
    }
}

/// Server handshakes per second of server CPU (one core), and how many resumed. Each
/// connection then gets a one-byte answer, not measured, which carries the TLS 1.3
/// tickets (the session holds them until its first answer).
fn handshakes(config: &Arc<ServerConfig>, cc: &Arc<ClientConfig>, n: usize) -> (f64, usize) {
    let mut spent = Duration::ZERO;
    let mut resumed = 0;
    let mut scratch = TlsScratch::default();
    for _ in 0..n {
        let mut c = client(cc);
        let t0 = cpu_now();
        let mut s = TlsSession::new(Arc::clone(config)).unwrap();
        spent += cpu_now() - t0;
        exchange(&mut c, &mut s, &mut spent);
        assert!(s.handshake_done());
        answer(&mut s, &mut scratch, &mut c, 1);
        if s.handshake_kind() == Some(HandshakeKind::Resumed) {
            resumed += 1;
        }
    }
    (n as f64 / spent.as_secs_f64(), resumed)
}

fn bench_handshakes(ca: &TestCa, n: usize) {
    let mut leaves = vec![("ECDSA-P256", ca.leaf(1))];
    match ca.rsa_leaf(2) {
        Some(l) => leaves.push(("RSA-2048", l)),
        None => println!("RSA 2048: SKIPPED (no openssl command)"),
    }
    for (key, leaf) in &leaves {
        let config = server_config(leaf);
        for (vname, versions) in [("TLS1.3", V13), ("TLS1.2", V12)] {
            let cc = ca.client_config(versions);
            // The first connection fills the client's session store.
            handshakes(&config, &cc, 1);
            let (full, _) = handshakes(&config, &no_resumption(&cc), n);
            let (res, resumed) = handshakes(&config, &cc, n);
            assert_eq!(resumed, n, "every handshake after the first resumes");
            println!(
                "handshakes {vname} {key}: full {full:.0}/s, resumed {res:.0}/s per core of server CPU \
                 ({:.0} / {:.0} us each; n={n})",
                1e6 / full,
                1e6 / res
            );
        }
    }
}

/// Heap per idle `TlsSession`, just after the handshake (TLS 1.3: with the tickets it
/// holds until its first answer) and after one request and answer.
fn idle_session_heap(
    config: &Arc<ServerConfig>,
    cc: &Arc<ClientConfig>,
    k: usize,
    traffic: bool,
) -> f64 {
    let mut servers: Vec<TlsSession> = Vec::with_capacity(k);
    let mut scratch = TlsScratch::default();
    let mut spent = Duration::ZERO;
    // Grow the scratch buffers before counting: they are the worker's, not the sessions'.
    scratch_warm(config, cc, &mut scratch);
    let base = live();
    for _ in 0..k {
        let mut c = client(cc);
        let mut s = TlsSession::new(Arc::clone(config)).unwrap();
        exchange(&mut c, &mut s, &mut spent);
        if traffic {
            c.writer()
                .write_all(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .unwrap();
            exchange(&mut c, &mut s, &mut spent);
            answer(&mut s, &mut scratch, &mut c, 300);
        }
        servers.push(s);
    }
    let per = (live() - base) as f64 / k as f64;
    assert!(!traffic || servers.iter().all(|s| s.buffered_capacity() == 0));
    per
}

fn scratch_warm(config: &Arc<ServerConfig>, cc: &Arc<ClientConfig>, scratch: &mut TlsScratch) {
    let mut c = client(cc);
    let mut s = TlsSession::new(Arc::clone(config)).unwrap();
    exchange(&mut c, &mut s, &mut Duration::default());
    answer(&mut s, scratch, &mut c, 100_000);
    // Also leaves a small tail buffer in this thread's `OutBuf` pool, which is the
    // worker's too.
    answer(&mut s, scratch, &mut c, 300);
}

/// The server sends `len` bytes through an `OutBuf` and a `TlsSink`; returns the time.
fn answer(
    s: &mut TlsSession,
    scratch: &mut TlsScratch,
    c: &mut ClientConnection,
    len: usize,
) -> Duration {
    let mut out = OutBuf::default();
    out.extend(&vec![b'a'; len]);
    let mut wire = Vec::new();
    let t0 = Instant::now();
    let mut sink = TlsSink::new(s, &mut wire, scratch);
    assert_eq!(out.write_to(&mut sink).unwrap(), Flush::Done);
    assert_eq!(sink.finish().unwrap(), Flush::Done);
    let spent = t0.elapsed();
    assert_eq!(feed_client(c, &wire), len);
    spent
}

/// Heap per idle buffered `rustls::ServerConnection` after a request and answer (what
/// the session would hold without the unbuffered API).
fn idle_buffered_heap(config: &Arc<ServerConfig>, cc: &Arc<ClientConfig>, k: usize) -> f64 {
    let mut servers: Vec<rustls::ServerConnection> = Vec::with_capacity(k);
    let base = live();
    for _ in 0..k {
        let mut c = client(cc);
        let mut s = rustls::ServerConnection::new(Arc::clone(config)).unwrap();
        c.writer()
            .write_all(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        for _ in 0..10 {
            let ct = client_out(&mut c);
            let mut rd = &ct[..];
            while !rd.is_empty() {
                s.read_tls(&mut rd).unwrap();
                s.process_new_packets().unwrap();
            }
            let mut got = Vec::new();
            let _ = s.reader().read_to_end(&mut got);
            if !got.is_empty() {
                s.writer().write_all(&[b'a'; 300]).unwrap();
            }
            let mut back = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut back).unwrap();
            }
            if ct.is_empty() && back.is_empty() {
                break;
            }
            feed_client(&mut c, &back);
        }
        servers.push(s);
    }
    (live() - base) as f64 / k as f64
}

/// Server time per small request (decrypted) and answer (encrypted), and per MiB sent
/// (wall time around the server's calls: too short for a CPU-time reading each).
fn bench_records(config: &Arc<ServerConfig>, cc: &Arc<ClientConfig>, n: usize) {
    let mut c = client(cc);
    let mut s = TlsSession::new(Arc::clone(config)).unwrap();
    let mut scratch = TlsScratch::default();
    exchange(&mut c, &mut s, &mut Duration::default());
    let mut spent = Duration::ZERO;
    let req = vec![b'r'; 200];
    let mut plain = Vec::new();
    for _ in 0..n {
        c.writer().write_all(&req).unwrap();
        let mut ct = client_out(&mut c);
        plain.clear();
        let t0 = Instant::now();
        s.read_tls(&mut ct, &mut plain).unwrap();
        spent += t0.elapsed();
        assert_eq!(plain.len(), 200);
        spent += answer(&mut s, &mut scratch, &mut c, 300);
    }
    let per = spent.as_secs_f64() / n as f64;
    println!(
        "200-byte request in + 300-byte answer out: {:.2} us of server time per pair (n={n})",
        per * 1e6
    );
    let mut bulk = Duration::ZERO;
    let rounds = n / 100 + 1;
    for _ in 0..rounds {
        bulk += answer(&mut s, &mut scratch, &mut c, 1 << 20);
    }
    println!(
        "bulk answers through OutBuf + TlsSink: {:.0} MiB/s of server time",
        rounds as f64 / bulk.as_secs_f64()
    );
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (n, k) = if bench { (2000, 2000) } else { (3, 3) };
    let ca = TestCa::new();
    bench_handshakes(&ca, if bench { n } else { 2 });
    let config = server_config(&ca.leaf(3));
    for (vname, versions) in [("TLS1.3", V13), ("TLS1.2", V12)] {
        let cc = no_resumption(&ca.client_config(versions));
        let hs = idle_session_heap(&config, &cc, k, false);
        let tr = idle_session_heap(&config, &cc, k, true);
        let buffered = idle_buffered_heap(&config, &cc, k);
        println!(
            "idle {vname} session heap: TlsSession {hs:.0} B after the handshake, {tr:.0} B after traffic; \
             buffered rustls::ServerConnection {buffered:.0} B after traffic (k={k}; inline sizes {} / {} B)",
            std::mem::size_of::<TlsSession>(),
            std::mem::size_of::<rustls::ServerConnection>()
        );
    }
    bench_records(
        &config,
        &ca.client_config(V13),
        if bench { 100_000 } else { 10 },
    );
}
