//! JSON-RPC over the WebSocket (the waku relay): a message is decoded (`rpc::decode`),
//! each request validated into an operation (`rpc::Call::op`) and executed here against the
//! worker's relay share, and the answers (one, or an array for a batch) queued on the
//! connection in request order. A publish whose store answers later leaves a pending part in
//! its answer (`outbound::Part::Pending`), filled in when the store's answer comes back.
//!
//! Relay refusals ([`RelayError`]) become JSON-RPC errors here, at the edge.

use std::borrow::Cow;
use std::sync::Arc;

use super::admit::{admit, cost_of};
use super::outbound::{self, write_publish_answer, Part, Parts};
use super::{Conn, ConnSub, Ctx, Phase};
use crate::engine::ClientRef;
use crate::limits;
use crate::message::Meta;
use crate::relay::{Done, RelayError, SubId};
use crate::rpc::{self, Dialect, Id, Incoming, Item, Op, Request, RpcError};

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

/// An answer being assembled: bytes known now, and the pending parts among them.
pub(super) struct Answer<'s> {
    pub(super) parts: Parts,
    pub(super) cur: &'s mut Vec<u8>,
}

impl Answer<'_> {
    /// An answer that comes later: its part waits for `left` results of answer number
    /// `answer`.
    fn pending(&mut self, answer: u64, id: &Id<'_>, left: u32, outcome: outbound::Outcome) {
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
            if let Err(e) = super::bridge::frame(conn, frame, ctx) {
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
        conn.ws_close(code, "rate limited", ctx.now, ctx.close_ms());
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
            let result = call
                .op(ctx.shared.config.limits.max_topic)
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
    /// Answered later: this many results of the answer number given to `execute` are still
    /// to come, and what the ones known now gave.
    Pending(u32, outbound::Outcome),
}

/// Folds publishes' results into one answer (`true` when every one stored, else the first
/// refusal): at once when all were answered at once.
#[inline]
pub(super) fn publishes(results: &[Done<Result<(), RelayError>>]) -> Result<Outcome, RpcError> {
    let later = results.iter().filter(|d| matches!(d, Done::Later)).count() as u32;
    let failed = results.iter().find_map(|d| match d {
        Done::Now(Err(e)) => Some(*e),
        _ => None,
    });
    match (later, failed) {
        (0, None) => Ok(Outcome::Done),
        (0, Some(e)) => Err(rpc_error(&e)),
        (n, None) => Ok(Outcome::Pending(n, outbound::Outcome::Done)),
        (n, Some(e)) => Ok(Outcome::Pending(n, outbound::Outcome::Failed(e))),
    }
}

/// A publish from this connection; `tag`/`attestation` as the request gave them, `plain`
/// when its strings need no escape (`rpc::Plain`).
#[allow(
    clippy::too_many_arguments,
    reason = "a publish's fields, named at each caller"
)]
pub(super) fn publish<S>(
    conn: &Conn<S>,
    topic: &str,
    message: &str,
    ttl: u32,
    prompt: bool,
    tag: u32,
    attestation: Option<&str>,
    plain: bool,
    answer: u64,
    ctx: &mut Ctx<'_>,
) -> Done<Result<(), RelayError>> {
    let publisher = match &conn.phase {
        Phase::Ws(w) => w.client_ref().cloned(),
        _ => None,
    };
    let meta = meta(tag, attestation, plain);
    publish_by(
        conn, topic, message, ttl, prompt, meta, answer, publisher, ctx,
    )
}

/// The meta of a message published now.
pub(super) fn meta(tag: u32, attestation: Option<&str>, plain: bool) -> Meta<'_> {
    Meta {
        published_at: crate::clock::coarse().1,
        tag,
        attestation,
        plain,
    }
}

/// A publish from this connection by client id `publisher` (its publisher watches hear of
/// it): a socket's client id, or an HTTP request's JWT's.
#[allow(
    clippy::too_many_arguments,
    reason = "a publish's fields, named at each caller"
)]
pub(super) fn publish_by<S>(
    conn: &Conn<S>,
    topic: &str,
    message: &str,
    ttl: u32,
    prompt: bool,
    meta: Meta<'_>,
    answer: u64,
    publisher: Option<Arc<ClientRef>>,
    ctx: &mut Ctx<'_>,
) -> Done<Result<(), RelayError>> {
    let me = ctx.conn_ref(conn);
    ctx.relay
        .publish_as(me, answer, topic, message, meta, ttl, prompt, publisher)
}

/// sign-client's tags of the session set-up (DECISIONS §10).
pub(super) const TAG_PROPOSE: u32 = 1100;
pub(super) const TAG_PROPOSE_RESPONSE: u32 = 1101;
pub(super) const TAG_SETTLE: u32 = 1102;

/// Runs a validated request.
fn execute<S>(
    conn: &mut Conn<S>,
    req: Request<'_>,
    answer: u64,
    ctx: &mut Ctx<'_>,
) -> Result<Outcome, RpcError> {
    if !matches!(conn.phase, Phase::Ws(_)) {
        return Err(rpc_error(&RelayError::Closing));
    }
    admit(conn, cost_of(&req.op), ctx)?;
    let dialect = req.dialect;
    let plain = req.plain.0;
    match req.op {
        Op::Subscribe { topic } => subscribe(conn, &topic, dialect, ctx).map(Outcome::Subscribed),
        Op::BatchSubscribe { topics } => {
            let mut ids = Vec::with_capacity(topics.len());
            for t in &topics {
                ids.push(subscribe(conn, t, dialect, ctx)?);
            }
            Ok(Outcome::SubscribedMany(ids))
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
            let done = publish(
                conn, &topic, &message, ttl, prompt, tag, a, plain, answer, ctx,
            );
            publishes(&[done])
        }
        Op::Unsubscribe { topic, id } => {
            unsubscribe(conn, topic.as_deref(), id.as_deref(), ctx);
            Ok(Outcome::Done)
        }
        Op::BatchUnsubscribe { subs } => {
            for (topic, id) in &subs {
                unsubscribe(conn, Some(topic), id.as_deref(), ctx);
            }
            Ok(Outcome::Done)
        }
        Op::SubscribeBlocking { topic } => {
            let (id, slot) = subscribe_at(conn, &topic, dialect, ctx)?;
            ctx.relay.when_in_place(ctx.conn_ref(conn), answer, slot);
            Ok(Outcome::Pending(
                1,
                outbound::Outcome::Subscribed(Box::new(id)),
            ))
        }
        Op::BatchSubscribeBlocking { topics } => {
            let mut each = Vec::with_capacity(topics.len());
            let mut waiting = 0;
            for t in &topics {
                each.push(match subscribe_at(conn, t, dialect, ctx) {
                    Ok((id, slot)) => {
                        ctx.relay.when_in_place(ctx.conn_ref(conn), answer, slot);
                        waiting += 1;
                        Ok(id)
                    }
                    Err(e) => Err(RpcError::tagged(
                        e.code,
                        e.message,
                        "SubscriberLimitExceeded",
                    )),
                });
            }
            Ok(Outcome::Pending(
                waiting,
                outbound::Outcome::SubscribedEach(each),
            ))
        }
        Op::CreateTopic { topic } => {
            subscribe(conn, &topic, dialect, ctx)?;
            Ok(Outcome::Done)
        }
        Op::BatchReceive { receipts } => {
            receive(
                conn.ws().and_then(|w| w.client()).map(|c| c.did()),
                &receipts,
                ctx,
            );
            Ok(Outcome::Done)
        }
        Op::Fetch { topics, .. } => {
            super::fetch::start(conn, &topics, answer, ctx);
            let gathered = outbound::Outcome::Fetch(Default::default());
            Ok(Outcome::Pending(topics.len() as u32, gathered))
        }
        Op::ProposeSession {
            pairing_topic,
            proposal,
            ttl,
        } => {
            subscribe(conn, &pairing_topic, dialect, ctx)?;
            let (t, p) = (&*pairing_topic, &*proposal);
            let done = publish(conn, t, p, ttl, true, TAG_PROPOSE, None, plain, answer, ctx);
            publishes(&[done])
        }
        Op::ApproveSession {
            session_topic,
            pairing_topic,
            response,
            settlement,
            ttl,
        } => {
            subscribe(conn, &session_topic, dialect, ctx)?;
            let (pt, st) = (&*pairing_topic, &*session_topic);
            let r = TAG_PROPOSE_RESPONSE;
            let first = publish(conn, pt, &response, ttl, false, r, None, plain, answer, ctx);
            let second = publish(
                conn,
                st,
                &settlement,
                ttl,
                false,
                TAG_SETTLE,
                None,
                plain,
                answer,
                ctx,
            );
            publishes(&[first, second])
        }
        Op::WatchRegister { auth } => watch(conn, answer, ctx, &auth, true),
        Op::WatchUnregister { auth } => watch(conn, answer, ctx, &auth, false),
    }
}

/// `irn_watchRegister` (`register`) or `irn_watchUnregister`: checked and applied by
/// `notify` (a lock taken by registrations only, no I/O); refusals -32000 with their tag.
/// On a durable node or Redis the answer is pending until the change is on disk or
/// acknowledged by Redis (`notify::Saved::Later`): the persister's or the Redis writer's
/// thread tells the worker (`Shared::watch_reply`), which resolves it.
pub(super) fn watch<S>(
    conn: &mut Conn<S>,
    answer: u64,
    ctx: &Ctx<'_>,
    auth: &str,
    register: bool,
) -> Result<Outcome, RpcError> {
    let n = &ctx.shared.notifier;
    let done: crate::notify::Done = match answer {
        // A notification (no id): nothing to answer.
        0 => Box::new(|_| {}),
        _ => {
            let (reply, me, worker) = (ctx.shared.watch_reply.clone(), ctx.conn_ref(conn), ctx.me);
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
        (crate::notify::Saved::Later, 1..) => Outcome::Pending(1, outbound::Outcome::Json(result)),
        _ => Outcome::Json(result),
    })
}

/// `irn_batchReceive`: the receipts handed to the relay in one call.
pub(super) fn receive(client: Option<String>, receipts: &[(Cow<'_, str>, u64)], ctx: &mut Ctx<'_>) {
    let list: Vec<(&str, u64)> = receipts.iter().map(|(t, id)| (&**t, *id)).collect();
    ctx.relay.receive(client.as_deref(), &list);
}

/// `*_unsubscribe`: removes the connection's subscription `id` (of `topic`, when given);
/// without an id, its subscription to `topic`; an unknown id is no error.
fn unsubscribe<S>(conn: &mut Conn<S>, topic: Option<&str>, id: Option<&str>, ctx: &mut Ctx<'_>) {
    let id = match id {
        Some(id) => match SubId::from_hex(id) {
            Some(id) => Some(id),
            None => return,
        },
        None => None,
    };
    let me = ctx.conn_ref(conn);
    let relay = &*ctx.relay;
    let pos = conn.subs.iter().position(|s| {
        id.is_none_or(|id| s.id == id)
            && topic.is_none_or(|t| relay.topic_name(s.slot).is_some_and(|x| **x == *t))
    });
    if let Some(p) = pos {
        let s = conn.subs.swap_remove(p);
        ctx.relay.unsubscribe_client(s.slot, me);
    } else if let (Some(t), Some(c)) = (topic, conn.ws().and_then(|w| w.client_ref()).cloned()) {
        // The client id's subscription made elsewhere (another socket, over HTTP, before a
        // reconnect) ends too.
        let project = (!c.project.is_empty()).then_some(&*c.project);
        ctx.relay.client_unsubscribe(&c.id, project, t);
    }
}

/// `*_subscribe`: the existing id for a topic this connection already follows (the
/// reference relay made duplicates), else a new subscription whose pushes use `dialect`.
/// Its id is the one an authenticated client computes itself, else random.
fn subscribe<S>(
    conn: &mut Conn<S>,
    topic: &str,
    dialect: Dialect,
    ctx: &mut Ctx<'_>,
) -> Result<SubId, RpcError> {
    subscribe_at(conn, topic, dialect, ctx).map(|(id, _)| id)
}

/// [`subscribe`], with the topic's slot in the relay.
fn subscribe_at<S>(
    conn: &mut Conn<S>,
    topic: &str,
    dialect: Dialect,
    ctx: &mut Ctx<'_>,
) -> Result<(SubId, u32), RpcError> {
    let relay = &*ctx.relay;
    let existing = conn
        .subs
        .iter()
        .find(|s| relay.topic_name(s.slot).is_some_and(|t| **t == *topic));
    if let Some(s) = existing {
        return Ok((s.id, s.slot));
    }
    // v1 subscriptions count too (DECISIONS §8: the same limits).
    let max = ctx.shared.config.limits.max_subscriptions;
    if conn.subs.len() + conn.v1_topics().len() >= max {
        return Err(rpc_error(&RelayError::TooManySubscriptions(max)));
    }
    let me = ctx.conn_ref(conn);
    let slot = match conn.ws().and_then(|w| w.client_ref().cloned()) {
        Some(client) => {
            let id = SubId::for_client(topic, &client.id);
            let slot = ctx.relay.subscribe_as(me, topic, id, dialect, &client);
            (slot.map_err(|e| rpc_error(&e))?, id)
        }
        None => {
            let id = ctx.tools.ids.next_id();
            (ctx.relay.subscribe(me, topic, id, dialect), id)
        }
    };
    let (slot, id) = slot;
    if conn.subs.capacity() == 0 {
        // Most connections hold one or two subscriptions: a first push would make room
        // for four (about 300 bytes per idle connection).
        conn.subs.reserve_exact(1);
    }
    conn.subs.push(ConnSub { slot, id });
    Ok((id, slot))
}
