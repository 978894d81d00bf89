//! The relay's [`Deliveries`] applied to this worker's connections: each push, answer and
//! frame reaches its connection if that is still the one meant (its uid), through the
//! connection's outbound policy (`conn::outbound`); which connections now have output, are
//! over their outbound limit, or may read again is noted in the round. The relay decided
//! who gets what; here is how it gets there.

use std::sync::Arc;

use bytes::Bytes;

use super::Worker;
use crate::conn::outbound::{PushTo, Writing};
use crate::conn::{self, http::webhook_answer, Conn, HttpWait, Phase};
use crate::engine::History;
use crate::http::response;
use crate::message::{Origin, Position};
use crate::outbuf::SHARE_THRESHOLD;
use crate::relay::{ConnRef, Deliveries, Delivery, Dialect, Outgoing, PushKind, RelayError, SubId};
use crate::ws::deflate::Shared;

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

impl Worker {
    /// Carries out what the relay decided since the last call.
    pub(super) fn deliver(&mut self) {
        let d = self.relay.deliver();
        self.apply_all(d);
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
            let d = self.relay.deliver_within_round();
            self.apply_all(d);
        }
    }

    /// Applies `d` in order, then gives it back to the relay.
    fn apply_all(&mut self, mut d: Deliveries) {
        for one in d.list.drain(..) {
            match one {
                Delivery::Push { conn, at, msg } => {
                    // The subscription's id and shape, read where the relay keeps them.
                    let Some((s, _)) = self.relay.sub_at(at).filter(|(s, _)| s.conn == conn) else {
                        continue;
                    };
                    let (id, dialect) = (s.id, s.dialect);
                    self.push(conn, &id, dialect, &d.messages[msg as usize]);
                }
                Delivery::Unacked {
                    conn,
                    at,
                    msg,
                    watched,
                } => {
                    let m = &d.messages[msg as usize];
                    // The topic and body are kept only for a watch's `delivered` event.
                    let watched = match watched {
                        true => self
                            .relay
                            .sub_at(at)
                            .map(|(_, t)| (t.clone(), m.body.clone())),
                        false => None,
                    };
                    if let Some(w) = conn::live(&mut self.conns, conn).and_then(|c| c.ws()) {
                        w.acks_mut().note(conn::acks::Pending {
                            id: m.push_id,
                            slot: at.slot,
                            pos: m.pos,
                            watched,
                        });
                    }
                }
                Delivery::Text { conn, frame } => {
                    let (frame, kind) = &d.frames[frame as usize];
                    self.push_text(conn, frame, *kind);
                }
                Delivery::Answer {
                    conn,
                    answer,
                    result,
                } => self.resolve(conn, answer, |c| c.resolve(answer, result)),
                Delivery::Fetched(f) => {
                    let f = *f;
                    self.fetched(f.conn, f.answer, &f.topic, f.after, f.result);
                }
                Delivery::Webhook { conn, result } => self.webhook_answer(conn, result),
            }
        }
        // The compressed form of the last push is not kept past the call.
        self.tools.deflate.push = [None, None];
        self.relay.recycle(d);
    }

    /// Queues the push of `m` to subscription `id` on connection `r`.
    fn push(&mut self, r: ConnRef, id: &SubId, dialect: Dialect, m: &Outgoing) {
        let (fill, max_out) = (self.round.out.fill_mark, self.round.out.max_outbound);
        let Some(c) = conn::live(&mut self.conns, r).filter(|c| matches!(c.phase, Phase::Ws(_)))
        else {
            return;
        };
        let (body, push_id) = (&m.body, m.push_id);
        let deflate = c.ws().and_then(|w| w.deflate);
        let over = match m.kind {
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
        self.shared.metrics.cores[self.id].delivered.inc();
        self.queued(r.key, over);
    }

    /// Queues a WalletConnect 1.0 frame on connection `r`.
    fn push_text(&mut self, r: ConnRef, frame: &Bytes, kind: PushKind) {
        let (fill, max_out) = (self.round.out.fill_mark, self.round.out.max_outbound);
        let Some(c) = conn::live(&mut self.conns, r).filter(|c| matches!(c.phase, Phase::Ws(_)))
        else {
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
        self.shared.metrics.cores[self.id].v1_delivered.inc();
        self.queued(r.key, over);
    }

    /// Connection `key` has output; `over`: past its outbound limit (judged after the
    /// round's write-out: `Worker::write_out`).
    fn queued(&mut self, key: usize, over: bool) {
        self.round.mark_dirty(&mut self.conns, key);
        if over {
            self.round.overflow.push(key);
        }
    }

    /// Resolves a fetch's pending answer with the topic's history after `after`.
    fn fetched(
        &mut self,
        r: ConnRef,
        answer: u64,
        topic: &Arc<str>,
        after: Position,
        result: Result<History, RelayError>,
    ) {
        let me = Origin {
            node: self.relay.node(),
            conn: Origin::conn_id(self.id as u16, r.uid),
        };
        self.resolve(r, answer, |c| {
            conn::fetch::resolve(c, answer, topic, after, me, result)
        });
    }

    /// Writes the answer to the connection's `POST /subscribe`.
    fn webhook_answer(&mut self, r: ConnRef, result: Result<(), RelayError>) {
        let (date, now, close_ms) = (
            self.clock.date.as_bytes(),
            self.clock.now,
            self.round.out.close_ms,
        );
        let Some(c) = conn::live(&mut self.conns, r) else {
            return;
        };
        let Phase::Http(HttpWait::Webhook { close }) = c.phase else {
            return;
        };
        response::write(&mut c.out, &webhook_answer(result), date, false, close);
        if close {
            c.begin_close(now, close_ms);
        } else {
            c.phase = Phase::Http(HttpWait::Nothing);
            self.round.resume(&mut self.conns, r);
        }
        self.round.mark_dirty(&mut self.conns, r.key);
    }

    /// Resolves one result of the connection's pending answer `answer` with `f`, then
    /// resumes its input if the answer was what held it.
    fn resolve(&mut self, r: ConnRef, answer: u64, f: impl FnOnce(&mut Conn) -> bool) {
        let max_pending = self.round.out.max_pending;
        let (date, now) = (self.clock.date.as_bytes(), self.clock.now);
        let (close_ms, idle_ms) = (self.round.out.close_ms, self.round.out.idle_ms);
        let Some(c) = conn::live(&mut self.conns, r) else {
            return;
        };
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
        self.round.mark_dirty(&mut self.conns, r.key);
        if resume {
            self.round.resume(&mut self.conns, r);
        }
    }

    /// A watch change of connection `r` is durable (or could not be made so): its pending
    /// answer `answer` is resolved, `{"relayId":..}` / `true` as gathered, or the refusal
    /// (a `POST /rpc` one then written as its HTTP response).
    pub(super) fn watched(
        &mut self,
        r: ConnRef,
        answer: u64,
        result: Result<(), crate::notify::WatchError>,
    ) {
        self.resolve(r, answer, |c| {
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
