//! The subscriber's own connection to a shard: connected with the cluster's timeouts (its
//! read timeout is the liveness timeout: the writer pings every heartbeat, so a healthy server
//! sends something at least that often) and authenticated, then handed to the subscriber's
//! reader and writer threads (`pubsub`). Raw RESP over a `TcpStream`: the subscriber only
//! ever sends SUBSCRIBE, UNSUBSCRIBE and PING, and reads pushes.

use std::io::{BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use redis::Value;

use super::command::ShardCtx;
use super::script::Packer;
use super::types::ClusterConfig;

/// Connects and authenticates; returns the write half and the buffered read half.
pub(crate) fn connect(
    ctx: &ShardCtx,
) -> Result<(TcpStream, BufReader<TcpStream>, redis::Parser), String> {
    let cfg = &ctx.cfg;
    let addr = (ctx.addr.host.as_str(), ctx.addr.port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let s = TcpStream::connect_timeout(&addr, cfg.connect_timeout).map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(liveness_timeout(cfg)))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(cfg.read_timeout))
        .map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut parser = redis::Parser::new();
    if let Some(pw) = ctx.addr.password.as_deref() {
        let mut buf = Vec::new();
        let mut p = Packer::new(&mut buf);
        match ctx.addr.username.as_deref() {
            Some(u) => p.cmd(3).arg(b"AUTH").arg(u.as_bytes()).arg(pw.as_bytes()),
            None => p.cmd(2).arg(b"AUTH").arg(pw.as_bytes()),
        };
        w.write_all(&buf).map_err(|e| e.to_string())?;
        if let Value::ServerError(e) = parser.parse_value(&mut r).map_err(|e| e.to_string())? {
            return Err(format!("AUTH: {e:?}"));
        }
    }
    Ok((w, r, parser))
}

/// How long the reader waits for any byte before it declares the server dead: the writer
/// pings every heartbeat, so a healthy server sends something at least that often.
pub(crate) fn liveness_timeout(cfg: &ClusterConfig) -> Duration {
    cfg.heartbeat * 2 + cfg.read_timeout
}
