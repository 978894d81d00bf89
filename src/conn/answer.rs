//! The answers a connection owes, as they are assembled: a message's [`Parts`] (bytes known
//! now, and [`Part::Pending`] results of stores that answer later), what each pending result
//! folds into ([`Gathered`], a fetch's [`Fetched`]), and the encoders of the answers whose
//! shape is pinned (`irn_batchSubscribeBlocking`'s, a publish's). `outbound.rs` queues them.

use crate::relay::{RelayError, SubId};
use crate::rpc::{self, Id, RpcError};

/// One part of a text message answering a WebSocket message (a single answer, or a batch).
#[derive(Debug)]
pub enum Part {
    /// Bytes known now.
    Bytes(Vec<u8>),
    /// An answer that waits for the relay (a publish's store, a fetch's reads).
    Pending {
        /// The connection's number for it.
        answer: u64,
        /// The request's id, echoed back.
        id: Id<'static>,
        /// Results still to come (a session method waits for two publishes, a batch fetch
        /// for one read per topic).
        left: u32,
        /// What came so far.
        outcome: Gathered,
    },
}

/// What a pending answer has gathered.
#[derive(Debug)]
pub enum Gathered {
    /// `true` so far.
    Done,
    /// A refusal (the first one is answered).
    Failed(RelayError),
    /// A fetch's messages.
    Fetch(Fetched),
    /// A result known when the request was taken, answered once what it waits for is done
    /// (a watch registration's `{"relayId":..}` once it is durable).
    Json(Vec<u8>),
    /// An error answer (a watch change that could not be made durable).
    Error(Box<RpcError>),
    /// A blocking subscribe's id, answered once its subscription is in place (boxed: the
    /// 64 bytes would grow every queued item, publishes' answers included).
    Subscribed(Box<SubId>),
    /// A blocking batch subscribe's answers, one per topic in order: `{"id":..}` or
    /// `{"error":{..}}` (relay-api.md (b)).
    SubscribedEach(Vec<Result<SubId, RpcError>>),
}

/// A fetch answer being gathered: `{"messages":[items],"hasMore":more}`.
#[derive(Debug, Default)]
pub struct Fetched {
    /// The messages' objects so far, comma-separated.
    pub items: Vec<u8>,
    /// How many.
    pub count: usize,
    /// Some were left for the next call.
    pub more: bool,
}

impl Part {
    /// A pending answer waiting for `left` results.
    pub fn pending(answer: u64, id: Id<'static>, left: u32, outcome: Gathered) -> Part {
        Part::Pending {
            answer,
            id,
            left,
            outcome,
        }
    }

    pub(super) fn is_pending(&self) -> bool {
        matches!(self, Part::Pending { left, .. } if *left > 0)
    }
}

/// A text message's parts; a lone one (a publish's answer) is kept inline, without a heap
/// block of its own: under `--fsync always` every publish's answer waits in a backlog, and
/// a block allocated for it would be cold by the time the answer is queued and again when
/// it is read.
#[derive(Debug, Default)]
pub enum Parts {
    /// None yet.
    #[default]
    Zero,
    /// One part.
    One(Part),
    /// Two or more, in order.
    Many(Vec<Part>),
}

impl Parts {
    /// Appends `p`.
    pub fn push(&mut self, p: Part) {
        *self = match std::mem::take(self) {
            Parts::Zero => Parts::One(p),
            Parts::One(a) => Parts::Many(vec![a, p]),
            Parts::Many(mut v) => {
                v.push(p);
                Parts::Many(v)
            }
        };
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// None.
    pub fn is_empty(&self) -> bool {
        matches!(self, Parts::Zero)
    }

    pub(super) fn as_slice(&self) -> &[Part] {
        match self {
            Parts::Zero => &[],
            Parts::One(p) => std::slice::from_ref(p),
            Parts::Many(v) => v,
        }
    }

    /// Some part still waits for a result.
    pub(super) fn has_pending(&self) -> bool {
        self.as_slice().iter().any(Part::is_pending)
    }

    /// Writes a complete text message's parts.
    pub(super) fn render(&self, out: &mut Vec<u8>) {
        for p in self.as_slice() {
            match p {
                Part::Bytes(b) => out.extend_from_slice(b),
                Part::Pending { left: 1.., .. } => {}
                Part::Pending { id, outcome, .. } => match outcome {
                    Gathered::Done => write_publish_answer(out, id, &Ok(())),
                    Gathered::Failed(e) => write_publish_answer(out, id, &Err(*e)),
                    Gathered::Fetch(f) => {
                        let mut r = Vec::with_capacity(f.items.len() + 40);
                        r.extend_from_slice(b"{\"messages\":[");
                        r.extend_from_slice(&f.items);
                        r.extend_from_slice(b"],\"hasMore\":");
                        r.extend_from_slice(if f.more { b"true" } else { b"false" });
                        r.push(b'}');
                        rpc::write_result(out, id, &r);
                    }
                    Gathered::Json(r) => rpc::write_result(out, id, r),
                    Gathered::Error(e) => rpc::write_error(out, id, e),
                    Gathered::Subscribed(sub) => {
                        let mut r = [b'"'; 66];
                        r[1..65].copy_from_slice(sub.hex());
                        rpc::write_result(out, id, &r);
                    }
                    Gathered::SubscribedEach(each) => {
                        rpc::write_result(out, id, &subscribed_each(each));
                    }
                },
            }
        }
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [Part] {
        match self {
            Parts::Zero => &mut [],
            Parts::One(p) => std::slice::from_mut(p),
            Parts::Many(v) => v,
        }
    }
}

/// `irn_batchSubscribeBlocking`'s result: `[{"id":".."}|{"error":{code,message,data}}]`.
pub fn subscribed_each(each: &[Result<SubId, RpcError>]) -> Vec<u8> {
    let mut r = Vec::with_capacity(each.len() * 75 + 2);
    r.push(b'[');
    for (i, e) in each.iter().enumerate() {
        if i > 0 {
            r.push(b',');
        }
        match e {
            Ok(sub) => {
                r.extend_from_slice(b"{\"id\":\"");
                r.extend_from_slice(sub.hex());
                r.extend_from_slice(b"\"}");
            }
            Err(e) => {
                r.extend_from_slice(b"{\"error\":");
                rpc::write_error_object(&mut r, e);
                r.push(b'}');
            }
        }
    }
    r.push(b']');
    r
}

/// The bytes of a JSON-RPC answer to a publish.
pub fn write_publish_answer(out: &mut Vec<u8>, id: &Id<'_>, result: &Result<(), RelayError>) {
    match result {
        Ok(()) => rpc::write_result(out, id, b"true"),
        Err(e) => rpc::write_error(out, id, &RpcError::server(e.to_string())),
    }
}
