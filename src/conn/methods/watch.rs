//! `irn_watchRegister {registerAuth}` and `irn_watchUnregister {unregisterAuth}` (DECISIONS
//! 13): their params (the watched client's JWT), their cost (nothing) and their execution,
//! one call to `Shared::notifier`.

use std::borrow::Cow;

use super::{Caller, Method, Outcome};
use crate::conn::{outbound, Ctx};
use crate::limits::Cost;
use crate::rpc::params::{extra, string_param, Rules};
use crate::rpc::wire::Params;
use crate::rpc::{self, RpcError};

/// `irn_watchRegister {registerAuth}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRegister<'a> {
    /// The watched client's JWT.
    pub auth: Cow<'a, str>,
}

/// `irn_watchUnregister {unregisterAuth}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchUnregister<'a> {
    /// The watched client's JWT.
    pub auth: Cow<'a, str>,
}

impl<'a> Method<'a> for WatchRegister<'a> {
    fn parse(p: &mut Params<'a>, _: Rules) -> Result<Self, RpcError> {
        let max = crate::auth::MAX_TOKEN_LEN;
        let auth = string_param(extra(p).register_auth, "registerAuth", max)?;
        Ok(WatchRegister { auth })
    }

    fn cost(&self) -> Cost {
        Cost::default()
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        watch(c, ctx, &self.auth, true)
    }
}

impl<'a> Method<'a> for WatchUnregister<'a> {
    fn parse(p: &mut Params<'a>, _: Rules) -> Result<Self, RpcError> {
        let max = crate::auth::MAX_TOKEN_LEN;
        let auth = string_param(extra(p).unregister_auth, "unregisterAuth", max)?;
        Ok(WatchUnregister { auth })
    }

    fn cost(&self) -> Cost {
        Cost::default()
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        watch(c, ctx, &self.auth, false)
    }
}

/// `irn_watchRegister` (`register`) or `irn_watchUnregister`: checked and applied by
/// `notify` (a lock taken by registrations only, no I/O); refusals -32000 with their tag.
/// On a durable node or Redis the answer is pending until the change is on disk or
/// acknowledged by Redis (`notify::Saved::Later`): the persister's or the Redis writer's
/// thread tells the worker (`Shared::watch_reply`), which resolves it.
fn watch<S>(
    c: &mut Caller<'_, S>,
    ctx: &Ctx<'_>,
    auth: &str,
    register: bool,
) -> Result<Outcome, RpcError> {
    let n = &ctx.shared.notifier;
    let answer = c.answer;
    let done: crate::notify::Done = match answer {
        // A notification (no id): nothing to answer.
        0 => Box::new(|_| {}),
        _ => {
            let (reply, me, worker) =
                (ctx.shared.watch_reply.clone(), ctx.conn_ref(c.conn), ctx.me);
            Box::new(move |r| reply(worker, me, answer, r))
        }
    };
    let saved = match register {
        true => n.register_then(auth, done),
        false => n.unregister_then(auth, done),
    }
    .map_err(|e| RpcError::tagged(rpc::code::SERVER_ERROR, e.message(), e.tag()))?;
    let result = match register {
        true => {
            let mut out = b"{\"relayId\":".to_vec();
            rpc::write_str(&mut out, n.key().did_key());
            out.push(b'}');
            out
        }
        false => b"true".to_vec(),
    };
    Ok(match (saved, answer) {
        (crate::notify::Saved::Later, 1..) => Outcome::Pending(1, outbound::Gathered::Json(result)),
        _ => Outcome::Json(result),
    })
}
