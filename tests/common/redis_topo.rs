//! Redis as operators run it (DECISIONS §12, issue 46), for the tests: real topologies of
//! `redis-server` processes on free loopback ports, each process killed on drop and each in
//! a temporary directory of its own:
//! - [`RedisTlsAcl`]: one server on a TLS port only, with a fresh test CA, an ACL file in
//!   which the default user is off and user `relay` has a password (`rediss://`);
//! - [`SentinelGroup`]: a primary, replicas and 3 Sentinels (`redis+sentinel://`);
//! - [`RedisCluster`]: a Redis Cluster formed with `redis-cli --cluster create`
//!   (`redis+cluster://`);
//! - [`RedisSetup`]: one topology of a [`RedisKind`] (or a mixed list of them), and the
//!   `walletrelay` flags that point a node at it ([`RedisSetup::redis_args`]).
//!
//! The plain standalone kind is [`super::redis::RedisServer`]. Inspection goes through the
//! `redis` crate on plain ports and through `redis-cli --tls` on the TLS one (the crate is
//! built without its TLS features). Needs `redis-server` and `redis-cli` 7.0 or later;
//! without them the tests fail with a message saying so.

mod rcluster;
mod sentinel;
mod tls_acl;

// Each test binary uses some of these, none uses all.
#[allow(unused_imports)]
pub use rcluster::{key_slot, RedisCluster, SlotRange};
pub use sentinel::SentinelGroup;
pub use tls_acl::RedisTlsAcl;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::RedisServer;
use super::wait::poll;
use super::TempDir;

/// How long a topology may take to form (replicas in sync, Sentinels that know each other,
/// a cluster whose nodes agree), or to fail over, before the test fails.
pub const FORM: Duration = Duration::from_secs(60);

/// The path of a Redis program (`redis-server`, `redis-cli`); fails the test with a clear
/// message without it.
pub fn redis_bin(name: &str) -> String {
    for dir in ["/usr/bin", "/usr/local/bin"] {
        let p = format!("{dir}/{name}");
        if Path::new(&p).exists() {
            return p;
        }
    }
    let found = Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "{name} not found: the cluster tests need a real Redis 7 (apt-get install \
         redis-server, which brings redis-cli and Sentinel); CI installs it"
    );
    name.to_string()
}

/// A free port on 127.0.0.1 (free now: a process started on it may still lose a race).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("addr").port()
}

/// One `redis-server` process of a topology (a data node, a Sentinel or a cluster node) in
/// a directory of its own, logging to `redis.log` there; killed on drop.
pub struct Proc {
    /// The port clients connect to (the TLS port for [`RedisTlsAcl`]).
    pub port: u16,
    /// Its directory (data, configuration, log).
    pub dir: TempDir,
    args: Vec<String>,
    child: Option<Child>,
    ready: fn(u16) -> bool,
}

impl Proc {
    /// Starts `redis-server` with the arguments `args(port, dir)` gives on a free port
    /// (another one if the process exits, at most 5 tries) and waits until `ready(port)`.
    pub fn start(
        tag: &str,
        mut args: impl FnMut(u16, &Path) -> Vec<String>,
        ready: fn(u16) -> bool,
    ) -> Proc {
        let mut p = Proc {
            port: 0,
            dir: TempDir::new(tag),
            args: Vec::new(),
            child: None,
            ready,
        };
        for _ in 0..5 {
            p.port = free_port();
            p.args = args(p.port, p.dir.path());
            if p.spawn() {
                return p;
            }
        }
        panic!(
            "redis-server ({tag}) did not start on a free port (5 tries); its log:\n{}",
            p.log_tail(20)
        );
    }

    /// Starts the process with its arguments; true once it is ready.
    fn spawn(&mut self) -> bool {
        let child = Command::new(redis_bin("redis-server"))
            .args(&self.args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let up = poll(Duration::from_secs(10), || {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return Some(false); // exited: port taken?
                }
            }
            (self.ready)(self.port).then_some(true)
        });
        if up != Some(true) {
            self.kill();
        }
        up == Some(true)
    }

    /// Whether the process is running (not killed by the test, not exited).
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Whether the test started it and has not killed it (it may still have died).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Its pid (panics once killed).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// `SIGKILL` and reap; returns when it happened.
    pub fn kill(&mut self) -> Instant {
        let at = Instant::now();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        at
    }

    /// Starts it again on the same port, directory and arguments.
    pub fn restart(&mut self) {
        self.kill();
        let up = poll(Duration::from_secs(10), || self.spawn().then_some(()));
        assert!(
            up.is_some(),
            "redis-server did not restart on {}",
            self.port
        );
    }

    /// The path of its log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The last `n` lines of its log (for failure messages).
    pub fn log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A plain connection to `127.0.0.1:port`, `None` if it cannot be had within 500 ms.
pub fn try_conn(port: u16) -> Option<redis::Connection> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let con = c
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    con.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    con.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(con)
}

/// A plain connection to `127.0.0.1:port` (fails the test if there is none).
pub fn conn(port: u16) -> redis::Connection {
    try_conn(port).unwrap_or_else(|| panic!("no connection to redis on port {port}"))
}

/// Whether the plain port answers `PING`.
pub fn ping(port: u16) -> bool {
    try_conn(port).is_some_and(|mut c| redis::cmd("PING").query::<String>(&mut c).is_ok())
}

/// `INFO <section>` of the server on a plain port (`None` when it does not answer).
pub fn info(port: u16, section: &str) -> Option<String> {
    let mut c = try_conn(port)?;
    redis::cmd("INFO").arg(section).query(&mut c).ok()
}

/// The value of `field` in an `INFO` (or `CLUSTER INFO`) text.
pub fn info_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Runs `redis-cli` with `args` (give `-e` before a command, so that an error reply is a
/// failure); its stdout, or what it printed as the error (a failed `AUTH` is one too:
/// redis-cli only warns and goes on).
pub fn redis_cli(args: &[String]) -> Result<String, String> {
    let out = Command::new(redis_bin("redis-cli"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    if out.status.success() && !stderr.contains("AUTH failed") {
        Ok(stdout)
    } else {
        Err(format!("redis-cli: {}\n{stdout}{stderr}", out.status))
    }
}

/// The kinds of shard a `--redis` entry can be (DECISIONS §12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisKind {
    /// `redis://`: one plain server ([`RedisServer`]).
    Standalone,
    /// `rediss://` with an ACL user ([`RedisTlsAcl`]).
    TlsAcl,
    /// `redis+sentinel://` ([`SentinelGroup`], one replica, no persistence).
    Sentinel,
    /// `redis+cluster://` ([`RedisCluster`], 3 primaries and 3 replicas).
    Cluster,
}

/// One running topology: what a `--redis` entry points at.
pub enum Topology {
    /// A plain server.
    Standalone(RedisServer),
    /// A TLS server with an ACL user.
    TlsAcl(RedisTlsAcl),
    /// A Sentinel group.
    Sentinel(SentinelGroup),
    /// A Redis Cluster.
    Cluster(RedisCluster),
}

impl Topology {
    /// Starts one of `kind`.
    pub fn start(kind: RedisKind) -> Topology {
        match kind {
            RedisKind::Standalone => Topology::Standalone(RedisServer::start()),
            RedisKind::TlsAcl => Topology::TlsAcl(RedisTlsAcl::start()),
            RedisKind::Sentinel => Topology::Sentinel(SentinelGroup::start(false)),
            RedisKind::Cluster => Topology::Cluster(RedisCluster::start()),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> RedisKind {
        match self {
            Topology::Standalone(_) => RedisKind::Standalone,
            Topology::TlsAcl(_) => RedisKind::TlsAcl,
            Topology::Sentinel(_) => RedisKind::Sentinel,
            Topology::Cluster(_) => RedisKind::Cluster,
        }
    }

    /// Its `--redis` entry.
    pub fn url(&self) -> String {
        match self {
            Topology::Standalone(r) => r.url(),
            Topology::TlsAcl(r) => r.url(),
            Topology::Sentinel(g) => g.url(),
            Topology::Cluster(c) => c.url(),
        }
    }
}

/// The Redis side of a test: one or more topologies, each one shard (one `--redis` entry).
pub struct RedisSetup {
    /// The shards, in `--redis` order.
    pub shards: Vec<Topology>,
}

impl RedisSetup {
    /// One shard of `kind`.
    pub fn start(kind: RedisKind) -> RedisSetup {
        RedisSetup::mixed(&[kind])
    }

    /// One shard per entry of `kinds`, in that order (at most one [`RedisKind::TlsAcl`]:
    /// the node takes one `--redis-tls-ca`).
    pub fn mixed(kinds: &[RedisKind]) -> RedisSetup {
        let tls = kinds.iter().filter(|k| **k == RedisKind::TlsAcl).count();
        assert!(tls <= 1, "one CA per node: at most one TlsAcl shard");
        RedisSetup {
            shards: kinds.iter().map(|k| Topology::start(*k)).collect(),
        }
    }

    /// A setup around topologies started by the test itself.
    pub fn of(shards: Vec<Topology>) -> RedisSetup {
        RedisSetup { shards }
    }

    /// How many shards (`--redis` entries).
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether it has no shard.
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The `--redis` value: the entries joined by commas.
    pub fn redis_flag(&self) -> String {
        let urls: Vec<String> = self.shards.iter().map(Topology::url).collect();
        urls.join(",")
    }

    /// The flags that point a `walletrelay` node at these shards: `--redis URL[,URL...]`,
    /// and `--redis-tls-ca CA` when a shard speaks TLS.
    pub fn redis_args(&self) -> Vec<String> {
        let mut args = vec!["--redis".to_string(), self.redis_flag()];
        if let Some(t) = self.tls_acl() {
            args.push("--redis-tls-ca".to_string());
            args.push(t.ca_path().display().to_string());
        }
        args
    }

    /// The TLS shard, if any.
    pub fn tls_acl(&self) -> Option<&RedisTlsAcl> {
        self.shards.iter().find_map(|s| match s {
            Topology::TlsAcl(t) => Some(t),
            _ => None,
        })
    }

    /// The first Sentinel group, if any.
    pub fn sentinel(&self) -> Option<&SentinelGroup> {
        self.shards.iter().find_map(|s| match s {
            Topology::Sentinel(g) => Some(g),
            _ => None,
        })
    }

    /// The first Sentinel group, if any, to kill its processes.
    pub fn sentinel_mut(&mut self) -> Option<&mut SentinelGroup> {
        self.shards.iter_mut().find_map(|s| match s {
            Topology::Sentinel(g) => Some(g),
            _ => None,
        })
    }

    /// The first Redis Cluster, if any.
    pub fn cluster(&self) -> Option<&RedisCluster> {
        self.shards.iter().find_map(|s| match s {
            Topology::Cluster(c) => Some(c),
            _ => None,
        })
    }

    /// The first Redis Cluster, if any, to kill its processes.
    pub fn cluster_mut(&mut self) -> Option<&mut RedisCluster> {
        self.shards.iter_mut().find_map(|s| match s {
            Topology::Cluster(c) => Some(c),
            _ => None,
        })
    }
}
