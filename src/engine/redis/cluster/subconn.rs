//! The subscriber's own connection to a shard: the shard's primary (found as the command
//! thread finds it, `primary`), connected with the cluster's timeouts (its read timeout is
//! the liveness timeout: the writer pings every heartbeat, so a healthy server sends
//! something at least that often) and logged in, then split for the subscriber's reader and
//! writer threads (`pubsub`). The subscriber only ever sends SUBSCRIBE, UNSUBSCRIBE and
//! PING, and reads pushes.

use std::net::{Shutdown, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::addr::Endpoint;
use super::command::ShardCtx;
use super::link::{Split, WriteHalf};
use super::primary;
use super::types::ClusterConfig;

/// The write half of the current connection, shared by the writer thread and whoever
/// closes it.
pub(crate) struct Sock {
    w: Mutex<WriteHalf>,
    s: TcpStream,
}

impl Sock {
    pub(crate) fn new(w: WriteHalf, s: TcpStream) -> Sock {
        Sock {
            w: Mutex::new(w),
            s,
        }
    }

    /// The write half (a poisoned lock still holds a usable value).
    pub(crate) fn writer(&self) -> MutexGuard<'_, WriteHalf> {
        self.w.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes the connection (the reader's blocked read returns).
    pub(crate) fn shutdown(&self) {
        let _ = self.s.shutdown(Shutdown::Both);
    }
}

/// Connects and logs in to `at` (one node of a Redis Cluster), or else to the shard's
/// primary (found again on every connect); returns the halves.
pub(crate) fn connect(ctx: &ShardCtx, at: Option<&Endpoint>) -> Result<Split, String> {
    let link = match at {
        Some(at) => primary::node(&ctx.reach(), at),
        None => primary::connect(&ctx.reach()).map(|p| p.link),
    }
    .map_err(|e| e.to_string())?;
    link.set_read_timeout(liveness_timeout(&ctx.cfg))
        .map_err(|e| e.to_string())?;
    Ok(link.split())
}

/// How long the reader waits for any byte before it declares the server dead: the writer
/// pings every heartbeat, so a healthy server sends something at least that often.
pub(crate) fn liveness_timeout(cfg: &ClusterConfig) -> Duration {
    cfg.heartbeat * 2 + cfg.read_timeout
}
