//! `*_unsubscribe` and `*_batchUnsubscribe`: their params (a topic and/or a subscription id,
//! or a list of `{topic, id}`), their cost (nothing) and their execution. An unknown id is
//! no error.

use std::borrow::Cow;

use super::{Caller, Method, Outcome, Via};
use crate::conn::Ctx;
use crate::limits::Cost;
use crate::relay::SubId;
use crate::rpc::params::{extra, string_param, Rules};
use crate::rpc::wire::{Elem, List, Loose, Params};
use crate::rpc::RpcError;

/// `*_unsubscribe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe<'a> {
    /// Topic, when given (older clients send only the id).
    pub topic: Option<Cow<'a, str>>,
    /// Subscription id; `None` (`irn_`/`iridium_` with a topic: what `relay_client` sends)
    /// unsubscribes the caller from the topic, whatever the id.
    pub id: Option<Cow<'a, str>>,
}

/// `*_batchUnsubscribe`: `(topic, id)` pairs (the id optional as for [`Unsubscribe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchUnsubscribe<'a> {
    /// The subscriptions.
    pub subs: Vec<(Cow<'a, str>, Option<Cow<'a, str>>)>,
}

impl<'a> Method<'a> for Unsubscribe<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let topic = match p.topic.take() {
            None | Some(Loose::Null) => None,
            t => Some(r.topic(t, "topic")?),
        };
        let id = sub_id(p.id.take(), topic.is_some() && r.irn, "id")?;
        Ok(Unsubscribe { topic, id })
    }

    fn cost(&self) -> Cost {
        Cost::default()
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        c.unsubscribe(self.topic.as_deref(), self.id.as_deref(), ctx);
        Ok(Outcome::Done)
    }
}

impl<'a> Method<'a> for BatchUnsubscribe<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let Some(List::Items(items)) = extra(p).subscriptions else {
            return Err(RpcError::param("subscriptions"));
        };
        let subs = items
            .into_iter()
            .map(|e| match e {
                Elem::Sub { topic, id } => Ok((
                    r.topic(topic, "subscriptions")?,
                    sub_id(id, r.irn, "subscriptions")?,
                )),
                _ => Err(RpcError::param("subscriptions")),
            })
            .collect::<Result<_, _>>()?;
        Ok(BatchUnsubscribe { subs })
    }

    fn cost(&self) -> Cost {
        Cost::default()
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        for (topic, id) in &self.subs {
            c.unsubscribe(Some(topic), id.as_deref(), ctx);
        }
        Ok(Outcome::Done)
    }
}

/// A subscription id param; absent (or null) is allowed when `optional` (an `irn_`
/// unsubscribe that names its topic).
fn sub_id<'a>(
    v: Option<Loose<'a>>,
    optional: bool,
    name: &str,
) -> Result<Option<Cow<'a, str>>, RpcError> {
    match v {
        None | Some(Loose::Null) if optional => Ok(None),
        v => string_param(v, name, 1024).map(Some),
    }
}

impl<S> Caller<'_, S> {
    /// Removes a socket's subscription `id` (of `topic`, when given), or without an id its
    /// subscription to `topic`; over HTTP the token's client id's subscription to `topic`.
    fn unsubscribe(&mut self, topic: Option<&str>, id: Option<&str>, ctx: &mut Ctx<'_>) {
        if let Via::Http(h) = self.via {
            if let Some(t) = topic {
                ctx.relay.client_unsubscribe(&h.did, h.project, t);
            }
            return;
        }
        let id = match id {
            Some(id) => match SubId::from_hex(id) {
                Some(id) => Some(id),
                None => return,
            },
            None => None,
        };
        let conn = &mut *self.conn;
        let me = ctx.conn_ref(conn);
        let relay = &*ctx.relay;
        let pos = conn.subs.iter().position(|s| {
            id.is_none_or(|id| s.id == id)
                && topic.is_none_or(|t| relay.topic_name(s.slot).is_some_and(|x| **x == *t))
        });
        if let Some(p) = pos {
            let s = conn.subs.swap_remove(p);
            ctx.relay.unsubscribe_client(s.slot, me);
        } else if let (Some(t), Some(c)) = (topic, conn.ws().and_then(|w| w.client_ref()).cloned())
        {
            // The client id's subscription made elsewhere (another socket, over HTTP, before
            // a reconnect) ends too.
            let project = (!c.project.is_empty()).then_some(&*c.project);
            ctx.relay.client_unsubscribe(&c.id, project, t);
        }
    }
}
