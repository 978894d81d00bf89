//! `*_fetchMessages`, `*_batchFetchMessages` and `irn_batchReceive`: their params (a topic,
//! 1 to 500 topics, 1 to 500 receipts), their cost (nothing) and their execution. A fetch
//! reads the topics through the engine (`conn/fetch.rs` keeps the cursors and folds the
//! reads into the answer); a receipt tells the relay what a client id was given.

use std::borrow::Cow;

use super::{Caller, Method, Outcome, Via};
use crate::conn::{fetch, outbound, Ctx};
use crate::limits::Cost;
use crate::rpc::params::{extra, Rules};
use crate::rpc::wire::{Elem, List, Loose, Params};
use crate::rpc::{code, RpcError};

/// `*_fetchMessages`: one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchMessages<'a> {
    /// Topic.
    pub topic: Cow<'a, str>,
}

/// `*_batchFetchMessages`: 1 to 500 topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchFetchMessages<'a> {
    /// Topics.
    pub topics: Vec<Cow<'a, str>>,
}

/// `irn_batchReceive`: 1 to 500 receipts `(topic, message id)`, answered `true`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchReceive<'a> {
    /// The receipts.
    pub receipts: Vec<(Cow<'a, str>, u64)>,
}

impl<'a> Method<'a> for FetchMessages<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let topic = r.topic(p.topic.take(), "topic")?;
        Ok(FetchMessages { topic })
    }

    fn cost(&self) -> Cost {
        Cost::default()
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        Ok(c.fetch(std::slice::from_ref(&self.topic), ctx))
    }
}

impl<'a> Method<'a> for BatchFetchMessages<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let topics = r.topics(extra(p).topics)?;
        Ok(BatchFetchMessages { topics })
    }

    fn cost(&self) -> Cost {
        Cost::default()
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        Ok(c.fetch(&self.topics, ctx))
    }
}

impl<S> Caller<'_, S> {
    /// Starts reading `topics` for this request: after what the socket was given, or over
    /// HTTP (no socket cursor) after what the token's client id was given (its mailbox).
    /// Answered once every topic was read.
    fn fetch(&mut self, topics: &[Cow<'_, str>], ctx: &mut Ctx<'_>) -> Outcome {
        match self.via {
            Via::Socket => fetch::start(self.conn, topics, self.answer, ctx),
            Via::Http(h) => {
                let client = Some(h.by.clone());
                fetch::start_for(self.conn, topics, self.answer, client, ctx);
            }
        }
        let gathered = outbound::Gathered::Fetch(Default::default());
        Outcome::Pending(topics.len() as u32, gathered)
    }
}

impl<'a> Method<'a> for BatchReceive<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let receipts = receipts(r, extra(p).receipts)?;
        Ok(BatchReceive { receipts })
    }

    fn cost(&self) -> Cost {
        Cost::default()
    }

    /// The receipts handed to the relay in one call, for the socket's client id or the
    /// HTTP request's token's.
    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        let client = match c.via {
            Via::Socket => c.conn.ws().and_then(|w| w.client()).map(|c| c.did()),
            Via::Http(h) => Some(h.did.clone()),
        };
        let list: Vec<(&str, u64)> = self.receipts.iter().map(|(t, id)| (&**t, *id)).collect();
        ctx.relay.receive(client.as_deref(), &list);
        Ok(Outcome::Done)
    }
}

/// `irn_batchReceive`'s receipts, 1 to 500 (`wire::MAX_LIST`, relay_rpc's
/// `MAX_RECEIVE_BATCH_SIZE`): an empty or longer list is -32600 with the tag relay_client
/// parses (`BatchEmpty`, `BatchLimitExceeded`).
fn receipts<'a>(r: Rules, v: Option<List<'a>>) -> Result<Vec<(Cow<'a, str>, u64)>, RpcError> {
    let items = match v {
        Some(List::Items(items)) if items.is_empty() => {
            let m = "Invalid payload: Batch is empty";
            return Err(RpcError::tagged(code::INVALID_REQUEST, m, "BatchEmpty"));
        }
        Some(List::Items(items)) => items,
        Some(List::TooLong) => {
            let m = "Invalid payload: Batch size limit exceeded";
            let tag = "BatchLimitExceeded";
            return Err(RpcError::tagged(code::INVALID_REQUEST, m, tag));
        }
        _ => return Err(RpcError::param("receipts")),
    };
    items
        .into_iter()
        .map(|e| match e {
            Elem::Sub { topic, id } => {
                let topic = r.topic(topic, "receipts")?;
                let id = match id {
                    Some(Loose::U64(n)) => n,
                    Some(Loose::Str(s)) => s.parse().map_err(|_| RpcError::param("receipts"))?,
                    _ => return Err(RpcError::param("receipts")),
                };
                Ok((topic, id))
            }
            _ => Err(RpcError::param("receipts")),
        })
        .collect()
}
