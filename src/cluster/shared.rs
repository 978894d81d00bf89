//! One value the whole cluster shares, agreed at start: `SET key value NX` then `GET key` on
//! the first shard (the relay's key, `notify`). A blocking round trip, made before the
//! workers run. Only a standalone first shard without TLS is asked; for the others the
//! caller falls back to its own value (`Ok(None)`).

use std::time::Duration;

use super::addr::{Kind, ShardAddr};
use super::link::{Link, Login};

/// The cluster's value of `key`: `value` when no node set it before. `Ok(None)`: the first
/// shard is not a plain standalone server (Sentinel, Redis Cluster, TLS).
pub fn shared_value(redis: &[String], key: &str, value: &str) -> Result<Option<String>, String> {
    let Some(first) = redis.first() else {
        return Ok(None);
    };
    let addr = ShardAddr::parse(first).map_err(|e| e.to_string())?;
    let (Kind::Standalone, false, Some(at)) = (&addr.kind, addr.tls, addr.endpoints.first()) else {
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
    let mut link = Link::open(at, &login).map_err(|e| e.to_string())?;
    link.query(&[b"SET", key.as_bytes(), value.as_bytes(), b"NX"])
        .map_err(|e| e.to_string())?;
    let got = link
        .query(&[b"GET", key.as_bytes()])
        .map_err(|e| e.to_string())?;
    link.shutdown();
    super::resp::text(&got)
        .map(Some)
        .ok_or_else(|| format!("GET {key}: no value"))
}
