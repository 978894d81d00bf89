//! JSON-RPC over HTTP, `POST /rpc` (DECISIONS 13, relay-api.md (c)): the relay-auth JWT (query
//! `auth` or `Authorization: Bearer`; `exp` optional, the audience may be the relay's http(s)
//! origin) and the project are checked (401/403), the body must be one JSON-RPC request
//! (else 400), and the request is executed as on a socket, except that what a socket would
//! subscribe belongs to the JWT's client id (`Relay::client_subscribe`). The answer is
//! 200 `application/json` with the JSON-RPC response; one that waits for the relay (a
//! publish's store, a fetch's reads) waits in the connection's backlog like a WebSocket
//! answer (`outbound`), and [`finish`] writes it as the HTTP response once it is complete.
//! The connection reads no further request meanwhile (`HttpWait::Rpc`).

use std::borrow::Cow;
use std::sync::Arc;

use super::outbound::{self, Part, Parts};
use super::waku::{self, publishes, rpc_error, write_outcome, Answer, Outcome};
use super::{admit, Conn, Ctx, HttpWait, Phase};
use crate::auth::{ClientKey, UpgradeAuth, Verdict};
use crate::http::{self, response, response::Response};
use crate::rpc::{self, Id, Incoming, Item, Op, Request, RpcError};

/// The answer number of a `POST /rpc` request that waits for the relay: an HTTP
/// connection has at most one such request at a time (it reads no other until it is
/// answered), so one number serves them all.
const HTTP_ANSWER: u64 = 1;

/// Answers `POST /rpc`: the response now, or `None` when it waits for the relay (the
/// connection is then in `HttpWait::Rpc` until [`finish`] writes it).
pub fn request<S>(
    conn: &mut Conn<S>,
    req: &http::Request<'_>,
    ctx: &mut Ctx<'_>,
) -> Option<Response> {
    let up = UpgradeAuth::from_request(req.query, req.authorization);
    let client = match ctx
        .tools
        .gate
        .check_http(&up, crate::clock::unix_ms() / 1000)
    {
        Verdict::Open(Some(c)) => c,
        Verdict::Open(None) => return Some(Response::json_error(401, "missing auth token")),
        Verdict::Refused(status, reason) => {
            ctx.metrics().auth_refused.inc();
            return Some(Response::json_error(status, reason));
        }
    };
    let project = up.project_id.as_deref().map(str::to_owned);
    let mut body = req.body.to_vec();
    let mut call = match rpc::decode(&mut body, &mut ctx.tools.json) {
        Err(_) => return Some(refusal(&Id::Null, rpc::code::PARSE_ERROR, "Parse error")),
        Ok(Incoming::Single(Item::Call(call))) => call,
        Ok(Incoming::Single(Item::Invalid(id, e))) => {
            return Some(refusal(&id, e.code, &e.message));
        }
        Ok(Incoming::Batch(_)) => {
            let m = "Invalid request: one JSON-RPC request per POST, not a batch";
            return Some(refusal(&Id::Null, rpc::code::INVALID_REQUEST, m));
        }
        Ok(Incoming::Single(Item::Ack(_) | Item::V1(_))) => {
            let m = "Invalid request: not a JSON-RPC request";
            return Some(refusal(&Id::Null, rpc::code::INVALID_REQUEST, m));
        }
    };
    ctx.tools
        .limits
        .bind_client(&mut conn.limit, &client, ctx.now);
    let id = call.id.take();
    let answer = if id.is_some() { HTTP_ANSWER } else { 0 };
    let result = call
        .op(ctx.shared.config.limits.max_topic)
        .and_then(|req| execute(conn, req, answer, &client, project.as_deref(), ctx));
    let Some(id) = id else {
        // A notification: executed, never answered (JSON-RPC 2.0 §4.1).
        return Some(Response::empty(204));
    };
    let mut buf = Vec::new();
    let mut a = Answer {
        parts: Parts::Zero,
        cur: &mut buf,
    };
    write_outcome(&mut a, &id, answer, result, ctx);
    if a.parts.is_empty() {
        return Some(Response::new(200, response::JSON, buf));
    }
    if !a.cur.is_empty() {
        a.parts.push(Part::Bytes(std::mem::take(a.cur)));
    }
    conn.hold_answer(std::mem::take(&mut a.parts));
    let mut text = Vec::new();
    if conn.take_ready_answer(&mut text) {
        return Some(Response::new(200, response::JSON, text));
    }
    conn.phase = Phase::Http(HttpWait::Rpc { close: req.close });
    None
}

/// A request that is not one JSON-RPC request: 400 with the JSON-RPC error as its body.
fn refusal(id: &Id<'_>, code: i32, message: &str) -> Response {
    let e = RpcError {
        code,
        message: Cow::Owned(message.to_owned()),
        data: None,
    };
    let mut body = Vec::new();
    rpc::write_error(&mut body, id, &e);
    Response::new(400, response::JSON, body)
}

/// Writes a waiting `POST /rpc` answer as its HTTP response once it is complete; returns
/// whether it did (the connection then reads its next request, idle for at most `idle_ms`,
/// or closes when asked to).
pub fn finish<S>(conn: &mut Conn<S>, date: &[u8], now: u64, close_ms: u64, idle_ms: u64) -> bool {
    let Phase::Http(HttpWait::Rpc { close }) = conn.phase else {
        return false;
    };
    let mut text = Vec::new();
    if !conn.take_ready_answer(&mut text) {
        return false;
    }
    let resp = Response::new(200, response::JSON, text);
    response::write(&mut conn.out, &resp, date, false, close);
    if close {
        conn.begin_close(now, close_ms);
    } else {
        conn.phase = Phase::Http(HttpWait::Nothing);
        conn.deadline = now + idle_ms;
    }
    true
}

/// Runs a validated request for `client` over HTTP: as on a socket, except that the
/// subscribing methods make client-id subscriptions.
fn execute<S>(
    conn: &mut Conn<S>,
    req: Request<'_>,
    answer: u64,
    client: &Arc<ClientKey>,
    project: Option<&str>,
    ctx: &mut Ctx<'_>,
) -> Result<Outcome, RpcError> {
    admit::admit_http(conn, admit::cost_of(&req.op), ctx)?;
    let did = client.did();
    let plain = req.plain.0;
    // The JWT's client id publishes (its publisher watches hear of it).
    let by = crate::engine::clients::ClientRef::new(&did, project);
    let publish = |conn: &Conn<S>, t: &str, m: &str, ttl, prompt, tag, a, ctx: &mut Ctx<'_>| {
        let meta = waku::meta(tag, a, plain);
        waku::publish_by(conn, t, m, ttl, prompt, meta, answer, Some(by.clone()), ctx)
    };
    let sub = |ctx: &mut Ctx<'_>, topic: &str| {
        ctx.relay
            .client_subscribe(&did, project, topic)
            .map_err(|e| rpc_error(&e))
    };
    match req.op {
        Op::Subscribe { topic } | Op::SubscribeBlocking { topic } => {
            sub(ctx, &topic).map(Outcome::Subscribed)
        }
        Op::CreateTopic { topic } => sub(ctx, &topic).map(|_| Outcome::Done),
        Op::BatchSubscribe { topics } => {
            let ids = topics
                .iter()
                .map(|t| sub(ctx, t))
                .collect::<Result<_, _>>()?;
            Ok(Outcome::SubscribedMany(ids))
        }
        Op::BatchSubscribeBlocking { topics } => {
            let each = topics
                .iter()
                .map(|t| {
                    sub(ctx, t)
                        .map_err(|e| RpcError::tagged(e.code, e.message, "SubscriberLimitExceeded"))
                })
                .collect();
            Ok(Outcome::Pending(0, outbound::Outcome::SubscribedEach(each)))
        }
        Op::Unsubscribe { topic, .. } => {
            if let Some(t) = topic {
                ctx.relay.client_unsubscribe(&did, project, &t);
            }
            Ok(Outcome::Done)
        }
        Op::BatchUnsubscribe { subs } => {
            for (t, _) in &subs {
                ctx.relay.client_unsubscribe(&did, project, t);
            }
            Ok(Outcome::Done)
        }
        Op::Publish {
            topic,
            message,
            ttl,
            prompt,
            tag,
            attestation,
        } => {
            let a = attestation.as_deref();
            let done = publish(conn, &topic, &message, ttl, prompt, tag, a, ctx);
            publishes(&[done])
        }
        Op::Fetch { topics, .. } => {
            // No socket cursor: after what the client id was given (its mailbox).
            let c = crate::engine::clients::ClientRef::new(&did, project);
            super::fetch::start_for(conn, &topics, answer, Some(c), ctx);
            let gathered = outbound::Outcome::Fetch(Default::default());
            Ok(Outcome::Pending(topics.len() as u32, gathered))
        }
        Op::BatchReceive { receipts } => {
            waku::receive(Some(did.clone()), &receipts, ctx);
            Ok(Outcome::Done)
        }
        Op::WatchRegister { auth } => waku::watch(conn, answer, ctx, &auth, true),
        Op::WatchUnregister { auth } => waku::watch(conn, answer, ctx, &auth, false),
        Op::ProposeSession {
            pairing_topic,
            proposal,
            ttl,
        } => {
            sub(ctx, &pairing_topic)?;
            let (t, p) = (&*pairing_topic, &*proposal);
            let tag = waku::TAG_PROPOSE;
            let done = publish(conn, t, p, ttl, true, tag, None, ctx);
            publishes(&[done])
        }
        Op::ApproveSession {
            session_topic,
            pairing_topic,
            response,
            settlement,
            ttl,
        } => {
            sub(ctx, &session_topic)?;
            let (pt, st) = (&*pairing_topic, &*session_topic);
            let r = waku::TAG_PROPOSE_RESPONSE;
            let first = publish(conn, pt, &response, ttl, false, r, None, ctx);
            let s = waku::TAG_SETTLE;
            let second = publish(conn, st, &settlement, ttl, false, s, None, ctx);
            publishes(&[first, second])
        }
    }
}
