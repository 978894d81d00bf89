//! [`RedisCluster`]: a Redis Cluster of 3 primaries with replicas, formed with
//! `redis-cli --cluster create` (`--cluster-node-timeout 1000`, `appendonly yes`, each node
//! in its own directory), as an operator runs it (`redis+cluster://`); primaries killed,
//! slots moved with `redis-cli --cluster reshard`, and [`key_slot`], the slot of a key.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{conn, free_port, info, info_field, ping, redis_cli, try_conn, Proc, FORM};
use crate::common::wait::poll;

/// The slots of a Redis Cluster.
pub const SLOTS: u32 = 16384;

/// A range of slots and the port of the primary that serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SlotRange {
    /// First slot.
    pub start: u16,
    /// Last slot (inclusive).
    pub end: u16,
    /// The primary's port.
    pub port: u16,
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
struct NodeLine {
    id: String,
    port: u16,
    flags: Vec<String>,
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn parse(line: &str) -> Option<NodeLine> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            return None;
        }
        // `ip:port@cport[,hostname]`
        let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
        let slots = f[8..]
            .iter()
            .filter(|s| !s.starts_with('[')) // migrating / importing markers
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect();
        Some(NodeLine {
            id: f[0].to_string(),
            port,
            flags: f[2].split(',').map(str::to_string).collect(),
            slots,
        })
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// A primary not flagged as failing (by this view).
    fn serving_primary(&self) -> bool {
        self.has("master") && !self.has("fail") && !self.has("fail?")
    }
}

/// `CLUSTER NODES` as one node sees it.
fn view(port: u16) -> Option<Vec<NodeLine>> {
    let mut c = try_conn(port)?;
    let text: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).ok()?;
    Some(text.lines().filter_map(NodeLine::parse).collect())
}

/// The slot map of a view: the ranges of serving primaries, sorted.
fn slot_map(view: &[NodeLine]) -> Vec<SlotRange> {
    let mut m: Vec<SlotRange> = view
        .iter()
        .filter(|n| n.serving_primary())
        .flat_map(|n| {
            n.slots.iter().map(|&(start, end)| SlotRange {
                start,
                end,
                port: n.port,
            })
        })
        .collect();
    m.sort();
    m
}

/// A Redis Cluster, every node killed on drop.
pub struct RedisCluster {
    nodes: Vec<Proc>,
}

impl RedisCluster {
    /// 3 primaries and 3 replicas (6 nodes).
    pub fn start() -> RedisCluster {
        Self::start_with(1)
    }

    /// 3 primaries with `replicas` replicas each (`--cluster-replicas`). Returns once every
    /// node says `cluster_state:ok`, all agree on the slot map, and every replica is in
    /// sync with its primary.
    pub fn start_with(replicas: usize) -> RedisCluster {
        let n = 3 * (1 + replicas);
        let nodes: Vec<Proc> = (0..n)
            .map(|_| {
                Proc::start(
                    "redis-cluster",
                    |port, dir: &Path| {
                        // The bus port is set (Redis 7): port + 10000 may be past 65535.
                        let bus = free_port();
                        [
                            "--port",
                            &port.to_string(),
                            "--cluster-port",
                            &bus.to_string(),
                            "--bind",
                            "127.0.0.1",
                            "--save",
                            "",
                            "--dir",
                            &dir.display().to_string(),
                            "--logfile",
                            "redis.log",
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            "nodes.conf",
                            "--cluster-node-timeout",
                            "1000",
                            "--appendonly",
                            "yes",
                        ]
                        .map(String::from)
                        .to_vec()
                    },
                    ping,
                )
            })
            .collect();
        let c = RedisCluster { nodes };
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(c.nodes.iter().map(|p| format!("127.0.0.1:{}", p.port)));
        args.extend([
            "--cluster-replicas".to_string(),
            replicas.to_string(),
            "--cluster-yes".to_string(),
        ]);
        if let Err(e) = redis_cli(&args) {
            panic!("redis-cli --cluster create failed: {e}");
        }
        c.wait_ok();
        c
    }

    /// `redis+cluster://127.0.0.1:P1?addr=127.0.0.1:P2&addr=127.0.0.1:P3`: the first three
    /// nodes as seeds.
    pub fn url(&self) -> String {
        let p: Vec<u16> = self.nodes.iter().take(3).map(|n| n.port).collect();
        format!(
            "redis+cluster://127.0.0.1:{}?addr=127.0.0.1:{}&addr=127.0.0.1:{}",
            p[0], p[1], p[2]
        )
    }

    /// Every node's port, killed ones too.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The ports of the nodes not killed by the test.
    pub fn running_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter_map(|n| n.running().then_some(n.port))
            .collect()
    }

    /// The view of the first running node that answers.
    fn any_view(&self) -> Vec<NodeLine> {
        self.nodes
            .iter()
            .find_map(|n| view(n.port))
            .expect("no cluster node answers CLUSTER NODES")
    }

    /// The ports of the primaries that serve slots, in slot order.
    pub fn primaries(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = Vec::new();
        for r in self.slot_map() {
            if !ports.contains(&r.port) {
                ports.push(r.port);
            }
        }
        ports
    }

    /// The slot map (ranges and their primaries), as one running node sees it.
    pub fn slot_map(&self) -> Vec<SlotRange> {
        slot_map(&self.any_view())
    }

    /// The port of the primary serving `slot`.
    pub fn slot_owner(&self, slot: u16) -> u16 {
        self.slot_map()
            .iter()
            .find(|r| r.start <= slot && slot <= r.end)
            .map(|r| r.port)
            .unwrap_or_else(|| panic!("slot {slot} is served by no primary"))
    }

    /// The slot ranges `port` serves.
    pub fn slots_of(&self, port: u16) -> Vec<(u16, u16)> {
        let m = self.slot_map();
        m.iter()
            .filter(|r| r.port == port)
            .map(|r| (r.start, r.end))
            .collect()
    }

    /// A node's id (`CLUSTER MYID`).
    pub fn node_id(&self, port: u16) -> String {
        let v = self.any_view();
        v.iter()
            .find(|n| n.port == port)
            .map(|n| n.id.clone())
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// `DBSIZE` of a node.
    pub fn dbsize(&self, port: u16) -> u64 {
        redis::cmd("DBSIZE").query(&mut conn(port)).expect("DBSIZE")
    }

    /// `SIGKILL`s the primary with the most keys (`DBSIZE`); returns its port and when.
    pub fn kill_primary_with_most_keys(&mut self) -> (u16, Instant) {
        let port = self
            .primaries()
            .into_iter()
            .max_by_key(|p| self.dbsize(*p))
            .expect("a primary");
        (port, self.kill(port))
    }

    /// `SIGKILL`s the node on `port`; returns when.
    pub fn kill(&mut self, port: u16) -> Instant {
        self.node(port).kill()
    }

    /// Starts a killed node again (it rejoins from its `nodes.conf`, as a replica if its
    /// slots were failed over).
    pub fn restart(&mut self, port: u16) {
        self.node(port).restart();
    }

    fn node(&mut self, port: u16) -> &mut Proc {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// Waits until every running node says `cluster_state:ok`, all see the same slot map
    /// covering every slot with running primaries that none flags as failing, and every
    /// running replica is in sync with its primary; returns how long it waited. Right after
    /// a kill the survivors still say `ok` until the node timeout has passed: the map is what
    /// shows the failover. Fails the test after [`FORM`].
    pub fn wait_ok(&self) -> Duration {
        let from = Instant::now();
        let mut last = String::new();
        let ok = poll(FORM, || {
            let alive: HashSet<u16> = self
                .nodes
                .iter()
                .filter(|n| n.running())
                .map(|n| n.port)
                .collect();
            let mut maps = Vec::new();
            for &p in &alive {
                let ci: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut try_conn(p)?)
                    .ok()?;
                if info_field(&ci, "cluster_state") != Some("ok") {
                    last = format!("port {p}: {ci}");
                    return None;
                }
                let m = slot_map(&view(p)?);
                let covered: u32 = m.iter().map(|r| u32::from(r.end - r.start) + 1).sum();
                if covered != SLOTS || m.iter().any(|r| !alive.contains(&r.port)) {
                    last = format!("port {p} sees {m:?}");
                    return None;
                }
                maps.push(m);
                let repl = info(p, "replication")?;
                if info_field(&repl, "role") == Some("slave")
                    && info_field(&repl, "master_link_status") != Some("up")
                {
                    last = format!("replica {p}: {repl}");
                    return None;
                }
            }
            if maps.windows(2).any(|w| w[0] != w[1]) {
                last = format!("views differ: {maps:?}");
                return None;
            }
            Some(())
        });
        if ok.is_none() {
            let logs: Vec<String> = self
                .nodes
                .iter()
                .map(|n| format!("== {}\n{}", n.port, n.log_tail(8)))
                .collect();
            panic!(
                "the cluster was not ok within {FORM:?}: {last}\n{}",
                logs.join("\n")
            );
        }
        from.elapsed()
    }

    /// Moves `slots` slots from the primary on `from_port` to the one on `to_port` with
    /// `redis-cli --cluster reshard` (it takes the lowest slots `from_port` serves), then
    /// waits until the cluster is ok again. Returns how long the reshard itself took.
    pub fn reshard(&self, from_port: u16, to_port: u16, slots: u32) -> Duration {
        let (from_id, to_id) = (self.node_id(from_port), self.node_id(to_port));
        let args: Vec<String> = [
            "--cluster",
            "reshard",
            &format!("127.0.0.1:{from_port}"),
            "--cluster-from",
            &from_id,
            "--cluster-to",
            &to_id,
            "--cluster-slots",
            &slots.to_string(),
            "--cluster-yes",
        ]
        .map(String::from)
        .to_vec();
        let t = Instant::now();
        if let Err(e) = redis_cli(&args) {
            panic!("redis-cli --cluster reshard failed: {e}");
        }
        let took = t.elapsed();
        self.wait_ok();
        took
    }

    /// Runs one command on a node through `redis-cli -e` (no redirects followed).
    pub fn cli(&self, port: u16, args: &[&str]) -> Result<String, String> {
        let mut a = vec!["-p".to_string(), port.to_string(), "-e".to_string()];
        a.extend(args.iter().map(|s| s.to_string()));
        redis_cli(&a)
    }

    /// A plain connection to one node (no redirects followed).
    pub fn conn(&self, port: u16) -> redis::Connection {
        conn(port)
    }

    /// The last lines of every node's log (for failure messages).
    pub fn logs(&self, n: usize) -> String {
        let parts: Vec<String> = self
            .nodes
            .iter()
            .map(|p| format!("== port {}\n{}", p.port, p.log_tail(n)))
            .collect();
        parts.join("\n")
    }
}

/// The cluster slot of a key: CRC16 (XMODEM) of the key, or of its hash tag (the part
/// between the first `{` and the next `}`, when not empty), modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let mut k = key;
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                k = &key[open + 1..open + 1 + len];
            }
        }
    }
    let mut crc: u16 = 0;
    for &b in k {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS as u16
}
