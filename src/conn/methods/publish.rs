//! `*_publish`: its params (`topic`, `message`, `ttl`, `prompt`, `tag`, `attestation`), its
//! cost (one publish of its message's bytes) and its execution, plus what every publishing
//! method shares (`Caller::publish`, `publishes`). This is the hot path of the relay:
//! everything here is inlined into the message loop, with no allocation of its own.

use std::borrow::Cow;

use super::{rpc_error, Caller, Method, Outcome, Via};
use crate::conn::{outbound, Ctx, Phase};
use crate::limits::Cost;
use crate::message::Meta;
use crate::relay::{Done, Publishing, RelayError};
use crate::rpc::params::{string_param, Rules};
use crate::rpc::wire::{Loose, Params};
use crate::rpc::RpcError;

/// Longest `attestation`, bytes (DECISIONS §10).
pub const MAX_ATTESTATION: usize = 4096;

/// `*_publish`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish<'a> {
    /// Topic.
    pub topic: Cow<'a, str>,
    /// Message payload.
    pub message: Cow<'a, str>,
    /// Seconds to keep it cached.
    pub ttl: u32,
    /// `false` suppresses push notifications.
    pub prompt: bool,
    /// `tag` (0 when absent).
    pub tag: u32,
    /// `attestation`, stored and pushed with the message.
    pub attestation: Option<Cow<'a, str>>,
}

impl<'a> Method<'a> for Publish<'a> {
    #[inline(always)]
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        Ok(Publish {
            topic: r.topic(p.topic.take(), "topic")?,
            message: string_param(p.message.take(), "message", usize::MAX)?,
            ttl: r.ttl(p.ttl.take())?,
            prompt: prompt(p.prompt.take())?,
            tag: tag(p.tag.take())?,
            attestation: attestation(p.attestation.take())?,
        })
    }

    #[inline(always)]
    fn cost(&self) -> Cost {
        Cost {
            publishes: 1,
            bytes: self.message.len(),
            subscribes: 0,
        }
    }

    #[inline(always)]
    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        let out = Outgoing {
            topic: &self.topic,
            message: &self.message,
            ttl: self.ttl,
            prompt: self.prompt,
            tag: self.tag,
            attestation: self.attestation.as_deref(),
        };
        let done = c.publish(out, ctx);
        publishes(&[done])
    }
}

#[inline(always)]
fn prompt(v: Option<Loose<'_>>) -> Result<bool, RpcError> {
    match v {
        None | Some(Loose::Null) => Ok(true),
        Some(Loose::Bool(b)) => Ok(b),
        Some(_) => Err(RpcError::param("prompt")),
    }
}

#[inline(always)]
fn tag(v: Option<Loose<'_>>) -> Result<u32, RpcError> {
    match v {
        None | Some(Loose::Null) => Ok(0),
        Some(Loose::U64(n)) => u32::try_from(n).map_err(|_| RpcError::param("tag")),
        Some(Loose::F64(f)) if f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&f) => {
            Ok(f as u32)
        }
        Some(_) => Err(RpcError::param("tag")),
    }
}

#[inline(always)]
fn attestation(v: Option<Loose<'_>>) -> Result<Option<Cow<'_, str>>, RpcError> {
    match v {
        None | Some(Loose::Null) => Ok(None),
        Some(Loose::Str(s)) if s.len() <= MAX_ATTESTATION => Ok(Some(s)),
        Some(_) => Err(RpcError::param("attestation")),
    }
}

/// One message a method publishes (a session method publishes one or two).
#[derive(Debug, Clone, Copy)]
pub(super) struct Outgoing<'a> {
    pub topic: &'a str,
    pub message: &'a str,
    pub ttl: u32,
    pub prompt: bool,
    pub tag: u32,
    pub attestation: Option<&'a str>,
}

impl<S> Caller<'_, S> {
    /// Publishes `out` as this request: by the socket's client id, or by the HTTP
    /// request's token's (its publisher watches hear of it).
    #[inline(always)]
    pub(super) fn publish(
        &mut self,
        out: Outgoing<'_>,
        ctx: &mut Ctx<'_>,
    ) -> Done<Result<(), RelayError>> {
        let publisher = match self.via {
            Via::Socket => match &self.conn.phase {
                Phase::Ws(w) => w.client_ref().cloned(),
                _ => None,
            },
            Via::Http(h) => Some(h.by.clone()),
        };
        let meta = Meta {
            published_at: crate::clock::coarse().1,
            tag: out.tag,
            attestation: out.attestation,
            plain: self.plain,
        };
        let me = ctx.conn_ref(self.conn);
        let p = Publishing {
            topic: out.topic,
            message: out.message,
            meta,
            ttl: out.ttl,
            prompt: out.prompt,
            publisher,
        };
        ctx.relay.publish(me, self.answer, p)
    }
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
        (n, None) => Ok(Outcome::Pending(n, outbound::Gathered::Done)),
        (n, Some(e)) => Ok(Outcome::Pending(n, outbound::Gathered::Failed(e))),
    }
}
