//! Plain Redis round trips outside the engine's pipelines, for state every node shares that
//! is not a topic's: the relay's key, agreed at start (`SET key value NX` then `GET key`),
//! and the watch registrations (`notify::redis_sync`). Always on the first `--redis` shard,
//! whatever its kind (every node lists the same shards in the same order: the fingerprint
//! check refuses the others).
//!
//! Owns: [`SharedSpec`] (where the first shard is and how to log in: its URL parsed with
//! `--redis-password-file`, the TLS settings of `--redis-tls-*`) and [`SharedLink`], a
//! blocking connection for helper threads, one command at a time, built on the project's
//! own connection code: a standalone server or a Sentinel group's primary
//! (`primary::connect`: asked of the Sentinels, checked with `ROLE`, TLS, ACL user); a Redis
//! Cluster through its slot map (`CLUSTER SLOTS` from the seeds; a keyed command goes to
//! the slot's owner; `MOVED` moves the slot and is followed once, `ASK` once after
//! `ASKING`). Keyless commands (`PUBLISH`, `SUBSCRIBE`, `PING`) go to one node of a Cluster:
//! classic pub/sub is broadcast to every node of the cluster. A failed link is dropped by
//! its user, who opens a new one (which asks the Sentinels or reads the map again).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use rustls::ClientConfig;

use super::addr::{Endpoint, Kind, ShardAddr};
use super::link::{Link, LinkError, Login};
use super::primary::{self, Reach};
use super::slots::{key_slot, redirect, SlotMap};
use super::tls::RedisTlsFiles;
use super::types::ClusterConfig;

/// Connect, read and write timeout of the shared links.
const TIMEOUT: Duration = Duration::from_secs(5);

/// How to reach the first shard.
pub struct SharedSpec {
    addr: ShardAddr,
    tls: Option<Arc<ClientConfig>>,
    cfg: ClusterConfig,
    /// `--redis-wait-replicas`, when given.
    wait: Option<u32>,
    wait_timeout: Duration,
}

impl std::fmt::Debug for SharedSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `ShardAddr`'s Display leaves the password out.
        write!(f, "SharedSpec({})", self.addr)
    }
}

impl SharedSpec {
    /// The first of `redis`'s shards (`None`: no `--redis`), its password from
    /// `--redis-password-file` when its URL has none, TLS from `tls` when it is `rediss`;
    /// `wait`: `--redis-wait-replicas`, `wait_timeout`: `--redis-wait-timeout-ms`.
    pub fn new(
        redis: &[String],
        password: Option<&str>,
        tls: &RedisTlsFiles,
        wait: Option<u32>,
        wait_timeout: Duration,
    ) -> Result<Option<SharedSpec>, String> {
        if redis.is_empty() {
            return Ok(None);
        }
        let addr = ShardAddr::parse_list(redis, password)
            .map_err(|e| e.to_string())?
            .swap_remove(0);
        let tls = match addr.tls {
            true => Some(super::tls::client_config(tls).map_err(|e| e.to_string())?),
            false => None,
        };
        let cfg = ClusterConfig {
            connect_timeout: TIMEOUT,
            read_timeout: TIMEOUT,
            ..ClusterConfig::default()
        };
        Ok(Some(SharedSpec {
            addr,
            tls,
            cfg,
            wait,
            wait_timeout,
        }))
    }

    fn reach(&self) -> Reach<'_> {
        Reach {
            addr: &self.addr,
            cfg: &self.cfg,
            tls: self.tls.as_ref(),
        }
    }

    fn login(&self) -> Login<'_> {
        Login {
            tls: self.tls.as_ref(),
            user: self.addr.username.as_deref(),
            password: self.addr.password.as_deref(),
            db: 0,
            connect_timeout: TIMEOUT,
            read_timeout: TIMEOUT,
            write_timeout: TIMEOUT,
        }
    }

    /// The replicas a write waits for on a primary with `replicas` of them: as the engine
    /// decides (`setup::wait_replicas`): the flag, else 1 where the shard fails over and the
    /// primary has a replica.
    fn wait_for(&self, replicas: u32) -> u32 {
        self.wait
            .unwrap_or(u32::from(self.addr.fails_over() && replicas > 0))
    }
}

enum Conn {
    /// A standalone server or a Sentinel group's primary.
    One { link: Link, replicas: u32 },
    /// A Redis Cluster: its map, a link per node used so far, the node of keyless commands.
    Cluster {
        map: SlotMap,
        links: HashMap<Endpoint, Link>,
        any: Endpoint,
    },
}

/// A connection to the first shard, blocking, one command at a time.
pub struct SharedLink {
    spec: Arc<SharedSpec>,
    conn: Conn,
}

fn err(e: LinkError) -> String {
    e.to_string()
}

impl SharedLink {
    /// Connects to the first shard: its primary, or (a Cluster) its slot map and one node.
    pub fn open(spec: &Arc<SharedSpec>) -> Result<SharedLink, String> {
        let conn = match spec.addr.kind {
            Kind::Standalone | Kind::Sentinel { .. } => {
                let p = primary::connect(&spec.reach()).map_err(err)?;
                Conn::One {
                    link: p.link,
                    replicas: p.replicas,
                }
            }
            Kind::Cluster => {
                let (map, any, link) = read_map(spec)?;
                let mut links = HashMap::new();
                links.insert(any.clone(), link);
                Conn::Cluster { map, links, any }
            }
        };
        Ok(SharedLink {
            spec: Arc::clone(spec),
            conn,
        })
    }

    /// A keyless command (`PUBLISH`, `SUBSCRIBE`, `PING`), its reply (a server error is an
    /// `Err`).
    pub fn query(&mut self, args: &[&[u8]]) -> Result<Value, String> {
        match &mut self.conn {
            Conn::One { link, .. } => link.query(args).map_err(err),
            Conn::Cluster { links, any, .. } => match links.get_mut(any) {
                Some(l) => l.query(args).map_err(err),
                None => Err("no cluster node".into()),
            },
        }
    }

    /// A command on `key` (one key, or keys of one slot), sent to the node serving it.
    pub fn query_key(&mut self, key: &[u8], args: &[&[u8]]) -> Result<Value, String> {
        let spec = Arc::clone(&self.spec);
        let Conn::Cluster { map, links, .. } = &mut self.conn else {
            return self.query(args);
        };
        let slot = key_slot(key);
        let at = map
            .owner(slot)
            .map(|i| map.nodes[i].clone())
            .ok_or_else(|| format!("no node serves slot {slot}"))?;
        match node(&spec, links, &at)?.query(args) {
            Err(LinkError::Server(e)) if e.starts_with("MOVED ") => {
                let (slot, to) = redirect(&e["MOVED ".len()..]).ok_or(e)?;
                map.moved(slot, to.clone());
                node(&spec, links, &to)?.query(args).map_err(err)
            }
            Err(LinkError::Server(e)) if e.starts_with("ASK ") => {
                let (_, to) = redirect(&e["ASK ".len()..]).ok_or(e)?;
                let l = node(&spec, links, &to)?;
                l.query(&[b"ASKING"]).map_err(err)?;
                l.query(args).map_err(err)
            }
            Err(e) => {
                links.remove(&at);
                Err(err(e))
            }
            Ok(v) => Ok(v),
        }
    }

    /// After writes on `key`: `WAIT` for the replicas the engine would wait for (none on a
    /// standalone server); fewer in time is an error (the write may not survive a
    /// failover).
    pub fn wait_replicas(&mut self, key: &[u8]) -> Result<(), String> {
        let replicas = match &self.conn {
            Conn::One { replicas, .. } => *replicas,
            Conn::Cluster { map, .. } => map
                .owner(key_slot(key))
                .and_then(|i| map.replicas.get(i).copied())
                .unwrap_or(0),
        };
        let want = self.spec.wait_for(replicas);
        if want == 0 {
            return Ok(());
        }
        let n = want.to_string();
        let ms = self.spec.wait_timeout.as_millis().to_string();
        let got = self.query_key(key, &[b"WAIT", n.as_bytes(), ms.as_bytes()])?;
        match super::resp::int(&got) {
            Some(acked) if acked >= i64::from(want) => Ok(()),
            other => Err(format!(
                "WAIT: {} of {want} replicas confirmed in time",
                other.unwrap_or(0)
            )),
        }
    }

    /// The next reply or push on the keyless link (a subscriber's messages).
    pub fn recv(&mut self) -> Result<Value, String> {
        self.keyless()?.recv().map_err(err)
    }

    /// As [`SharedLink::recv`], `None` when nothing came within the read timeout.
    pub fn recv_or_idle(&mut self) -> Result<Option<Value>, String> {
        match self.keyless()?.recv() {
            Ok(v) => Ok(Some(v)),
            Err(LinkError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => Ok(None),
            Err(e) => Err(err(e)),
        }
    }

    /// Sends a keyless command without reading its reply (a subscriber's `PING`).
    pub fn send(&mut self, args: &[&[u8]]) -> Result<(), String> {
        let mut buf = Vec::new();
        let mut p = super::resp::Packer::new(&mut buf);
        p.cmd(args.len());
        for a in args {
            p.arg(a);
        }
        self.keyless()?.send(&buf).map_err(err)
    }

    /// Changes the keyless link's read timeout.
    pub fn set_read_timeout(&mut self, d: Duration) -> Result<(), String> {
        self.keyless()?.set_read_timeout(d).map_err(err)
    }

    fn keyless(&mut self) -> Result<&mut Link, String> {
        match &mut self.conn {
            Conn::One { link, .. } => Ok(link),
            Conn::Cluster { links, any, .. } => {
                links.get_mut(any).ok_or_else(|| "no cluster node".into())
            }
        }
    }
}

impl Drop for SharedLink {
    fn drop(&mut self) {
        match &self.conn {
            Conn::One { link, .. } => link.shutdown(),
            Conn::Cluster { links, .. } => links.values().for_each(Link::shutdown),
        }
    }
}

/// The link to cluster node `at`, opened on first use.
fn node<'a>(
    spec: &SharedSpec,
    links: &'a mut HashMap<Endpoint, Link>,
    at: &Endpoint,
) -> Result<&'a mut Link, String> {
    if !links.contains_key(at) {
        let l = Link::open(at, &spec.login()).map_err(|e| format!("{at}: {e}"))?;
        links.insert(at.clone(), l);
    }
    links.get_mut(at).ok_or_else(|| format!("{at}: no link"))
}

/// The slot map from the first seed that answers, and that seed's link.
fn read_map(spec: &SharedSpec) -> Result<(SlotMap, Endpoint, Link), String> {
    let mut why = Vec::new();
    for at in &spec.addr.endpoints {
        let got = Link::open(at, &spec.login()).and_then(|mut l| {
            let v = l.query(&[b"CLUSTER", b"SLOTS"])?;
            Ok((v, l))
        });
        match got {
            Ok((v, l)) => match SlotMap::parse(&v, at) {
                Some(m) if m.complete() => return Ok((m, at.clone(), l)),
                _ => why.push(format!("{at}: not every slot is served")),
            },
            Err(e) => why.push(format!("{at}: {e}")),
        }
    }
    Err(format!(
        "no node of the cluster gave a slot map ({})",
        why.join("; ")
    ))
}

/// The text of a string reply.
pub fn text(v: &Value) -> Option<String> {
    super::resp::text(v)
}

/// The cluster's value of `key`: `value` when no node set it before.
pub fn shared_value(spec: &Arc<SharedSpec>, key: &str, value: &str) -> Result<String, String> {
    let mut link = SharedLink::open(spec)?;
    let k = key.as_bytes();
    link.query_key(k, &[b"SET", k, value.as_bytes(), b"NX"])?;
    if let Err(e) = link.wait_replicas(k) {
        log::warn!("{key}: {e}; a failover now could lose the key");
    }
    let got = link.query_key(k, &[b"GET", k])?;
    text(&got).ok_or_else(|| format!("GET {key}: no value"))
}
