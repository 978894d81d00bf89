//! The heartbeat (DECISIONS §3: ping every interval, close a connection silent for two) and
//! graceful shutdown on SIGTERM / SIGINT (close 1001 to every WebSocket, exit 0 within 5 s).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use common::raw_ws::{OP_PING, OP_TEXT};
use common::wait::poll;
use common::{topic, Next, RawWs, Server};

fn signal(server: &Server, sig: libc::c_int) {
    let pid = server.child.id() as libc::pid_t;
    // SAFETY: kill(2) with the pid of our own child process; no memory is involved.
    let r = unsafe { libc::kill(pid, sig) };
    assert_eq!(r, 0, "kill failed");
}

/// Waits (at most until `deadline`) for the server process to exit; returns its status.
fn wait_exit(server: &mut Server, deadline: Instant) -> std::process::ExitStatus {
    let left = deadline.saturating_duration_since(Instant::now());
    poll(left, || server.child.try_wait().expect("try_wait"))
        .expect("server still running 5 s after the signal")
}

// ------------------------------------------------------------------------------------------
// Heartbeat

#[test]
fn server_pings_a_connected_client_within_5s() {
    let s = Server::start(&["--ping-interval", "0.5"]);
    let mut c = RawWs::open(&s);
    // The first frame the server sends unprompted is a ping, within 5 s.
    match c.next_within(Duration::from_secs(5)) {
        Next::Frame(f) if f.op == OP_PING => {
            assert!(f.fin);
            assert!(f.payload.len() <= 125);
        }
        Next::Frame(f) => panic!("unexpected frame before the ping: {f:?}"),
        Next::Timeout => panic!("no ping within 5 s"),
        closed => panic!("closed before any ping: {closed:?}"),
    }
}

/// Connections opened together (a reconnect storm after a restart) get their first ping
/// at random times between half an interval and one interval after their upgrade, not all
/// at once: a burst of thousands of pings in one loop iteration stalls every client of
/// that worker, once per interval, for ever after.
#[test]
fn first_pings_of_connections_opened_together_are_spread_over_half_an_interval() {
    const N: usize = 40;
    let s = Server::start(&["--ping-interval", "2", "--threads", "1"]);
    let conns: Vec<(RawWs, Instant)> = (0..N).map(|_| (RawWs::open(&s), Instant::now())).collect();
    let waits: Vec<_> = conns
        .into_iter()
        .map(|(mut c, opened)| {
            std::thread::spawn(move || match c.next_within(Duration::from_secs(6)) {
                Next::Frame(f) if f.op == OP_PING => (opened, Instant::now()),
                other => panic!("expected a first ping, got {other:?}"),
            })
        })
        .collect();
    let pings: Vec<(Instant, Instant)> = waits.into_iter().map(|w| w.join().unwrap()).collect();
    for (opened, pinged) in &pings {
        let after = pinged.duration_since(*opened);
        // Between half an interval (less the wheel's tick) and one interval (plus slack for
        // a loaded test machine).
        assert!(
            after >= Duration::from_millis(900),
            "first ping after {after:?}"
        );
        assert!(
            after <= Duration::from_millis(5000),
            "first ping after {after:?}"
        );
    }
    let first = pings.iter().map(|p| p.1).min().unwrap();
    let last = pings.iter().map(|p| p.1).max().unwrap();
    // 40 uniform draws over 1 s span ~950 ms; all within 300 ms has probability ~0.3^39.
    assert!(
        last.duration_since(first) >= Duration::from_millis(300),
        "{N} first pings all came within {:?}",
        last.duration_since(first)
    );
}

#[test]
fn silent_client_is_closed_while_a_ponging_client_stays_open() {
    let s = Server::start(&["--ping-interval", "0.5"]);
    let start = Instant::now();
    let mut silent = RawWs::open(&s);
    let mut alive = s.ws();
    let tp = topic();
    alive.subscribe(&tp);

    let watcher = std::thread::spawn(move || silent.until_closed(start + Duration::from_secs(5)));

    // Reading makes tungstenite answer every ping with a pong.
    while start.elapsed() < Duration::from_secs(3) {
        assert_eq!(alive.recv_within(100), None, "unexpected message");
    }
    // Still open and working after 3 s (six ping intervals).
    let id = alive.subscribe(&topic());
    assert_eq!(id.len(), 64);

    let code = watcher
        .join()
        .expect("the silent client was not closed within 5 s");
    // Closed with or without a close frame; if one came, it is not a "normal" farewell.
    if let Some(c) = code {
        assert_ne!(c, 1000, "heartbeat close announced as normal closure");
    }
    assert!(start.elapsed() < Duration::from_secs(6));
}

#[test]
fn client_that_keeps_sending_requests_but_never_pongs_stays_open() {
    let s = Server::start(&["--ping-interval", "0.5"]);
    let mut c = RawWs::open(&s);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let id = c.call("waku_subscribe", serde_json::json!({ "topic": topic() }));
        // Read the answer, ignoring (and never answering) pings.
        loop {
            match c.next_within(Duration::from_secs(5)) {
                Next::Frame(f) if f.op == OP_PING => continue,
                Next::Frame(f) if f.op == OP_TEXT => {
                    let v = f.json();
                    assert_eq!(v["id"], id, "{v}");
                    assert!(v["result"].is_string(), "{v}");
                    break;
                }
                other => panic!("connection of an active client ended: {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

// ------------------------------------------------------------------------------------------
// Shutdown

#[test]
fn sigterm_closes_websockets_with_1001_and_exits_0() {
    let mut s = Server::start(&["--threads", "2"]);
    let mut subscribed = s.ws();
    subscribed.subscribe(&topic());
    let mut plain = s.ws();
    // Both are open and served.
    plain.subscribe(&topic());

    signal(&s, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    assert_eq!(subscribed.close_code(), 1001);
    assert_eq!(plain.close_code(), 1001);
    let st = wait_exit(&mut s, deadline);
    assert_eq!(st.code(), Some(0), "exit status {st:?}");
}

#[test]
fn sigint_exits_0() {
    let mut s = Server::start(&[]);
    // Serving first (so the signal handlers are certainly installed).
    assert_eq!(s.get("/health").0, Some(204));
    let mut ws = s.ws();
    signal(&s, libc::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(5);
    assert_eq!(ws.close_code(), 1001);
    let st = wait_exit(&mut s, deadline);
    assert_eq!(st.code(), Some(0), "exit status {st:?}");
}

#[test]
fn sigterm_exits_0_within_5s_even_if_a_client_never_answers_the_close() {
    let mut s = Server::start(&["--threads", "2"]);
    let mut deaf = RawWs::open(&s);
    // An idle keep-alive HTTP connection too.
    let mut http = s.tcp();
    http.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut tmp = [0u8; 1024];
    let n = http.read(&mut tmp).unwrap();
    assert!(tmp[..n].starts_with(b"HTTP/1.1 204 "));

    signal(&s, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    let st = wait_exit(&mut s, deadline);
    assert_eq!(st.code(), Some(0), "exit status {st:?}");
    // The deaf client was sent a 1001 all the same, then the connection ended.
    assert_eq!(
        deaf.until_closed(Instant::now() + Duration::from_secs(2)),
        Some(1001)
    );
    // The idle HTTP connection was closed without a further answer.
    http.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    match http.read(&mut tmp) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("idle HTTP connection after shutdown: {other:?}"),
    }
}
