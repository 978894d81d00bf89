//! Setting up a shard's command connection: find the primary (`primary`), decide how many
//! replicas each round waits for, load the scripts, check the shard-list fingerprint and
//! mark the node alive, all in one round trip after the login.
//!
//! Owns: [`ConnectError`] and the connect sequence. Must not keep anything: the command
//! thread (`shard`) takes the [`Conn`] it returns.

use redis::Value;

use super::addr::Endpoint;
use super::command::ShardCtx;
use super::link::{Link, LinkError};
use super::primary;
use super::script::{self, Shas};
use super::v1;

/// Why a shard could not be (re)connected.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Redis (or a Sentinel) could not be reached, refused the login, or answered an error.
    #[error("{0}")]
    Link(#[from] LinkError),
    /// The shard holds another node's shard list.
    #[error("this shard was joined with another --redis list: it holds {theirs:?}, this node has {ours:?}; every node must list the same Redis servers in the same order")]
    Mismatch {
        /// This node's fingerprint.
        ours: String,
        /// The one found in the shard.
        theirs: String,
    },
    /// A reply of an unexpected shape during setup.
    #[error("unexpected reply during setup: {0}")]
    Setup(&'static str),
}

/// A command connection ready for rounds, and what it learnt of the primary.
pub(crate) struct Conn {
    pub link: Link,
    pub shas: Shas,
    /// Where the primary is.
    pub at: Endpoint,
    /// Replicas each round's writes wait for (0: no `WAIT`).
    pub wait: u32,
    /// The primary's replication id (handed to the publish script).
    pub replid: Vec<u8>,
}

/// The replicas a round waits for on this primary: `--redis-wait-replicas` when given, else
/// 1 on a Sentinel or Cluster shard whose primary has a replica (0 with a warning when it
/// has none), 0 on a standalone one.
fn wait_replicas(ctx: &ShardCtx, replicas: u32) -> u32 {
    if let Some(n) = ctx.cfg.wait_replicas {
        return n;
    }
    if !ctx.addr.fails_over() {
        return 0;
    }
    if replicas == 0 {
        log::warn!(shard = ctx.idx, addr:% = ctx.addr;
            "redis shard {} ({}): the primary has no replica; publishes are acknowledged without WAIT and may be lost if it fails",
            ctx.idx,
            ctx.addr
        );
        return 0;
    }
    1
}

/// Finds the primary, connects, loads the scripts and checks (or writes) the fingerprint.
pub(crate) fn connect(ctx: &ShardCtx) -> Result<Conn, ConnectError> {
    let p = primary::connect(&ctx.reach())?;
    let mut con = p.link;
    let wait = wait_replicas(ctx, p.replicas);
    if wait > 0 || ctx.addr.fails_over() {
        // A round's reply may wait for WAIT as well as for the commands (on a shard that
        // fails over, the automatic WAIT may turn on later: `shard::follow_replicas`).
        con.set_read_timeout(ctx.cfg.read_timeout + ctx.cfg.wait_timeout)?;
    }
    let mut buf = Vec::new();
    for s in script::ALL {
        script::Packer::new(&mut buf)
            .cmd(3)
            .arg(b"SCRIPT")
            .arg(b"LOAD")
            .arg(s.as_bytes());
    }
    script::Packer::new(&mut buf)
        .cmd(4)
        .arg(b"SET")
        .arg(script::RING_KEY)
        .arg(ctx.fingerprint.as_bytes())
        .arg(b"NX");
    script::Packer::new(&mut buf)
        .cmd(2)
        .arg(b"GET")
        .arg(script::RING_KEY);
    // Alive at once: a restarted Redis holds no liveness key until the first heartbeat.
    v1::pack_alive(&mut buf, ctx.node);
    con.send(&buf)?;
    let mut shas = Shas::default();
    for sha in shas.0.iter_mut() {
        match con.recv()? {
            Value::BulkString(b) => {
                *sha = String::from_utf8(b).map_err(|_| ConnectError::Setup("sha"))?
            }
            Value::ServerError(e) => return Err(LinkError::server(&e).into()),
            _ => return Err(ConnectError::Setup("SCRIPT LOAD")),
        }
    }
    if let Value::ServerError(e) = con.recv()? {
        return Err(LinkError::server(&e).into());
    }
    let theirs = match con.recv()? {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::ServerError(e) => return Err(LinkError::server(&e).into()),
        _ => return Err(ConnectError::Setup("GET ring")),
    };
    if let Value::ServerError(e) = con.recv()? {
        return Err(LinkError::server(&e).into());
    }
    if theirs != ctx.fingerprint {
        return Err(ConnectError::Mismatch {
            ours: ctx.fingerprint.clone(),
            theirs,
        });
    }
    Ok(Conn {
        link: con,
        shas,
        at: p.at,
        wait,
        replid: p.replid.into_bytes(),
    })
}
