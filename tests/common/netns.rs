//! Network namespaces of a test's own, for the partition tests (issue 46 §3): [`Lab`] makes
//! one namespace for Redis and one per `walletrelay` node, wires each node to the Redis
//! namespace and to the host with veth pairs, and can cut one node's link to Redis (and
//! restore it) while the host keeps reaching every node; [`NsRedis`] runs Redis inside the
//! Redis namespace (a standalone server, or a primary, a replica and 3 Sentinels).
//!
//! Where the traffic goes. Every address is in `10.213.X.0/24` (X chosen free on this host),
//! and each one is an address of an interface in a namespace the lab made, or of the
//! host's end of one of its veth pairs:
//! - `10.213.X.1/32` on the Redis namespace's `lo`: every Redis process binds it;
//! - host <-> Redis: `.5` (host) / `.6`; the host routes `.1` via `.6`;
//! - node i <-> Redis: `.(8i+9)` (node) / `.(8i+10)`; the node routes `.1` via `.(8i+10)`, and
//!   has no other route: a node can reach Redis and the host, nothing else;
//! - node i <-> host: `.(8i+13)` (host) / `.(8i+14)` (the node listens there).
//!
//! The host also holds `unreachable 10.213.X.0/24` while the lab lives, so that nothing of
//! the range ever follows its default route. [`Lab::cut`] sets the Redis namespace's end of a
//! node's link down: from then on the node's packets to Redis vanish without an answer (its
//! end keeps its address and route, only the carrier goes), as when a cable or a switch port
//! is lost; Redis's packets to the node cannot leave either. [`Lab::restore`] sets it up.
//!
//! Cleanup: every namespace, the host's veth ends and the route are removed on drop (after
//! the processes the lab started in them are killed), and at the start of every lab, what a
//! test process that no longer runs left behind (names carry the pid: namespaces
//! `wrp-<pid>-<n>-...`, host links `wrp<pid>x<n>...`, the route's metric is the pid).
//! Without root or without `ip` (iproute2), [`Lab::new`] says why and the test skips.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use super::redis_topo::{info_field, redis_bin, FORM};
use super::wait::{poll, WAIT};
use super::{limits_off, Server, TempDir};

/// The first two octets of every lab address.
const RANGE: [u8; 2] = [10, 213];

/// Runs `ip` with `args`; its stdout, or what went wrong.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// [`ip`] that must work (the lab's setup past its first steps, its cut and restore).
fn ip_ok(args: &[&str]) -> String {
    ip(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a name `<prefix><pid><sep>...`, if it has that shape.
fn pid_in(name: &str, prefix: &str, sep: char) -> Option<u32> {
    name.strip_prefix(prefix)?.split(sep).next()?.parse().ok()
}

/// Removes what labs of test processes that no longer run left behind: their processes
/// (still inside a namespace: only labs start processes there), namespaces, host links and
/// routes.
fn remove_stale() {
    let me = std::process::id();
    let stale = |pid: Option<u32>| pid.is_some_and(|p| p != me && !alive(p));
    for ns in ip(&["netns", "list"]).unwrap_or_default().lines() {
        let name = ns.split_whitespace().next().unwrap_or("");
        if stale(pid_in(name, "wrp-", '-')) {
            purge_ns(name);
        }
    }
    for line in ip(&["-o", "link", "show"]).unwrap_or_default().lines() {
        let name = line.split(": ").nth(1).unwrap_or("");
        let name = name.split('@').next().unwrap_or("");
        if stale(pid_in(name, "wrp", 'x')) {
            let _ = ip(&["link", "del", name]);
        }
    }
    let routes = ip(&["-4", "route", "show", "type", "unreachable"]).unwrap_or_default();
    for line in routes.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let net = w.iter().find(|s| s.starts_with("10.213.")).copied();
        let metric = w
            .iter()
            .position(|s| *s == "metric")
            .and_then(|i| w.get(i + 1))
            .and_then(|m| m.parse::<u32>().ok());
        if let Some(net) = net {
            if stale(metric) {
                let m = metric.expect("a metric").to_string();
                let _ = ip(&["route", "del", "unreachable", net, "metric", &m]);
            }
        }
    }
}

/// Kills the processes in namespace `name` (only labs start processes in theirs) and
/// deletes it.
fn purge_ns(name: &str) {
    for pid in ip(&["netns", "pids", name]).unwrap_or_default().lines() {
        if let Ok(pid) = pid.trim().parse::<libc::pid_t>() {
            // SAFETY: kill(2) touches no memory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = ip(&["netns", "del", name]);
}

/// A `/24` of [`RANGE`] that no address or route of this host uses yet.
fn free_subnet(seed: u32) -> Result<u8, String> {
    let used = ip(&["-4", "addr", "show"])? + &ip(&["-4", "route", "show", "table", "all"])?;
    (0..250u32)
        .map(|k| ((seed + k) % 250 + 1) as u8)
        .find(|x| !used.contains(&format!("{}.{}.{x}.", RANGE[0], RANGE[1])))
        .ok_or_else(|| "no free 10.213.X.0/24 on this host".to_string())
}

/// Namespaces and veth pairs of one test (see the module's comment); removed on drop.
pub struct Lab {
    pid: u32,
    n: u32,
    x: u8,
    nodes: usize,
    namespaces: Vec<String>,
    route: bool,
}

impl Lab {
    /// A Redis namespace and `nodes` node namespaces, wired up. `Err` says why it cannot
    /// be done here (not root, no `ip`, no namespaces or veth in this kernel): the caller
    /// skips.
    pub fn new(nodes: usize) -> Result<Lab, String> {
        assert!((1..=8).contains(&nodes), "1 to 8 nodes");
        // SAFETY: geteuid(2) has no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("network namespaces need root".into());
        }
        ip(&["-V"])?;
        // One lab set up at a time in this process: the subnet check and the names.
        static SETUP: Mutex<()> = Mutex::new(());
        let _one = SETUP.lock().unwrap_or_else(|e| e.into_inner());
        remove_stale();
        static N: AtomicU32 = AtomicU32::new(0);
        let (pid, n) = (std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        assert!(
            n < 10,
            "at most 10 labs per test process (link names are short)"
        );
        let x = free_subnet(pid.wrapping_mul(7).wrapping_add(n * 97))?;
        let mut lab = Lab {
            pid,
            n,
            x,
            nodes,
            namespaces: Vec::new(),
            route: false,
        };
        // Left by an earlier process that had this pid: its names are this lab's.
        purge_ns(&lab.redis_ns());
        (0..nodes).for_each(|i| purge_ns(&lab.node_ns(i)));
        lab.del_host_links();
        // The first namespace and veth pair say whether this machine can do it at all.
        let r = lab.redis_ns();
        ip(&["netns", "add", &r])?;
        lab.namespaces.push(r.clone());
        let hr = lab.host_link("r");
        ip(&[
            "link", "add", &hr, "type", "veth", "peer", "name", "host", "netns", &r,
        ])?;
        lab.wire();
        Ok(lab)
    }

    /// Everything past the first veth pair.
    fn wire(&mut self) {
        let me = self.pid.to_string();
        let net = format!("{}/24", self.addr(0));
        ip_ok(&["route", "add", "unreachable", &net, "metric", &me]);
        self.route = true;
        let r = self.redis_ns();
        let hr = self.host_link("r");
        ip_ok(&["-n", &r, "link", "set", "lo", "up"]);
        ip_ok(&[
            "-n",
            &r,
            "addr",
            "add",
            &format!("{}/32", self.redis_ip()),
            "dev",
            "lo",
        ]);
        self.pair_addrs(("", &hr, 5), (&r, "host", 6));
        let (rip, via) = (self.redis_ip().to_string(), self.addr(6).to_string());
        ip_ok(&["route", "add", &rip, "via", &via, "dev", &hr]);
        for i in 0..self.nodes {
            let ns = self.node_ns(i);
            ip_ok(&["netns", "add", &ns]);
            self.namespaces.push(ns.clone());
            ip_ok(&["-n", &ns, "link", "set", "lo", "up"]);
            let to_r = format!("node{i}");
            ip_ok(&[
                "link", "add", "redis", "netns", &ns, "type", "veth", "peer", "name", &to_r,
                "netns", &r,
            ]);
            let base = 8 * i as u8;
            self.pair_addrs((&ns, "redis", base + 9), (&r, &to_r, base + 10));
            let via = self.addr(base + 10).to_string();
            ip_ok(&["-n", &ns, "route", "add", &rip, "via", &via, "dev", "redis"]);
            let hn = self.host_link(&format!("h{i}"));
            ip_ok(&[
                "link", "add", &hn, "type", "veth", "peer", "name", "host", "netns", &ns,
            ]);
            self.pair_addrs(("", &hn, base + 13), (&ns, "host", base + 14));
        }
    }

    /// Gives the two ends of a veth pair (namespace or `""` for the host, link name, last
    /// octet) their `/30` addresses and sets them up.
    fn pair_addrs(&self, a: (&str, &str, u8), b: (&str, &str, u8)) {
        for (ns, link, octet) in [a, b] {
            let addr = format!("{}/30", self.addr(octet));
            let mut args = Vec::new();
            if !ns.is_empty() {
                args.extend(["-n", ns]);
            }
            let add = [&args[..], &["addr", "add", &addr, "dev", link]].concat();
            ip_ok(&add);
            let up = [&args[..], &["link", "set", link, "up"]].concat();
            ip_ok(&up);
        }
    }

    /// Deletes the host's ends of the lab's veth pairs (with their peers), if they exist.
    fn del_host_links(&self) {
        let _ = ip(&["link", "del", &self.host_link("r")]);
        for i in 0..self.nodes {
            let _ = ip(&["link", "del", &self.host_link(&format!("h{i}"))]);
        }
    }

    /// `10.213.X.<last>`.
    fn addr(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(RANGE[0], RANGE[1], self.x, last)
    }

    /// The name of a host link of this lab (at most 15 characters).
    fn host_link(&self, what: &str) -> String {
        let name = format!("wrp{}x{}{what}", self.pid, self.n);
        assert!(name.len() <= 15, "link name {name} too long");
        name
    }

    /// The Redis namespace.
    pub fn redis_ns(&self) -> String {
        format!("wrp-{}-{}-redis", self.pid, self.n)
    }

    /// Node `i`'s namespace.
    pub fn node_ns(&self, i: usize) -> String {
        format!("wrp-{}-{}-node{i}", self.pid, self.n)
    }

    /// The address every Redis process binds (reachable from the host and every node).
    pub fn redis_ip(&self) -> Ipv4Addr {
        self.addr(1)
    }

    /// Node `i`'s address on its link to the host (where it listens).
    pub fn node_ip(&self, i: usize) -> Ipv4Addr {
        self.addr(8 * i as u8 + 14)
    }

    /// A command that runs `program` inside namespace `ns`.
    pub fn command_in(&self, ns: &str, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, program]);
        cmd
    }

    /// Starts `walletrelay` in node `i`'s namespace, listening on [`Lab::node_ip`] (a free
    /// port) with `--data-dir none`, the limits per client off and `args`; returns once it
    /// listens (fails the test if it does not within [`WAIT`]).
    pub fn start_node(&self, i: usize, args: &[&str]) -> Server {
        let mut cmd = self.command_in(&self.node_ns(i), env!("CARGO_BIN_EXE_walletrelay"));
        limits_off(&mut cmd);
        let listen = format!("{}:0", self.node_ip(i));
        let mut child = cmd
            .args(["--listen", &listen, "--data-dir", "none"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn walletrelay in its namespace");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        // Reads the address, then keeps draining stdout so the node never blocks on it.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("walletrelay listening on ") {
                    let _ = tx.send(rest.trim().parse::<SocketAddr>());
                }
            }
        });
        match rx.recv_timeout(WAIT) {
            Ok(Ok(addr)) => Server::adopt(addr, child),
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("node {i} did not listen in its namespace within {WAIT:?}: {other:?}");
            }
        }
    }

    /// Cuts node `i` off from Redis (its link's Redis end goes down).
    pub fn cut(&self, i: usize) {
        ip_ok(&[
            "-n",
            &self.redis_ns(),
            "link",
            "set",
            &format!("node{i}"),
            "down",
        ]);
    }

    /// Gives node `i` its link to Redis back.
    pub fn restore(&self, i: usize) {
        ip_ok(&[
            "-n",
            &self.redis_ns(),
            "link",
            "set",
            &format!("node{i}"),
            "up",
        ]);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            purge_ns(ns);
        }
        // The host ends go with their peers' namespaces once those are freed; now, here.
        self.del_host_links();
        if self.route {
            let net = format!("{}/24", self.addr(0));
            let _ = ip(&[
                "route",
                "del",
                "unreachable",
                &net,
                "metric",
                &self.pid.to_string(),
            ]);
        }
    }
}

/// Which Redis an [`NsRedis`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NsKind {
    /// One server (`redis://`).
    Standalone,
    /// A primary, one replica and 3 Sentinels watching it as `mymaster` (`redis+sentinel://`).
    Sentinel,
}

/// The primary's port (the replica's is the next one; the Sentinels' are 26379-26381).
pub const PRIMARY_PORT: u16 = 6379;
const SENTINEL_PORTS: [u16; 3] = [26379, 26380, 26381];

/// Redis processes in a lab's Redis namespace, bound to [`Lab::redis_ip`], each killed on
/// drop. No persistence (nothing is restarted here).
pub struct NsRedis {
    /// What runs.
    pub kind: NsKind,
    ip: Ipv4Addr,
    procs: Vec<Child>,
    dir: TempDir,
}

impl NsRedis {
    /// Starts `kind` in `lab`'s Redis namespace; returns once it serves (a Sentinel group:
    /// once the replica is in sync and every Sentinel knows the other two and the replica).
    pub fn start(lab: &Lab, kind: NsKind) -> NsRedis {
        let mut r = NsRedis {
            kind,
            ip: lab.redis_ip(),
            procs: Vec::new(),
            dir: TempDir::new("netns-redis"),
        };
        let ip = r.ip.to_string();
        r.spawn(lab, PRIMARY_PORT, &[]);
        if kind == NsKind::Standalone {
            return r;
        }
        let primary = PRIMARY_PORT.to_string();
        r.spawn(lab, PRIMARY_PORT + 1, &["--replicaof", &ip, &primary]);
        for port in SENTINEL_PORTS {
            // A Sentinel rewrites its configuration file: one of its own. It should never
            // fail over here (the data nodes are fine), so it waits 5 s before it would.
            let conf = r.dir.join(&format!("sentinel-{port}.conf"));
            let text = format!(
                "port {port}\nbind {ip}\nprotected-mode no\ndir {dir}\n\
                 logfile \"sentinel-{port}.log\"\n\
                 sentinel monitor mymaster {ip} {PRIMARY_PORT} 2\n\
                 sentinel down-after-milliseconds mymaster 5000\n\
                 sentinel failover-timeout mymaster 10000\n\
                 sentinel parallel-syncs mymaster 1\n",
                dir = r.dir.arg()
            );
            std::fs::write(&conf, text).expect("write sentinel.conf");
            r.spawn(lab, port, &[conf.to_str().expect("path"), "--sentinel"]);
        }
        let formed = poll(FORM, || {
            let i: String = r.query(PRIMARY_PORT, redis::cmd("INFO").arg("replication"))?;
            let online = info_field(&i, "slave0").is_some_and(|s| s.contains("state=online"));
            let sentinels_ok = SENTINEL_PORTS.iter().all(|p| {
                let m: Option<Vec<String>> =
                    r.query(*p, redis::cmd("SENTINEL").arg("MASTER").arg("mymaster"));
                let field = |name: &str| {
                    let m = m.as_ref()?;
                    let at = m.iter().position(|f| f == name)?;
                    m.get(at + 1).cloned()
                };
                field("num-other-sentinels").as_deref() == Some("2")
                    && field("num-slaves").as_deref() == Some("1")
            });
            (online && sentinels_ok).then_some(())
        });
        assert!(
            formed.is_some(),
            "the Sentinel group in the namespace never formed within {FORM:?}"
        );
        r
    }

    /// Starts `redis-server` on `port` in the Redis namespace (`extra` first: a Sentinel's
    /// configuration file goes there) and waits until it answers `PING`.
    fn spawn(&mut self, lab: &Lab, port: u16, extra: &[&str]) {
        let sentinel = extra.contains(&"--sentinel");
        let mut cmd = lab.command_in(&lab.redis_ns(), &redis_bin("redis-server"));
        cmd.args(extra);
        if !sentinel {
            let ip = self.ip.to_string();
            let log = format!("redis-{port}.log");
            cmd.args(["--port", &port.to_string(), "--bind", &ip])
                .args(["--protected-mode", "no", "--save", "", "--appendonly", "no"])
                .args(["--dir", self.dir.arg(), "--logfile", &log])
                .args(["--dbfilename", &format!("dump-{port}.rdb")]);
        }
        let child = cmd
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server in the namespace");
        self.procs.push(child);
        let up = poll(Duration::from_secs(10), || {
            self.query::<String>(port, &redis::cmd("PING"))
        });
        assert!(
            up.is_some(),
            "redis-server on {}:{port} in the namespace never answered PING",
            self.ip
        );
    }

    /// Runs `cmd` on the process on `port` (from the host); `None` when it does not answer.
    pub fn query<T: redis::FromRedisValue>(&self, port: u16, cmd: &redis::Cmd) -> Option<T> {
        let c = redis::Client::open(format!("redis://{}:{port}/", self.ip)).ok()?;
        let mut con = c
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        con.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        cmd.query(&mut con).ok()
    }

    /// The `--redis` entry for it.
    pub fn url(&self) -> String {
        let ip = self.ip;
        match self.kind {
            NsKind::Standalone => format!("redis://{ip}:{PRIMARY_PORT}/0"),
            NsKind::Sentinel => {
                let [s1, s2, s3] = SENTINEL_PORTS;
                format!("redis+sentinel://{ip}:{s1}/mymaster?addr={ip}:{s2}&addr={ip}:{s3}")
            }
        }
    }

    /// The primary's port as each Sentinel reports it (empty for a standalone server).
    pub fn reported_primaries(&self) -> Vec<Option<u16>> {
        if self.kind == NsKind::Standalone {
            return Vec::new();
        }
        SENTINEL_PORTS
            .iter()
            .map(|p| {
                let a: Option<Vec<String>> = self.query(
                    *p,
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg("mymaster"),
                );
                a?.get(1)?.parse().ok()
            })
            .collect()
    }
}

impl Drop for NsRedis {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
