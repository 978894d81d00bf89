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

use super::methods::{self, HttpClient, Via};
use super::outbound::{Part, Parts};
use super::waku::{write_outcome, Answer};
use super::{Conn, Ctx, HttpWait, Phase};
use crate::auth::{UpgradeAuth, Verdict};
use crate::engine::clients::ClientRef;
use crate::http::{self, response, response::Response};
use crate::rpc::{self, Id, Incoming, Item, RpcError};

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
        // `check_http` verifies at once; it never answers `Pending`.
        Verdict::Open(None) | Verdict::Pending => {
            return Some(Response::json_error(401, "missing auth token"))
        }
        Verdict::Refused(status, reason) => {
            ctx.metrics().auth_refused.inc();
            log::debug!(
                worker = ctx.me, status, reason, via = "http";
                "relay auth refused: {reason}"
            );
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
        .bind_client(&mut conn.limit, &client, ctx.time.ms);
    let id = call.id.take();
    let answer = if id.is_some() { HTTP_ANSWER } else { 0 };
    // The JWT's client id subscribes and publishes (its publisher watches hear of it).
    let did = client.did();
    let project = project.as_deref();
    let by = ClientRef::new(&did, project);
    let who = HttpClient { did, project, by };
    let result = methods::parse(&mut call, ctx.shared.config.limits.max_topic)
        .and_then(|req| methods::execute(conn, req, answer, Via::Http(&who), ctx));
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
