//! The durability tests' support (DECISIONS §6): the real binary started on a data
//! directory (a [`TempDir`]) with its log captured, `kill -9` and SIGTERM, pipelined
//! publishers that record exactly which publishes were answered `true`, and a fresh
//! subscriber's view of a topic's history.
//!
//! Like the rest of `common`, it goes through the binary's flags, sockets, signals, files and
//! log only; it must not reach into the server's code.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};
use tungstenite::Message;

use super::wait::{poll, wait_until};
use super::{Server, Stderr, TempDir, Ws};

/// A server process on a data directory, with every line it logged (at `info`).
pub struct Node {
    /// The process and its address.
    pub server: Server,
}

impl std::ops::Deref for Node {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl Node {
    /// Starts the binary on `127.0.0.1:0` with `--data-dir dir` and `args`, and waits until
    /// it listens (it recovers the directory before that).
    pub fn start(dir: &TempDir, args: &[&str]) -> Node {
        let mut all = vec!["--data-dir", dir.arg()];
        all.extend_from_slice(args);
        let env = [("RUST_LOG", "info")];
        Node {
            server: Server::spawn(&all, Stderr::Keep, false, &env),
        }
    }

    /// Every line logged so far.
    pub fn log(&self) -> Vec<String> {
        self.server.log().lines().map(str::to_string).collect()
    }

    /// The first logged line containing `needle` (waiting up to 10 s for it).
    pub fn wait_log(&self, needle: &str) -> String {
        let found = poll(Duration::from_secs(10), || {
            self.log().into_iter().find(|l| l.contains(needle))
        });
        found.unwrap_or_else(|| panic!("no log line with {needle:?}: {:#?}", self.log()))
    }

    /// The start-up line saying what was recovered: (messages, webhooks, the line).
    pub fn recovered(&self) -> (u64, u64, String) {
        let line = self.wait_log(": recovered ");
        let after = line.split(": recovered ").nth(1).unwrap_or_default();
        let words: Vec<&str> = after.split_whitespace().collect();
        let n = |i: usize| words.get(i).and_then(|w| w.parse().ok());
        match (n(0), n(3)) {
            (Some(m), Some(w)) if words[1] == "messages" && words[4] == "webhook" => (m, w, line),
            _ => panic!("not the recovery line: {line}"),
        }
    }

    /// `kill -9`: the process dies at once, whatever it was doing.
    pub fn kill9(mut self) {
        self.server.child.kill().expect("SIGKILL");
        self.server.child.wait().expect("reap");
    }

    /// SIGTERM, then waits (up to 15 s) for the process to exit; returns its status.
    pub fn sigterm(mut self) -> ExitStatus {
        let pid = self.server.child.id() as libc::pid_t;
        // SAFETY: kill(2) with a pid we spawned and still own (not reaped yet).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let child = &mut self.server.child;
        poll(Duration::from_secs(15), || child.try_wait().expect("wait"))
            .expect("no exit 15 s after SIGTERM")
    }
}

/// Runs the binary on `dir` expecting it to exit by itself; returns its status and what it
/// wrote on stderr.
pub fn run_to_exit(dir: &TempDir, args: &[&str]) -> (ExitStatus, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .args(["--listen", "127.0.0.1:0", "--data-dir", dir.arg()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run walletrelay");
    (out.status, String::from_utf8_lossy(&out.stderr).to_string())
}

/// What one publisher did: per topic, the messages sent and those answered `true`, each in
/// the order sent.
#[derive(Debug, Default, Clone)]
pub struct Published {
    /// The topics.
    pub topics: Vec<String>,
    /// Per topic: every message sent (answered or not).
    pub sent: Vec<Vec<String>>,
    /// Per topic: the messages answered `true`.
    pub acked: Vec<Vec<String>>,
    /// Per topic: how many were answered `true` (also without [`Plan::record`]).
    pub acked_count: Vec<usize>,
    /// Answers that were errors (e.g. -32000), as received.
    pub errors: Vec<Value>,
}

/// The body of message `n` of publisher `p` on its topic `t`: unique, then `size` hex
/// characters, like a real encrypted payload.
pub fn body(p: usize, t: usize, n: usize, size: usize) -> String {
    let filler = super::hex(size, (p * 1000 + t) as u64 + 1);
    format!("p{p}t{t}n{n:06}-{filler}")
}

/// What a [`Load`] publishes.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Connections, each with its own topics.
    pub publishers: usize,
    /// Topics of each publisher, published to in turn (no topic has two publishers, so a
    /// topic's order is its publisher's).
    pub topics_each: usize,
    /// Publishes in flight on each connection at most.
    pub window: usize,
    /// Messages per topic at most.
    pub per_topic: usize,
    /// Their time to live, seconds.
    pub ttl: u64,
    /// Hex characters of filler in each message.
    pub size: usize,
    /// Keep every message sent and acknowledged in [`Published`] (off for very large runs:
    /// the counts are kept, and the messages can be made again with [`body`]).
    pub record: bool,
}

impl Plan {
    /// `publishers` x `topics_each` topics, 32 in flight, up to 900 messages of 120 hex
    /// characters per topic, living an hour.
    pub fn new(publishers: usize, topics_each: usize) -> Plan {
        Plan {
            publishers,
            topics_each,
            window: 32,
            per_topic: 900,
            ttl: 3600,
            size: 120,
            record: true,
        }
    }
}

/// Publishers running against a server until told to stop or until their connection dies.
pub struct Load {
    stop: Arc<AtomicBool>,
    /// Publishes answered `true` so far, all publishers together.
    pub acked: Arc<AtomicUsize>,
    handles: Vec<JoinHandle<Published>>,
}

impl Load {
    /// Starts the publishers of `plan`.
    pub fn start(addr: SocketAddr, plan: Plan) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let handles = (0..plan.publishers)
            .map(|p| {
                let (stop, acked) = (stop.clone(), acked.clone());
                let topics: Vec<String> = (0..plan.topics_each).map(|_| super::topic()).collect();
                std::thread::spawn(move || publish_pipelined(addr, p, topics, plan, &stop, &acked))
            })
            .collect();
        Load {
            stop,
            acked,
            handles,
        }
    }

    /// Waits until `n` publishes were answered `true` (at most 60 s).
    pub fn wait_acked(&self, n: usize) {
        let acked = || self.acked.load(Ordering::Relaxed) >= n;
        assert!(
            wait_until(Duration::from_secs(60), acked),
            "only {:?} acked",
            self.acked
        );
    }

    /// Tells the publishers to stop sending; each waits for the answers of what it sent.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// What every publisher did (they end when stopped and answered, or when their
    /// connection dies).
    pub fn join(self) -> Vec<Published> {
        self.handles
            .into_iter()
            .map(|h| h.join().expect("publisher thread"))
            .collect()
    }
}

/// One pipelined publisher (see [`Plan`]).
fn publish_pipelined(
    addr: SocketAddr,
    p: usize,
    topics: Vec<String>,
    plan: Plan,
    stop: &AtomicBool,
    acked: &AtomicUsize,
) -> Published {
    let Plan {
        window,
        per_topic,
        ttl,
        size,
        record,
        ..
    } = plan;
    let mut ws = Ws::connect(addr);
    let n = topics.len();
    let mut out = Published {
        sent: vec![Vec::new(); n],
        acked: vec![Vec::new(); n],
        acked_count: vec![0; n],
        topics,
        errors: Vec::new(),
    };
    let mut inflight: VecDeque<(u64, usize, String)> = VecDeque::new();
    let (mut next, mut id) = (0usize, 1u64);
    loop {
        let more = !stop.load(Ordering::Relaxed) && next < per_topic * n;
        if more && inflight.len() < window {
            let (t, k) = (next % n, next / n);
            next += 1;
            let msg = body(p, t, k, size);
            let req = json!({"id": id, "jsonrpc": "2.0", "method": "waku_publish",
                "params": {"topic": out.topics[t], "message": msg, "ttl": ttl}});
            if ws.sock.send(Message::text(req.to_string())).is_err() {
                break;
            }
            if record {
                out.sent[t].push(msg.clone());
            }
            inflight.push_back((id, t, msg));
            id += 1;
            continue;
        }
        let Some((want, t, msg)) = inflight.pop_front() else {
            break;
        };
        let v: Value = match ws.sock.read() {
            Ok(Message::Text(s)) => serde_json::from_str(s.as_str()).expect("JSON answer"),
            Ok(_) => {
                inflight.push_front((want, t, msg));
                continue;
            }
            Err(_) => break,
        };
        assert_eq!(v["id"], want, "answers come in request order: {v}");
        if v["result"] == true {
            if record {
                out.acked[t].push(msg);
            }
            out.acked_count[t] += 1;
            acked.fetch_add(1, Ordering::Relaxed);
        } else {
            out.errors.push(v);
        }
    }
    out
}

/// Per topic of every publisher: (topic, sent, acked).
pub fn by_topic(ps: &[Published]) -> Vec<(String, Vec<String>, Vec<String>)> {
    ps.iter()
        .flat_map(|p| {
            (0..p.topics.len())
                .map(move |i| (p.topics[i].clone(), p.sent[i].clone(), p.acked[i].clone()))
        })
        .collect()
}

/// What a new subscriber of `topic` is given: the cached history, oldest first, read up to
/// a marker published (from another connection) after the subscription. Returns the
/// messages before the marker; the marker is then part of the topic's history.
pub fn history(server: &Server, topic: &str, marker: &str) -> Vec<String> {
    let mut sub = server.ws();
    history_on(&mut sub, server, topic, marker)
}

/// [`history`] on a given subscriber connection (which stays subscribed).
pub fn history_on(sub: &mut Ws, server: &Server, topic: &str, marker: &str) -> Vec<String> {
    sub.subscribe(topic);
    server.ws().publish(topic, marker);
    let mut got = Vec::new();
    loop {
        let (_, t, m) = sub.next_push();
        assert_eq!(t, topic);
        if m == marker {
            return got;
        }
        got.push(m);
    }
}

/// The history a topic must have after a crash: every acknowledged message, each once, in
/// the order sent; messages sent but not answered may be there too (they may have been
/// stored before the crash), in their place; nothing else.
pub fn check_history(topic: &str, got: &[String], sent: &[String], acked: &[String]) {
    let index = |m: &String| sent.iter().position(|s| s == m);
    let mut last = None;
    for m in got {
        let i = index(m).unwrap_or_else(|| panic!("{topic}: {m:?} was never sent"));
        assert!(
            last.is_none_or(|l| i > l),
            "{topic}: {m:?} out of order or twice"
        );
        last = Some(i);
    }
    let missing: Vec<&String> = acked.iter().filter(|a| !got.contains(a)).collect();
    assert!(
        missing.is_empty(),
        "{topic}: {} of {} acknowledged messages missing, first {:?}",
        missing.len(),
        acked.len(),
        missing.first()
    );
}

/// Every topic's history after a restart, against what was published: see
/// [`check_history`]. `marker` names this check's markers; returns per topic the history
/// as it now is (the marker included), for a later check.
pub fn check_all(
    node: &Node,
    topics: &[(String, Vec<String>, Vec<String>)],
    marker: &str,
) -> Vec<Vec<String>> {
    topics
        .iter()
        .map(|(topic, sent, acked)| {
            let mark = format!("{marker}-{topic}");
            let mut got = history(node, topic, &mark);
            check_history(topic, &got, sent, acked);
            got.push(mark);
            got
        })
        .collect()
}
