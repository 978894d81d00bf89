//! Redis for the cluster tests: [`RedisServer`], a real `redis-server` on a free loopback
//! port (persistent or not, killed, restarted, put to sleep), killed on drop; and [`Node`],
//! the cluster library's side of a node on it with its events collected, for the tests of
//! that library (`cluster_store`, `cluster_failures`): the one place in `common` that drives
//! the server's code itself rather than the binary.
//!
//! Needs `redis-server` (7.0 or later) on `PATH` or at `/usr/bin/redis-server`; without it
//! the tests fail with a message saying so (CI installs it).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::wait::{poll, wait_until};
use super::TempDir;

/// A running `redis-server`.
pub struct RedisServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
    /// Working directory (append-only file when persistent), removed after the process
    /// is killed (fields drop after `Drop::drop`).
    dir: TempDir,
    persistent: bool,
    /// `--requirepass`, when started with one ([`RedisServer::start_with_password`]).
    password: Option<String>,
}

fn binary() -> String {
    for p in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        if std::path::Path::new(p).exists() {
            return p.to_string();
        }
    }
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "redis-server not found: the cluster tests need a real Redis 7 \
         (apt-get install redis-server); CI installs it"
    );
    "redis-server".to_string()
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("addr").port()
}

impl RedisServer {
    /// A server without persistence (`--save "" --appendonly no`).
    pub fn start() -> RedisServer {
        Self::launch(false, None)
    }

    /// A server without persistence whose default user needs `password` (`--requirepass`);
    /// [`RedisServer::url`] stays without it, [`RedisServer::url_with_password`] has it.
    pub fn start_with_password(password: &str) -> RedisServer {
        Self::launch(false, Some(password.to_string()))
    }

    /// A server with `appendonly yes` and `appendfsync always`: a write it acknowledged
    /// survives `kill -9` and a restart.
    pub fn start_persistent() -> RedisServer {
        Self::launch(true, None)
    }

    fn launch(persistent: bool, password: Option<String>) -> RedisServer {
        let mut s = RedisServer {
            port: 0,
            child: None,
            dir: TempDir::new("redis"),
            persistent,
            password,
        };
        for _ in 0..5 {
            s.port = free_port();
            if s.spawn() {
                return s;
            }
        }
        panic!("redis-server did not start on a free port (5 tries)");
    }

    /// Starts the process on `self.port`; true once it answers PING.
    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(binary());
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--enable-debug-command", "yes"])
            .args(["--dir", self.dir.arg()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(pw) = &self.password {
            cmd.args(["--requirepass", pw]);
        }
        if self.persistent {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        let child = cmd.spawn().expect("spawn redis-server");
        self.child = Some(child);
        let up = poll(Duration::from_secs(10), || {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return Some(false); // exited: port taken?
                }
            }
            self.ping().then_some(true)
        });
        up == Some(true)
    }

    /// Whether the server answers PING now.
    pub fn ping(&self) -> bool {
        let Ok(c) = redis::Client::open(self.url_with_password()) else {
            return false;
        };
        let Ok(mut con) = c.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        let _ = con.set_read_timeout(Some(Duration::from_millis(200)));
        redis::cmd("PING").query::<String>(&mut con).is_ok()
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        self.url_db(0)
    }

    /// `redis://127.0.0.1:PORT/DB`.
    pub fn url_db(&self, db: u8) -> String {
        format!("redis://127.0.0.1:{}/{db}", self.port)
    }

    /// `redis://:PASSWORD@127.0.0.1:PORT/0` (as [`RedisServer::url`] without a password).
    pub fn url_with_password(&self) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}/0", self.port),
            None => self.url(),
        }
    }

    /// A plain connection for inspecting keys (database 0).
    pub fn conn(&self) -> redis::Connection {
        let c = redis::Client::open(self.url_with_password()).expect("client");
        c.get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to the test redis")
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// `kill -9` and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same port and directory (a persistent server reloads its file).
    pub fn restart(&mut self) {
        self.kill();
        let up = wait_until(Duration::from_secs(10), || self.spawn());
        assert!(up, "redis-server did not restart on port {}", self.port);
    }

    /// Puts the server to sleep (`DEBUG SLEEP secs`, on a thread of its own) and returns
    /// once it no longer answers PING; join the handle to wait for it to wake.
    pub fn debug_sleep(&self, secs: u32) -> std::thread::JoinHandle<()> {
        let url = self.url_with_password();
        let sleeper = std::thread::spawn(move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            let _: () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(secs)
                .query(&mut c)
                .unwrap();
        });
        let asleep = wait_until(WAIT, || !self.ping());
        assert!(asleep, "DEBUG SLEEP never took effect");
        sleeper
    }

    /// Whether something accepts connections on the port.
    pub fn listening(&self) -> bool {
        TcpStream::connect(("127.0.0.1", self.port)).is_ok()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A node's Redis side with its events collected, for tests.
pub struct Node {
    /// The cluster side under test.
    pub cluster: walletrelay::engine::redis::cluster::Cluster,
    rx: crossbeam_channel::Receiver<(
        usize,
        walletrelay::event::Event<walletrelay::engine::redis::cluster::Followup>,
    )>,
    /// Events received but not yet taken by a `wait`.
    backlog: std::cell::RefCell<
        std::collections::VecDeque<(
            usize,
            walletrelay::event::Event<walletrelay::engine::redis::cluster::Followup>,
        )>,
    >,
    ticket: std::cell::Cell<u64>,
}

use walletrelay::engine::redis::cluster::{
    Cluster, ClusterConfig, ClusterError, ClusterHandle, Followup, History, Origin, PublishOutcome,
    PublishReq, Unavailable,
};
use walletrelay::event::Event;

/// Short timeouts so failure tests finish quickly.
pub fn test_config(urls: &[String]) -> ClusterConfig {
    ClusterConfig {
        urls: urls.to_vec(),
        connect_timeout: Duration::from_secs(1),
        read_timeout: Duration::from_millis(800),
        heartbeat: Duration::from_millis(200),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..ClusterConfig::default()
    }
}

/// How long a test waits for an expected event before it fails.
pub const WAIT: Duration = Duration::from_secs(15);

/// The bytes the relay stores for a message.
pub fn data(topic: &str, msg: &str) -> walletrelay::message::Body {
    let meta = walletrelay::message::Meta {
        published_at: 1_700_000_000_000,
        tag: 1108,
        attestation: None,
        plain: false,
    };
    walletrelay::message::Body::encode(topic, msg, meta)
}

impl Node {
    /// Starts a node on `cfg`.
    pub fn try_start(cfg: ClusterConfig) -> Result<Node, ClusterError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let sink: walletrelay::engine::redis::cluster::EventSink =
            std::sync::Arc::new(move |w, ev| {
                let _ = tx.send((w, ev));
            });
        Ok(Node {
            cluster: Cluster::start(cfg, sink)?,
            rx,
            backlog: Default::default(),
            ticket: std::cell::Cell::new(0),
        })
    }

    /// Starts a node on these shards with the test timeouts.
    pub fn start(urls: &[String]) -> Node {
        Self::try_start(test_config(urls)).expect("cluster starts")
    }

    /// Worker `w`'s handle.
    pub fn h(&self, w: usize) -> ClusterHandle {
        self.cluster.handle(w)
    }

    /// A fresh ticket.
    pub fn ticket(&self) -> u64 {
        let t = self.ticket.get() + 1;
        self.ticket.set(t);
        t
    }

    /// Waits for the first event (backlog first) for which `f` returns `Some`; other events
    /// stay in the backlog. Panics after [`WAIT`].
    pub fn wait<T>(
        &self,
        what: &str,
        mut f: impl FnMut(usize, &Event<Followup>) -> Option<T>,
    ) -> T {
        {
            let mut b = self.backlog.borrow_mut();
            if let Some(i) = b.iter().position(|(w, e)| f(*w, e).is_some()) {
                let (w, e) = b.remove(i).expect("index");
                return f(w, &e).expect("matched");
            }
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (w, e) = self
                .rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
            if let Some(t) = f(w, &e) {
                return t;
            }
            self.backlog.borrow_mut().push_back((w, e));
        }
    }

    /// Everything received so far (backlog and channel), emptied.
    pub fn drain(&self) -> Vec<(usize, Event<Followup>)> {
        let mut v: Vec<_> = self.backlog.borrow_mut().drain(..).collect();
        v.extend(self.rx.try_iter());
        v
    }

    /// Publishes from worker 0 and waits for the outcome.
    pub fn publish(
        &self,
        topic: &str,
        msg: &str,
        ttl: Duration,
    ) -> Result<PublishOutcome, Unavailable> {
        self.publish_as(
            topic,
            data(topic, msg),
            ttl,
            Origin { node: 1, conn: 1 },
            true,
        )
    }

    /// Publishes with every field given and waits for the outcome.
    pub fn publish_as(
        &self,
        topic: &str,
        data: walletrelay::message::Body,
        ttl: Duration,
        origin: Origin,
        prompt: bool,
    ) -> Result<PublishOutcome, Unavailable> {
        let t = self.ticket();
        let req = PublishReq {
            ns: walletrelay::engine::redis::cluster::NS_V2,
            topic: topic.into(),
            body: data,
            ttl,
            origin,
            prompt,
            publisher: None,
        };
        self.h(0).publish(t, req)?;
        self.wait("publish outcome", |_, e| match e {
            Event::Engine(Followup::Published { ticket, result }) if *ticket == t => {
                Some(result.clone())
            }
            _ => None,
        })
    }

    /// Reads a v2 topic's history from worker 0 and waits for it.
    pub fn read(&self, topic: &str, epoch: u64, after: u64) -> Result<History, Unavailable> {
        let t = self.ticket();
        self.h(0).read(
            t,
            walletrelay::engine::redis::cluster::NS_V2,
            &topic.into(),
            epoch,
            after,
        )?;
        self.wait("history", |_, e| match e {
            Event::Engine(Followup::Page { ticket, result }) if *ticket == t => {
                Some(result.clone())
            }
            _ => None,
        })
    }

    /// Waits until `healthy()` is `Ok`.
    pub fn wait_healthy(&self) {
        let mut why = String::new();
        let healthy = wait_until(WAIT, || match self.cluster.healthy() {
            Ok(()) => true,
            Err(e) => {
                why = e.to_string();
                false
            }
        });
        assert!(healthy, "never healthy: {why}");
    }
}
