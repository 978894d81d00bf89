//! The rolling upgrade of issue 55 with the real previous build (DECISIONS §7, docs/SCALING.md
//! "Upgrading"): two nodes of the previous commit (`scripts/previous-build`, Redis data layout
//! 4) behind HAProxy (Debian's package, TCP mode, `leastconn`), on a Sentinel group and on a
//! Redis Cluster, are replaced one by one by this build under load, then `walletrelay
//! switch-layout` moves the shards to layout 5.
//!
//! The previous build has no admin address, no `/ready` and no drain: HAProxy's checks ask
//! each node's traffic port for `/health` (204) and then `/ready` (204, or the previous
//! build's 404; this build's 503 while it drains), and a node of the previous build is taken
//! out with HAProxy's runtime API (`disable server`, then SIGTERM); a node of this build is
//! drained (`walletrelay drain ADMIN`, HAProxy marks it down, then SIGTERM). Either way the
//! new process starts on the same ports. Nothing acknowledged is lost:
//! - the real SDK (sign-client 2.25.0, `tests/e2e-sdk/sdk.mjs` SCENARIO=upgrade) through
//!   HAProxy: a session; the wallet goes offline and the dApp sends a request before the
//!   upgrade; the wallet gets it after, and the session still works after the switch;
//! - raw load through HAProxy: `irn_publish` and `waku_publish` on their own topics, one at a
//!   time, each publisher reconnecting through HAProxy when its node goes; subscribers on each
//!   node's own address, reconnecting to it when it comes back: every acknowledged publish is
//!   delivered to every subscriber (again after a reconnect: a new subscription gets the
//!   cache), in order and once on each connection; late subscribers on either node get the
//!   cache;
//! - a client id's mailbox: an authenticated client subscribes, goes away; what is published
//!   meanwhile (on the old build, in the mixed cluster) is served to it when it subscribes
//!   again after the switch (what 2.25.0 does on reconnect);
//! - a webhook registered on the old build (`POST /subscribe`) is still called in the mixed
//!   cluster and after the switch; a watch of a client's publishes (`irn_watchRegister`)
//!   registered on the old build (which stores registrations but sends no events) gets its
//!   events from the new nodes, signed by the key the old build showed;
//! - in the mixed cluster, what is published through the old node is delivered by the new one
//!   and the other way round, and a late subscriber on either gets the cache;
//! - each new node says `writes 4` (`/health`'s `Walletrelay-Layouts`) until the switch, then
//!   both say 5 (`walletrelay_layout_writes`), and the previous build refuses these shards.
//!
//! On the Sentinel group the rollback is tested too: once A runs this build, the previous
//! build goes back on A (before the switch) and nothing is lost either.
//!
//! Prints the figures (time per node replacement, publishes acknowledged during the upgrade,
//! lost, the SDK's reconnect times) as `rolling_upgrade: ...` lines. The first run builds the
//! previous commit (a few minutes; cached in `target/previous/`); needs the commit in the
//! clone's history (not a shallow clone), `redis-server` 7, Node.js and npm, and `haproxy`
//! (installed with apt-get when missing, as root).

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use tungstenite::Message;

use common::cluster::{read_json, refused_start_binary};
use common::durability::body;
use common::jwt::Signer;
use common::redis_topo::{free_port, RedisKind, RedisSetup};
use common::relay_auth::AuthClient;
use common::wait::{poll, wait_until};
use common::watch::{connect_as, Filter, Service};
use common::webhook::{Receiver, Reply};
use common::{http, node, Server, TempDir, Ws};

/// The SDK package whose presence means `npm ci` has run.
const MARKER: &str = "@walletconnect/sign-client";

/// Upper bound for a step that waits on HAProxy, a node's start or stop, or a delivery.
const STEP: Duration = Duration::from_secs(60);
/// The whole scenario's bound (the previous build's compilation included), far above what it
/// takes on a loaded 2-core machine (about 5 minutes): a wait that never ends fails the
/// suite rather than holding CI.
const OVERALL: Duration = Duration::from_secs(25 * 60);

/// Topics of each raw publisher.
const TOPICS_EACH: usize = 4;

/// Publishes acknowledged in each state of the cluster (old, mixed, rolled back, new).
const LOAD_STEP: usize = 100;

/// Pause between two publishes of one raw publisher (a modest rate, ~2 x 30/s).
const PACE: Duration = Duration::from_millis(30);

/// The binary of the previous layout's build, built by `scripts/previous-build` (once).
fn previous_build() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/previous-build");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/previous-build");
    assert!(
        out.status.success(),
        "scripts/previous-build failed ({}): the rolling-upgrade test needs the previous \
         layout's build (the commit named in src/layout.rs must be in this clone's history: \
         `git fetch --unshallow` on a shallow clone); see its message above",
        out.status
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        path.is_file(),
        "scripts/previous-build printed {path:?}, not a file"
    );
    path
}

/// This build.
fn new_build() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_walletrelay"))
}

// ---------------------------------------------------------------------------------------------
// HAProxy

/// HAProxy in front of the two nodes, in a temporary directory; killed on drop.
struct Haproxy {
    /// Its relay port on 127.0.0.1.
    addr: SocketAddr,
    /// Its runtime API (`stats socket ... level admin`).
    sock: PathBuf,
    child: Child,
    _dir: TempDir,
}

impl Haproxy {
    /// Starts HAProxy on a free loopback port before `servers`: (name, port) each.
    ///
    /// The checks are those of a fleet that mixes the two builds: the previous one has no
    /// admin address, no `/ready` and no drain (404), only `/health` on its traffic port. So
    /// each check asks the traffic port for `/health` (204: the node can store) and then
    /// `/ready` (204, or 404 from a build without it; 503 while this build drains).
    fn start(servers: &[(&str, u16)]) -> Haproxy {
        let bin = common::apt::tool("haproxy", "haproxy")
            .unwrap_or_else(|e| panic!("the rolling-upgrade test needs HAProxy: {e}"));
        let dir = TempDir::new("rolling-haproxy");
        for _ in 0..5 {
            let (port, stats) = (free_port(), free_port());
            let backends: String = servers
                .iter()
                .map(|(name, p)| format!("    server {name} 127.0.0.1:{p} check\n"))
                .collect();
            // As deploy/haproxy.cfg, with quicker checks and everything on loopback.
            let sock = dir.join("admin.sock");
            let cfg = format!(
                "global\n    maxconn 2000\n    stats socket {} level admin\n\
                 defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 75s\n\
                 \x20   timeout server 75s\n    timeout tunnel 1h\n    timeout client-fin 10s\n\
                 \x20   timeout server-fin 10s\n    retries 3\n    option redispatch 1\n\
                 frontend relay\n    bind 127.0.0.1:{port}\n    default_backend walletrelay\n\
                 backend walletrelay\n    balance leastconn\n    option httpchk\n\
                 \x20   http-check connect\n\
                 \x20   http-check send meth GET uri /health ver HTTP/1.1 hdr Host walletrelay\n\
                 \x20   http-check expect status 204\n\
                 \x20   http-check connect\n\
                 \x20   http-check send meth GET uri /ready ver HTTP/1.1 hdr Host walletrelay\n\
                 \x20   http-check expect rstatus ^(204|404)$\n\
                 \x20   default-server inter 300ms fall 2 rise 2\n{backends}\
                 frontend stats\n    mode http\n    bind 127.0.0.1:{stats}\n\
                 \x20   timeout client 10s\n    stats enable\n    stats uri /stats\n",
                sock.display()
            );
            let path = dir.join("haproxy.cfg");
            std::fs::write(&path, cfg).expect("write haproxy.cfg");
            let mut child = Command::new(&bin)
                .args(["-db", "-f"])
                .arg(&path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn haproxy");
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let stats: SocketAddr = ([127, 0, 0, 1], stats).into();
            let up = poll(Duration::from_secs(10), || {
                if let Ok(Some(_)) = child.try_wait() {
                    return Some(false);
                }
                (TcpStream::connect(addr).is_ok()
                    && TcpStream::connect(stats).is_ok()
                    && sock.exists())
                .then_some(true)
            });
            if up == Some(true) {
                return Haproxy {
                    addr,
                    sock,
                    child,
                    _dir: dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("haproxy did not start on a free loopback port (5 tries)");
    }

    /// Its view of the servers: name -> status (`UP`, `DOWN`, `MAINT`, `UP 1/2`...), from
    /// `show stat` on its runtime API.
    fn servers(&self) -> HashMap<String, String> {
        let mut out = HashMap::new();
        let text = self.command("show stat");
        let mut lines = text.lines();
        let Some(head) = lines.next() else {
            return out;
        };
        let cols: Vec<&str> = head.trim_start_matches("# ").split(',').collect();
        let (Some(px), Some(sv), Some(st)) = (
            cols.iter().position(|c| *c == "pxname"),
            cols.iter().position(|c| *c == "svname"),
            cols.iter().position(|c| *c == "status"),
        ) else {
            return out;
        };
        for l in lines {
            let f: Vec<&str> = l.split(',').collect();
            if f.get(px) == Some(&"walletrelay") {
                if let (Some(name), Some(status)) = (f.get(sv), f.get(st)) {
                    out.insert(name.to_string(), status.to_string());
                }
            }
        }
        out
    }

    /// A command on its runtime API (`disable server walletrelay/a`); its answer.
    fn command(&self, cmd: &str) -> String {
        let mut s = std::os::unix::net::UnixStream::connect(&self.sock)
            .unwrap_or_else(|e| panic!("HAProxy's runtime API {:?}: {e}", self.sock));
        s.write_all(format!("{cmd}\n").as_bytes())
            .expect("write to HAProxy");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// Waits until HAProxy's checks say `status` (`UP` or `DOWN`, exactly) of `name`.
    fn wait_status(&self, name: &str, status: &str) {
        let ok = wait_until(STEP, || {
            self.servers().get(name).map(String::as_str) == Some(status)
        });
        assert!(
            ok,
            "HAProxy never saw {name} {status} within {STEP:?}: {:?}",
            self.servers()
        );
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The nodes

/// One node's place behind HAProxy: its fixed ports and the process running there. This
/// build runs with an admin address and `--drain 2`; the previous one has neither.
struct Slot {
    name: &'static str,
    port: u16,
    /// This build's admin address.
    admin: u16,
    redis: Vec<String>,
    server: Option<Server>,
    /// Which build runs there.
    bin: PathBuf,
}

impl Slot {
    fn new(name: &'static str, redis: &[String]) -> Slot {
        Slot {
            name,
            port: free_port(),
            admin: free_port(),
            redis: redis.to_vec(),
            server: None,
            bin: PathBuf::new(),
        }
    }

    fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    fn server(&self) -> &Server {
        self.server.as_ref().expect("the node runs")
    }

    /// Whether this build runs there (else the previous one).
    fn is_new(&self) -> bool {
        self.bin == new_build()
    }

    /// Starts `bin` on the slot's ports.
    fn start(&mut self, bin: &Path) {
        assert!(self.server.is_none(), "{} already runs", self.name);
        let (listen, admin) = (
            format!("127.0.0.1:{}", self.port),
            format!("127.0.0.1:{}", self.admin),
        );
        let mut args = vec![
            "--threads",
            "2",
            "--webhook-allow-private",
            "--listen",
            listen.as_str(),
        ];
        if bin == new_build() {
            args.extend(["--admin-listen", admin.as_str(), "--drain", "2"]);
        }
        args.extend(self.redis.iter().map(String::as_str));
        self.server = Some(Server::start_binary(bin, &args, &[]));
        self.bin = bin.to_path_buf();
    }

    /// Takes the node out of HAProxy and stops it (SIGTERM), then waits until its ports are
    /// free. This build drains (`walletrelay drain ADMIN`: HAProxy's check on `/ready` marks
    /// it down); the previous build has no drain, so it is put in maintenance on HAProxy's
    /// runtime API (`disable server`), as an operator would (true when so).
    fn stop(&mut self, lb: &Haproxy) -> bool {
        let disabled = !self.is_new();
        if disabled {
            let said = lb.command(&format!("disable server walletrelay/{}", self.name));
            assert!(said.trim().is_empty(), "HAProxy: disable server: {said}");
            lb.wait_status(self.name, "MAINT");
        } else {
            self.drain(lb);
        }
        self.sigterm();
        disabled
    }

    /// `walletrelay drain ADMIN`, and HAProxy marking the node down meanwhile.
    fn drain(&self, lb: &Haproxy) {
        let admin = format!("127.0.0.1:{}", self.admin);
        let mut drain = Command::new(new_build())
            .args(["drain", admin.as_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn walletrelay drain");
        lb.wait_status(self.name, "DOWN");
        let status = poll(STEP, || drain.try_wait().expect("wait for drain"))
            .unwrap_or_else(|| panic!("`walletrelay drain {admin}` did not end within {STEP:?}"));
        assert!(status.success(), "`walletrelay drain {admin}`: {status}");
    }

    /// SIGTERM; waits for the exit and for the ports to be free.
    fn sigterm(&mut self) {
        let mut s = self.server.take().expect("the node runs");
        s.signal(libc::SIGTERM);
        let exit = poll(STEP, || s.child.try_wait().expect("wait"));
        let exit = exit.unwrap_or_else(|| panic!("{} did not exit after SIGTERM", self.name));
        assert!(exit.success(), "{} exited {exit} after SIGTERM", self.name);
        for port in [self.port, self.admin] {
            let free = || std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
            assert!(wait_until(STEP, free), "port {port} still taken");
        }
    }

    /// Replaces the node by `bin` (see [`Slot::stop`]) and waits until HAProxy has it up;
    /// returns how long it took.
    fn replace(&mut self, lb: &Haproxy, bin: &Path) -> Duration {
        let t0 = Instant::now();
        let disabled = self.stop(lb);
        self.start(bin);
        // Ready by its own word before HAProxy is told (or finds) so.
        let ready = if self.is_new() { "/ready" } else { "/health" };
        let ok = wait_until(STEP, || self.admin_get(ready).status == 204);
        assert!(
            ok,
            "{}: {ready} never answered 204 after the start",
            self.name
        );
        if disabled {
            let said = lb.command(&format!("enable server walletrelay/{}", self.name));
            assert!(said.trim().is_empty(), "HAProxy: enable server: {said}");
        }
        lb.wait_status(self.name, "UP");
        t0.elapsed()
    }

    /// `GET path` on its admin address (this build), or its traffic port (the previous
    /// build, which serves `/metrics` and `/health` there).
    fn admin_get(&self, path: &str) -> http::Resp {
        let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        if self.is_new() {
            self.server().admin_request(&req)
        } else {
            self.server().request(&req)
        }
    }

    /// A metric of its `/metrics`, summed over its series (`None` if it did not answer).
    fn metric(&self, name: &str) -> Option<f64> {
        let r = self.admin_get("/metrics");
        (r.status == 200).then(|| common::metrics::sum(r.body_str(), name))
    }

    /// `/health`'s `Walletrelay-Layouts` header.
    fn layouts(&self) -> String {
        let r = self.admin_get("/health");
        r.header("Walletrelay-Layouts")
            .unwrap_or_else(|| panic!("{}: no Walletrelay-Layouts header: {r:?}", self.name))
            .to_string()
    }

    /// `walletrelay_layout_writes{layout="redis"}` of its `/metrics`.
    fn redis_writes(&self) -> Option<f64> {
        let r = self.admin_get("/metrics");
        (r.status == 200)
            .then(|| {
                common::metrics::series(r.body_str(), "walletrelay_layout_writes{layout=\"redis\"}")
            })
            .flatten()
    }
}

// ---------------------------------------------------------------------------------------------
// Raw clients that reconnect

/// A WebSocket to `addr`, or why not (no panic: the node may be gone).
fn try_ws(addr: SocketAddr) -> Result<Ws, String> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    Ws::try_handshake(s, &format!("ws://{addr}/?projectId=p"), &[])
}

/// The protocol of a publisher's topics and their subscriptions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    /// `irn_publish` / `irn_subscribe` / `irn_subscription` (today's SDK).
    Irn,
    /// `waku_publish` / `waku_subscribe` / `waku_subscription`.
    Waku,
}

impl Proto {
    fn publish(self) -> &'static str {
        match self {
            Proto::Irn => "irn_publish",
            Proto::Waku => "waku_publish",
        }
    }
    fn subscribe(self) -> &'static str {
        match self {
            Proto::Irn => "irn_subscribe",
            Proto::Waku => "waku_subscribe",
        }
    }
}

/// What a raw publisher did, per topic: every message sent and those answered `true`.
#[derive(Debug, Default, Clone)]
struct Published {
    topics: Vec<String>,
    sent: Vec<Vec<String>>,
    acked: Vec<Vec<String>>,
    /// Error answers, as received.
    errors: Vec<Value>,
    /// Connections it opened (1 + its reconnects).
    connections: usize,
}

/// A publisher on `addr` (HAProxy) that publishes on its topics in turn, one at a time,
/// reconnecting when its connection dies, until stopped.
struct Publisher {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    thread: Option<JoinHandle<Published>>,
}

impl Publisher {
    fn start(addr: SocketAddr, p: usize, proto: Proto, topics: Vec<String>) -> Publisher {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let (stop2, acked2) = (Arc::clone(&stop), Arc::clone(&acked));
        let thread = std::thread::spawn(move || {
            let n = topics.len();
            let mut out = Published {
                sent: vec![Vec::new(); n],
                acked: vec![Vec::new(); n],
                topics,
                ..Published::default()
            };
            let mut next = 0usize;
            let mut id = 1_000_000u64;
            'connect: while !stop2.load(Ordering::Relaxed) {
                let Ok(mut ws) = try_ws(addr) else {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                out.connections += 1;
                while !stop2.load(Ordering::Relaxed) {
                    let (t, k) = (next % n, next / n);
                    next += 1;
                    id += 1;
                    let plain = body(p, t, k, 64);
                    let msg = match proto {
                        Proto::Irn => base64::engine::general_purpose::STANDARD.encode(&plain),
                        Proto::Waku => plain,
                    };
                    let mut params = json!({"topic": out.topics[t], "message": msg, "ttl": 3600});
                    if proto == Proto::Irn {
                        params["tag"] = json!(1100);
                        params["prompt"] = json!(false);
                    }
                    let req = json!({"id": id, "jsonrpc": "2.0", "method": proto.publish(),
                        "params": params});
                    out.sent[t].push(msg.clone());
                    if ws.sock.send(Message::text(req.to_string())).is_err() {
                        std::thread::sleep(Duration::from_millis(100));
                        continue 'connect;
                    }
                    // A live connection answers within STEP (the server's pings do not
                    // count); past it the publish is reported, never waited for forever.
                    let asked = Instant::now();
                    let answer = loop {
                        match read_json(&mut ws) {
                            Ok(Some(v)) if v["id"] == id => break v,
                            Ok(_) if asked.elapsed() < STEP => {}
                            Ok(_) => {
                                out.errors
                                    .push(json!({"unanswered": req, "within": STEP.as_secs()}));
                                continue 'connect;
                            }
                            Err(_) => continue 'connect, // no answer: not acknowledged
                        }
                    };
                    if answer["result"] == true {
                        out.acked[t].push(msg);
                        acked2.fetch_add(1, Ordering::Relaxed);
                    } else {
                        out.errors.push(answer);
                    }
                    std::thread::sleep(PACE);
                }
            }
            out
        });
        Publisher {
            stop,
            acked,
            thread: Some(thread),
        }
    }

    fn acked(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }

    fn finish(mut self) -> Published {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("publisher thread")
    }
}

/// One delivery a [`Subscriber`] saw: (connection number, topic, message).
type Delivery = (usize, String, String);

/// A subscriber of `topics` on one node's own address that reconnects (and subscribes
/// again) whenever its connection dies, until stopped.
struct Subscriber {
    stop: Arc<AtomicBool>,
    got: Arc<Mutex<Vec<Delivery>>>,
    /// The connection whose subscriptions are all answered (0: none yet).
    live: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Subscriber {
    fn start(addr: SocketAddr, topics: Vec<(Proto, String)>) -> Subscriber {
        let stop = Arc::new(AtomicBool::new(false));
        let got = Arc::new(Mutex::new(Vec::new()));
        let live = Arc::new(AtomicUsize::new(0));
        let (stop2, got2, live2) = (Arc::clone(&stop), Arc::clone(&got), Arc::clone(&live));
        let thread = std::thread::spawn(move || {
            let mut conn = 0usize;
            'connect: while !stop2.load(Ordering::Relaxed) {
                let Ok(mut ws) = try_ws(addr) else {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                conn += 1;
                for (i, (proto, t)) in topics.iter().enumerate() {
                    let req = json!({"id": i + 1, "jsonrpc": "2.0", "method": proto.subscribe(),
                        "params": {"topic": t}});
                    if ws.sock.send(Message::text(req.to_string())).is_err() {
                        continue 'connect;
                    }
                }
                let mut answered = 0;
                while !stop2.load(Ordering::Relaxed) {
                    let v = match read_json(&mut ws) {
                        Ok(Some(v)) => v,
                        Ok(None) => continue,
                        Err(_) => continue 'connect,
                    };
                    let method = v["method"].as_str().unwrap_or("");
                    if method == "irn_subscription" || method == "waku_subscription" {
                        let d = &v["params"]["data"];
                        let (t, m) = (d["topic"].as_str(), d["message"].as_str());
                        got2.lock().unwrap().push((
                            conn,
                            t.expect("topic").to_string(),
                            m.expect("message").to_string(),
                        ));
                        let ack = json!({"id": v["id"], "jsonrpc": "2.0", "result": true});
                        let _ = ws.sock.send(Message::text(ack.to_string()));
                    } else if v.get("result").is_some_and(Value::is_string) {
                        answered += 1;
                        if answered == topics.len() {
                            live2.store(conn, Ordering::SeqCst);
                        }
                    } else {
                        // A refused subscription (a node not ready yet): again, anew.
                        eprintln!("subscriber on {addr}: {v}; connecting again");
                        std::thread::sleep(Duration::from_millis(200));
                        continue 'connect;
                    }
                }
            }
        });
        Subscriber {
            stop,
            got,
            live,
            thread: Some(thread),
        }
    }

    /// Waits until a connection of its is subscribed to everything.
    fn wait_live(&self, who: &str) {
        let ok = wait_until(STEP, || self.live.load(Ordering::SeqCst) > 0);
        assert!(ok, "{who}: never subscribed within {STEP:?}");
    }

    fn got(&self) -> Vec<Delivery> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until every message of `want` (topic, message) was delivered at least once.
    fn wait_all(&self, who: &str, want: &[(String, String)]) {
        let missing = || -> Vec<(String, String)> {
            let got = self.got();
            let have: std::collections::HashSet<(&str, &str)> = got
                .iter()
                .map(|(_, t, m)| (t.as_str(), m.as_str()))
                .collect();
            want.iter()
                .filter(|(t, m)| !have.contains(&(t.as_str(), m.as_str())))
                .cloned()
                .collect()
        };
        if wait_until(STEP, || missing().is_empty()) {
            return;
        }
        let m = missing();
        panic!(
            "{who}: {} of {} acknowledged messages never delivered, first {:?}",
            m.len(),
            want.len(),
            &m[..m.len().min(5)]
        );
    }

    fn finish(mut self) -> Vec<Delivery> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("subscriber thread");
        }
        std::mem::take(&mut *self.got.lock().unwrap())
    }
}

/// What one subscriber got against what was published: every acknowledged message at least
/// once; on each connection nothing twice and each topic in the order sent; nothing that
/// was never sent.
fn check_deliveries(who: &str, got: &[Delivery], published: &[Published]) -> usize {
    let mut rank: HashMap<(&str, &str), usize> = HashMap::new();
    let mut acked: Vec<(&str, &str)> = Vec::new();
    for p in published {
        for (i, t) in p.topics.iter().enumerate() {
            for (k, m) in p.sent[i].iter().enumerate() {
                rank.insert((t.as_str(), m.as_str()), k);
            }
            acked.extend(p.acked[i].iter().map(|m| (t.as_str(), m.as_str())));
        }
    }
    let mut last: HashMap<(usize, &str), usize> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut connections = std::collections::HashSet::new();
    for (conn, t, m) in got {
        connections.insert(*conn);
        let r = *rank
            .get(&(t.as_str(), m.as_str()))
            .unwrap_or_else(|| panic!("{who}: {m:?} on {t} was never sent"));
        if let Some(&prev) = last.get(&(*conn, t.as_str())) {
            assert!(
                r > prev,
                "{who}: on connection {conn}, {m:?} on {t} came twice or out of order \
                 (position {r} after {prev})"
            );
        }
        last.insert((*conn, t.as_str()), r);
        seen.insert((t.as_str(), m.as_str()));
    }
    let missing: Vec<_> = acked.iter().filter(|a| !seen.contains(*a)).collect();
    assert!(
        missing.is_empty(),
        "{who}: {} of {} acknowledged publishes never delivered (LOST), first {:?}",
        missing.len(),
        acked.len(),
        missing.first()
    );
    connections.len()
}

/// A late subscriber's view of `topic` on `s`: the cached history read up to a marker, as
/// [`common::durability::history`], for either protocol. Every acknowledged message must be
/// there, in the order sent, once; messages sent but not answered may be there too.
fn check_cache(
    who: &str,
    s: &Server,
    proto: Proto,
    topic: &str,
    sent: &[String],
    acked: &[String],
) {
    let marker = format!("marker-{}", common::topic());
    let mut sub = try_ws(s.addr).unwrap_or_else(|e| panic!("{who}: connect: {e}"));
    sub.sock
        .get_ref()
        .set_read_timeout(Some(common::READ_TIMEOUT))
        .unwrap();
    let r = sub.call(proto.subscribe(), json!({ "topic": topic }));
    assert!(r["result"].is_string(), "{who}: subscribe: {r}");
    let mut publ = try_ws(s.addr).unwrap_or_else(|e| panic!("{who}: connect: {e}"));
    publ.sock
        .get_ref()
        .set_read_timeout(Some(common::READ_TIMEOUT))
        .unwrap();
    let mut params = json!({"topic": topic, "message": marker, "ttl": 3600});
    if proto == Proto::Irn {
        params["tag"] = json!(1100);
    }
    let r = publ.call(proto.publish(), params);
    assert_eq!(r["result"], true, "{who}: marker publish: {r}");
    let mut got = Vec::new();
    loop {
        let v = sub.recv();
        let m = v["params"]["data"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{who}: not a push: {v}"))
            .to_string();
        sub.send(&json!({"id": v["id"], "jsonrpc": "2.0", "result": true}));
        if m == marker {
            break;
        }
        if !m.starts_with("marker-") {
            got.push(m); // (earlier markers are part of the history too)
        }
    }
    common::durability::check_history(topic, &got, sent, acked);
}

/// In the cluster as it is now: a message published directly on `from` reaches a fresh
/// subscriber on `to` (live), and a late subscriber on `to` gets it from the cache.
fn cross_check(what: &str, from: &Slot, to: &Slot) {
    let topic = common::topic();
    let mut sub = to.server().ws();
    sub.subscribe(&topic);
    let mut publ = from.server().ws();
    let m = format!("{what}: {} -> {}", from.name, to.name);
    publ.publish(&topic, &m);
    let (_, t, got) = sub.next_push();
    assert_eq!(
        (t.as_str(), got.as_str()),
        (topic.as_str(), m.as_str()),
        "{what}"
    );
    let mut late = to.server().ws();
    late.subscribe(&topic);
    let (_, t, got) = late.next_push();
    assert_eq!(
        (t.as_str(), got.as_str()),
        (topic.as_str(), m.as_str()),
        "{what}: a late subscriber on {} gets the cache",
        to.name
    );
}

// ---------------------------------------------------------------------------------------------
// The SDK

/// The SDK scenario running on its own thread; its stdout lines come on `lines`, and a line
/// sent on `replies` answers the one that asked (`WALLET_OFFLINE`, `READY_FOR_SWITCH`).
struct Sdk {
    lines: mpsc::Receiver<String>,
    replies: mpsc::Sender<String>,
    thread: Option<JoinHandle<String>>,
}

impl Sdk {
    fn start(url: String) -> Sdk {
        node::ensure_node_modules("e2e-sdk", MARKER);
        let (tx, lines) = mpsc::channel::<String>();
        let (replies, rx) = mpsc::channel::<String>();
        let thread = std::thread::spawn(move || {
            node::run_script_interactive(
                "e2e-sdk",
                "sdk.mjs",
                &[
                    ("SCENARIO", "upgrade"),
                    ("RELAY_URL", url.as_str()),
                    ("E2E_TIMEOUT_MS", "540000"),
                    ("OFFLINE_MS", "280000"),
                ],
                Duration::from_secs(600),
                &format!("SCENARIO=upgrade through HAProxy {url}"),
                |line| {
                    let _ = tx.send(line.to_string());
                    let asks = line == "WALLET_OFFLINE" || line == "READY_FOR_SWITCH";
                    asks.then(|| rx.recv().ok()).flatten()
                },
            )
        });
        Sdk {
            lines,
            replies,
            thread: Some(thread),
        }
    }

    /// Waits for the line `want` (other lines are kept in `seen`).
    fn wait_line(&self, want: &str, within: Duration, seen: &mut Vec<String>) {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let done = l == want;
                    seen.push(l);
                    if done {
                        return;
                    }
                }
                Err(_) => panic!(
                    "the SDK script never printed {want} within {within:?} (it failed or \
                     hangs: its output comes with the test's failure once it ends)"
                ),
            }
        }
    }

    fn reply(&self, line: &str) {
        self.replies
            .send(line.to_string())
            .expect("the SDK script is gone");
    }

    /// Waits for the script to pass; all it printed.
    fn finish(mut self) -> String {
        self.thread
            .take()
            .expect("running")
            .join()
            .unwrap_or_else(|_| panic!("the SDK scenario failed (its output is above)"))
    }
}

// ---------------------------------------------------------------------------------------------
// The scenario

fn upgrade(kind: RedisKind, rollback: bool) {
    let _bound = common::wait::watchdog(OVERALL, &format!("rolling_upgrade {kind:?}"));
    let old_bin = previous_build();
    let new_bin = new_build();
    let what = format!("{kind:?}");
    let setup = RedisSetup::start(kind);
    let redis = setup.redis_args();
    let mut a = Slot::new("a", &redis);
    let mut b = Slot::new("b", &redis);
    a.start(&old_bin);
    b.start(&old_bin);
    for s in [&a, &b] {
        let l = s.layouts_or_none();
        assert!(
            l.is_none(),
            "{what}: the previous build has no layout header: {l:?}"
        );
    }
    let lb = Haproxy::start(&[("a", a.port), ("b", b.port)]);
    lb.wait_status("a", "UP");
    lb.wait_status("b", "UP");

    // (a) The SDK: a session, the wallet offline with a request waiting for it.
    let sdk = Sdk::start(format!("ws://{}", lb.addr));
    let mut sdk_lines = Vec::new();
    sdk.wait_line("WALLET_OFFLINE", Duration::from_secs(180), &mut sdk_lines);

    // (c) A client id's mailbox: subscribed, away, published to meanwhile on the old build.
    let wallet = AuthClient::new();
    let mbox = common::topic();
    let open = |s: &Slot| s.metric("walletrelay_websockets_open");
    let open_before = open(&b);
    {
        let mut w = wallet.connect(b.addr());
        let r = w.call("irn_subscribe", json!({ "topic": mbox }));
        assert!(r["result"].is_string(), "{r}");
        irn_publish(lb.addr, &mbox, "mbox-1");
        let m = w.recv();
        assert_eq!(m["params"]["data"]["message"], "mbox-1", "{m}");
        w.send(&json!({"id": m["id"], "jsonrpc": "2.0", "result": true}));
    }
    let gone = wait_until(STEP, || open(&b) <= open_before);
    assert!(
        gone,
        "{what}: the mailbox client's socket is still open on b ({:?} open, {open_before:?} before)",
        open(&b)
    );
    irn_publish(lb.addr, &mbox, "mbox-2");

    // (d) A webhook registered on the old build.
    let hook = Receiver::start(|_| Reply::Status(200));
    let hook_topic = common::topic();
    let (st, body) = a.server().register_webhook(&hook_topic, &hook.url("/push"));
    assert_eq!(
        st, 200,
        "{what}: POST /subscribe on the previous build: {body}"
    );
    let mut hooked = 0;
    webhook_called(&hook, &hook_topic, lb.addr, "before", &mut hooked);
    // ... and a watch of a client's publishes, registered on the old build (which keeps
    // registrations in Redis but sends no events yet: that came after it), called by the
    // new nodes; its events are JWTs checked against the old build's `/public-key` (the key
    // the cluster shares).
    let watch = Service::ok(a.server());
    let watched = Signer::random();
    let publisher = Filter {
        typ: "publisher",
        sts: &["accepted"],
        tag: &[],
    };
    watch.register(&mut a.server().ws(), &watched, 0, publisher);
    let watch_topic = common::topic();
    for s in [&a, &b] {
        let known = wait_until(STEP, || s.metric("walletrelay_watches") == Some(1.0));
        assert!(
            known,
            "{what}: {} does not have the watch registration",
            s.name
        );
    }

    // (b) Raw load through HAProxy, subscribers on each node's own address.
    let topics = |_| {
        (0..TOPICS_EACH)
            .map(|_| common::topic())
            .collect::<Vec<_>>()
    };
    let (irn_topics, waku_topics): (Vec<String>, Vec<String>) = (topics(0), topics(1));
    let all: Vec<(Proto, String)> = irn_topics
        .iter()
        .map(|t| (Proto::Irn, t.clone()))
        .chain(waku_topics.iter().map(|t| (Proto::Waku, t.clone())))
        .collect();
    let subs = [
        ("subscriber on a", Subscriber::start(a.addr(), all.clone())),
        ("subscriber on b", Subscriber::start(b.addr(), all.clone())),
    ];
    for (who, s) in &subs {
        s.wait_live(who);
    }
    let pubs = [
        Publisher::start(lb.addr, 0, Proto::Irn, irn_topics.clone()),
        Publisher::start(lb.addr, 1, Proto::Waku, waku_topics.clone()),
    ];
    let acked = || pubs.iter().map(Publisher::acked).sum::<usize>();
    // After each replacement the load goes on through the cluster as it is then.
    let more_load = |when: &str| {
        let from = acked();
        assert!(
            wait_until(STEP, || acked() >= from + LOAD_STEP),
            "{what}: the load stalled {when} ({} acked, {from} before)",
            acked()
        );
    };
    assert!(
        wait_until(STEP, || acked() >= 50),
        "{what}: the load never got going through HAProxy ({} acked)",
        acked()
    );
    let acked_before = acked();
    let upgrade_began = Instant::now();
    let mut replaced = Vec::new();

    // A: old -> new. The mixed cluster.
    replaced.push(("a old->new", a.replace(&lb, &new_bin)));
    more_load("after a old -> new");
    mixed_checks(&what, &a, &b, lb.addr, &mbox, "mbox-3");
    webhook_called(&hook, &hook_topic, lb.addr, "a new, b old", &mut hooked);
    watch_event(&watch, &watched, &a, &watch_topic, "a new, b old: on a");

    if rollback {
        // Back: A new -> old (before the switch nothing is lost), then forward again.
        replaced.push(("a new->old (rollback)", a.replace(&lb, &old_bin)));
        more_load("after a new -> old (rollback)");
        assert!(
            a.layouts_or_none().is_none(),
            "{what}: a runs the previous build again"
        );
        cross_check("rolled back", &a, &b);
        cross_check("rolled back", &b, &a);
        webhook_called(&hook, &hook_topic, lb.addr, "rolled back", &mut hooked);
        replaced.push(("a old->new (again)", a.replace(&lb, &new_bin)));
        more_load("after a old -> new (again)");
        mixed_checks(&what, &a, &b, lb.addr, &mbox, "mbox-4");
    }

    // B: old -> new.
    replaced.push(("b old->new", b.replace(&lb, &new_bin)));
    more_load("after b old -> new");
    for s in [&a, &b] {
        assert!(
            s.layouts().contains("redis reads 4-5 writes 4;"),
            "{what}: {} before the switch: {}",
            s.name,
            s.layouts()
        );
    }
    cross_check("both new", &a, &b);
    cross_check("both new", &b, &a);
    let upgrade_took = upgrade_began.elapsed();
    let acked_during = acked() - acked_before;

    // The SDK's wallet comes back and gets its request; a second request.
    sdk.reply("UPGRADED");
    sdk.wait_line("READY_FOR_SWITCH", Duration::from_secs(120), &mut sdk_lines);

    // The switch, with the load still on.
    let admin = format!("127.0.0.1:{}", a.admin);
    let out = Command::new(&new_bin)
        .args(["switch-layout", admin.as_str()])
        .output()
        .expect("run walletrelay switch-layout");
    assert!(
        out.status.success(),
        "{what}: walletrelay switch-layout {admin}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for s in [&a, &b] {
        let five = wait_until(STEP, || s.redis_writes() == Some(5.0));
        assert!(
            five,
            "{what}: {} still writes layout {:?} after the switch",
            s.name,
            s.redis_writes()
        );
        assert!(s.layouts().contains("writes 5;"), "{what}: {}", s.layouts());
    }
    let refused = refused_start_binary(&old_bin, &redis, &[]);
    assert!(
        !refused.status.success(),
        "{what}: the previous build on switched shards: {refused:?}"
    );
    println!(
        "rolling_upgrade {what}: the previous build refused the switched shards ({}): {}",
        refused.status,
        refused.stderr.lines().last().unwrap_or_default()
    );
    cross_check("switched", &a, &b);
    cross_check("switched", &b, &a);
    sdk.reply("SWITCHED");
    webhook_called(&hook, &hook_topic, lb.addr, "after the switch", &mut hooked);
    watch_event(&watch, &watched, &a, &watch_topic, "after the switch: on a");
    watch_event(&watch, &watched, &b, &watch_topic, "after the switch: on b");

    // The mailbox: subscribing again (2.25.0's reconnect) serves what came while it was away
    // (on layout 4 the cluster kept no client-id subscription: the cache serves it, mbox-1
    // too, which the SDK drops as a message it has); then once more on layout 5.
    let mut want = vec!["mbox-2", "mbox-3"];
    if rollback {
        want.push("mbox-4");
    }
    let served = mailbox_serves(&wallet, lb.addr, &mbox, &want, &what);
    irn_publish(lb.addr, &mbox, "mbox-5");
    let served_again = mailbox_serves(&wallet, lb.addr, &mbox, &["mbox-5"], &what);
    println!(
        "rolling_upgrade {what}: the mailbox served {served:?} after the switch, then \
         {served_again:?}"
    );

    // A while more of load on layout 5, then stop it.
    let at_switch = acked();
    assert!(
        wait_until(STEP, || acked() >= at_switch + 50),
        "{what}: the load stalled after the switch"
    );
    let published: Vec<Published> = pubs.into_iter().map(Publisher::finish).collect();
    let mut want = Vec::new();
    for p in &published {
        assert!(
            p.errors.is_empty(),
            "{what}: publishes answered an error: {:?}",
            p.errors
        );
        for (i, t) in p.topics.iter().enumerate() {
            want.extend(p.acked[i].iter().map(|m| (t.clone(), m.clone())));
        }
    }
    let mut connections = Vec::new();
    for (who, s) in subs {
        s.wait_all(who, &want);
        let got = s.finish();
        connections.push(check_deliveries(who, &got, &published));
    }
    // Late subscribers on either node get every topic's cache.
    for s in [&a, &b] {
        for p in &published {
            let proto = if p.topics == irn_topics {
                Proto::Irn
            } else {
                Proto::Waku
            };
            for (i, t) in p.topics.iter().enumerate() {
                let who = format!("{what}: a late subscriber on {}", s.name);
                check_cache(&who, s.server(), proto, t, &p.sent[i], &p.acked[i]);
            }
        }
    }
    let sdk_out = sdk.finish();
    let reconnects: Vec<&str> = sdk_out
        .lines()
        .filter(|l| l.starts_with("RECONNECTED "))
        .collect();
    assert_eq!(
        hooked,
        3 + usize::from(rollback),
        "{what}: the webhook calls (one per check)"
    );

    let total: usize = published
        .iter()
        .map(|p| p.acked.iter().map(Vec::len).sum::<usize>())
        .sum();
    let sent: usize = published
        .iter()
        .map(|p| p.sent.iter().map(Vec::len).sum::<usize>())
        .sum();
    let reconnects_of: usize = published.iter().map(|p| p.connections).sum();
    println!(
        "rolling_upgrade {what}: replacements {:?}; upgrade (first drain to both new) {:.1} s; \
         publishes acked during the upgrade {acked_during}, in all {total} of {sent} sent \
         (the rest cut unanswered with their node), lost 0; \
         publisher connections {reconnects_of}, subscriber connections {connections:?}; \
         SDK reconnects (ms) {reconnects:?}",
        replaced
            .iter()
            .map(|(w, d)| format!("{w} {:.1} s", d.as_secs_f64()))
            .collect::<Vec<_>>(),
        upgrade_took.as_secs_f64()
    );
}

/// `wallet` connects through `lb` and subscribes to `topic` again (`irn_batchSubscribe`, as
/// 2.25.0 does on reconnect): every message of `want` must be pushed; returns all that was
/// pushed until then (each acknowledged as the SDK does).
fn mailbox_serves(
    wallet: &AuthClient,
    lb: SocketAddr,
    topic: &str,
    want: &[&str],
    what: &str,
) -> Vec<String> {
    let mut w = wallet.connect(lb);
    // Pushes may come before the answer: read them all in one loop.
    w.send(
        &json!({"id": 7, "jsonrpc": "2.0", "method": "irn_batchSubscribe",
        "params": {"topics": [topic]}}),
    );
    let mut got = Vec::new();
    let end = Instant::now() + STEP;
    while !want.iter().all(|m| got.iter().any(|g: &String| g == m)) {
        let left = end.saturating_duration_since(Instant::now());
        let m = w.recv_within(left.as_millis() as u64).unwrap_or_else(|| {
            panic!("{what}: the mailbox served only {got:?} of {want:?} within {STEP:?} (LOST)")
        });
        if m["id"] == 7 {
            assert!(m["result"].is_array(), "{what}: irn_batchSubscribe: {m}");
            continue;
        }
        assert_eq!(m["method"], "irn_subscription", "{m}");
        w.send(&json!({"id": m["id"], "jsonrpc": "2.0", "result": true}));
        got.push(m["params"]["data"]["message"].as_str().unwrap().to_string());
    }
    got
}

/// An `irn_publish` answered `true`.
fn irn_publish(at: SocketAddr, topic: &str, message: &str) {
    let r = Ws::connect(at).call(
        "irn_publish",
        json!({"topic": topic, "message": message, "ttl": 3600, "tag": 1100}),
    );
    assert_eq!(r["result"], true, "{r}");
}

/// A publish on the webhook's topic reaches the webhook (one POST naming the topic).
fn webhook_called(hook: &Receiver, topic: &str, at: SocketAddr, when: &str, n: &mut usize) {
    let m = format!("hook-{when}");
    let r = Ws::connect(at).call(
        "waku_publish",
        json!({"topic": topic, "message": m, "ttl": 3600}),
    );
    assert_eq!(r["result"], true, "{when}: {r}");
    let end = Instant::now() + STEP;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let seen = hook.next(left).unwrap_or_else(|| {
            panic!("the webhook registered on the previous build was not called {when}")
        });
        let v: Value = serde_json::from_slice(&seen.body).expect("JSON webhook body");
        // The POST names the topic only (one per stored publish).
        if v["topic"] == topic {
            *n += 1;
            return;
        }
    }
}

/// `c` publishes on `topic` through `s`; its watch's service gets the `accepted` event.
fn watch_event(svc: &Service, c: &Signer, s: &Slot, topic: &str, when: &str) {
    // The node has the registration (taken by another node, or loaded at its start).
    let known = wait_until(STEP, || s.metric("walletrelay_watches") == Some(1.0));
    assert!(
        known,
        "{when}: {} does not have the watch registration",
        s.name
    );
    let m = format!("watched {when}").replace([' ', ':', ','], "-");
    let r = connect_as(s.server(), c).call(
        "irn_publish",
        json!({"topic": topic, "message": m, "ttl": 3600, "tag": 1100}),
    );
    assert_eq!(r["result"], true, "{when}: {r}");
    let ev = svc.hook.next(STEP).unwrap_or_else(|| {
        panic!("the watch registered on the previous build got no event {when}")
    });
    let ev = svc.check(&ev);
    assert_eq!(
        (ev.status(), ev.message()),
        ("accepted", m.as_str()),
        "{when}"
    );
}

/// The mixed cluster (a new, b old): across both ways, live and cached; a's `/health`
/// says it writes layout 4; the mailbox gets one more message while its client is away.
fn mixed_checks(what: &str, a: &Slot, b: &Slot, lb: SocketAddr, mbox: &str, m: &str) {
    let l = a.layouts();
    assert!(
        l.contains("redis reads 4-5 writes 4;"),
        "{what}: the new node on layout-4 shards: {l}"
    );
    assert_eq!(
        a.redis_writes(),
        Some(4.0),
        "{what}: walletrelay_layout_writes"
    );
    cross_check("mixed", a, b);
    cross_check("mixed", b, a);
    irn_publish(lb, mbox, m);
}

impl Slot {
    /// `/health`'s `Walletrelay-Layouts` header, `None` without one (the previous build).
    fn layouts_or_none(&self) -> Option<String> {
        let r = self.admin_get("/health");
        r.header("Walletrelay-Layouts").map(str::to_string)
    }
}

#[test]
fn rolling_upgrade_on_a_sentinel_group_loses_nothing_and_rolls_back() {
    upgrade(RedisKind::Sentinel, true);
}

#[test]
fn rolling_upgrade_on_a_redis_cluster_loses_nothing() {
    upgrade(RedisKind::Cluster, false);
}
