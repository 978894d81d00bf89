//! The params validation every method shares: a [`Call`]'s params as the wire model gave them
//! ([`Call::params`]), topics and ttls by the rules of the method's prefix ([`Rules`]),
//! strings ([`string_param`]); each refusal a -32602 [`RpcError`] naming the param. What one
//! method alone reads of its params is validated in its own file (`conn/methods/`), which
//! also runs it.

use std::borrow::Cow;

use super::wire::{Elem, Extra, List, Loose, Params, ParamsField};
use super::{code, Call, Dialect, Plain, RpcError, MAX_TTL};

/// Shortest `irn_` ttl, seconds (DECISIONS §10).
pub const IRN_MIN_TTL: u64 = 10;

/// The rules a dialect's params follow.
#[derive(Clone, Copy)]
pub(crate) struct Rules {
    /// Longest topic, bytes (beta topics).
    pub(crate) max_topic: usize,
    /// `irn_`: topics are exactly 64 hex characters, ttl at least [`IRN_MIN_TTL`].
    pub(crate) irn: bool,
}

impl Rules {
    #[inline(always)]
    pub(crate) fn topic<'a>(
        self,
        v: Option<Loose<'a>>,
        name: &str,
    ) -> Result<Cow<'a, str>, RpcError> {
        match v {
            Some(Loose::Str(s)) if self.topic_ok(&s) => Ok(s),
            _ => Err(RpcError::param(name)),
        }
    }

    #[inline(always)]
    pub(crate) fn topic_ok(self, s: &str) -> bool {
        if self.irn {
            s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
        } else {
            !s.is_empty() && s.len() <= self.max_topic
        }
    }

    #[inline(always)]
    pub(crate) fn ttl(self, v: Option<Loose<'_>>) -> Result<u32, RpcError> {
        let min = if self.irn { IRN_MIN_TTL } else { 1 };
        match v {
            Some(Loose::U64(n)) if (min..=MAX_TTL).contains(&n) => Ok(n as u32),
            Some(Loose::F64(f)) if f.fract() == 0.0 && f >= min as f64 && f <= MAX_TTL as f64 => {
                Ok(f as u32)
            }
            _ => Err(RpcError::param("ttl")),
        }
    }

    /// A list of topics, 1 to 500.
    pub(crate) fn topics<'a>(self, v: Option<List<'a>>) -> Result<Vec<Cow<'a, str>>, RpcError> {
        let Some(List::Items(items)) = v else {
            return Err(RpcError::param("topics"));
        };
        if items.is_empty() {
            return Err(RpcError::param("topics"));
        }
        items
            .into_iter()
            .map(|e| match e {
                Elem::Str(s) if self.topic_ok(&s) => Ok(s),
                _ => Err(RpcError::param("topics")),
            })
            .collect()
    }
}

#[inline(always)]
pub(crate) fn string_param<'a>(
    v: Option<Loose<'a>>,
    name: &str,
    max: usize,
) -> Result<Cow<'a, str>, RpcError> {
    match v {
        Some(Loose::Str(s)) if !s.is_empty() && s.len() <= max => Ok(s),
        _ => Err(RpcError::param(name)),
    }
}

/// The members only batch and session methods read (a publish has none), taken out of `p`.
#[inline]
pub(crate) fn extra<'a>(p: &mut Params<'a>) -> Extra<'a> {
    p.extra.take().map(|b| *b).unwrap_or_default()
}

impl Rules {
    /// The rules of `dialect`'s params; `max_topic` bounds a beta topic's length (`irn_`
    /// topics are 64 hex characters).
    #[inline(always)]
    pub(crate) fn new(dialect: Dialect, max_topic: usize) -> Rules {
        Rules {
            max_topic,
            irn: dialect == Dialect::Irn,
        }
    }
}

impl<'a> Call<'a> {
    /// The method name.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// Whether its strings need no escape (see [`Plain`]).
    #[inline(always)]
    pub(crate) fn plain(&self) -> Plain {
        self.plain
    }

    /// Its params, where they lie (an absent member: empty params), for the method to take
    /// its members out of (handed over by value, the wire model's 232 bytes would be
    /// copied); -32602 when `params` is not an object.
    #[inline(always)]
    pub(crate) fn params(&mut self) -> Result<&mut Params<'a>, RpcError> {
        if self.params.is_none() {
            self.params = Some(ParamsField::Object(Params::default()));
        }
        match &mut self.params {
            Some(ParamsField::Object(p)) => Ok(p),
            _ => Err(RpcError::new(
                code::INVALID_PARAMS,
                "Invalid params: expected an object",
            )),
        }
    }
}
