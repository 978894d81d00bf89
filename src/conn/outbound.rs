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

use super::{Conn, Phase};
use crate::relay::{RelayError, SubId};
use crate::rpc::{self, Id, RpcError};
use crate::ws::{self, Opcode};

/// A push waiting in a connection's backlog.
#[derive(Debug)]
struct QueuedPush {
    id: SubId,
    /// The data object, or (`compressed`) the shared compressed `data` + suffix.
    data: Bytes,
    live: bool,
    compressed: bool,
}

/// One part of a text message answering a WebSocket message (a single answer, or a batch).
#[derive(Debug)]
pub enum Part {
    /// Bytes known now.
    Bytes(Vec<u8>),
    /// The answer of a publish whose store has not answered yet.
    Pending {
        /// The connection's number for it.
        answer: u64,
        /// The request's id, echoed back.
        id: Id<'static>,
        /// Its outcome, once known.
        result: Option<Result<(), RelayError>>,
    },
}

/// A queued item.
#[derive(Debug)]
enum Queued {
    Push(QueuedPush),
    /// A text message sent as it is (a WalletConnect 1.0 frame), by reference.
    Raw {
        data: Bytes,
        live: bool,
    },
    /// A text message whose parts are all known, or will be.
    Text(Vec<Part>),
}

/// What waits behind a connection's `OutBuf`. Empty (no heap) when nothing waits.
#[derive(Debug, Default)]
pub struct Backlog {
    items: VecDeque<Queued>,
    /// Bytes of live pushes queued (they count against `--max-outbound`).
    live: usize,
    /// Pending answers in `items`.
    pending: usize,
}

impl Backlog {
    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Answers still waiting for their store.
    pub fn pending_answers(&self) -> usize {
        self.pending
    }

    /// Drops everything (the connection is closing).
    pub fn clear(&mut self) {
        *self = Backlog::default();
    }

    /// Drops the queued pushes and frames, keeps the answers (the peer half-closed).
    pub fn keep_answers(&mut self) {
        self.items.retain(|q| matches!(q, Queued::Text(_)));
        self.live = 0;
        if self.items.is_empty() {
            self.items = VecDeque::new();
        }
    }
}

/// The bytes of a JSON-RPC answer to a publish.
pub fn write_publish_answer(out: &mut Vec<u8>, id: &Id<'_>, result: &Result<(), RelayError>) {
    match result {
        Ok(()) => rpc::write_result(out, id, b"true"),
        Err(e) => rpc::write_error(out, id, &RpcError::server(e.to_string())),
    }
}

impl<S> Conn<S> {
    /// Bytes queued for this connection that count against `--max-outbound`.
    pub fn outbound_len(&self) -> usize {
        self.out.len() + self.backlog.live + self.tls.as_ref().map_or(0, |t| t.pending_len())
    }

    /// Delivers a push: encoded into `out` while it holds less than `fill_mark` bytes and
    /// nothing waits before it, else queued (by reference) in the backlog.
    pub fn deliver(
        &mut self,
        id: &SubId,
        data: &Bytes,
        live: bool,
        fill_mark: usize,
        share_min: usize,
        scratch: &mut Vec<u8>,
    ) {
        self.deliver_push(id, data, false, live, fill_mark, share_min, scratch);
    }

    /// Delivers a permessage-deflate push: `z` is the push's `data` + suffix compressed once
    /// for every subscriber on this worker (`ws::deflate::Shared`).
    pub fn deliver_compressed(
        &mut self,
        id: &SubId,
        z: &Bytes,
        live: bool,
        fill_mark: usize,
        share_min: usize,
        scratch: &mut Vec<u8>,
    ) {
        self.deliver_push(id, z, true, live, fill_mark, share_min, scratch);
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one push, named at the two callers"
    )]
    // Inlined into its two callers (one push each, per subscriber).
    #[inline]
    fn deliver_push(
        &mut self,
        id: &SubId,
        data: &Bytes,
        compressed: bool,
        live: bool,
        fill_mark: usize,
        share_min: usize,
        scratch: &mut Vec<u8>,
    ) {
        if self.backlog.is_empty() && self.out.len() < fill_mark {
            if compressed {
                self.push_compressed(id, data, share_min, scratch);
            } else {
                self.push_message(id, data, share_min, scratch);
            }
        } else {
            if live {
                self.backlog.live += data.len();
            }
            self.backlog.items.push_back(Queued::Push(QueuedPush {
                id: *id,
                data: data.clone(),
                live,
                compressed,
            }));
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
    pub fn answer(&mut self, parts: Vec<Part>) {
        let pending = parts
            .iter()
            .filter(|p| matches!(p, Part::Pending { result: None, .. }))
            .count();
        if pending == 0 && self.backlog.is_empty() {
            let mut text = Vec::new();
            for p in parts {
                if let Part::Bytes(b) = p {
                    if text.is_empty() {
                        text = b;
                    } else {
                        text.extend_from_slice(&b);
                    }
                }
            }
            self.send_text(&text);
            return;
        }
        self.backlog.pending += pending;
        self.backlog.items.push_back(Queued::Text(parts));
    }

    /// Queues a text message known in full (sent at once when nothing waits before it).
    pub fn answer_text(&mut self, text: &[u8]) {
        if self.backlog.is_empty() {
            self.send_text(text);
        } else {
            let parts = vec![Part::Bytes(text.to_vec())];
            self.backlog.items.push_back(Queued::Text(parts));
        }
    }

    /// Records the outcome of pending answer `answer`; returns whether it was found.
    pub fn resolve(&mut self, answer: u64, outcome: Result<(), RelayError>) -> bool {
        for item in self.backlog.items.iter_mut() {
            let Queued::Text(parts) = item else { continue };
            for p in parts.iter_mut() {
                if let Part::Pending {
                    answer: a, result, ..
                } = p
                {
                    if *a == answer && result.is_none() {
                        *result = Some(outcome);
                        self.backlog.pending -= 1;
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Moves backlog entries into `out` until it holds `fill_mark` bytes or the next entry
    /// is still pending; returns whether anything moved.
    pub fn refill(&mut self, fill_mark: usize, scratch: &mut Vec<u8>) -> bool {
        let mut moved = false;
        while self.out.len() < fill_mark {
            match self.backlog.items.front() {
                None => break,
                Some(Queued::Text(parts)) if has_pending(parts) => break,
                Some(_) => {}
            }
            match self.backlog.items.pop_front() {
                Some(Queued::Push(q)) => {
                    if q.live {
                        self.backlog.live -= q.data.len();
                    }
                    let min = crate::outbuf::PUSH_SHARE_MIN;
                    if q.compressed {
                        self.push_compressed(&q.id, &q.data, min, scratch);
                    } else {
                        self.push_message(&q.id, &q.data, min, scratch);
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
                    render(&parts, scratch);
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

    /// Queues a `waku_subscription` push of `data` for subscription `id`.
    pub fn push_message(
        &mut self,
        id: &SubId,
        data: &Bytes,
        share_min: usize,
        scratch: &mut Vec<u8>,
    ) {
        let Phase::Ws(w) = &mut self.phase else {
            return;
        };
        scratch.clear();
        rpc::write_push_prefix(scratch, w.next_push_id, id.hex());
        w.next_push_id += 1;
        let len = scratch.len() + data.len() + rpc::PUSH_SUFFIX.len();
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, Opcode::Text, len);
        self.out.extend(&h[..n]);
        self.out.extend(scratch);
        self.out.push_shared(data, share_min);
        self.out.extend(rpc::PUSH_SUFFIX);
    }
}

impl<S> Conn<S> {
    /// Queues a compressed `waku_subscription` push: the frame header and the subscriber's
    /// own prefix as a stored block, then the shared compressed bytes by reference.
    fn push_compressed(&mut self, id: &SubId, z: &Bytes, share_min: usize, scratch: &mut Vec<u8>) {
        let Phase::Ws(w) = &mut self.phase else {
            return;
        };
        scratch.clear();
        rpc::write_push_prefix(scratch, w.next_push_id, id.hex());
        w.next_push_id += 1;
        let mut head = Vec::with_capacity(scratch.len() + 16);
        crate::ws::deflate::push_head(scratch, z, &mut head);
        self.out.extend(&head);
        self.out.push_shared(z, share_min);
    }
}

fn has_pending(parts: &[Part]) -> bool {
    parts
        .iter()
        .any(|p| matches!(p, Part::Pending { result: None, .. }))
}

/// Writes a complete text message's parts.
fn render(parts: &[Part], out: &mut Vec<u8>) {
    for p in parts {
        match p {
            Part::Bytes(b) => out.extend_from_slice(b),
            Part::Pending {
                id,
                result: Some(r),
                ..
            } => write_publish_answer(out, id, r),
            Part::Pending { result: None, .. } => {}
        }
    }
}
