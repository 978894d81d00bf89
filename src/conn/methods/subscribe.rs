//! `*_subscribe`, `*_batchSubscribe`, `irn_subscribeBlocking`, `irn_batchSubscribeBlocking`:
//! their params (a topic, or 1 to 500), their cost (one subscribe a topic) and their
//! execution, plus the subscribing every method shares (`Caller::subscribe`). A socket's
//! subscription is the connection's (its id the one an authenticated client computes
//! itself, else random); an HTTP request's is its token's client id's.

use std::borrow::Cow;

use super::{rpc_error, Caller, Method, Outcome, Via};
use crate::conn::{outbound, ConnSub, Ctx};
use crate::limits::Cost;
use crate::relay::{RelayError, SubId};
use crate::rpc::params::{extra, Rules};
use crate::rpc::wire::Params;
use crate::rpc::RpcError;

/// `*_subscribe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe<'a> {
    /// Topic.
    pub topic: Cow<'a, str>,
}

/// `*_batchSubscribe`: 1 to 500 topics, answered with their ids in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSubscribe<'a> {
    /// Topics.
    pub topics: Vec<Cow<'a, str>>,
}

/// `irn_subscribeBlocking`: `Subscribe`, answered once the subscription is in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeBlocking<'a> {
    /// Topic.
    pub topic: Cow<'a, str>,
}

/// `irn_batchSubscribeBlocking`: answered `[{id}|{error}]` per topic, in order, once every
/// subscription is in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSubscribeBlocking<'a> {
    /// Topics.
    pub topics: Vec<Cow<'a, str>>,
}

/// What subscribing to `topics` topics costs.
pub(super) fn cost(topics: usize) -> Cost {
    Cost {
        subscribes: topics as u32,
        ..Cost::default()
    }
}

impl<'a> Method<'a> for Subscribe<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let topic = r.topic(p.topic.take(), "topic")?;
        Ok(Subscribe { topic })
    }

    fn cost(&self) -> Cost {
        cost(1)
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        c.subscribe(&self.topic, ctx).map(Outcome::Subscribed)
    }
}

impl<'a> Method<'a> for BatchSubscribe<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let topics = r.topics(extra(p).topics)?;
        Ok(BatchSubscribe { topics })
    }

    fn cost(&self) -> Cost {
        cost(self.topics.len())
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        let mut ids = Vec::with_capacity(self.topics.len());
        for t in &self.topics {
            ids.push(c.subscribe(t, ctx)?);
        }
        Ok(Outcome::SubscribedMany(ids))
    }
}

impl<'a> Method<'a> for SubscribeBlocking<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let topic = r.topic(p.topic.take(), "topic")?;
        Ok(SubscribeBlocking { topic })
    }

    fn cost(&self) -> Cost {
        cost(1)
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        if let Via::Http(_) = c.via {
            // A client id's subscription is in place once the call returns.
            return c.subscribe(&self.topic, ctx).map(Outcome::Subscribed);
        }
        let (id, slot) = c.subscribe_at(&self.topic, ctx)?;
        ctx.relay
            .when_in_place(ctx.conn_ref(c.conn), c.answer, slot);
        let outcome = outbound::Gathered::Subscribed(Box::new(id));
        Ok(Outcome::Pending(1, outcome))
    }
}

impl<'a> Method<'a> for BatchSubscribeBlocking<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let topics = r.topics(extra(p).topics)?;
        Ok(BatchSubscribeBlocking { topics })
    }

    fn cost(&self) -> Cost {
        cost(self.topics.len())
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        let tagged = |e: RpcError| RpcError::tagged(e.code, e.message, "SubscriberLimitExceeded");
        let mut each = Vec::with_capacity(self.topics.len());
        let mut waiting = 0;
        for t in &self.topics {
            each.push(match c.via {
                Via::Http(_) => c.subscribe(t, ctx).map_err(tagged),
                Via::Socket => match c.subscribe_at(t, ctx) {
                    Ok((id, slot)) => {
                        ctx.relay
                            .when_in_place(ctx.conn_ref(c.conn), c.answer, slot);
                        waiting += 1;
                        Ok(id)
                    }
                    Err(e) => Err(tagged(e)),
                },
            });
        }
        let outcome = outbound::Gathered::SubscribedEach(each);
        Ok(Outcome::Pending(waiting, outcome))
    }
}

impl<S> Caller<'_, S> {
    /// Subscribes this request's caller to `topic`: a socket keeps the existing id for a
    /// topic it already follows (the reference relay made duplicates), else a new
    /// subscription whose pushes use the request's dialect; over HTTP the token's client id
    /// subscribes.
    pub(super) fn subscribe(&mut self, topic: &str, ctx: &mut Ctx<'_>) -> Result<SubId, RpcError> {
        match self.via {
            Via::Socket => self.subscribe_at(topic, ctx).map(|(id, _)| id),
            Via::Http(h) => ctx
                .relay
                .client_subscribe(&h.did, h.project, topic)
                .map_err(|e| rpc_error(&e)),
        }
    }

    /// A socket's [`Caller::subscribe`], with the topic's slot in the relay.
    fn subscribe_at(&mut self, topic: &str, ctx: &mut Ctx<'_>) -> Result<(SubId, u32), RpcError> {
        let conn = &mut *self.conn;
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
        let dialect = self.dialect;
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
        if conn.subs.len() == conn.subs.capacity() && conn.subs.len() < 4 {
            // Most connections hold one or two subscriptions (the SDK: a pairing and a
            // session topic): growing by doubling would make room for four at the first or
            // second push, bytes every idle connection keeps.
            conn.subs.reserve_exact(1);
        }
        conn.subs.push(ConnSub { slot, id });
        Ok((id, slot))
    }
}
