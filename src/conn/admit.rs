//! The rate-limit gate of a connection's requests (DECISIONS §11): [`admit`] (a socket's)
//! and [`admit_http`] (a `POST /rpc`'s) take a request's cost (each method says its own,
//! `methods/`) from the connection's, its address's and its client's buckets or refuse it
//! (counted in `walletrelay_limited_total`).
//!
//! Used by `methods` before a method or a v1 frame runs; decides nothing else.

use super::{Conn, Ctx, Phase};
use crate::limits::Cost;
use crate::rpc::RpcError;

/// [`admit`] for a `POST /rpc` request: its address's and its client's buckets (bound at
/// the request, `Limiter::bind_client`), with fresh buckets of its own (an HTTP request
/// is one request; what counts across requests is the address and the client id).
pub(super) fn admit_http<S>(
    conn: &mut Conn<S>,
    cost: Cost,
    ctx: &mut Ctx<'_>,
) -> Result<(), RpcError> {
    if cost.publishes == 0 && cost.subscribes == 0 {
        return Ok(());
    }
    let mut own = ctx.tools.limits.conn_buckets(ctx.time.ms);
    match ctx
        .tools
        .limits
        .admit(&conn.limit, &mut own, cost, ctx.time.ms)
    {
        Ok(()) => Ok(()),
        Err(l) => {
            ctx.metrics().limited[l.kind as usize].inc();
            Err(RpcError::rate_limited(l.retry_after_ms))
        }
    }
}

/// Takes a request's cost from the connection's, its address's and its client's buckets,
/// or refuses it whole: -32000 `rate limited` with `retryAfterMs`.
pub(super) fn admit<S>(conn: &mut Conn<S>, cost: Cost, ctx: &mut Ctx<'_>) -> Result<(), RpcError> {
    if cost.publishes == 0 && cost.subscribes == 0 {
        return Ok(());
    }
    let Phase::Ws(w) = &mut conn.phase else {
        return Ok(());
    };
    match ctx
        .tools
        .limits
        .admit(&conn.limit, &mut w.limits, cost, ctx.time.ms)
    {
        Ok(()) => Ok(()),
        Err(l) => {
            ctx.metrics().limited[l.kind as usize].inc();
            Err(RpcError::rate_limited(l.retry_after_ms))
        }
    }
}
