//! JSON-RPC over the WebSocket (the waku relay): a message is decoded (`rpc::decode`),
//! each request validated into an operation (`rpc::Call::op`) and executed here against the
//! worker's relay share, and the answers (one, or an array for a batch) queued on the
//! connection in request order. A publish whose store answers later leaves a pending part in
//! its answer (`outbound::Part::Pending`), filled in when the store's answer comes back.
//!
//! Relay refusals ([`RelayError`]) become JSON-RPC errors here, at the edge.

use std::borrow::Cow;

use bytes::Bytes;

use super::outbound::{write_publish_answer, Part};
use super::{Conn, ConnSub, Ctx, Phase};
use crate::relay::{Done, RelayError, SubId};
use crate::rpc::{self, Id, Incoming, Item, Op, RpcError};

/// The JSON-RPC error a relay refusal is answered with.
pub fn rpc_error(e: &RelayError) -> RpcError {
    RpcError::server(e.to_string())
}

/// An answer being assembled: bytes known now, and the pending parts among them.
struct Answer<'s> {
    parts: Vec<Part>,
    cur: &'s mut Vec<u8>,
}

impl Answer<'_> {
    /// A publish answered later: its part waits for answer number `answer`.
    fn pending(&mut self, answer: u64, id: &Id<'_>) {
        if !self.cur.is_empty() {
            self.parts.push(Part::Bytes(self.cur.clone()));
            self.cur.clear();
        }
        self.parts.push(Part::Pending {
            answer,
            id: owned(id),
            result: None,
        });
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
    let mut buf = std::mem::take(ctx.scratch);
    buf.clear();
    let mut a = Answer {
        parts: Vec::new(),
        cur: &mut buf,
    };
    match rpc::decode(payload, ctx.json) {
        Err(_) => {
            let e = RpcError {
                code: rpc::code::PARSE_ERROR,
                message: "Parse error".into(),
            };
            rpc::write_error(a.cur, &Id::Null, &e);
            ctx.metrics().rpc_errors.inc();
        }
        Ok(Incoming::Single(Item::V1(frame))) => {
            if let Err(e) = super::bridge::frame(conn, frame, ctx) {
                ctx.metrics().rpc_errors.inc();
                rpc::write_error(a.cur, &Id::Null, &e);
            }
        }
        Ok(Incoming::Single(item)) => {
            run_item(conn, item, &mut a, ctx);
        }
        Ok(Incoming::Batch(items)) => {
            a.cur.push(b'[');
            let mut any = false;
            for item in items {
                let (before, parts) = (a.cur.len(), a.parts.len());
                if any {
                    a.cur.push(b',');
                }
                if run_item(conn, item, &mut a, ctx) {
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
    if buf.capacity() > 64 << 10 {
        buf = Vec::with_capacity(4096);
    }
    *ctx.scratch = buf;
}

/// Runs one element; appends its answer and returns whether it has one.
fn run_item<S>(conn: &mut Conn<S>, item: Item<'_>, a: &mut Answer<'_>, ctx: &mut Ctx<'_>) -> bool {
    match item {
        Item::Ack => false,
        Item::V1(_) => {
            ctx.metrics().rpc_errors.inc();
            let e = RpcError {
                code: rpc::code::INVALID_REQUEST,
                message: "Invalid request: a v1 frame inside a batch".into(),
            };
            rpc::write_error(a.cur, &Id::Null, &e);
            true
        }
        Item::Invalid(id, e) => {
            ctx.metrics().rpc_errors.inc();
            rpc::write_error(a.cur, &id, &e);
            true
        }
        Item::Call(call) => {
            let id = call.id.clone();
            let answer = match &id {
                Some(_) => next_answer(conn),
                None => 0,
            };
            let result = call
                .op(ctx.shared.config.limits.max_topic)
                .and_then(|op| execute(conn, op, answer, ctx));
            let Some(id) = id else { return false };
            match result {
                Ok(Outcome::Done) => write_publish_answer(a.cur, &id, &Ok(())),
                Ok(Outcome::Subscribed(sub)) => {
                    let mut r = [b'"'; 66];
                    r[1..65].copy_from_slice(sub.hex());
                    rpc::write_result(a.cur, &id, &r);
                }
                Ok(Outcome::Pending) => a.pending(answer, &id),
                Err(e) => {
                    ctx.metrics().rpc_errors.inc();
                    rpc::write_error(a.cur, &id, &e);
                }
            }
            true
        }
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

/// What an operation gave.
enum Outcome {
    /// `true`.
    Done,
    /// A subscription id.
    Subscribed(SubId),
    /// Answered later (answer number given to `execute`).
    Pending,
}

/// Runs a validated operation.
fn execute<S>(
    conn: &mut Conn<S>,
    op: Op<'_>,
    answer: u64,
    ctx: &mut Ctx<'_>,
) -> Result<Outcome, RpcError> {
    if !matches!(conn.phase, Phase::Ws(_)) {
        return Err(rpc_error(&RelayError::Closing));
    }
    let me = ctx.conn_ref(conn);
    match op {
        Op::Subscribe { topic } => subscribe(conn, &topic, ctx).map(Outcome::Subscribed),
        Op::Publish {
            topic,
            message,
            ttl,
            prompt,
        } => {
            let data = Bytes::from(rpc::encode_data(&topic, &message));
            match ctx.relay.publish(me, answer, &topic, data, ttl, prompt) {
                Done::Now(Ok(())) => Ok(Outcome::Done),
                Done::Now(Err(e)) => Err(rpc_error(&e)),
                Done::Later => Ok(Outcome::Pending),
            }
        }
        Op::Unsubscribe { topic, id } => {
            if let Some(id) = SubId::from_hex(&id) {
                let relay = &*ctx.relay;
                let pos = conn.subs.iter().position(|s| {
                    s.id == id
                        && topic
                            .as_ref()
                            .is_none_or(|t| relay.topic_name(s.slot).is_some_and(|x| **x == **t))
                });
                if let Some(p) = pos {
                    let s = conn.subs.swap_remove(p);
                    ctx.relay.unsubscribe(s.slot, me);
                }
            }
            Ok(Outcome::Done)
        }
    }
}

/// `waku_subscribe`: the existing id for a topic this connection already follows (the
/// reference relay made duplicates), else a new subscription.
fn subscribe<S>(conn: &mut Conn<S>, topic: &str, ctx: &mut Ctx<'_>) -> Result<SubId, RpcError> {
    let relay = &*ctx.relay;
    let existing = conn
        .subs
        .iter()
        .find(|s| relay.topic_name(s.slot).is_some_and(|t| **t == *topic));
    if let Some(s) = existing {
        return Ok(s.id);
    }
    // v1 subscriptions count too (DECISIONS §8: the same limits).
    let max = ctx.shared.config.limits.max_subscriptions;
    if conn.subs.len() + conn.v1_topics.len() >= max {
        return Err(rpc_error(&RelayError::TooManySubscriptions(max)));
    }
    let id = ctx.ids.next_id();
    let me = ctx.conn_ref(conn);
    let slot = ctx.relay.subscribe(me, topic, id);
    if conn.subs.capacity() == 0 {
        // Most connections hold one or two subscriptions: a first push would make room
        // for four (about 300 bytes per idle connection).
        conn.subs.reserve_exact(1);
    }
    conn.subs.push(ConnSub { slot, id });
    Ok(id)
}
