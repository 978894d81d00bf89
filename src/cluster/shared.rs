//! Plain Redis round trips outside the engine's pipelines, for state every node shares that
//! is not a topic's: the relay's key, agreed at start (`SET key value NX` then `GET key`),
//! and the watch registrations (`notify::redis_sync`). Only a standalone first shard
//! without TLS is spoken to; for the others the caller keeps its state to itself
//! (`Ok(None)`).

use std::time::Duration;

use redis::Value;

use super::addr::{Kind, ShardAddr};
use super::link::{Link, Login};

/// A connection to the first shard, blocking, one command at a time.
pub struct SharedLink(Link);

impl SharedLink {
    /// Connects to the first of `redis`'s shards. `Ok(None)`: it is not a plain standalone
    /// server (Sentinel, Redis Cluster, TLS).
    pub fn open(redis: &[String]) -> Result<Option<SharedLink>, String> {
        let Some(first) = redis.first() else {
            return Ok(None);
        };
        let addr = ShardAddr::parse(first).map_err(|e| e.to_string())?;
        let (Kind::Standalone, false, Some(at)) = (&addr.kind, addr.tls, addr.endpoints.first())
        else {
            return Ok(None);
        };
        let login = Login {
            tls: None,
            user: addr.username.as_deref(),
            password: addr.password.as_deref(),
            db: addr.db,
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
        };
        Link::open(at, &login)
            .map(|l| Some(SharedLink(l)))
            .map_err(|e| e.to_string())
    }

    /// One command, its reply (a server error is an `Err`).
    pub fn query(&mut self, args: &[&[u8]]) -> Result<Value, String> {
        self.0.query(args).map_err(|e| e.to_string())
    }

    /// The next reply or push (a subscriber's messages).
    pub fn recv(&mut self) -> Result<Value, String> {
        self.0.recv().map_err(|e| e.to_string())
    }

    /// Changes the socket's read timeout.
    pub fn set_read_timeout(&self, d: Duration) -> Result<(), String> {
        self.0.set_read_timeout(d).map_err(|e| e.to_string())
    }
}

impl Drop for SharedLink {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

/// The text of a string reply.
pub fn text(v: &Value) -> Option<String> {
    super::resp::text(v)
}

/// The cluster's value of `key`: `value` when no node set it before. `Ok(None)`: the first
/// shard is not a plain standalone server.
pub fn shared_value(redis: &[String], key: &str, value: &str) -> Result<Option<String>, String> {
    let Some(mut link) = SharedLink::open(redis)? else {
        return Ok(None);
    };
    link.query(&[b"SET", key.as_bytes(), value.as_bytes(), b"NX"])?;
    let got = link.query(&[b"GET", key.as_bytes()])?;
    text(&got)
        .map(Some)
        .ok_or_else(|| format!("GET {key}: no value"))
}
