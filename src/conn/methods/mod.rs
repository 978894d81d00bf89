//! The relay's JSON-RPC methods, one file per family (as mini-redis's `cmd/`): each method is
//! a type holding its validated params that implements `Method`: how it reads its params,
//! what it costs the rate limits, how it runs. The table below (`methods!`) names every
//! method and its type; from it come [`Op`], the name lookup and the dispatch, all static
//! (`match`), so a request costs no `dyn` call and no allocation of its own here.
//!
//! Both ways in go through `execute`: a WebSocket message (`conn/waku.rs`) and `POST /rpc`
//! (`conn/rpc_http.rs`). Where they differ (what a socket subscribes is the connection's,
//! what an HTTP request subscribes is its token's client id's), the method asks its
//! `Caller`. WalletConnect 1.0 frames are not JSON-RPC methods: [`v1`].

pub mod fetch;
pub mod publish;
pub mod session;
pub mod subscribe;
pub mod unsubscribe;
pub mod v1;
pub mod watch;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use super::admit::{admit, admit_http};
use super::{outbound, Conn, Ctx};
use crate::engine::ClientRef;
use crate::limits::Cost;
use crate::relay::{RelayError, SubId};
use crate::rpc::params::Rules;
use crate::rpc::wire::Params;
use crate::rpc::{self, Call, Dialect, Plain, RpcError};

/// One JSON-RPC method: its params, its cost, its execution.
pub(super) trait Method<'a>: Sized {
    /// Validates the params (taken out of `p` where they lie) by the rules of the method's
    /// prefix; a refusal names the param (-32602).
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError>;
    /// What it takes from the rate limits before it runs (DECISIONS §11: a batch counts each
    /// topic; a method that neither publishes nor subscribes costs nothing).
    fn cost(&self) -> Cost;
    /// Runs it for `c` against the worker's relay share.
    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError>;
}

/// Builds [`Op`], the name lookup and the dispatch from the table's rows:
/// `Variant => family::Type, NAMES "name";`, where `NAMES` says under which prefixes the
/// name is known ([`Names`]).
macro_rules! methods {
    ($($variant:ident => $fam:ident::$ty:ident, $names:ident $name:literal;)*) => {
        /// Which method a call names.
        #[derive(Clone, Copy)]
        enum Kind {
            $($variant,)*
        }

        /// A validated relay operation: the method, with its params.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Op<'a> {
            $(
                #[doc = concat!("`", $name, "` (`methods/", stringify!($fam), ".rs`).")]
                $variant($fam::$ty<'a>),
            )*
        }

        /// The method `name` calls and the dialect of its prefix; `None` for an unknown one.
        #[inline(always)]
        fn lookup(name: &str) -> Option<(Dialect, Kind)> {
            let (dialect, rest, under) = prefix(name);
            let kind = match rest {
                $($name if Names::$names.known(under) => Kind::$variant,)*
                _ => return None,
            };
            Some((dialect, kind))
        }

        impl<'a> Op<'a> {
            #[inline(always)]
            fn parse(kind: Kind, p: &mut Params<'a>, r: Rules) -> Result<Op<'a>, RpcError> {
                Ok(match kind {
                    $(Kind::$variant => Op::$variant(Method::parse(p, r)?),)*
                })
            }

            /// What it takes from the rate limits.
            #[inline(always)]
            pub fn cost(&self) -> Cost {
                match self {
                    $(Op::$variant(m) => m.cost(),)*
                }
            }

            #[inline(always)]
            fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
                match self {
                    $(Op::$variant(m) => m.run(c, ctx),)*
                }
            }
        }
    };
}

// The table: every method, the type that parses, prices and runs it, the prefixes it is
// known under and its name. Adding a method is a file beside this one and a row here. The
// publish comes first: names are compared in this order, and it is most requests.
methods! {
    Publish => publish::Publish, All "publish";
    Subscribe => subscribe::Subscribe, All "subscribe";
    Unsubscribe => unsubscribe::Unsubscribe, All "unsubscribe";
    BatchSubscribe => subscribe::BatchSubscribe, All "batchSubscribe";
    BatchUnsubscribe => unsubscribe::BatchUnsubscribe, All "batchUnsubscribe";
    FetchMessages => fetch::FetchMessages, All "fetchMessages";
    BatchFetchMessages => fetch::BatchFetchMessages, All "batchFetchMessages";
    SubscribeBlocking => subscribe::SubscribeBlocking, Today "subscribeBlocking";
    BatchSubscribeBlocking => subscribe::BatchSubscribeBlocking, Today "batchSubscribeBlocking";
    BatchReceive => fetch::BatchReceive, Today "batchReceive";
    WatchRegister => watch::WatchRegister, Today "watchRegister";
    WatchUnregister => watch::WatchUnregister, Today "watchUnregister";
    ProposeSession => session::ProposeSession, Bare "wc_proposeSession";
    ApproveSession => session::ApproveSession, Bare "wc_approveSession";
    CreateTopic => session::CreateTopic, Bare "wc_createTopic";
}

/// The prefix a method name came under.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prefix {
    /// `waku_` (the 2021 beta).
    Beta,
    /// `irn_` or `iridium_`.
    Today,
    /// None (the `wc_` methods).
    Bare,
}

/// Under which prefixes a table row's name is known (DECISIONS §10: one API under three
/// prefixes).
#[derive(Clone, Copy)]
enum Names {
    /// `waku_`, `irn_`, `iridium_`.
    All,
    /// `irn_`, `iridium_`: methods of today's relay only, not under the beta prefix.
    Today,
    /// As written, without a prefix (answered with `irn_` pushes).
    Bare,
}

impl Names {
    #[inline(always)]
    fn known(self, under: Prefix) -> bool {
        match self {
            Names::All => under != Prefix::Bare,
            Names::Today => under == Prefix::Today,
            Names::Bare => under == Prefix::Bare,
        }
    }
}

/// A method name's dialect, the name without its prefix, and the prefix.
#[inline(always)]
fn prefix(name: &str) -> (Dialect, &str, Prefix) {
    if let Some(r) = name.strip_prefix("waku_") {
        (Dialect::Waku, r, Prefix::Beta)
    } else if let Some(r) = name.strip_prefix("irn_") {
        (Dialect::Irn, r, Prefix::Today)
    } else if let Some(r) = name.strip_prefix("iridium_") {
        (Dialect::Iridium, r, Prefix::Today)
    } else {
        (Dialect::Irn, name, Prefix::Bare)
    }
}

/// A validated request: its operation and the prefix it came under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The method prefix.
    pub dialect: Dialect,
    /// The operation.
    pub op: Op<'a>,
    /// Whether its strings need no escape (see [`Plain`]).
    pub plain: Plain,
}

/// Validates a call's method and params into a request (-32601 for an unknown method,
/// -32602 naming a param). `max_topic` bounds topic length (beta topics; `irn_` topics are
/// 64 hex characters). Takes the params out of the call where they lie, so it is done with
/// the call. Inlined into its caller: a request returned through memory is written in
/// pieces and read back whole, a store-forwarding stall on every call.
#[inline(always)]
pub fn parse<'a>(call: &mut Call<'a>, max_topic: usize) -> Result<Request<'a>, RpcError> {
    let Some((dialect, kind)) = lookup(call.method()) else {
        return Err(RpcError {
            code: rpc::code::METHOD_NOT_FOUND,
            message: "Method not found".into(),
            data: None,
        });
    };
    let plain = call.plain();
    let p = call.params()?;
    let op = Op::parse(kind, p, Rules::new(dialect, max_topic))?;
    Ok(Request { dialect, op, plain })
}

/// Who runs a request, and what a method may ask of them.
pub(super) struct Caller<'c, S> {
    /// The connection it came on.
    pub(super) conn: &'c mut Conn<S>,
    /// Its answer number on the connection (0: a notification, never answered).
    pub(super) answer: u64,
    /// The prefix it came under (a subscription's pushes use it).
    pub(super) dialect: Dialect,
    /// Whether its strings need no escape (`rpc::Plain`).
    pub(super) plain: bool,
    /// The way it came.
    pub(super) via: Via<'c>,
}

/// The way a request came.
#[derive(Clone, Copy)]
pub(super) enum Via<'c> {
    /// A WebSocket message: what it subscribes is the connection's.
    Socket,
    /// `POST /rpc`: what it subscribes is the token's client id's.
    Http(&'c HttpClient<'c>),
}

/// The client of a `POST /rpc` request, as its relay-auth token names it.
pub(super) struct HttpClient<'p> {
    /// Its did:key.
    pub(super) did: String,
    /// Its project id, when the request named one.
    pub(super) project: Option<&'p str>,
    /// As the relay names a publisher (its publisher watches hear of what it publishes).
    pub(super) by: Arc<ClientRef>,
}

/// Runs a validated request that came `via`, as the connection's answer number `answer`:
/// takes its cost from the rate limits (-32000 `rate limited` when refused), then runs it.
#[inline(always)]
pub(super) fn execute<S>(
    conn: &mut Conn<S>,
    req: Request<'_>,
    answer: u64,
    via: Via<'_>,
    ctx: &mut Ctx<'_>,
) -> Result<Outcome, RpcError> {
    let cost = req.op.cost();
    match via {
        Via::Socket => admit(conn, cost, ctx)?,
        Via::Http(_) => admit_http(conn, cost, ctx)?,
    }
    let mut c = Caller {
        conn,
        answer,
        dialect: req.dialect,
        plain: req.plain.0,
        via,
    };
    req.op.run(&mut c, ctx)
}

/// What an operation gave.
pub(super) enum Outcome {
    /// `true`.
    Done,
    /// A subscription id.
    Subscribed(SubId),
    /// Subscription ids, in request order.
    SubscribedMany(Vec<SubId>),
    /// A result already encoded as JSON.
    Json(Vec<u8>),
    /// Answered later: this many results of the request's answer number are still to
    /// come, and what the ones known now gave.
    Pending(u32, outbound::Gathered),
}

/// The JSON-RPC error a relay refusal is answered with.
pub fn rpc_error(e: &RelayError) -> RpcError {
    match e {
        // relay_rpc's typed `SubscriptionError` (relay-api.md (e)).
        RelayError::SubscriberLimitExceeded(_) => RpcError::tagged(
            rpc::code::SERVER_ERROR,
            e.to_string(),
            "SubscriberLimitExceeded",
        ),
        _ => RpcError::server(e.to_string()),
    }
}
