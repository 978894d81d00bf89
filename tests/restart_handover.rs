//! A node restarted without refusing anyone (issue 55 §4; docs/DEPLOY.md "Restarting a
//! node"): a new process started with `--take-over` takes the old one's listening sockets
//! over its `--handover-socket`, the old one closes its clients with 1001 and exits, and a
//! client that connects in a tight loop meanwhile is never refused nor left unanswered.
//! With `--data-dir` a publish the old process acknowledged reaches a subscriber of the new
//! one. A takeover of nothing, or of something else, fails clearly, and a new process that
//! gives up halfway leaves the old one serving.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::durability::{check_history, history};
use common::wait::{poll, wait_until};
use common::{topic, Server, TempDir, Ws};
use serde_json::json;

/// Safety bound of every wait below (none is a pass/fail threshold).
const WAIT: Duration = Duration::from_secs(30);

/// Waits for the process to exit by itself; returns its status.
fn exited(server: &mut Server) -> ExitStatus {
    let child = &mut server.child;
    poll(WAIT, || child.try_wait().expect("try_wait")).expect("the old process did not exit")
}

/// What the knockers saw.
#[derive(Default)]
struct Tally {
    served: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    failures: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// Clients that connect in a tight loop, each sending one `GET /hello` and reading the
/// answer to its end: served (a 200), refused (`ECONNREFUSED`), or failed (anything else:
/// reset, closed unanswered, timed out).
struct Knockers {
    tally: Arc<Tally>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Knockers {
    fn start(addr: SocketAddr, n: usize) -> Knockers {
        let tally = Arc::new(Tally::default());
        let threads = (0..n)
            .map(|_| {
                let t = tally.clone();
                std::thread::spawn(move || {
                    while !t.stop.load(Ordering::Relaxed) {
                        match knock(addr) {
                            Ok(()) => t.served.fetch_add(1, Ordering::Relaxed),
                            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                                t.refused.fetch_add(1, Ordering::Relaxed)
                            }
                            Err(e) => {
                                t.failures.lock().unwrap().push(e.to_string());
                                t.failed.fetch_add(1, Ordering::Relaxed)
                            }
                        };
                    }
                })
            })
            .collect();
        Knockers { tally, threads }
    }

    fn served(&self) -> u64 {
        self.tally.served.load(Ordering::Relaxed)
    }

    /// Waits until `n` more connections were served than now.
    fn wait_served(&self, more: u64) {
        let goal = self.served() + more;
        assert!(
            wait_until(WAIT, || self.served() >= goal),
            "the knockers are not served"
        );
    }

    /// Stops them: (served, refused, failed, what failed).
    fn stop(self) -> (u64, u64, u64, Vec<String>) {
        self.tally.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let t = &self.tally;
        (
            t.served.load(Ordering::Relaxed),
            t.refused.load(Ordering::Relaxed),
            t.failed.load(Ordering::Relaxed),
            t.failures.lock().unwrap().clone(),
        )
    }
}

fn knock(addr: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /hello HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    if answer.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "answered {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(40)])
        )))
    }
}

/// `args` with `--take-over`.
fn taking_over<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut a = args.to_vec();
    a.push("--take-over");
    a
}

/// Runs the binary expecting it to exit by itself: its status and stderr.
fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let out = common::limits_off(&mut Command::new(env!("CARGO_BIN_EXE_walletrelay")))
        .args(["--data-dir", "none"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run walletrelay");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The served node answers on a connection it had and on a new one.
fn still_serving(server: &Server, kept: &mut Ws) {
    let t = topic();
    kept.subscribe(&t);
    server.ws().publish(&t, "still here");
    assert_eq!(kept.next_push().2, "still here");
    assert_eq!(server.get("/hello").0, Some(200));
}

#[test]
fn a_handover_refuses_no_connection_and_closes_the_old_clients_with_1001() {
    let dir = TempDir::new("handover");
    let sock = dir.join("handover.sock");
    let args = [
        "--threads",
        "2",
        "--admin-listen",
        "127.0.0.1:0",
        "--handover-socket",
        sock.to_str().unwrap(),
    ];
    let mut old = Server::start(&args);
    let mut subscribed = old.ws();
    subscribed.subscribe(&topic());
    let mut idle = old.ws();
    let knockers = Knockers::start(old.addr, 2);
    knockers.wait_served(50);

    let mut new = Server::start(&taking_over(&args));
    assert_eq!(
        new.addr, old.addr,
        "the new process serves the old one's address"
    );
    assert_eq!(new.admin_addr, old.admin_addr);
    assert_eq!(subscribed.close_code(), 1001);
    assert_eq!(idle.close_code(), 1001);
    assert_eq!(exited(&mut old).code(), Some(0));
    // Served by the new process alone for a while.
    knockers.wait_served(300);
    let (served, refused, failed, why) = knockers.stop();
    assert_eq!(refused, 0, "refused during the handover ({served} served)");
    assert_eq!(failed, 0, "failed during the handover: {why:?}");
    let mut kept = new.ws();
    still_serving(&new, &mut kept);

    // And again: the new process offers its sockets at the same path.
    let third = Server::start(&taking_over(&args));
    assert_eq!(third.addr, old.addr);
    assert_eq!(kept.close_code(), 1001);
    assert_eq!(exited(&mut new).code(), Some(0));
    let mut kept = third.ws();
    still_serving(&third, &mut kept);
}

/// Publishes `stream-<i>` on `topic` over `ws` one at a time until the connection closes;
/// returns what was sent and what was answered `true`.
fn publish_until_closed(mut ws: Ws, topic: &str) -> (Vec<String>, Vec<String>) {
    let (mut sent, mut acked) = (Vec::new(), Vec::new());
    for i in 0.. {
        let m = format!("stream-{i}");
        let req = json!({"id": i + 1, "jsonrpc": "2.0", "method": "irn_publish",
            "params": {"topic": topic, "message": m, "ttl": 300, "tag": 1000}});
        if ws
            .sock
            .send(tungstenite::Message::Text(req.to_string().into()))
            .is_err()
        {
            break;
        }
        sent.push(m.clone());
        let answer = loop {
            match ws.sock.read() {
                Ok(tungstenite::Message::Text(t)) => break Some(t.to_string()),
                Ok(tungstenite::Message::Close(_)) | Err(_) => break None,
                Ok(_) => continue,
            }
        };
        let Some(answer) = answer else { break };
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["result"], true, "{v}");
        acked.push(m);
    }
    (sent, acked)
}

#[test]
fn with_a_data_dir_what_the_old_process_acknowledged_reaches_the_new_ones_subscribers() {
    let dir = TempDir::new("handover-data");
    let data = TempDir::new("handover-journal");
    let sock = dir.join("handover.sock");
    let args = [
        "--threads",
        "2",
        "--data-dir",
        data.arg(),
        // The publisher below is not paced: more than the default 1,000 a topic keeps may be
        // acknowledged before the handover ends, and the oldest would be dropped by design.
        "--max-cached-per-topic",
        "100000",
        "--handover-socket",
        sock.to_str().unwrap(),
    ];
    let mut old = Server::start(&args);
    let (irn, waku, stream) = (topic(), topic(), topic());
    let mut p = old.ws();
    let r = p.call(
        "irn_publish",
        json!({"topic": irn, "message": "acked-by-old-irn", "ttl": 300, "tag": 1000}),
    );
    assert_eq!(r["result"], true, "{r}");
    p.publish(&waku, "acked-by-old-waku");
    let mut sub = old.ws();
    sub.subscribe(&topic());
    // A publisher at work through the handover: everything answered `true` must survive.
    let publisher = {
        let (ws, stream) = (old.ws(), stream.clone());
        std::thread::spawn(move || publish_until_closed(ws, &stream))
    };
    let new = Server::start(&taking_over(&args));
    assert_eq!(new.addr, old.addr);
    assert_eq!(sub.close_code(), 1001);
    assert_eq!(exited(&mut old).code(), Some(0));
    let (sent, acked) = publisher.join().unwrap();
    assert!(
        !acked.is_empty(),
        "nothing was published before the handover"
    );

    assert_eq!(history(&new, &irn, "marker-1"), ["acked-by-old-irn"]);
    assert_eq!(history(&new, &waku, "marker-2"), ["acked-by-old-waku"]);
    let got = history(&new, &stream, "marker-3");
    check_history(&stream, &got, &sent, &acked);
}

#[test]
fn taking_over_from_nothing_or_from_something_else_fails_clearly() {
    let dir = TempDir::new("handover-bad");
    let absent = dir.join("absent.sock");
    let (st, err) = run_to_exit(&["--handover-socket", absent.to_str().unwrap(), "--take-over"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("nothing to take over"), "{err}");

    let file = dir.join("a-file");
    std::fs::write(&file, b"not a socket").unwrap();
    let (st, err) = run_to_exit(&["--handover-socket", file.to_str().unwrap(), "--take-over"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("nothing to take over"), "{err}");

    // Something that answers, but not a walletrelay.
    let other = dir.join("http.sock");
    let listener = UnixListener::bind(&other).unwrap();
    let impostor = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut line = [0u8; 64];
        let _ = s.read(&mut line);
        s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
    });
    let (st, err) = run_to_exit(&["--handover-socket", other.to_str().unwrap(), "--take-over"]);
    impostor.join().unwrap();
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("not a walletrelay handover socket"), "{err}");

    // `--take-over` needs a socket to take over from.
    let (st, err) = run_to_exit(&["--take-over"]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("--handover-socket"), "{err}");
}

#[test]
fn the_old_process_keeps_serving_when_the_new_one_gives_up_mid_handover() {
    let dir = TempDir::new("handover-giveup");
    let sock = dir.join("handover.sock");
    let path = sock.to_str().unwrap();
    let args = ["--threads", "2", "--handover-socket", path];
    let mut old = Server::start(&args);
    let mut kept = old.ws();
    still_serving(&old, &mut kept);

    // A new process that takes the sockets and vanishes before saying stop.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(format!("walletrelay-handover 1 take pid={}\n", std::process::id()).as_bytes())
        .unwrap();
    let mut line = [0u8; 256];
    let n = s.read(&mut line).unwrap();
    let line = String::from_utf8_lossy(&line[..n]).into_owned();
    assert!(
        line.starts_with("walletrelay-handover 1 offer pid="),
        "{line}"
    );
    assert!(line.contains(" plain=2 "), "{line}");
    drop(s);
    old.assert_alive("after a new process gave up");
    still_serving(&old, &mut kept);

    // A real one whose flags do not fit: it stops before asking the old one to stop.
    let (st, err) = run_to_exit(&[
        "--listen",
        "127.0.0.2:1",
        "--handover-socket",
        path,
        "--take-over",
    ]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains(&format!("listens on {}", old.addr)), "{err}");
    old.assert_alive("after a takeover with another address");
    still_serving(&old, &mut kept);

    // A second node on the same handover socket, not told to take over.
    let (st, err) = run_to_exit(&["--listen", "127.0.0.1:0", "--handover-socket", path]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(
        err.contains("another walletrelay offers its listeners here"),
        "{err}"
    );
    old.assert_alive("after a second node on its handover socket");
    still_serving(&old, &mut kept);

    // The offer still stands.
    let new = Server::start(&taking_over(&args));
    assert_eq!(kept.close_code(), 1001);
    assert_eq!(exited(&mut old).code(), Some(0));
    let mut kept = new.ws();
    still_serving(&new, &mut kept);
}

#[test]
fn the_tls_listeners_are_handed_over_too() {
    let tls = common::tls::TlsSetup::new();
    let dir = TempDir::new("handover-tls");
    let sock = dir.join("handover.sock");
    let extra = [
        "--threads",
        "2",
        "--handover-socket",
        sock.to_str().unwrap(),
    ];
    let mut old = tls.start(&extra);
    let client = tls.client();
    let mut kept = old.wss(&client);
    kept.subscribe(&topic());
    let new = tls.start(&taking_over(&extra));
    assert_eq!(new.tls_addr, old.tls_addr);
    assert_eq!(new.addr, old.addr);
    assert_eq!(kept.close_code(), 1001);
    assert_eq!(exited(&mut old).code(), Some(0));
    let mut sub = new.wss(&client);
    let t = topic();
    sub.subscribe(&t);
    new.ws().publish(&t, "over TLS, from the new process");
    assert_eq!(sub.next_push().2, "over TLS, from the new process");
}
