//! WalletConnect 1.0 bridge frames on the relay's socket (DECISIONS §8), executed against the
//! worker's relay share: `sub` subscribes the connection to the v1 topic and hands it the
//! topic's pending frames, `pub` goes to the topic's other v1 subscribers (or waits for one),
//! `ack` is consumed. The 1.0 protocol has no answers: a refused frame is answered with a
//! JSON-RPC error (`id: null`), which 1.0 clients ignore. Not JSON-RPC methods, so not in
//! the table of `methods`, but a family like them: their cost (`cost_of_v1`) and execution.

use crate::conn::admit::admit;
use crate::conn::{Conn, Ctx, Phase};
use crate::limits::Cost;
use crate::relay::RelayError;
use crate::rpc::v1::{V1Frame, V1Kind};
use crate::rpc::RpcError;

/// Executes a v1 frame.
pub fn frame<S>(conn: &mut Conn<S>, f: V1Frame<'_>, ctx: &mut Ctx<'_>) -> Result<(), RpcError> {
    if !matches!(conn.phase, Phase::Ws(_)) {
        return Err(RpcError::server(RelayError::Closing.to_string()));
    }
    let max_topic = ctx.shared.config.limits.max_topic;
    if f.topic.len() > max_topic {
        return Err(RpcError::invalid_request(format!(
            "Invalid v1 frame: \"topic\" longer than {max_topic} bytes"
        )));
    }
    // The same rate limits as the relay's own methods (DECISIONS §11).
    admit(conn, cost_of_v1(&f), ctx)?;
    let me = ctx.conn_ref(conn);
    match f.kind {
        V1Kind::Sub => {
            let max = ctx.shared.config.limits.max_subscriptions;
            let known = conn.v1_topics().iter().any(|t| **t == *f.topic);
            if !known && conn.subs.len() + conn.v1_topics().len() >= max {
                return Err(RpcError::server(
                    RelayError::TooManySubscriptions(max).to_string(),
                ));
            }
            if let Some(name) = ctx.relay.v1_subscribe(me, &f.topic) {
                conn.v1.get_or_insert_with(Default::default).push(name);
            }
        }
        V1Kind::Pub => ctx.relay.v1_publish(me, &f.topic, &f.payload, f.silent),
        V1Kind::Ack => {}
    }
    Ok(())
}

/// What a WalletConnect 1.0 frame asks of the rate limits: the same as the relay's own
/// methods (a `pub` is a publish of its payload, a `sub` a subscribe, an `ack` nothing).
fn cost_of_v1(f: &V1Frame<'_>) -> Cost {
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
