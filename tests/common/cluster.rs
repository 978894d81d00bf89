//! The multi-node tests' support (DECISIONS §7): real `walletrelay` nodes started with
//! `--redis` on real `redis-server`s ([`super::redis`]), topics chosen on a given shard,
//! and clients that keep publishing or reading on their own threads while a test kills
//! things around them.
//!
//! Like the rest of `common`, it reaches the nodes only through their sockets, flags and
//! signals; the library is used for one thing only, `cluster::shard_of`, to pick a topic's
//! shard.

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use super::redis::RedisServer;
use super::wait::{wait_until, WAIT};
use super::{topic, Server, Ws};

/// The `--redis` value for these servers, in order (one shard each).
pub fn redis_flag(shards: &[&RedisServer]) -> String {
    shards.iter().map(|r| r.url()).collect::<Vec<_>>().join(",")
}

/// Starts a node on these shards: 2 workers, loopback webhooks allowed, `extra` flags.
pub fn node(shards: &[&RedisServer], extra: &[&str]) -> Server {
    let flag = redis_flag(shards);
    let mut args = vec![
        "--threads",
        "2",
        "--redis",
        flag.as_str(),
        "--webhook-allow-private",
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// `n` nodes on these shards.
pub fn nodes(n: usize, shards: &[&RedisServer], extra: &[&str]) -> Vec<Server> {
    (0..n).map(|_| node(shards, extra)).collect()
}

/// The nodes' `ws://` addresses, comma-separated (what the real-client scripts take to put
/// the dApp and the wallet on different nodes).
pub fn ws_urls(nodes: &[Server]) -> String {
    let urls: Vec<String> = nodes.iter().map(|s| format!("ws://{}", s.addr)).collect();
    urls.join(",")
}

/// A fresh topic that lives on shard `shard` of `shards`.
pub fn topic_on(shard: usize, shards: usize) -> String {
    loop {
        let t = topic();
        if walletrelay::engine::redis::cluster::shard_of(t.as_bytes(), shards) == shard {
            return t;
        }
    }
}

/// The status of `GET /health` (0 when nothing answered).
pub fn health(s: &Server) -> u16 {
    s.get("/health").0.unwrap_or(0)
}

/// The pub/sub channel of a v2 topic on database 0 (`wr:{db}:{ns}:T`, docs/CLUSTER.md).
pub fn channel(topic: &str) -> String {
    format!("wr:0:2:{topic}")
}

/// How many connections are subscribed to a topic's channel on this Redis.
pub fn channel_subscribers(r: &RedisServer, topic: &str) -> i64 {
    let v: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel(topic))
        .query(&mut r.conn())
        .expect("PUBSUB NUMSUB");
    v.first().map_or(0, |(_, n)| *n)
}

/// Publishes `message` and returns the whole answer (result or error).
pub fn publish_raw(ws: &mut Ws, topic: &str, message: &str, prompt: Option<bool>) -> Value {
    let mut params = json!({ "topic": topic, "message": message, "ttl": 21600 });
    if let Some(p) = prompt {
        params["prompt"] = json!(p);
    }
    ws.call("waku_publish", params)
}

/// The next push's `(topic, message)` (a response instead is an error).
pub fn push(ws: &mut Ws) -> (String, String) {
    let (_, t, m) = ws.next_push();
    (t, m)
}

/// The next `n` pushes' messages, all on `topic`.
pub fn pushes(ws: &mut Ws, topic: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let (t, m) = push(ws);
            assert_eq!(t, topic, "a push of another topic");
            m
        })
        .collect()
}

/// What became of one publish of a [`Publisher`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answered `true`.
    Acked,
    /// Answered an error: (code, message).
    Refused(i64, String),
}

/// What a [`Publisher`] saw: every message it sent, in order, and each one's answer
/// (missing: no answer came, e.g. its node died).
#[derive(Debug, Default)]
pub struct Sent {
    /// Messages in the order sent.
    pub order: Vec<String>,
    /// Answers by message.
    pub outcome: HashMap<String, Outcome>,
}

impl Sent {
    /// Messages answered `true`.
    pub fn acked(&self) -> Vec<String> {
        self.order
            .iter()
            .filter(|m| self.outcome.get(*m) == Some(&Outcome::Acked))
            .cloned()
            .collect()
    }

    /// Messages refused with -32000 `storage unavailable`.
    pub fn unavailable(&self) -> usize {
        self.outcome
            .values()
            .filter(|o| matches!(o, Outcome::Refused(-32000, m) if m == "storage unavailable"))
            .count()
    }

    /// Answers of any other kind (a bug).
    pub fn other_errors(&self) -> Vec<Outcome> {
        self.outcome
            .values()
            .filter(|o| match o {
                Outcome::Acked => false,
                Outcome::Refused(c, m) => !(*c == -32000 && m == "storage unavailable"),
            })
            .cloned()
            .collect()
    }
}

/// Reads the next text message within the socket's timeout: `Ok(None)` on a timeout,
/// `Err` when the connection is gone.
pub fn read_json(ws: &mut Ws) -> Result<Option<Value>, String> {
    match ws.sock.read() {
        Ok(tungstenite::Message::Text(t)) => serde_json::from_str(t.as_str())
            .map(Some)
            .map_err(|e| e.to_string()),
        Ok(tungstenite::Message::Close(c)) => Err(format!("closed: {c:?}")),
        Ok(_) => Ok(None),
        Err(tungstenite::Error::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A connection publishing `<name>-<n>` messages on one topic on its own thread, at most
/// `window` unanswered, until stopped or its connection dies.
pub struct Publisher {
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Sent>>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Starts publishing on `ws` (its ids start at 1_000_000, clear of `Ws::call`'s).
    pub fn start(mut ws: Ws, topic: &str, name: &str, window: usize) -> Publisher {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(Sent::default()));
        let (stop2, sent2, topic, name) = (
            Arc::clone(&stop),
            Arc::clone(&sent),
            topic.to_string(),
            name.to_string(),
        );
        ws.sock
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let thread = std::thread::spawn(move || {
            let mut waiting: HashMap<u64, String> = HashMap::new();
            let mut n = 0u64;
            loop {
                while waiting.len() < window && !stop2.load(Ordering::Relaxed) {
                    n += 1;
                    let (id, msg) = (1_000_000 + n, format!("{name}-{n}"));
                    let req = json!({"id": id, "jsonrpc": "2.0", "method": "waku_publish",
                        "params": {"topic": topic, "message": msg, "ttl": 21600}});
                    if ws
                        .sock
                        .send(tungstenite::Message::text(req.to_string()))
                        .is_err()
                    {
                        return;
                    }
                    sent2.lock().unwrap().order.push(msg.clone());
                    waiting.insert(id, msg);
                }
                if waiting.is_empty() {
                    return;
                }
                let v = match read_json(&mut ws) {
                    Ok(Some(v)) => v,
                    Ok(None) => continue,
                    Err(_) => return, // the node is gone: what is waiting has no answer
                };
                let Some(msg) = v["id"].as_u64().and_then(|id| waiting.remove(&id)) else {
                    continue;
                };
                let outcome = if v["result"] == true {
                    Outcome::Acked
                } else {
                    Outcome::Refused(
                        v["error"]["code"].as_i64().unwrap_or(0),
                        v["error"]["message"].as_str().unwrap_or("").to_string(),
                    )
                };
                sent2.lock().unwrap().outcome.insert(msg, outcome);
            }
        });
        Publisher {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    /// Messages answered `true` so far.
    pub fn acked(&self) -> usize {
        let s = self.sent.lock().unwrap();
        s.outcome.values().filter(|o| **o == Outcome::Acked).count()
    }

    /// Messages refused `storage unavailable` so far.
    pub fn unavailable(&self) -> usize {
        self.sent.lock().unwrap().unavailable()
    }

    /// Stops sending, waits for the answers still due (or the connection's end), returns
    /// what it saw.
    pub fn finish(mut self) -> Sent {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("publisher thread");
        }
        std::mem::take(&mut *self.sent.lock().unwrap())
    }
}

/// A connection subscribed to one topic, reading pushes on its own thread until stopped
/// or its connection dies.
pub struct Subscriber {
    stop: Arc<AtomicBool>,
    got: Arc<Mutex<Vec<String>>>,
    thread: Option<JoinHandle<Ws>>,
}

impl Subscriber {
    /// Subscribes `ws` to `topic` and starts reading.
    pub fn start(mut ws: Ws, topic: &str) -> Subscriber {
        ws.subscribe(topic);
        ws.sock
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (stop2, got2, topic) = (Arc::clone(&stop), Arc::clone(&got), topic.to_string());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match read_json(&mut ws) {
                    Ok(Some(v)) if v["method"] == "waku_subscription" => {
                        let d = &v["params"]["data"];
                        assert_eq!(d["topic"], topic.as_str(), "a push of another topic");
                        let m = d["message"].as_str().expect("message").to_string();
                        got2.lock().unwrap().push(m);
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            ws
        });
        Subscriber {
            stop,
            got,
            thread: Some(thread),
        }
    }

    /// Messages received so far, in order.
    pub fn got(&self) -> Vec<String> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until every message of `want` was received (panics after [`WAIT`]).
    pub fn wait_all(&self, who: &str, want: &[String]) {
        let missing = |got: &[String]| -> Vec<String> {
            let have: std::collections::HashSet<&String> = got.iter().collect();
            want.iter().filter(|m| !have.contains(m)).cloned().collect()
        };
        if wait_until(WAIT, || missing(&self.got()).is_empty()) {
            return;
        }
        let got = self.got();
        let missing = missing(&got);
        if missing.is_empty() {
            return; // all there just now
        }
        panic!(
            "{who}: {} of {} messages never arrived, first {:?} (got {})",
            missing.len(),
            want.len(),
            &missing[..missing.len().min(5)],
            got.len()
        );
    }

    /// Stops reading; returns the connection (if it is still open) and what it received.
    pub fn finish(mut self) -> (Option<Ws>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let ws = self.thread.take().map(|t| t.join().expect("subscriber"));
        let got = std::mem::take(&mut *self.got.lock().unwrap());
        (ws, got)
    }
}

/// Checks what one subscriber received against what the publishers sent: every message
/// answered `true` exactly once, nothing twice, and each publisher's messages in the
/// order it sent them (also those refused but stored anyway: Redis may have run them).
pub fn check_delivery(who: &str, got: &[String], publishers: &[&Sent]) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for m in got {
        *seen.entry(m.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{who}: delivered more than once: {twice:?}"
    );
    for p in publishers {
        for m in p.acked() {
            assert!(
                seen.contains_key(m.as_str()),
                "{who}: acked {m} never delivered"
            );
        }
        // Order: positions in `got` of this publisher's messages follow its send order.
        let rank: HashMap<&str, usize> = p
            .order
            .iter()
            .enumerate()
            .map(|(i, m)| (m.as_str(), i))
            .collect();
        let ranks: Vec<usize> = got
            .iter()
            .filter_map(|m| rank.get(m.as_str()).copied())
            .collect();
        assert!(
            ranks.windows(2).all(|w| w[0] < w[1]),
            "{who}: a publisher's messages arrived out of order"
        );
    }
}

/// A TCP connect to the node works (it is still up).
pub fn reachable(s: &Server) -> bool {
    TcpStream::connect(s.addr).is_ok()
}

/// Starts a node with these Redis flags (`--redis URL...`, `--redis-tls-ca ...`: see
/// [`super::redis_topo::RedisSetup::redis_args`]): 2 workers, loopback webhooks allowed,
/// `extra` flags.
pub fn node_args(args: &[String], extra: &[&str]) -> Server {
    Server::start(&node_argv(args, extra))
}

/// [`node_args`], keeping what the node logs for [`Server::log`].
pub fn node_args_logged(args: &[String], extra: &[&str]) -> Server {
    Server::start_logged(&node_argv(args, extra))
}

/// `n` nodes of [`node_args`].
pub fn nodes_args(n: usize, args: &[String], extra: &[&str]) -> Vec<Server> {
    (0..n).map(|_| node_args(args, extra)).collect()
}

fn node_argv<'a>(args: &'a [String], extra: &[&'a str]) -> Vec<&'a str> {
    let mut argv = vec!["--threads", "2", "--webhook-allow-private"];
    argv.extend(args.iter().map(String::as_str));
    argv.extend_from_slice(extra);
    argv
}

/// What a node that was expected to refuse to start did.
#[derive(Debug)]
pub struct Refused {
    /// How it exited.
    pub status: std::process::ExitStatus,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// Everything it wrote to stdout.
    pub stdout: String,
}

/// Runs a node with these flags (as [`node_args`] would) that must refuse to start: it must
/// exit within [`WAIT`] without listening. Fails the test if it listens (it is killed) or
/// never exits.
pub fn refused_start(args: &[String], extra: &[&str]) -> Refused {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_walletrelay"));
    refused_start_binary(bin, args, extra)
}

/// [`refused_start`] of the binary at `bin` (another build).
pub fn refused_start_binary(bin: &std::path::Path, args: &[String], extra: &[&str]) -> Refused {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(bin);
    super::limits_off(&mut cmd);
    let mut child = cmd
        .args(["--listen", "127.0.0.1:0", "--data-dir", "none"])
        .args(node_argv(args, extra))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn walletrelay");
    let drain = |mut r: Box<dyn Read + Send>| {
        let text = Arc::new(Mutex::new(String::new()));
        let keep = Arc::clone(&text);
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                keep.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        (text, t)
    };
    let (out, out_t) = drain(Box::new(child.stdout.take().expect("stdout")));
    let (err, err_t) = drain(Box::new(child.stderr.take().expect("stderr")));
    let mut status = None;
    let ended = wait_until(WAIT, || {
        if out.lock().unwrap().contains("walletrelay listening on") {
            return true;
        }
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        let _ = (out_t.join(), err_t.join());
        let err = err.lock().unwrap();
        if ended {
            panic!("the node started (it should have refused); stderr:\n{err}");
        }
        panic!("the node neither refused nor started within {WAIT:?}; stderr:\n{err}");
    }
    let _ = (out_t.join(), err_t.join());
    let (stdout, stderr) = (out.lock().unwrap().clone(), err.lock().unwrap().clone());
    Refused {
        status: status.expect("exited"),
        stderr,
        stdout,
    }
}
