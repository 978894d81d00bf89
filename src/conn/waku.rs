//! JSON-RPC over the WebSocket (the waku relay): a message is decoded (`rpc::decode`),
//! each request validated and executed by its method (`methods`) against the worker's relay
//! share, and the answers (one, or an array for a batch) queued on the connection in
//! request order; a client's acknowledgement of a push is consumed here. A publish whose
//! store answers later leaves a pending part in its answer (`outbound::Part::Pending`),
//! filled in when the store's answer comes back.
//!
//! Relay refusals ([`RelayError`]) become JSON-RPC errors at the edge (`methods::rpc_error`).

use std::borrow::Cow;

use super::methods::{self, rpc_error, Outcome, Request, Via};
use super::outbound::{self, write_publish_answer, Part, Parts};
use super::{Conn, Ctx, Phase};
use crate::limits;
use crate::relay::RelayError;
use crate::rpc::{self, Id, Incoming, Item, RpcError};

/// An answer being assembled: bytes known now, and the pending parts among them.
pub(super) struct Answer<'s> {
    pub(super) parts: Parts,
    pub(super) cur: &'s mut Vec<u8>,
}

impl Answer<'_> {
    /// An answer that comes later: its part waits for `left` results of answer number
    /// `answer`.
    fn pending(&mut self, answer: u64, id: &Id<'_>, left: u32, outcome: outbound::Gathered) {
        if !self.cur.is_empty() {
            self.parts.push(Part::Bytes(self.cur.clone()));
            self.cur.clear();
        }
        self.parts
            .push(Part::pending(answer, owned(id), left, outcome));
    }
}

/// An id that outlives the message it was read from.
fn owned(id: &Id<'_>) -> Id<'static> {
    match id {
        Id::U64(n) => Id::U64(*n),
        Id::I64(n) => Id::I64(*n),
        Id::F64(f) => Id::F64(*f),
        Id::Str(s) => Id::Str(Cow::Owned(s.to_string())),
        Id::Null => Id::Null,
    }
}

/// Executes a JSON-RPC message and queues its answer (if any).
pub fn message<S>(conn: &mut Conn<S>, payload: &mut [u8], ctx: &mut Ctx<'_>) {
    let mut buf = std::mem::take(&mut ctx.tools.scratch);
    buf.clear();
    let mut a = Answer {
        parts: Parts::Zero,
        cur: &mut buf,
    };
    match rpc::decode(payload, &mut ctx.tools.json) {
        Err(_) => {
            let e = RpcError {
                code: rpc::code::PARSE_ERROR,
                message: "Parse error".into(),
                data: None,
            };
            rpc::write_error(a.cur, &Id::Null, &e);
            ctx.metrics().rpc_errors.inc();
        }
        Ok(Incoming::Single(Item::V1(frame))) => {
            if let Err(e) = methods::v1::frame(conn, frame, ctx) {
                ctx.metrics().rpc_errors.inc();
                rpc::write_error(a.cur, &Id::Null, &e);
            }
        }
        Ok(Incoming::Single(ref mut item)) => {
            run_item(conn, item, &mut a, ctx);
        }
        Ok(Incoming::Batch(items)) => {
            a.cur.push(b'[');
            let mut any = false;
            for mut item in items {
                let (before, parts) = (a.cur.len(), a.parts.len());
                if any {
                    a.cur.push(b',');
                }
                if run_item(conn, &mut item, &mut a, ctx) {
                    any = true;
                } else if a.parts.len() == parts {
                    a.cur.truncate(before);
                }
            }
            if any {
                a.cur.push(b']');
            } else {
                a.cur.clear();
            }
        }
    }
    if !a.parts.is_empty() {
        if !a.cur.is_empty() {
            a.parts.push(Part::Bytes(a.cur.clone()));
        }
        conn.answer(std::mem::take(&mut a.parts));
    } else if !a.cur.is_empty() {
        conn.answer_text(a.cur);
    }
    // DECISIONS §11: a client that keeps going after its refusals is closed.
    if conn
        .ws()
        .is_some_and(|w| w.limits.refusals >= limits::CLOSE_AFTER_REFUSALS)
    {
        ctx.metrics().limit_closes.inc();
        let code = limits::CLOSE_TRY_AGAIN_LATER;
        conn.ws_close(code, "rate limited", ctx.time.ms, ctx.close_ms());
    }
    if buf.capacity() > 64 << 10 {
        buf = Vec::with_capacity(4096);
    }
    ctx.tools.scratch = buf;
}

/// Runs one element; appends its answer and returns whether it has one. The element is
/// taken apart where it lies (handed over by value, it was copied: 240 bytes).
fn run_item<S>(
    conn: &mut Conn<S>,
    item: &mut Item<'_>,
    a: &mut Answer<'_>,
    ctx: &mut Ctx<'_>,
) -> bool {
    match item {
        Item::Ack(id) => {
            if let Some(id) = *id {
                acknowledged(conn, id, ctx);
            }
            false
        }
        Item::V1(_) => {
            ctx.metrics().rpc_errors.inc();
            let e = RpcError {
                code: rpc::code::INVALID_REQUEST,
                message: "Invalid request: a v1 frame inside a batch".into(),
                data: None,
            };
            rpc::write_error(a.cur, &Id::Null, &e);
            true
        }
        Item::Invalid(id, e) => {
            ctx.metrics().rpc_errors.inc();
            rpc::write_error(a.cur, id, e);
            true
        }
        Item::Call(call) => {
            let id = call.id.take();
            let answer = match &id {
                Some(_) => next_answer(conn),
                None => 0,
            };
            let result = methods::parse(call, ctx.shared.config.limits.max_topic)
                .and_then(|req| execute(conn, req, answer, ctx));
            let Some(id) = id else { return false };
            write_outcome(a, &id, answer, result, ctx);
            true
        }
    }
}

/// Appends the answer to request `id` (the connection's answer number `answer`) for what
/// its execution gave. Inlined: it was the body of `run_item`, on every publish's way.
#[inline(always)]
pub(super) fn write_outcome(
    a: &mut Answer<'_>,
    id: &Id<'_>,
    answer: u64,
    result: Result<Outcome, RpcError>,
    ctx: &mut Ctx<'_>,
) {
    match result {
        Ok(Outcome::Done) => write_publish_answer(a.cur, id, &Ok(())),
        Ok(Outcome::Subscribed(sub)) => {
            let mut r = [b'"'; 66];
            r[1..65].copy_from_slice(sub.hex());
            rpc::write_result(a.cur, id, &r);
        }
        Ok(Outcome::SubscribedMany(subs)) => {
            let mut r = Vec::with_capacity(subs.len() * 67 + 2);
            r.push(b'[');
            for (i, s) in subs.iter().enumerate() {
                if i > 0 {
                    r.push(b',');
                }
                r.push(b'"');
                r.extend_from_slice(s.hex());
                r.push(b'"');
            }
            r.push(b']');
            rpc::write_result(a.cur, id, &r);
        }
        Ok(Outcome::Json(r)) => rpc::write_result(a.cur, id, &r),
        Ok(Outcome::Pending(left, outcome)) => a.pending(answer, id, left, outcome),
        Err(e) => {
            ctx.metrics().rpc_errors.inc();
            rpc::write_error(a.cur, id, &e);
        }
    }
}

/// The connection acknowledged push `id` (remembered for a client id's subscription:
/// `conn::acks`): no longer held back at its close; `delivered` for a watched client.
fn acknowledged<S>(conn: &mut Conn<S>, id: u64, ctx: &mut Ctx<'_>) {
    let Some(w) = conn.ws() else { return };
    let Some(p) = w.acks().and_then(|a| a.take(id)) else {
        return;
    };
    if let (Some((topic, body)), Some(c)) = (p.watched, w.client_ref()) {
        ctx.relay.acknowledged(&c.id, &topic, id, &body);
    }
}

/// The connection's number for its next pending answer.
fn next_answer<S>(conn: &mut Conn<S>) -> u64 {
    match conn.ws() {
        Some(w) => {
            w.next_answer += 1;
            w.next_answer
        }
        None => 0,
    }
}

/// Runs a validated request that came on the socket (see `methods`).
#[inline(always)]
fn execute<S>(
    conn: &mut Conn<S>,
    req: Request<'_>,
    answer: u64,
    ctx: &mut Ctx<'_>,
) -> Result<Outcome, RpcError> {
    if !matches!(conn.phase, Phase::Ws(_)) {
        return Err(rpc_error(&RelayError::Closing));
    }
    methods::execute(conn, req, answer, Via::Socket, ctx)
}
