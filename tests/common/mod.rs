//! Test support, all of it: runs the real `walletrelay` binary on a loopback port and talks
//! to it over real sockets. The modules and what each owns:
//! - this file: [`Server`], the process (started, probed, signalled, killed on drop; its
//!   log when asked) and plain TCP connections; topics, hex payloads, `/proc` readings;
//! - [`tempdir`]: [`TempDir`], the one temporary directory (removed on drop), and
//!   [`tempdir::Tmpfs`], a small tmpfs on one for the full-disk tests;
//! - [`wait`]: the one wait-until helper (poll a condition until it holds or time is up);
//! - [`skip`]: a test that cannot set up what it needs says so (counted as skipped);
//! - [`apt`]: tools from Debian's packages, installed with apt-get when missing (as root);
//! - [`tls`]: TLS connections to its TLS listener, with a test CA ([`tls_pki`]);
//! - [`ws::Ws`]: a normal WebSocket client (tungstenite);
//! - [`raw_ws::RawWs`]: the one raw WebSocket client, that controls every byte;
//! - [`v1`]: WalletConnect 1.0 bridge frames over a [`RawWs`];
//! - [`http`]: HTTP/1.1 requests and a strict answer reader;
//! - [`gzip`]: the one gzip decoder of the tests (the registry's unit tests include it too);
//! - [`jwt`]: relay-auth JWTs signed by a client key of the test's;
//! - [`metrics`]: `/metrics` scraping;
//! - [`loadtest_bin`]: the real `loadtest` binary, built when missing;
//! - [`checks`]: "the server still serves" assertions;
//! - [`rng::Rng`]: a seeded RNG for reproducible "random" input;
//! - [`node`]: Node.js scripts (the real WalletConnect clients from npm) against the binary;
//! - [`durability`]: the binary on a data directory (`kill -9`, SIGTERM, its log), pipelined
//!   publishers that record what was acknowledged, a topic's history after a restart;
//! - [`redis`]: a real `redis-server`, and the cluster library's side of a node on it;
//! - [`redis_topo`]: Redis as operators run it: TLS with an ACL user, Sentinel, Redis
//!   Cluster, and the `--redis` flags for each;
//! - [`cluster`]: nodes of the binary on real Redis shards, clients that keep publishing
//!   or reading on their own threads;
//! - [`netns`]: network namespaces of a test's own (Redis in one, each node in another),
//!   and a node's link to Redis cut and restored (the partition tests);
//! - [`webhook`]: an HTTP webhook receiver that records requests and answers as told;
//! - [`jwt`]: Ed25519 JWTs as a WalletConnect client signs them (relay-auth, watch tokens);
//! - [`pyvenv`]: a virtualenv of Python packages from a requirements file (made once);
//! - [`push_server`]: a stand-in for `reown-com/push-server` (what it does with a relay's
//!   signed push, read from its source), recording the pushes it accepts;
//! - [`relay_id`]: the relay's own key (`GET /public-key`), its `did:key`, and the check of
//!   a JWT it signed;
//! - [`watch`]: watch registrations as a service makes them, `/public-key`, the gauge;
//! - [`podman`]: the image `scripts/images` builds from `./Containerfile`, run as a
//!   container (podman, removed on drop) on a named volume, seen as a [`Server`].
//!
//! It must not reach into the server's code: everything goes through the binary's sockets,
//! flags and signals (or `/proc` for its memory). Two exceptions, each said in its module:
//! [`redis`] drives the cluster library itself (for the cluster library's tests), and
//! [`cluster`] asks it which shard a topic lives on.
#![allow(dead_code)]

pub mod apt;
pub mod checks;
pub mod cluster;
pub mod durability;
pub mod gzip;
pub mod http;
pub mod jwt;
pub mod loadtest_bin;
pub mod metrics;
pub mod netns;
pub mod node;
pub mod podman;
pub mod push_server;
pub mod pyvenv;
pub mod raw_ws;
pub mod redis;
pub mod redis_topo;
pub mod relay_auth;
pub mod relay_id;
pub mod rng;
pub mod skip;
pub mod tempdir;
pub mod tls;
pub mod tls_pki;
pub mod v1;
pub mod wait;
pub mod watch;
pub mod webhook;
pub mod ws;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// Each test binary uses some of these, none uses all.
#[allow(unused_imports)]
pub use http::{HttpConn, Resp};
#[allow(unused_imports)]
pub use raw_ws::{Frame, Next, RawWs};
#[allow(unused_imports)]
pub use rng::Rng;
#[allow(unused_imports)]
pub use tempdir::TempDir;
#[allow(unused_imports)]
pub use ws::Ws;

/// Worker counts every relay test runs at: one worker, and four (cross-worker routing).
pub const THREADS: [&str; 2] = ["1", "4"];

/// The read timeout of every test socket: generous, so only a hung server trips it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment that turns every limit per client of DECISIONS §11 off (each is a flag
/// with an environment variable; a flag a test passes wins over it). Every server the tests
/// start gets it, so that tests opening thousands of connections from 127.0.0.1 or
/// publishing thousands of messages on one connection measure what they are about, except
/// [`Server::start_limited`] (tests/limits.rs), which runs with the real defaults.
pub const LIMITS_OFF: [(&str, &str); 5] = [
    ("WALLETRELAY_MAX_CONNECTIONS_PER_IP", "0"),
    ("WALLETRELAY_ACCEPT_RATE_PER_IP", "0"),
    ("WALLETRELAY_PUBLISH_RATE", "0"),
    ("WALLETRELAY_PUBLISH_BYTES_RATE", "0"),
    ("WALLETRELAY_SUBSCRIBE_RATE", "0"),
];

/// Sets [`LIMITS_OFF`] on a command that runs the binary.
pub fn limits_off(cmd: &mut Command) -> &mut Command {
    cmd.envs(LIMITS_OFF)
}

/// A running server process, killed on drop.
pub struct Server {
    /// The address of its plain listener (`0.0.0.0:0` when started with `--listen none`).
    pub addr: SocketAddr,
    /// The address of its TLS listener, when started with `--tls-listen`.
    pub tls_addr: Option<SocketAddr>,
    /// The address of its admin listener, when started with `--admin-listen`.
    pub admin_addr: Option<SocketAddr>,
    /// The process.
    pub child: Child,
    /// Its stderr so far, when started with [`Server::start_logged`].
    log: Option<Arc<Mutex<String>>>,
}

/// What [`Server::spawn`] does with the server's stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stderr {
    /// The test's own stderr; no [`Server::log`].
    Inherit,
    /// Kept for [`Server::log`] and shown on the test's stderr as it comes.
    KeepAndShow,
    /// Kept for [`Server::log`] only (the durability tests run it at `info`).
    Keep,
}

/// Options set on a client socket before it connects (they shape the receive window and the
/// segment size the server sees).
#[derive(Clone, Copy, Debug, Default)]
pub struct SockOpts {
    /// `SO_RCVBUF`, bytes.
    pub rcvbuf: Option<usize>,
    /// `TCP_MAXSEG`, bytes.
    pub mss: Option<u32>,
}

impl Server {
    /// Starts the binary on `127.0.0.1:0` (unless `args` has its own `--listen`) with extra
    /// `args` and waits until it listens (on both listeners with `--tls-listen`).
    pub fn start(args: &[&str]) -> Server {
        Server::spawn(args, Stderr::Inherit, false, &[])
    }

    /// Like [`Server::start`] with the limits per client at their defaults (unless `args`
    /// sets them), not off.
    pub fn start_limited(args: &[&str]) -> Server {
        Server::spawn(args, Stderr::Inherit, true, &[])
    }

    /// A server some test started itself and saw listening on `addr` (plain only).
    pub fn adopt(addr: SocketAddr, child: Child) -> Server {
        Server {
            addr,
            tls_addr: None,
            admin_addr: None,
            child,
            log: None,
        }
    }

    /// Like [`Server::start`], keeping what the server logs (still shown) for
    /// [`Server::log`].
    pub fn start_logged(args: &[&str]) -> Server {
        Server::spawn(args, Stderr::KeepAndShow, false, &[])
    }

    /// Starts the binary (see [`Server::start`]) with its stderr handled as `stderr` says,
    /// the limits per client at their defaults if `limited`, and `env` set.
    fn spawn(args: &[&str], stderr: Stderr, limited: bool, env: &[(&str, &str)]) -> Server {
        Server::spawn_bin(
            Path::new(env!("CARGO_BIN_EXE_walletrelay")),
            args,
            stderr,
            limited,
            env,
        )
    }

    /// [`Server::spawn`] of the binary at `bin`.
    fn spawn_bin(
        bin: &Path,
        args: &[&str],
        stderr: Stderr,
        limited: bool,
        env: &[(&str, &str)],
    ) -> Server {
        let mut cmd = Command::new(bin);
        cmd.envs(env.iter().copied());
        if limited {
            for (k, _) in LIMITS_OFF {
                cmd.env_remove(k);
            }
        } else {
            limits_off(&mut cmd);
        }
        if !args.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        let plain = !args.windows(2).any(|w| w == ["--listen", "none"]);
        let tls = args.contains(&"--tls-listen");
        let admin = args.contains(&"--admin-listen");
        // Runs never share state: memory only, unless the test gives its own directory.
        if !args.contains(&"--data-dir") {
            cmd.args(["--data-dir", "none"]);
        }
        let mut child = cmd
            .args(args)
            .stdout(Stdio::piped())
            .stderr(if stderr == Stderr::Inherit {
                Stdio::inherit()
            } else {
                Stdio::piped()
            })
            .spawn()
            .expect("spawn walletrelay");
        let log = child.stderr.take().map(|err| {
            let log = Arc::new(Mutex::new(String::new()));
            let keep = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if stderr == Stderr::KeepAndShow {
                        let _ = writeln!(std::io::stderr(), "{line}");
                    }
                    let mut l = keep.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
            log
        });
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let (mut addr, mut tls_addr, mut admin_addr) = (None, None, None);
        while (plain && addr.is_none())
            || (tls && tls_addr.is_none())
            || (admin && admin_addr.is_none())
        {
            let Some(line) = lines.next() else {
                let _ = child.wait();
                // What it logged last is read by then (or the log was shown as it came).
                std::thread::sleep(Duration::from_millis(100));
                let logged = log.as_ref().map(|l| l.lock().unwrap().clone());
                panic!(
                    "server exited before listening:\n{}",
                    logged.unwrap_or_default()
                );
            };
            let line = line.expect("read stdout");
            if let Some(rest) = line.strip_prefix("walletrelay listening on ") {
                addr = Some(rest.trim().parse().expect("address"));
            } else if let Some(rest) = line.strip_prefix("walletrelay listening for TLS on ") {
                tls_addr = Some(rest.trim().parse().expect("TLS address"));
            } else if let Some(rest) = line.strip_prefix("walletrelay admin listening on ") {
                admin_addr = Some(rest.trim().parse().expect("admin address"));
            }
        }
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server {
            addr: addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
            tls_addr,
            admin_addr,
            child,
            log,
        }
    }

    /// What the server logged so far (needs [`Server::start_logged`]).
    pub fn log(&self) -> String {
        let log = self.log.as_ref().expect("started without start_logged");
        log.lock().unwrap().clone()
    }

    /// Waits (at most `within`) until the log has a line containing `needle` after its
    /// first `skip` bytes; returns that line.
    pub fn wait_log(&self, skip: usize, needle: &str, within: Duration) -> Option<String> {
        wait::poll(within, || {
            let log = self.log();
            let line = log.get(skip..)?.lines().find(|l| l.contains(needle))?;
            Some(line.to_string())
        })
    }

    /// Sends the server a signal (`libc::SIGHUP`, ...).
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) with the pid of our own child and a valid signal number; it
        // touches no memory.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// A raw TCP connection to its admin address (started with `--admin-listen`).
    pub fn admin_tcp(&self) -> TcpStream {
        tcp_to(self.admin_addr.expect("started without --admin-listen"))
    }

    /// A raw TCP connection with generous timeouts.
    pub fn tcp(&self) -> TcpStream {
        tcp_to(self.addr)
    }

    /// Like [`Server::tcp`], with socket options set before connecting.
    pub fn tcp_with(&self, opts: SockOpts) -> TcpStream {
        use socket2::{Domain, Protocol, Socket, Type};
        let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        if let Some(mss) = opts.mss {
            sock.set_mss(mss).expect("TCP_MAXSEG");
        }
        if let Some(n) = opts.rcvbuf {
            sock.set_recv_buffer_size(n).expect("SO_RCVBUF");
        }
        sock.connect(&self.addr.into()).expect("connect");
        let s: TcpStream = sock.into();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// Sends `raw` on a fresh connection and reads until the server closes it (or the read
    /// timeout passes).
    pub fn raw_exchange(&self, raw: &[u8]) -> Vec<u8> {
        let mut s = self.tcp();
        s.write_all(raw).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    }

    /// Starts the binary at `bin` (another build: the previous layout's, or this one under
    /// `faketime`) like [`Server::start_logged`], with `env` set.
    pub fn start_binary(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::spawn_bin(bin, args, Stderr::KeepAndShow, false, env)
    }

    /// The server process must still be running.
    pub fn assert_alive(&mut self, when: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the server process exited ({status}) {when}");
        }
    }

    /// Resident memory of the server process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP connection to `addr` with the tests' read timeout and no Nagle delay (for threads
/// that hold an address, not a [`Server`]).
pub fn tcp_to(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Runs `f` against a fresh server at each worker count of [`THREADS`], with extra flags.
pub fn each_server(extra: &[&str], f: impl Fn(&Server)) {
    for t in THREADS {
        let mut args = vec!["--threads", t];
        args.extend_from_slice(extra);
        let s = Server::start(&args);
        f(&s);
    }
}

/// A fresh 64-hex topic, like real clients use.
pub fn topic() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:032x}{:016x}{:016x}", t, n, std::process::id())
}

/// Lifts this test process's soft open-file limit to the hard one (tests that hold
/// thousands of sockets).
pub fn raise_nofile_limit() {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both calls only read or write the struct on this stack frame.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
}

/// Makes closing `s` send a reset instead of a FIN (`SO_LINGER` 0): a client that vanishes.
pub fn reset_on_close(s: &TcpStream) {
    socket2::SockRef::from(s)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER");
}

/// A field of `/proc/<pid>/<file>` (`status` or `smaps_rollup`), as the number before any
/// unit; `name` includes its colon (`"VmRSS:"`).
pub fn proc_field(pid: u32, file: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Resident memory of a process, in KiB (`VmRSS` in `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> u64 {
    proc_field(pid, "status", "VmRSS:").expect("VmRSS in /proc/<pid>/status")
}

/// `n` lowercase hex characters of pseudo-random bytes from `seed` (xorshift): what the
/// encrypted payloads of real clients look like, reproducibly.
pub fn hex(n: usize, mut seed: u64) -> String {
    let mut s = String::with_capacity(n + 16);
    while s.len() < n {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        s.push_str(&format!("{seed:016x}"));
    }
    s.truncate(n);
    s
}
