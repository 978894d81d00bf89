//! Carrying out the relay's deliveries on this worker's connections: the worker's side of
//! `relay::Recipients`. The relay decides which connection gets which push or answer; this
//! module checks that the connection is still the one meant (its uid), queues the bytes
//! through the connection's outbound policy (`conn::outbound`), and notes which connections
//! now have output, are over their outbound limit, or may read again.

use std::collections::VecDeque;

use bytes::Bytes;
use slab::Slab;

use super::Worker;
use crate::conn::{self, http::webhook_answer, Conn, DeflateKit, HttpWait, Phase};
use crate::http::response;
use crate::metrics::CoreMetrics;
use crate::outbuf::SHARE_THRESHOLD;
use std::sync::Arc;

use crate::engine::History;
use crate::message::{Body, Origin, Position};
use crate::relay::{ConnRef, Dialect, PushKind, Recipients, RelayError, SubId};
use crate::ws::deflate::Shared;

/// The worker's connections as the relay's deliveries reach them.
struct Conns<'a> {
    conns: &'a mut Slab<Conn>,
    dirty: &'a mut Vec<usize>,
    overflow: &'a mut Vec<usize>,
    ready: &'a mut VecDeque<ConnRef>,
    enc: &'a mut Vec<u8>,
    deflate: &'a mut DeflateKit,
    metrics: &'a CoreMetrics,
    date: &'a [u8],
    now: u64,
    close_ms: u64,
    /// `--keepalive-timeout` (ms): an HTTP connection's idle time after an answer.
    idle_ms: u64,
    fill_mark: usize,
    max_outbound: usize,
    max_pending: usize,
    /// This process (see `Origin`).
    node: u64,
    /// This worker.
    me: u16,
}

/// The worker's connections as [`Conns`] (a macro: the relay stays borrowable beside it).
macro_rules! conns_of {
    ($w:expr) => {{
        let limits = &$w.shared.config.limits;
        Conns {
            conns: &mut $w.conns,
            dirty: &mut $w.dirty,
            overflow: &mut $w.overflow,
            ready: &mut $w.ready,
            enc: &mut $w.enc,
            deflate: &mut $w.deflate,
            metrics: &$w.shared.metrics.cores[$w.id],
            date: $w.date.as_bytes(),
            now: $w.now,
            close_ms: $w.close_ms,
            idle_ms: limits.keepalive_timeout().as_millis() as u64,
            fill_mark: $w.fill_mark,
            max_outbound: limits.max_outbound,
            max_pending: limits.max_pending_answers,
            node: $w.relay.node(),
            me: $w.id as u16,
        }
    }};
}

impl Conns<'_> {
    fn live(&mut self, r: ConnRef) -> Option<&mut Conn> {
        conn::live(self.conns, r)
    }

    fn mark_dirty(&mut self, key: usize) {
        if let Some(c) = self.conns.get_mut(key) {
            if !c.marks.dirty {
                c.marks.dirty = true;
                self.dirty.push(key);
            }
        }
    }

    /// Input that waited for this connection's answers is driven again.
    fn resume(&mut self, r: ConnRef) {
        if let Some(c) = conn::live(self.conns, r) {
            if !c.marks.ready {
                c.marks.ready = true;
                self.ready.push_back(r);
            }
        }
    }
}

impl Conns<'_> {
    /// Resolves one result of the connection's pending answer `answer` with `f`, then
    /// resumes its input if the answer was what held it.
    fn resolve(&mut self, r: ConnRef, answer: u64, f: impl FnOnce(&mut Conn) -> bool) {
        let max_pending = self.max_pending;
        let (date, now, close_ms, idle_ms) = (self.date, self.now, self.close_ms, self.idle_ms);
        let Some(c) = self.live(r) else { return };
        if answer == 0 {
            return;
        }
        let was_blocked = c.input_blocked(max_pending);
        if !f(c) {
            return;
        }
        // A `POST /rpc` answer complete now is written as its HTTP response; the socket is
        // read again (as after a `POST /subscribe` answer): what it sent meanwhile, its
        // hang-up included, was left unread while the answer waited.
        let http = conn::rpc_http::finish(c, date, now, close_ms, idle_ms);
        let resume = http || (was_blocked && !c.input_blocked(max_pending) && !c.rbuf.is_empty());
        self.mark_dirty(r.key);
        if resume {
            self.resume(r);
        }
    }

    /// The origin of what the connection `r` publishes.
    fn origin_of(&self, r: ConnRef) -> Origin {
        Origin {
            node: self.node,
            conn: Origin::conn_id(self.me, r.uid),
        }
    }
}

impl Recipients for Conns<'_> {
    fn push(
        &mut self,
        r: ConnRef,
        id: &SubId,
        dialect: Dialect,
        body: &Body,
        push_id: u64,
        kind: PushKind,
    ) {
        let (fill, max_out) = (self.fill_mark, self.max_outbound);
        let Some(c) = conn::live(self.conns, r).filter(|c| matches!(c.phase, Phase::Ws(_))) else {
            return;
        };
        let deflate = c.ws().and_then(|w| w.deflate);
        let over = match kind {
            PushKind::Live { share_min } => {
                // permessage-deflate: the push compressed once per worker and shape, shared.
                let kit = &mut *self.deflate;
                let z = deflate.and_then(|a| {
                    let (data, len, suffix) = crate::rpc::push_shape(body, dialect);
                    let data = data.prefix(len);
                    let slot = &mut kit.push[usize::from(dialect != Dialect::Waku)];
                    if !slot.as_ref().is_some_and(|p| p.is_for(&data)) {
                        *slot = Some(Shared::new(data, Bytes::from_static(suffix)));
                    }
                    let shared = slot.as_mut()?;
                    shared.get(&mut kit.deflater, a.window_bits()).cloned()
                });
                match z {
                    Some(z) => c.deliver_compressed(
                        id, dialect, &z, push_id, true, fill, share_min, self.enc,
                    ),
                    None => c.deliver(id, dialect, body, push_id, true, fill, share_min, self.enc),
                }
                c.outbound_len() > max_out
            }
            // A replay is cached data: it waits by reference in the backlog and does not
            // count as falling behind.
            PushKind::Replay => {
                c.deliver(
                    id,
                    dialect,
                    body,
                    push_id,
                    false,
                    fill,
                    SHARE_THRESHOLD,
                    self.enc,
                );
                false
            }
        };
        self.metrics.delivered.inc();
        self.mark_dirty(r.key);
        if over {
            self.overflow.push(r.key);
        }
    }

    fn unacked(&mut self, r: ConnRef, u: crate::relay::Unacked<'_>) {
        if let Some(w) = self.live(r).and_then(|c| c.ws()) {
            w.acks_mut().note(conn::acks::Pending {
                id: u.push_id,
                slot: u.slot,
                pos: u.msg.pos,
                watched: u.watched.then(|| (u.topic.clone(), u.msg.body.clone())),
            });
        }
    }

    fn push_text(&mut self, r: ConnRef, frame: &Bytes, kind: PushKind) {
        let (fill, max_out) = (self.fill_mark, self.max_outbound);
        let Some(c) = conn::live(self.conns, r).filter(|c| matches!(c.phase, Phase::Ws(_))) else {
            return;
        };
        let over = match kind {
            PushKind::Live { share_min } => {
                c.deliver_text(frame, true, fill, share_min);
                c.outbound_len() > max_out
            }
            PushKind::Replay => {
                c.deliver_text(frame, false, fill, SHARE_THRESHOLD);
                false
            }
        };
        self.metrics.v1_delivered.inc();
        self.mark_dirty(r.key);
        if over {
            self.overflow.push(r.key);
        }
    }

    fn answer(&mut self, r: ConnRef, answer: u64, result: Result<(), RelayError>) {
        self.resolve(r, answer, |c| c.resolve(answer, result));
    }

    fn fetched(
        &mut self,
        r: ConnRef,
        answer: u64,
        topic: &Arc<str>,
        after: Position,
        result: Result<History, RelayError>,
    ) {
        let me = self.origin_of(r);
        self.resolve(r, answer, |c| {
            conn::fetch::resolve(c, answer, topic, after, me, result)
        });
    }

    fn webhook_answer(&mut self, r: ConnRef, result: Result<(), RelayError>) {
        let (date, now, close_ms) = (self.date, self.now, self.close_ms);
        let Some(c) = self.live(r) else { return };
        let Phase::Http(HttpWait::Webhook { close }) = c.phase else {
            return;
        };
        response::write(&mut c.out, &webhook_answer(result), date, false, close);
        if close {
            c.begin_close(now, close_ms);
        } else {
            c.phase = Phase::Http(HttpWait::Nothing);
            self.resume(r);
        }
        self.mark_dirty(r.key);
    }
}

/// See [`Worker::flush_within_round`].
const FLUSH_WITHIN_ROUND_BYTES: usize = 384 << 10;

/// See [`Worker::flush_within_round`]: a fan-out's rounds keep several pushes per write.
const FLUSH_PER_CONN_BYTES: usize = 8 << 10;

impl Worker {
    /// Carries out what the relay decided since the last call.
    pub(super) fn deliver(&mut self) {
        self.deliver_as(false);
    }

    /// After a connection's input: carries out what is queued once it would copy
    /// [`EARLY_DELIVERY_BYTES`](crate::relay::EARLY_DELIVERY_BYTES) or more, while the
    /// bodies are still in the core's cache (at the end of a saturated round, thousands of
    /// publishes later, each would be read back from memory to be copied into its
    /// subscribers' buffers). The pushes still count against the round's fan-out budget, and
    /// no socket is written here: they wait in the buffers for the round's flush, which
    /// comes after the engine has handed its work on (`Relay::flush`; docs/PERFORMANCE.md,
    /// "The publish path at saturation").
    pub(super) fn deliver_early(&mut self) {
        if self.relay.early_delivery_due() {
            self.m().early_deliveries.inc();
            self.round_bytes += self.relay.queued_bytes();
            self.deliver_as(true);
        }
    }

    /// Between two connections' events of a saturated round: once the bodies copied into
    /// buffers since the last flush pass [`FLUSH_WITHIN_ROUND_BYTES`] and average
    /// [`FLUSH_PER_CONN_BYTES`] per connection waiting to be written, the round's end comes
    /// early (the engine hands its work on, then every socket is written), so that the
    /// buffers are written, and taken again from the pool, while they are in the core's
    /// cache: a saturated round reads thousands of publishes, whose pushes would otherwise
    /// wait for its end in more memory than the core's L2 cache holds (figures:
    /// docs/perf-log/2026-11-27-round-written-in-cache.md).
    pub(super) fn flush_within_round(&mut self) {
        if self.round_bytes < FLUSH_WITHIN_ROUND_BYTES
            || self.round_bytes < FLUSH_PER_CONN_BYTES * self.dirty.len()
        {
            return;
        }
        self.m().round_flushes.inc();
        self.engine_waiting |= self.write_out();
    }

    /// A round's end: the engine hands the round's work on before any answer reaches a
    /// socket (a client that sees `true` finds its message where the engine promised it),
    /// then what is queued is delivered and every connection with output is written.
    /// Returns whether the engine has work waiting for room.
    pub(super) fn write_out(&mut self) -> bool {
        let mut waiting = self.relay.flush();
        self.deliver();
        self.flush_dirty();
        // Slow or not is judged after the socket took what it could.
        while let Some(k) = self.overflow.pop() {
            self.check_outbound(k);
        }
        self.flush_dirty();
        waiting |= self.relay.flush();
        self.round_bytes = 0;
        waiting
    }

    fn deliver_as(&mut self, within_round: bool) {
        let mut conns = conns_of!(self);
        if within_round {
            self.relay.deliver_within_round(&mut conns);
        } else {
            self.relay.deliver(&mut conns);
        }
        // The compressed form of the last push is not kept past the call.
        self.deflate.push = [None, None];
    }
}

impl Worker {
    /// A watch change of connection `r` is durable (or could not be made so): its pending
    /// answer `answer` is resolved, `{"relayId":..}` / `true` as gathered, or the refusal
    /// (a `POST /rpc` one then written as its HTTP response).
    pub(super) fn watched(
        &mut self,
        r: ConnRef,
        answer: u64,
        result: Result<(), crate::notify::WatchError>,
    ) {
        let mut conns = conns_of!(self);
        conns.resolve(r, answer, |c| {
            c.resolve_with(answer, |o| {
                if let Err(e) = result {
                    let code = crate::rpc::code::SERVER_ERROR;
                    let e = crate::rpc::RpcError::tagged(code, e.message(), e.tag());
                    *o = conn::outbound::Outcome::Error(Box::new(e));
                }
            })
        });
    }
}
