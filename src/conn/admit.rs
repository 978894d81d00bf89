//! The rate-limit gate of a WebSocket's requests (DECISIONS §11): what a JSON-RPC operation
//! ([`cost_of`]) or a WalletConnect 1.0 frame ([`cost_of_v1`]) costs, and [`admit`], which
//! takes that cost from the connection's, its address's and its client's buckets or refuses
//! it (counted in `walletrelay_limited_total`).
//!
//! Used by `waku` and `bridge` before they execute anything; decides nothing else.

use super::{Conn, Ctx, Phase};
use crate::limits::Cost;
use crate::rpc::v1::{V1Frame, V1Kind};
use crate::rpc::{Op, RpcError};

/// What an operation asks of the rate limits (DECISIONS §11: a batch counts each topic).
pub(super) fn cost_of(op: &Op<'_>) -> Cost {
    match op {
        Op::Publish { message, .. } => Cost {
            publishes: 1,
            bytes: message.len(),
            subscribes: 0,
        },
        Op::Subscribe { .. } | Op::SubscribeBlocking { .. } | Op::CreateTopic { .. } => Cost {
            subscribes: 1,
            ..Cost::default()
        },
        Op::BatchSubscribe { topics } | Op::BatchSubscribeBlocking { topics } => Cost {
            subscribes: topics.len() as u32,
            ..Cost::default()
        },
        Op::ProposeSession { proposal, .. } => Cost {
            publishes: 1,
            bytes: proposal.len(),
            subscribes: 1,
        },
        Op::ApproveSession {
            response,
            settlement,
            ..
        } => Cost {
            publishes: 2,
            bytes: response.len() + settlement.len(),
            subscribes: 1,
        },
        Op::Unsubscribe { .. }
        | Op::BatchUnsubscribe { .. }
        | Op::Fetch { .. }
        | Op::BatchReceive { .. }
        | Op::WatchRegister { .. }
        | Op::WatchUnregister { .. } => Cost::default(),
    }
}

/// What a WalletConnect 1.0 frame asks of the rate limits: the same as the relay's own
/// methods (a `pub` is a publish of its payload, a `sub` a subscribe, an `ack` nothing).
pub(super) fn cost_of_v1(f: &V1Frame<'_>) -> Cost {
    match f.kind {
        V1Kind::Pub => Cost {
            publishes: 1,
            bytes: f.payload.len(),
            subscribes: 0,
        },
        V1Kind::Sub => Cost {
            subscribes: 1,
            ..Default::default()
        },
        V1Kind::Ack => Cost::default(),
    }
}

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
    let mut own = ctx.tools.limits.conn_buckets(ctx.now);
    match ctx.tools.limits.admit(&conn.limit, &mut own, cost, ctx.now) {
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
        .admit(&conn.limit, &mut w.limits, cost, ctx.now)
    {
        Ok(()) => Ok(()),
        Err(l) => {
            ctx.metrics().limited[l.kind as usize].inc();
            Err(RpcError::rate_limited(l.retry_after_ms))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_methods_cost_what_their_nearest_method_costs() {
        let t = || std::borrow::Cow::Borrowed("t");
        let one = cost_of(&Op::Subscribe { topic: t() });
        assert_eq!(one.subscribes, 1);
        for op in [
            Op::SubscribeBlocking { topic: t() },
            Op::CreateTopic { topic: t() },
        ] {
            let c = cost_of(&op);
            assert_eq!((c.subscribes, c.publishes, c.bytes), (1, 0, 0));
        }
        let c = cost_of(&Op::BatchSubscribeBlocking {
            topics: vec![t(), t(), t()],
        });
        assert_eq!((c.subscribes, c.publishes), (3, 0));
        let c = cost_of(&Op::BatchReceive {
            receipts: vec![(t(), 1)],
        });
        assert_eq!((c.subscribes, c.publishes, c.bytes), (0, 0, 0));
    }
}
