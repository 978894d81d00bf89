//! Watch registrations on a Redis cluster: every node sees every registration. A hash per
//! watched client (`walletrelay:watch:{client}`, field `typ\nsub\nwhu`, value the
//! registration's JSON, the key expiring with its last registration), the set of watched
//! clients (`walletrelay:watch-clients`), and a pub/sub channel
//! (`walletrelay:watch-changed`) on which a node names the client it changed.
//!
//! Threads, never a worker: the writer applies this node's changes (HSET / HDEL, then
//! PUBLISH); the listener re-reads a client named on the channel and replaces it in the
//! table (`WatchHub::set_client`), and re-reads everything after a reconnection. All of it
//! is read once at start, before the workers run. Only a standalone first shard without
//! TLS is used (`cluster::SharedLink`); elsewhere registrations stay on their node.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use redis::Value;

use super::store::Line;
use super::table::{Change, Registration, WatchHub};
use crate::cluster::shared::{text, SharedLink};

const CLIENTS: &str = "walletrelay:watch-clients";
const CHANNEL: &str = "walletrelay:watch-changed";
/// Changes waiting for the writer; past it a change stays on this node (logged).
pub const QUEUE: usize = 10_000;

fn key(client: &str) -> String {
    format!("walletrelay:watch:{client}")
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

/// The writer's side of the hub's `changed` hook.
pub fn op_of(c: &Change<'_>) -> Option<Op> {
    match *c {
        Change::Set { client, reg } => Some(Op::Set(client.to_string(), reg.clone())),
        Change::Del {
            client,
            sub,
            whu,
            typ,
        } => Some(Op::Del(client.to_string(), field(typ.as_str(), sub, whu))),
        Change::Swept => None,
    }
}

/// The registrations of `client` held in Redis.
fn read_client(link: &mut SharedLink, client: &str) -> Result<Vec<Registration>, String> {
    let v = link.query(&[b"HGETALL", key(client).as_bytes()])?;
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

/// Reads every registration into `hub`; returns how many.
pub fn load_all(link: &mut SharedLink, hub: &WatchHub) -> Result<usize, String> {
    let clients = match link.query(&[b"SMEMBERS", CLIENTS.as_bytes()])? {
        Value::Array(items) | Value::Set(items) => items,
        _ => Vec::new(),
    };
    let now = super::unix_now();
    let mut all = HashMap::new();
    for c in clients.iter().filter_map(text) {
        let regs = read_client(link, &c)?;
        if regs.is_empty() {
            link.query(&[b"SREM", CLIENTS.as_bytes(), c.as_bytes()])?;
        }
        all.insert(c, regs);
    }
    let mut n = 0;
    for (c, regs) in all {
        n += regs.len();
        hub.set_client(&c, regs, now);
    }
    Ok(n)
}

/// Starts the writer (draining `ops`) and the listener for `hub`.
pub fn start(redis: Vec<String>, hub: Weak<WatchHub>, ops: Receiver<Op>) {
    let (r2, h2) = (redis.clone(), hub.clone());
    let spawned = std::thread::Builder::new()
        .name("watch-redis-w".into())
        .spawn(move || writer(&r2, &h2, &ops))
        .and_then(|_| {
            std::thread::Builder::new()
                .name("watch-redis-l".into())
                .spawn(move || listener(&redis, &hub))
        });
    if let Err(e) = spawned {
        log::error!("watches: cannot start the Redis threads: {e}");
    }
}

fn connect(redis: &[String]) -> Option<SharedLink> {
    match SharedLink::open(redis) {
        Ok(l) => l,
        Err(e) => {
            log::warn!("watches: Redis: {e}");
            None
        }
    }
}

fn writer(redis: &[String], hub: &Weak<WatchHub>, ops: &Receiver<Op>) {
    let mut link = None;
    for op in ops.iter() {
        let Some(hub) = hub.upgrade() else { return };
        for _ in 0..3 {
            if link.is_none() {
                link = connect(redis);
            }
            let Some(l) = link.as_mut() else {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            };
            match apply(l, &op, &hub) {
                Ok(()) => break,
                Err(e) => {
                    log::warn!("watches: Redis write failed: {e}");
                    link = None;
                }
            }
        }
    }
}

fn apply(link: &mut SharedLink, op: &Op, hub: &WatchHub) -> Result<(), String> {
    let client = match op {
        Op::Set(client, r) => {
            let k = key(client);
            let f = field(r.typ.as_str(), &r.sub, &r.whu);
            let json = serde_json::to_string(&Line::of(client, r)).map_err(|e| e.to_string())?;
            link.query(&[b"HSET", k.as_bytes(), f.as_bytes(), json.as_bytes()])?;
            // The key ends with the last of the client's registrations this node knows.
            let last = hub.of(client).map_or(r.exp, |rs| {
                rs.iter().map(|x| x.exp).max().unwrap_or(r.exp).max(r.exp)
            });
            link.query(&[b"EXPIREAT", k.as_bytes(), last.to_string().as_bytes()])?;
            link.query(&[b"SADD", CLIENTS.as_bytes(), client.as_bytes()])?;
            client
        }
        Op::Del(client, f) => {
            link.query(&[b"HDEL", key(client).as_bytes(), f.as_bytes()])?;
            client
        }
    };
    link.query(&[b"PUBLISH", CHANNEL.as_bytes(), client.as_bytes()])?;
    Ok(())
}

fn listener(redis: &[String], hub: &Weak<WatchHub>) {
    let mut first = true;
    loop {
        if hub.strong_count() == 0 {
            return;
        }
        if !first {
            std::thread::sleep(Duration::from_secs(1));
        }
        first = false;
        let (Some(mut sub), Some(mut cmd)) = (connect(redis), connect(redis)) else {
            continue;
        };
        if let Err(e) = sub.query(&[b"SUBSCRIBE", CHANNEL.as_bytes()]) {
            log::warn!("watches: Redis SUBSCRIBE: {e}");
            continue;
        }
        // Whatever changed while this node was not listening.
        let Some(h) = hub.upgrade() else { return };
        if let Err(e) = load_all(&mut cmd, &h) {
            log::warn!("watches: Redis reload: {e}");
            continue;
        }
        drop(h);
        let _ = sub.set_read_timeout(Duration::from_secs(3600));
        if let Err(e) = follow(&mut sub, &mut cmd, hub) {
            log::warn!("watches: Redis channel: {e}");
        }
    }
}

/// Applies the channel's messages until the connection fails (or the hub is gone).
fn follow(sub: &mut SharedLink, cmd: &mut SharedLink, hub: &Weak<WatchHub>) -> Result<(), String> {
    loop {
        let msg = sub.recv()?;
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

/// The sender the hub's hook uses: changes of this node go to Redis.
pub fn hook(tx: Sender<Op>) -> impl Fn(&Change<'_>) + Send + Sync {
    move |c| {
        if let Some(op) = op_of(c) {
            if tx.try_send(op).is_err() {
                log::warn!("watches: the Redis writer is behind; a change stays on this node");
            }
        }
    }
}
