//! A connection's outbound policy: what goes into its `OutBuf` now and what waits, in order,
//! in its [`Backlog`].
//!
//! Output leaves in the order it was decided. While the `OutBuf` holds less than the
//! worker's fill mark and nothing waits before it, a push or an answer is encoded into it at
//! once; otherwise it joins the backlog: pushes by reference (a cache replay, a burst to a
//! big topic), ready answers as bytes, and answers still *pending* (a `waku_publish` whose
//! store has not answered yet). A pending answer holds back everything behind it, so a
//! client sees its answers in request order and a subscription's pushes after the answer
//! that created it. The backlog's live bytes count against `--max-outbound`.

use std::collections::VecDeque;

use bytes::Bytes;

pub use super::answer::{subscribed_each, write_publish_answer, Fetched, Gathered, Part, Parts};
use super::{Conn, Phase};
use crate::arcbuf::ArcBuf;
use crate::message::Body;
use crate::relay::{RelayError, SubId};
use crate::rpc::{self, Dialect};
use crate::ws::{self, Opcode};

/// A push, written now or waiting in a connection's backlog with its shared bytes
/// (`Queued::Push`).
#[derive(Debug)]
struct QueuedPush {
    id: SubId,
    /// The push's JSON-RPC id (`notice::message_id` of its message).
    push_id: u64,
    dialect: Dialect,
    /// The data object is the first `len` of the shared bytes, then `suffix`; or
    /// (`compressed`) the shared bytes are the compressed `data` + suffix.
    len: usize,
    suffix: &'static [u8],
    live: bool,
    compressed: bool,
}

/// A queued item.
#[derive(Debug)]
enum Queued {
    Push(QueuedPush, ArcBuf),
    /// A text message sent as it is (a WalletConnect 1.0 frame), by reference.
    Raw {
        data: Bytes,
        live: bool,
    },
    /// A text message whose parts are all known, or will be.
    Text(Parts),
}

/// What waits behind a connection's `OutBuf`. Empty (no heap) when nothing waits.
#[derive(Debug, Default)]
pub struct Backlog {
    items: VecDeque<Queued>,
    /// Bytes of live pushes queued (they count against `--max-outbound`).
    live: usize,
    /// Pending answers in `items` (at most `--max-pending-answers`, and each answer is a
    /// request read: far below `u32::MAX`). 32 bits, with `settled`, keep a connection's
    /// state in its size class (`conn::tests`).
    pending: u32,
    /// How many of the first `items` are known to wait for nothing (no part of theirs is
    /// pending; at most that many really are): where [`Conn::resolve_with`] starts looking.
    /// Stores complete in the order they were asked for, so the answer resolved next is
    /// nearly always the first one still pending; starting there spares a walk over the
    /// answers already resolved but not yet sent, each a cold line (about half of those in
    /// flight under `--fsync always`). Never more than `items.len()`.
    settled: u32,
}

impl Backlog {
    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Answers still waiting for their store.
    pub fn pending_answers(&self) -> usize {
        self.pending as usize
    }

    /// Drops everything (the connection is closing).
    pub fn clear(&mut self) {
        *self = Backlog::default();
    }

    /// Drops the queued pushes and frames, keeps the answers (the peer half-closed).
    pub fn keep_answers(&mut self) {
        self.items.retain(|q| matches!(q, Queued::Text(_)));
        self.settled = 0;
        self.live = 0;
        if self.items.is_empty() {
            self.items = VecDeque::new();
        }
    }
}

/// A push to one subscription of a connection ([`Conn::deliver`]).
#[derive(Debug, Clone, Copy)]
pub struct PushTo<'a> {
    /// The subscription.
    pub id: &'a SubId,
    /// The shape its pushes take.
    pub dialect: Dialect,
    /// The push's JSON-RPC id.
    pub push_id: u64,
    /// A live message (it counts against `--max-outbound` while it waits), not a replay.
    pub live: bool,
}

/// How a push is written ([`Conn::deliver`]): into the output buffer while it holds less
/// than `fill_mark` bytes, its shared bytes by reference from `share_min` on, encoded in
/// the worker's `scratch`.
#[derive(Debug)]
pub struct Writing<'a> {
    /// Output at which pushes wait in the backlog instead.
    pub fill_mark: usize,
    /// Bodies at least this long are referenced, not copied.
    pub share_min: usize,
    /// The worker's scratch buffer.
    pub scratch: &'a mut Vec<u8>,
}

impl<S> Conn<S> {
    /// Bytes queued for this connection that count against `--max-outbound`.
    pub fn outbound_len(&self) -> usize {
        self.out.len() + self.backlog.live + self.tls.as_ref().map_or(0, |t| t.pending_len())
    }

    /// Delivers a push of `body` in the shape of `to.dialect`: encoded into `out` while it
    /// holds less than `w.fill_mark` bytes and nothing waits before it, else queued (by
    /// reference) in the backlog.
    // Inlined into its caller (one push per subscriber).
    #[inline]
    pub fn deliver(&mut self, to: PushTo<'_>, body: &Body, w: Writing<'_>) {
        let (data, len, suffix) = rpc::push_shape(body, to.dialect);
        let q = QueuedPush {
            id: *to.id,
            push_id: to.push_id,
            dialect: to.dialect,
            len,
            suffix,
            live: to.live,
            compressed: false,
        };
        self.deliver_push(q, data, w);
    }

    /// Delivers a permessage-deflate push: `z` is the push's `data` + suffix compressed once
    /// for every subscriber of its dialect on this worker (`ws::deflate::Shared`).
    pub fn deliver_compressed(&mut self, to: PushTo<'_>, z: &ArcBuf, w: Writing<'_>) {
        let q = QueuedPush {
            id: *to.id,
            push_id: to.push_id,
            dialect: to.dialect,
            len: z.len(),
            suffix: b"",
            live: to.live,
            compressed: true,
        };
        self.deliver_push(q, z, w);
    }

    /// `q` with its shared bytes `data`: written now or queued.
    #[inline]
    fn deliver_push(&mut self, q: QueuedPush, data: &ArcBuf, w: Writing<'_>) {
        let Writing {
            fill_mark,
            share_min,
            scratch,
        } = w;
        if self.backlog.is_empty() && self.out.len() < fill_mark {
            if q.compressed {
                self.push_compressed(&q.id, q.dialect, q.push_id, data, share_min, scratch);
            } else {
                self.push_message(&q, data, share_min, scratch);
            }
        } else {
            if q.live {
                self.backlog.live += q.len;
            }
            self.backlog.items.push_back(Queued::Push(q, data.clone()));
        }
    }

    /// Delivers a text message sent as it is (a v1 frame), as [`Conn::deliver`] does pushes.
    pub fn deliver_text(&mut self, data: &Bytes, live: bool, fill_mark: usize, share_min: usize) {
        if self.backlog.is_empty() && self.out.len() < fill_mark {
            self.push_text(data, share_min);
        } else {
            if live {
                self.backlog.live += data.len();
            }
            self.backlog.items.push_back(Queued::Raw {
                data: data.clone(),
                live,
            });
        }
    }

    fn push_text(&mut self, data: &Bytes, share_min: usize) {
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, Opcode::Text, data.len());
        self.out.extend(&h[..n]);
        self.out.push_shared(data, share_min);
    }

    /// Queues a text message made of `parts`: sent at once when every part is known and
    /// nothing waits before it, else kept in order in the backlog.
    pub fn answer(&mut self, parts: Parts) {
        let pending = parts.as_slice().iter().filter(|p| p.is_pending()).count();
        if pending == 0 && self.backlog.is_empty() {
            let mut text = Vec::new();
            parts.render(&mut text);
            self.send_text(&text);
            return;
        }
        self.backlog.pending += pending as u32;
        self.backlog.items.push_back(Queued::Text(parts));
    }

    /// Queues an answer in the backlog without sending anything (a `POST /rpc` answer: the
    /// caller writes it as an HTTP response, `Conn::take_ready_answer`).
    pub fn hold_answer(&mut self, parts: Parts) {
        let pending = parts.as_slice().iter().filter(|p| p.is_pending()).count();
        self.backlog.pending += pending as u32;
        self.backlog.items.push_back(Queued::Text(parts));
    }

    /// Queues a text message known in full (sent at once when nothing waits before it).
    pub fn answer_text(&mut self, text: &[u8]) {
        if self.backlog.is_empty() {
            self.send_text(text);
        } else {
            let parts = Parts::One(Part::Bytes(text.to_vec()));
            self.backlog.items.push_back(Queued::Text(parts));
        }
    }

    /// Records one result of pending answer `answer` (a publish's store): a refusal
    /// makes the answer that error; returns whether it was found.
    pub fn resolve(&mut self, answer: u64, result: Result<(), RelayError>) -> bool {
        self.resolve_with(answer, |o| {
            if let (Err(e), Gathered::Done | Gathered::Fetch(_) | Gathered::Json(_)) = (result, &*o)
            {
                *o = Gathered::Failed(e);
            }
        })
    }

    /// Records one result of pending answer `answer`, as `f` folds it into what the
    /// answer gathered; returns whether it was found.
    pub fn resolve_with(&mut self, answer: u64, f: impl FnOnce(&mut Gathered)) -> bool {
        let b = &mut self.backlog;
        // Past the items that wait for nothing: a part's count only goes down, so an item
        // that waits for nothing never waits again.
        let from = (b.settled as usize).min(b.items.len());
        let at = b
            .items
            .range(from..)
            .position(|q| matches!(q, Queued::Text(parts) if parts.has_pending()))
            .map_or(b.items.len(), |i| from + i);
        b.settled = at as u32;
        for item in b.items.range_mut(at..) {
            let Queued::Text(parts) = item else { continue };
            for p in parts.as_mut_slice() {
                if let Part::Pending {
                    answer: a,
                    left,
                    outcome,
                    ..
                } = p
                {
                    if *a == answer && *left > 0 {
                        f(outcome);
                        *left -= 1;
                        if *left == 0 {
                            b.pending -= 1;
                        }
                        return true;
                    }
                }
            }
        }
        false
    }

    /// The first waiting answer, rendered into `out`, when nothing else waits and it is
    /// complete (a `POST /rpc` answer, written as an HTTP response by the caller); returns
    /// whether there was one.
    pub fn take_ready_answer(&mut self, out: &mut Vec<u8>) -> bool {
        let b = &mut self.backlog;
        match b.items.front() {
            Some(Queued::Text(parts)) if b.items.len() == 1 && !parts.has_pending() => {}
            _ => return false,
        }
        if let Some(Queued::Text(parts)) = b.items.pop_front() {
            parts.render(out);
        }
        *b = Backlog::default();
        true
    }

    /// Moves backlog entries into `out` until it holds `fill_mark` bytes or the next entry
    /// is still pending; returns whether anything moved.
    pub fn refill(&mut self, fill_mark: usize, scratch: &mut Vec<u8>) -> bool {
        let mut moved = false;
        while self.out.len() < fill_mark {
            match self.backlog.items.front() {
                None => break,
                Some(Queued::Text(parts)) if parts.has_pending() => break,
                Some(_) => {}
            }
            let popped = self.backlog.items.pop_front();
            self.backlog.settled = self.backlog.settled.saturating_sub(1);
            match popped {
                Some(Queued::Push(q, data)) => {
                    if q.live {
                        self.backlog.live -= q.len;
                    }
                    let min = crate::outbuf::PUSH_SHARE_MIN;
                    if q.compressed {
                        self.push_compressed(&q.id, q.dialect, q.push_id, &data, min, scratch);
                    } else {
                        self.push_message(&q, &data, min, scratch);
                    }
                }
                Some(Queued::Raw { data, live }) => {
                    if live {
                        self.backlog.live -= data.len();
                    }
                    self.push_text(&data, crate::outbuf::PUSH_SHARE_MIN);
                }
                Some(Queued::Text(parts)) => {
                    scratch.clear();
                    parts.render(scratch);
                    let text = std::mem::take(scratch);
                    self.send_text(&text);
                    *scratch = text;
                }
                None => break,
            }
            moved = true;
        }
        if self.backlog.items.is_empty() && self.backlog.items.capacity() > 64 {
            self.backlog.items = VecDeque::new();
        }
        moved
    }

    /// Queues a text frame.
    pub fn send_text(&mut self, payload: &[u8]) {
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, Opcode::Text, payload.len());
        self.out.extend(&h[..n]);
        self.out.extend(payload);
    }

    /// Queues the push `q` describes, its data object `data[..q.len]` then `q.suffix`.
    fn push_message(
        &mut self,
        q: &QueuedPush,
        data: &ArcBuf,
        share_min: usize,
        scratch: &mut Vec<u8>,
    ) {
        if !self.push_prefix(q.dialect, &q.id, q.push_id, scratch) {
            return;
        }
        let len = scratch.len() + q.len + q.suffix.len();
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, Opcode::Text, len);
        let head = h.get(..n).unwrap_or(&[]);
        self.out
            .push_arc_between([head, scratch], data, q.len, share_min, q.suffix);
    }
}

impl<S> Conn<S> {
    /// Writes into `scratch` the prefix of push `push_id` to subscription `id`; `false`
    /// (nothing written) when it is no WebSocket.
    #[inline(always)]
    fn push_prefix(
        &mut self,
        dialect: Dialect,
        id: &SubId,
        push_id: u64,
        scratch: &mut Vec<u8>,
    ) -> bool {
        let Phase::Ws(_) = &self.phase else {
            return false;
        };
        scratch.clear();
        rpc::write_push_prefix(scratch, dialect, push_id, id.hex());
        true
    }

    /// Queues a compressed `waku_subscription` push: the frame header and the subscriber's
    /// own prefix as a stored block, then the shared compressed bytes by reference.
    fn push_compressed(
        &mut self,
        id: &SubId,
        dialect: Dialect,
        push_id: u64,
        z: &ArcBuf,
        share_min: usize,
        scratch: &mut Vec<u8>,
    ) {
        if !self.push_prefix(dialect, id, push_id, scratch) {
            return;
        }
        let mut head = Vec::with_capacity(scratch.len() + 16);
        crate::ws::deflate::push_head(scratch, z, &mut head);
        self.out.extend(&head);
        self.out.push_arc_prefix(z, z.len(), share_min);
    }
}
