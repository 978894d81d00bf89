//! Carrying out the relay's deliveries on this worker's connections: the worker's side of
//! `relay::Recipients`. The relay decides which connection gets which push or answer; this
//! module checks that the connection is still the one meant (its uid), queues the bytes
//! through the connection's outbound policy (`conn::outbound`), and notes which connections
//! now have output, are over their outbound limit, or may read again.

use std::time::Instant;

use bytes::Bytes;
use slab::Slab;

use super::round::{Early, Handoff, Round};
use super::Worker;
use crate::conn::outbound::{PushTo, Writing};
use crate::conn::{self, http::webhook_answer, Conn, HttpWait, Phase, Tools};
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
    /// The round's lists (to write, to resume, over their outbound limit).
    round: &'a mut Round,
    /// The encoding scratch and the deflate kit.
    tools: &'a mut Tools,
    metrics: &'a CoreMetrics,
    date: &'a [u8],
    now: u64,
    out: &'a OutLimits,
    /// This process (see `Origin`).
    node: u64,
    /// This worker.
    me: u16,
}

/// The limits a delivery applies to a connection's output, read once from the
/// configuration.
pub(super) struct OutLimits {
    /// How full a connection's `OutBuf` is kept from its backlog.
    pub fill_mark: usize,
    /// `--max-outbound`: a WebSocket past it is closed (1008).
    pub max_outbound: usize,
    /// `--max-pending-answers`: a connection's input waits past it.
    pub max_pending: usize,
    /// `--close-timeout` (ms).
    pub close_ms: u64,
    /// `--keepalive-timeout` (ms): an HTTP connection's idle time after an answer.
    pub idle_ms: u64,
}

impl OutLimits {
    /// Read from `limits`.
    pub fn new(limits: &crate::config::Limits) -> OutLimits {
        OutLimits {
            // Encoded bytes a connection's queue holds before further pushes wait by
            // reference (shared with the cache and every other subscriber): enough for a few
            // writes, while 10,000 subscribers of a burst do not each get their own copy.
            fill_mark: (limits.max_outbound / 2).clamp(1, 64 << 10),
            max_outbound: limits.max_outbound,
            max_pending: limits.max_pending_answers,
            close_ms: limits.close_ms(),
            idle_ms: limits.keepalive_timeout().as_millis() as u64,
        }
    }
}

/// The worker's connections as [`Conns`] (a macro: the relay stays borrowable beside it).
macro_rules! conns_of {
    ($w:expr) => {{
        Conns {
            conns: &mut $w.conns,
            round: &mut $w.round,
            tools: &mut $w.tools,
            metrics: &$w.shared.metrics.cores[$w.id],
            date: $w.clock.date.as_bytes(),
            now: $w.clock.now,
            out: &$w.out,
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
        self.round.mark_dirty(self.conns, key);
    }

    /// Input that waited for this connection's answers is driven again.
    fn resume(&mut self, r: ConnRef) {
        self.round.resume(self.conns, r);
    }
}

impl Conns<'_> {
    /// Resolves one result of the connection's pending answer `answer` with `f`, then
    /// resumes its input if the answer was what held it.
    fn resolve(&mut self, r: ConnRef, answer: u64, f: impl FnOnce(&mut Conn) -> bool) {
        let max_pending = self.out.max_pending;
        let (date, now, close_ms, idle_ms) =
            (self.date, self.now, self.out.close_ms, self.out.idle_ms);
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
        let (fill, max_out) = (self.out.fill_mark, self.out.max_outbound);
        let Some(c) = conn::live(self.conns, r).filter(|c| matches!(c.phase, Phase::Ws(_))) else {
            return;
        };
        let deflate = c.ws().and_then(|w| w.deflate);
        let over = match kind {
            PushKind::Live { share_min } => {
                // permessage-deflate: the push compressed once per worker and shape, shared.
                let kit = &mut self.tools.deflate;
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
                let to = PushTo {
                    id,
                    dialect,
                    push_id,
                    live: true,
                };
                let w = Writing {
                    fill_mark: fill,
                    share_min,
                    scratch: &mut self.tools.scratch,
                };
                match z {
                    Some(z) => c.deliver_compressed(to, &z, w),
                    None => c.deliver(to, body, w),
                }
                c.outbound_len() > max_out
            }
            // A replay is cached data: it waits by reference in the backlog and does not
            // count as falling behind.
            PushKind::Replay => {
                let to = PushTo {
                    id,
                    dialect,
                    push_id,
                    live: false,
                };
                let w = Writing {
                    fill_mark: fill,
                    share_min: SHARE_THRESHOLD,
                    scratch: &mut self.tools.scratch,
                };
                c.deliver(to, body, w);
                false
            }
        };
        self.metrics.delivered.inc();
        self.mark_dirty(r.key);
        if over {
            self.round.overflow.push(r.key);
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
        let (fill, max_out) = (self.out.fill_mark, self.out.max_outbound);
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
            self.round.overflow.push(r.key);
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
        let (date, now, close_ms) = (self.date, self.now, self.out.close_ms);
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
    /// no socket is written here: they wait in the buffers for the round's write-out, which
    /// comes after the engine has handed its work on (`Relay::flush`).
    pub(super) fn deliver_early(&mut self) {
        if self.relay.early_delivery_due() {
            self.m().early_deliveries.inc();
            self.round.copied(self.relay.queued_bytes());
            self.deliver_as(true);
        }
    }

    /// Between two connections' events: the round's end comes early (the engine hands its
    /// work on, then every socket is written) when the round says so
    /// ([`Round::write_early`]: past a volume of copied bodies, or output held past
    /// `--round-hold-us`).
    pub(super) fn flush_within_round(&mut self) {
        let queued = self.relay.pending_pushes() > 0;
        let Some(why) = self.round.write_early(queued, Instant::now) else {
            return;
        };
        match why {
            Early::Bytes => self.m().round_flushes.inc(),
            Early::Held => self.m().round_flushes_held.inc(),
        }
        let handoff = self.write_out();
        self.relay.written(crate::clock::stamp(Instant::now()));
        self.round.handoff = self.round.handoff.and(handoff);
    }

    /// A round's end: the engine hands the round's work on before any answer reaches a
    /// socket (a client that sees `true` finds its message where the engine promised it),
    /// then what is queued is delivered and every connection with output is written.
    pub(super) fn write_out(&mut self) -> Handoff {
        let first = self.relay.flush();
        self.deliver();
        self.flush_dirty();
        // Slow or not is judged after the socket took what it could.
        while let Some(k) = self.round.overflow.pop() {
            self.check_outbound(k);
        }
        self.flush_dirty();
        let again = self.relay.flush();
        self.round.written();
        first.and(again)
    }

    fn deliver_as(&mut self, within_round: bool) {
        let mut conns = conns_of!(self);
        if within_round {
            self.relay.deliver_within_round(&mut conns);
        } else {
            self.relay.deliver(&mut conns);
        }
        // The compressed form of the last push is not kept past the call.
        self.tools.deflate.push = [None, None];
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
                    *o = conn::outbound::Gathered::Error(Box::new(e));
                }
            })
        });
    }
}
