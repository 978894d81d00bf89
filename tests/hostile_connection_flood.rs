//! Hostile clients (issue 5 §3 b), against the real binary over real sockets: a flood of
//! connections past `--max-connections` is refused at once (no answer, counted), a newcomer
//! during the flood too, and the server recovers as soon as the flood ends. Figures are
//! printed (`--nocapture`) and recorded in `docs/RELIABILITY-hostile.md`.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{raise_nofile_limit, HttpConn, Server};

/// The server's `--max-connections`.
const LIMIT: usize = 50;

/// Connects `n` sockets from 4 threads at once (optionally sending `first` on each).
fn flood(server: &Server, n: usize, first: &[u8]) -> Vec<TcpStream> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    (0..n)
                        .filter(|i| i % 4 == t)
                        .map(|_| {
                            let mut c = TcpStream::connect(server.addr).expect("flood connect");
                            if !first.is_empty() {
                                let _ = c.write_all(first);
                            }
                            c
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// Flood connections the server closed (what each got), and those it holds (index, what
/// each got so far).
type Sorted = (Vec<Vec<u8>>, Vec<(usize, Vec<u8>)>);

/// Sorts flood connections into those the server closed (EOF or reset, with what they got)
/// and those it holds, waiting up to `within` for the closes to show.
fn classify(conns: &mut [TcpStream], want_held: usize, within: Duration) -> Sorted {
    for c in conns.iter() {
        c.set_nonblocking(true).unwrap();
    }
    let start = Instant::now();
    let mut got: Vec<Vec<u8>> = vec![Vec::new(); conns.len()];
    let mut closed = vec![false; conns.len()];
    loop {
        for (i, c) in conns.iter_mut().enumerate() {
            if closed[i] {
                continue;
            }
            let mut tmp = [0u8; 1024];
            loop {
                match c.read(&mut tmp) {
                    Ok(0) => {
                        closed[i] = true;
                        break;
                    }
                    Ok(n) => got[i].extend_from_slice(&tmp[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => {
                        closed[i] = true;
                        break;
                    }
                }
            }
        }
        let held = closed.iter().filter(|c| !**c).count();
        if held <= want_held || start.elapsed() > within {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut refused = Vec::new();
    let mut held = Vec::new();
    for (i, g) in got.into_iter().enumerate() {
        if closed[i] {
            refused.push(g);
        } else {
            held.push((i, g));
        }
    }
    (refused, held)
}

/// The figures of one flood, for the report.
struct Wave {
    held: usize,
    refused: usize,
    connect_time: Duration,
    classify_time: Duration,
}

/// Wave 1: 1,000 idle connections at once. Exactly `LIMIT` are held; every other one is
/// closed without a byte, and so is a newcomer while the flood holds every slot.
fn idle_wave(server: &mut Server) -> Wave {
    let t = Instant::now();
    let mut conns = flood(server, 1000, b"");
    let connect_time = t.elapsed();
    let (refused, held) = classify(&mut conns, LIMIT, Duration::from_secs(10));
    let classify_time = t.elapsed();
    assert_eq!(
        held.len(),
        LIMIT,
        "connections held open at --max-connections {LIMIT}"
    );
    assert_eq!(refused.len(), 1000 - LIMIT);
    assert!(
        refused.iter().all(|g| g.is_empty()),
        "a refused connection got bytes: {:?}",
        refused
            .iter()
            .find(|g| !g.is_empty())
            .map(|g| String::from_utf8_lossy(g).to_string())
    );
    // While the flood holds every slot, a newcomer is turned away too, without an answer.
    let late = server.raw_exchange(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        late.is_empty(),
        "a request past the limit got {:?}",
        String::from_utf8_lossy(&late)
    );
    server.assert_alive("during the flood");
    Wave {
        held: held.len(),
        refused: refused.len(),
        connect_time,
        classify_time,
    }
}

/// Once the flood lets go, `/health` answers 204 again (within 10 s); returns how long
/// that took.
fn recovery(server: &Server) -> Duration {
    let t = Instant::now();
    let mut healthy = false;
    while t.elapsed() < Duration::from_secs(10) {
        if server.get("/health").0 == Some(204) {
            healthy = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(healthy, "/health not 204 within 10 s of the flood's end");
    t.elapsed()
}

/// Wave 2: 300 connections that each send a request: exactly the first `LIMIT` slots are
/// answered (204), the others get nothing. Returns (answered, refused).
fn request_wave(server: &Server) -> (usize, usize) {
    let mut conns = flood(server, 300, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    let (refused, held) = classify(&mut conns, LIMIT, Duration::from_secs(10));
    assert_eq!(held.len(), LIMIT);
    // Held ones are answered (possibly still on their way): read what is missing.
    for (i, g) in &held {
        let c = conns[*i].try_clone().unwrap();
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = HttpConn::new(c);
        c.buf = g.clone();
        let r = c.response(false);
        assert_eq!(r.status, 204, "{r:?}");
    }
    assert!(
        refused.iter().all(|g| g.is_empty()),
        "a refused connection got an answer"
    );
    (held.len(), refused.len())
}

#[test]
fn connection_flood_past_the_limit_is_refused_at_once_and_the_server_recovers() {
    raise_nofile_limit();
    // The flag as README.md and `src/config.rs` spell it.
    let mut server = Server::start(&[
        "--threads",
        "1",
        "--max-connections",
        "50",
        "--head-timeout",
        "60",
    ]);
    let base = server.wait_metric(
        "walletrelay_connections_open",
        Duration::from_secs(5),
        |v| v <= 1.0,
    );
    assert_eq!(base, 1.0, "only the /metrics connection is open");
    let refused_before = server
        .try_metric("walletrelay_connections_refused_total")
        .expect("/metrics");
    let refused_since = |server: &Server| {
        server
            .try_metric("walletrelay_connections_refused_total")
            .expect("/metrics")
            - refused_before
    };
    // Let the server reap that last /metrics connection before the flood takes the slots.
    std::thread::sleep(Duration::from_millis(300));

    let wave1 = idle_wave(&mut server);
    let recover_time = recovery(&server);
    let refused_total = refused_since(&server);
    assert!(
        refused_total >= (1000 - LIMIT + 1) as f64,
        "walletrelay_connections_refused_total rose by {refused_total}"
    );
    // Every wave-1 slot is free again (the server reaps the closed ones as it reads their
    // EOF; on a loaded machine that can trail the first /health answer).
    let open = server.wait_metric(
        "walletrelay_connections_open",
        Duration::from_secs(10),
        |v| v <= 1.0,
    );
    assert_eq!(open, 1.0, "wave 1's connections are all closed");
    std::thread::sleep(Duration::from_millis(300));

    let (answered2, refused2) = request_wave(&server);
    let open = server.wait_metric(
        "walletrelay_connections_open",
        Duration::from_secs(10),
        |v| v <= base,
    );
    assert_eq!(open, base, "connections_open after the floods");
    eprintln!(
        "flood: 1000 connections in {:?}, sorted in {:?}: {} held, {} refused; recovered \
         (/health 204) {recover_time:?} after release; second wave 300 with requests: \
         {answered2} answered 204, {refused2} refused; connections_refused_total +{}",
        wave1.connect_time,
        wave1.classify_time,
        wave1.held,
        wave1.refused,
        refused_since(&server)
    );
    server.assert_serving("the floods");
    server.assert_alive("after the floods");
}

/// README.md documents the per-worker connection limit as `--max-connections N`.
#[test]
fn the_readmes_max_connections_flag_is_accepted() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .args(["--max-connections", "50", "--help"])
        .output()
        .expect("run walletrelay");
    assert!(
        out.status.success(),
        "`walletrelay --max-connections 50` (README.md) is refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
