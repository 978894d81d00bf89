//! Finding a shard's primary and connecting to it (DECISIONS §12): the server itself for a
//! standalone shard; for a Sentinel shard, the address the listed Sentinels give for the
//! group (`SENTINEL get-master-addr-by-name`, asked in turn until one answers), checked
//! with `ROLE` to be a primary now (a Sentinel may still name a demoted server for a moment
//! during a failover).
//!
//! Owns: the resolution and the facts learnt at connect time ([`Primary`]: where it is, how
//! many replicas it has, its replication id). Both the command thread and the subscriber
//! call [`connect`] on every (re)connect, so a failover is followed without a restart: the
//! old primary's connection breaks (or answers `READONLY`), the thread reconnects, and the
//! Sentinels name the new one.

use std::sync::Arc;

use redis::Value;
use rustls::ClientConfig;

use super::addr::{Endpoint, Kind, ShardAddr};
use super::link::{Link, LinkError, Login};
use super::resp::{int, text};
use super::types::ClusterConfig;

/// What a connection to a shard's primary knows of it.
pub(crate) struct Primary {
    /// The connection, logged in, database selected.
    pub link: Link,
    /// Where the primary is.
    pub at: Endpoint,
    /// Replicas connected to it (from `ROLE`).
    pub replicas: u32,
    /// Its replication id (`INFO replication`'s `master_replid`): it changes when a replica
    /// is promoted, which the publish script uses to keep positions of a lost primary from
    /// being reused (`script`). Empty when the ACL user may not run `INFO`.
    pub replid: String,
}

/// Everything needed to reach a shard's servers.
#[derive(Clone)]
pub(crate) struct Reach<'a> {
    pub addr: &'a ShardAddr,
    pub cfg: &'a ClusterConfig,
    pub tls: Option<&'a Arc<ClientConfig>>,
}

impl<'a> Reach<'a> {
    fn login(&self, user: Option<&'a str>, password: Option<&'a str>, db: i64) -> Login<'a> {
        Login {
            tls: self.tls,
            user,
            password,
            db,
            connect_timeout: self.cfg.connect_timeout,
            read_timeout: self.cfg.read_timeout,
            write_timeout: self.cfg.read_timeout,
        }
    }
}

/// Asks the Sentinels in turn where the group's primary is.
pub(crate) fn ask_sentinels(r: &Reach<'_>) -> Result<Endpoint, LinkError> {
    let Kind::Sentinel {
        master,
        user,
        password,
    } = &r.addr.kind
    else {
        return Ok(r.addr.endpoints[0].clone());
    };
    let mut why = Vec::new();
    for s in &r.addr.endpoints {
        let login = r.login(user.as_deref(), password.as_deref(), 0);
        let answer = Link::open(s, &login).and_then(|mut l| {
            l.query(&[b"SENTINEL", b"get-master-addr-by-name", master.as_bytes()])
        });
        match answer {
            Ok(Value::Array(v)) if v.len() == 2 => {
                let host = text(&v[0]);
                let port = int(&v[1]).and_then(|p| u16::try_from(p).ok());
                if let (Some(host), Some(port)) = (host, port) {
                    return Ok(Endpoint {
                        host: host.to_ascii_lowercase(),
                        port,
                    });
                }
                why.push(format!("{s}: a malformed address"));
            }
            Ok(Value::Nil) | Ok(Value::Array(_)) => {
                why.push(format!("{s}: does not know {master:?}"))
            }
            Ok(_) => why.push(format!("{s}: an unexpected reply")),
            Err(e) => why.push(format!("{s}: {e}")),
        }
    }
    Err(LinkError::NoPrimary(format!(
        "no Sentinel named the primary of {master:?} ({})",
        why.join("; ")
    )))
}

/// Finds the shard's primary, connects and logs in, and checks that it is a primary.
pub(crate) fn connect(r: &Reach<'_>) -> Result<Primary, LinkError> {
    let at = ask_sentinels(r)?;
    let login = r.login(
        r.addr.username.as_deref(),
        r.addr.password.as_deref(),
        r.addr.db,
    );
    let mut link = Link::open(&at, &login)?;
    let role = link.query(&[b"ROLE"])?;
    let Value::Array(role) = role else {
        return Err(LinkError::Protocol("ROLE".into()));
    };
    let kind = role.first().and_then(text).unwrap_or_default();
    if kind != "master" {
        return Err(LinkError::NoPrimary(format!(
            "{at} is a {kind}, not a primary (yet)"
        )));
    }
    let replicas = match role.get(2) {
        Some(Value::Array(r)) => u32::try_from(r.len()).unwrap_or(u32::MAX),
        _ => 0,
    };
    let replid = replid(&mut link, r.addr);
    Ok(Primary {
        link,
        at,
        replicas,
        replid,
    })
}

/// The server's replication id (`INFO replication`'s `master_replid`); empty when the ACL
/// user may not run `INFO` (positions are then not protected across a failover: said in
/// the log at each connect).
pub(crate) fn replid(link: &mut Link, addr: &ShardAddr) -> String {
    match link.query(&[b"INFO", b"replication"]) {
        Ok(v) => text(&v)
            .and_then(|info| {
                info.lines().find_map(|l| {
                    l.strip_prefix("master_replid:")
                        .map(|s| s.trim().to_string())
                })
            })
            .unwrap_or_default(),
        Err(e) => {
            log::warn!(addr:% = addr;
                "redis shard {addr}: INFO replication refused ({e}); a failover may reuse positions"
            );
            String::new()
        }
    }
}

/// A connection to one node of a Redis Cluster shard, logged in (database 0).
pub(crate) fn node(r: &Reach<'_>, at: &Endpoint) -> Result<Link, LinkError> {
    let login = r.login(r.addr.username.as_deref(), r.addr.password.as_deref(), 0);
    Link::open(at, &login)
}
