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
    /// The shard's cluster writes a data layout this build does not read.
    #[error("this shard's cluster writes Redis data layout {version} ({theirs:?}); this build reads layouts {oldest}-{newest}: upgrade (or go back) through a build that reads both (docs/UPGRADING.md)", oldest = crate::layout::REDIS_OLDEST, newest = crate::layout::REDIS)]
    Layout {
        /// The layout it names.
        version: u32,
        /// The fingerprint found in the shard.
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

/// The fingerprint a shard without one is given: this node's list, in the layout the
/// cluster writes now.
pub(crate) fn ring_offer(ctx: &ShardCtx) -> String {
    let v = ctx
        .cfg
        .layouts
        .redis_writes()
        .unwrap_or(crate::layout::REDIS);
    super::ring::at_version(&ctx.fingerprint, v)
}

/// Checks the fingerprint found in the shard (`theirs`) against this node's and notes the
/// layout it names (`layout::Current`): the same shard list, in a layout this build reads.
pub(crate) fn check_ring(ctx: &ShardCtx, theirs: String) -> Result<u32, ConnectError> {
    match super::ring::accept(&ctx.fingerprint, &theirs) {
        Ok(v) => {
            ctx.cfg.layouts.note_shard(ctx.idx, v);
            Ok(v)
        }
        Err(super::ring::Refusal::OtherList) => Err(ConnectError::Mismatch {
            ours: ctx.fingerprint.clone(),
            theirs,
        }),
        Err(super::ring::Refusal::Unreadable(version)) => {
            Err(ConnectError::Layout { version, theirs })
        }
    }
}

/// Moves the shard's fingerprint to layout `to` on `link` (a connection of its own, for
/// `walletrelay switch-layout`): from any layout this build reads; the same again is a
/// no-op. Returns the layout it named before. Nodes of the old layout then refuse to
/// (re)join the shard, and running nodes of this build read the move with their next
/// heartbeat (`Command::Ring`).
pub(crate) fn switch_ring(ctx: &ShardCtx, link: &mut Link, to: u32) -> Result<u32, ConnectError> {
    let theirs = match link.query(&[b"GET", script::RING_KEY])? {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        _ => return Err(ConnectError::Setup("the shard holds no fingerprint")),
    };
    let from = check_ring(ctx, theirs)?;
    if from != to {
        let next = super::ring::at_version(&ctx.fingerprint, to);
        link.query(&[b"SET", script::RING_KEY, next.as_bytes(), b"XX"])?;
        log::warn!(shard = ctx.idx, addr:% = ctx.addr, from, to;
            "redis shard {}: data layout switched from {from} to {to}: nodes of layout {from} can no longer join",
            ctx.addr
        );
    }
    ctx.cfg.layouts.note_shard(ctx.idx, to);
    Ok(from)
}

/// Moves a standalone or Sentinel shard's fingerprint to layout `to` (`switch_ring`).
pub(crate) fn switch(ctx: &ShardCtx, to: u32) -> Result<u32, ConnectError> {
    let mut p = primary::connect(&ctx.reach())?;
    switch_ring(ctx, &mut p.link, to)
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
    // A shard that holds no fingerprint yet joins the layout the cluster writes (this
    // build's newest when none is known).
    script::Packer::new(&mut buf)
        .cmd(4)
        .arg(b"SET")
        .arg(script::RING_KEY)
        .arg(ring_offer(ctx).as_bytes())
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
    check_ring(ctx, theirs)?;
    Ok(Conn {
        link: con,
        shas,
        at: p.at,
        wait,
        replid: p.replid.into_bytes(),
    })
}
