//! Watch registrations on a Redis cluster: every node sees every registration, on every
//! kind of first shard (standalone, Sentinel, Redis Cluster, TLS, ACL; `cluster::SharedLink`).
//! A hash per watched client (`walletrelay:watch:{client}`, field `typ\nsub\nwhu`, value
//! the registration's JSON, the key expiring with its last registration; the client is the
//! key's hash tag), the set of watched clients (`walletrelay:watch-clients`), and a pub/sub
//! channel (`walletrelay:watch-changed`, classic pub/sub: on a Redis Cluster it reaches every
//! node) on which a node names the client it changed.
//!
//! Threads, never a worker: the writer applies this node's changes (HSET / HDEL, the
//! replicas' `WAIT` where the engine would wait, then PUBLISH) and only then tells the
//! change's [`Done`] (the request's answer waits for it); the listener re-reads a client
//! named on the channel and replaces it in the table (`WatchHub::set_client`), and re-reads
//! everything after every (re)connection (a Sentinel failover, a Cluster node lost), clients
//! gone from Redis included. The subscriber's link is pinged when idle, so a server that
//! vanished without closing it is noticed. All of it is read once at start, before the
//! workers run.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use redis::Value;

use super::claims::WatchError;
use super::store::{Done, Line};
use super::table::{Registration, WatchHub};
use crate::engine::redis::cluster::shared::{text, SharedLink, SharedSpec};

const CLIENTS: &str = "walletrelay:watch-clients";
const CHANNEL: &str = "walletrelay:watch-changed";
/// Changes waiting for the writer; past it a change is answered `StorageError` at once.
pub const QUEUE: usize = 10_000;
/// How long the writer keeps trying one change (reconnecting, asking the Sentinels or the
/// cluster's map again) before it is answered `StorageError`: the service retries, as a
/// publish refused `storage unavailable` is retried.
const PATIENCE: Duration = Duration::from_secs(5);
/// Idle time after which the subscriber pings its server (and twice that: reconnects).
const KEEPALIVE: Duration = Duration::from_secs(10);

fn key(client: &str) -> String {
    format!("walletrelay:watch:{{{client}}}")
}

fn field(typ: &str, sub: &str, whu: &str) -> String {
    format!("{typ}\n{sub}\n{whu}")
}

/// A change for the writer, owned.
pub enum Op {
    /// HSET this registration of the client.
    Set(String, Registration),
    /// HDEL the registration (client, field).
    Del(String, String),
}

impl Op {
    /// The removal of (client, sub, whu, typ).
    pub fn del(client: &str, sub: &str, whu: &str, typ: &str) -> Op {
        Op::Del(client.to_string(), field(typ, sub, whu))
    }
}

/// The registrations of `client` held in Redis.
fn read_client(link: &mut SharedLink, client: &str) -> Result<Vec<Registration>, String> {
    let k = key(client);
    let v = link.query_key(k.as_bytes(), &[b"HGETALL", k.as_bytes()])?;
    let pairs: Vec<Value> = match v {
        Value::Array(items) => items,
        Value::Map(kv) => kv.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        Value::Nil => Vec::new(),
        other => return Err(format!("HGETALL: unexpected reply {other:?}")),
    };
    Ok(pairs
        .chunks_exact(2)
        .filter_map(|kv| text(&kv[1]))
        .filter_map(|json| serde_json::from_str::<Line>(&json).ok())
        .filter_map(Line::into_registration)
        .map(|(_, r)| r)
        .collect())
}

/// Reads every registration into `hub`, and forgets the clients Redis no longer holds;
/// returns how many registrations.
pub fn load_all(link: &mut SharedLink, hub: &WatchHub) -> Result<usize, String> {
    let c = CLIENTS.as_bytes();
    let clients = match link.query_key(c, &[b"SMEMBERS", c])? {
        Value::Array(items) | Value::Set(items) => items,
        _ => Vec::new(),
    };
    let now = super::unix_now();
    let mut all = HashMap::new();
    for client in clients.iter().filter_map(text) {
        let regs = read_client(link, &client)?;
        if regs.is_empty() {
            link.query_key(c, &[b"SREM", c, client.as_bytes()])?;
        }
        all.insert(client, regs);
    }
    let gone: Vec<Arc<str>> = hub
        .snapshot()
        .by_client
        .keys()
        .filter(|k| !all.contains_key(&***k))
        .cloned()
        .collect();
    for client in gone {
        hub.set_client(&client, Vec::new(), now);
    }
    let mut n = 0;
    for (client, regs) in all {
        n += regs.len();
        hub.set_client(&client, regs, now);
    }
    Ok(n)
}

/// Starts the writer (draining `ops`) and the listener for `hub`.
pub fn start(spec: Arc<SharedSpec>, hub: Weak<WatchHub>, ops: Receiver<(Op, Option<Done>)>) {
    let (s2, h2) = (spec.clone(), hub.clone());
    let spawned = std::thread::Builder::new()
        .name("watch-redis-w".into())
        .spawn(move || writer(&s2, &h2, &ops))
        .and_then(|_| {
            std::thread::Builder::new()
                .name("watch-redis-l".into())
                .spawn(move || listener(&spec, &hub))
        });
    if let Err(e) = spawned {
        log::error!("watches: cannot start the Redis threads: {e}");
    }
}

fn connect(spec: &Arc<SharedSpec>) -> Option<SharedLink> {
    match SharedLink::open(spec) {
        Ok(l) => Some(l),
        Err(e) => {
            log::warn!("watches: Redis: {e}");
            None
        }
    }
}

fn writer(spec: &Arc<SharedSpec>, hub: &Weak<WatchHub>, ops: &Receiver<(Op, Option<Done>)>) {
    let mut link = None;
    // After a change that could not be written, the next ones try once, not for PATIENCE:
    // a queue of answers does not wait 5 s each while Redis is away.
    let mut failing = false;
    for (op, done) in ops.iter() {
        let Some(hub) = hub.upgrade() else { return };
        let until = Instant::now() + if failing { Duration::ZERO } else { PATIENCE };
        let result = loop {
            if link.is_none() {
                link = connect(spec);
            }
            if let Some(l) = link.as_mut() {
                match apply(l, &op, &hub) {
                    Ok(()) => break Ok(()),
                    Err(e) => {
                        log::warn!("watches: Redis write failed: {e}");
                        link = None;
                    }
                }
            }
            if Instant::now() >= until {
                break Err(WatchError::Storage);
            }
            std::thread::sleep(Duration::from_millis(250));
        };
        failing = result.is_err();
        drop(hub);
        if let Some(done) = done {
            done(result);
        }
    }
}

fn apply(link: &mut SharedLink, op: &Op, hub: &WatchHub) -> Result<(), String> {
    let client = match op {
        Op::Set(client, r) => {
            let k = key(client);
            let kb = k.as_bytes();
            let f = field(r.typ.as_str(), &r.sub, &r.whu);
            let json = serde_json::to_string(&Line::of(client, r)).map_err(|e| e.to_string())?;
            link.query_key(kb, &[b"HSET", kb, f.as_bytes(), json.as_bytes()])?;
            // The key ends with the last of the client's registrations this node knows.
            let last = hub.of(client).map_or(r.exp, |rs| {
                rs.iter().map(|x| x.exp).max().unwrap_or(r.exp).max(r.exp)
            });
            link.query_key(kb, &[b"EXPIREAT", kb, last.to_string().as_bytes()])?;
            link.wait_replicas(kb)?;
            let c = CLIENTS.as_bytes();
            link.query_key(c, &[b"SADD", c, client.as_bytes()])?;
            link.wait_replicas(c)?;
            client
        }
        Op::Del(client, f) => {
            let k = key(client);
            link.query_key(k.as_bytes(), &[b"HDEL", k.as_bytes(), f.as_bytes()])?;
            link.wait_replicas(k.as_bytes())?;
            client
        }
    };
    link.query(&[b"PUBLISH", CHANNEL.as_bytes(), client.as_bytes()])?;
    Ok(())
}

fn listener(spec: &Arc<SharedSpec>, hub: &Weak<WatchHub>) {
    let mut first = true;
    loop {
        if hub.strong_count() == 0 {
            return;
        }
        if !first {
            std::thread::sleep(Duration::from_millis(500));
        }
        first = false;
        let (Some(mut sub), Some(mut cmd)) = (connect(spec), connect(spec)) else {
            continue;
        };
        if let Err(e) = sub.query(&[b"SUBSCRIBE", CHANNEL.as_bytes()]) {
            log::warn!("watches: Redis SUBSCRIBE: {e}");
            continue;
        }
        // Whatever changed while this node was not listening.
        let Some(h) = hub.upgrade() else { return };
        match load_all(&mut cmd, &h) {
            Ok(n) => log::debug!("watches: {n} registrations read again from Redis"),
            Err(e) => {
                log::warn!("watches: Redis reload: {e}");
                continue;
            }
        }
        drop(h);
        if let Err(e) = sub.set_read_timeout(KEEPALIVE) {
            log::warn!("watches: Redis channel: {e}");
            continue;
        }
        if let Err(e) = follow(&mut sub, &mut cmd, hub) {
            log::warn!("watches: Redis channel: {e}; reconnecting");
        }
    }
}

/// Applies the channel's messages until the connection fails (or the hub is gone).
fn follow(sub: &mut SharedLink, cmd: &mut SharedLink, hub: &Weak<WatchHub>) -> Result<(), String> {
    let mut unanswered = false;
    loop {
        let Some(msg) = sub.recv_or_idle()? else {
            if unanswered {
                return Err("no answer to PING".into());
            }
            sub.send(&[b"PING"])?;
            unanswered = true;
            continue;
        };
        unanswered = false;
        let Some(hub) = hub.upgrade() else {
            return Ok(());
        };
        let items = match msg {
            Value::Array(items) | Value::Push { data: items, .. } => items,
            _ => continue,
        };
        let words: Vec<String> = items.iter().filter_map(text).collect();
        if let [kind, _, client] = words.as_slice() {
            if kind == "message" {
                let regs = read_client(cmd, client)?;
                hub.set_client(client, regs, super::unix_now());
            }
        }
    }
}
