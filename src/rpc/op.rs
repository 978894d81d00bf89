//! Command validation: a classified [`Call`] into a typed [`Op`] (method known, params of
//! the right types and within limits), each refusal a -32601/-32602 [`RpcError`] naming the
//! param. Execution is not here (`worker` runs ops against `relay`).

use std::borrow::Cow;

use super::wire::{Elem, List, Loose, Params, ParamsField};
use super::{code, Call, Dialect, Op, Request, RpcError, MAX_TTL};

/// Shortest `irn_` ttl, seconds (DECISIONS §10).
pub const IRN_MIN_TTL: u64 = 10;

/// Longest `attestation`, bytes (DECISIONS §10).
pub const MAX_ATTESTATION: usize = 4096;

/// Which method a call names.
#[derive(Clone, Copy)]
enum Kind {
    Subscribe,
    BatchSubscribe,
    Publish,
    Unsubscribe,
    BatchUnsubscribe,
    Fetch,
    BatchFetch,
    Propose,
    Approve,
    WatchRegister,
    WatchUnregister,
    SubscribeBlocking,
    BatchSubscribeBlocking,
    CreateTopic,
    BatchReceive,
}

/// The dialect and method of a method name; `None` for an unknown method.
fn method(name: &str) -> Option<(Dialect, Kind)> {
    let (dialect, rest) = if let Some(r) = name.strip_prefix("waku_") {
        (Dialect::Waku, r)
    } else if let Some(r) = name.strip_prefix("irn_") {
        (Dialect::Irn, r)
    } else if let Some(r) = name.strip_prefix("iridium_") {
        (Dialect::Iridium, r)
    } else {
        return match name {
            "wc_proposeSession" => Some((Dialect::Irn, Kind::Propose)),
            "wc_approveSession" => Some((Dialect::Irn, Kind::Approve)),
            "wc_createTopic" => Some((Dialect::Irn, Kind::CreateTopic)),
            _ => None,
        };
    };
    let kind = match rest {
        "subscribe" => Kind::Subscribe,
        "publish" => Kind::Publish,
        "unsubscribe" => Kind::Unsubscribe,
        "batchSubscribe" => Kind::BatchSubscribe,
        "batchUnsubscribe" => Kind::BatchUnsubscribe,
        "fetchMessages" => Kind::Fetch,
        "batchFetchMessages" => Kind::BatchFetch,
        // Methods of today's relay only: not under the beta prefix.
        _ if dialect == Dialect::Waku => return None,
        "subscribeBlocking" => Kind::SubscribeBlocking,
        "batchSubscribeBlocking" => Kind::BatchSubscribeBlocking,
        "batchReceive" => Kind::BatchReceive,
        "watchRegister" => Kind::WatchRegister,
        "watchUnregister" => Kind::WatchUnregister,
        _ => return None,
    };
    Some((dialect, kind))
}

/// The rules a dialect's params follow.
#[derive(Clone, Copy)]
struct Rules {
    max_topic: usize,
    /// `irn_`: topics are exactly 64 hex characters, ttl at least [`IRN_MIN_TTL`].
    irn: bool,
}

impl Rules {
    #[inline(always)]
    fn topic<'a>(self, v: Option<Loose<'a>>, name: &str) -> Result<Cow<'a, str>, RpcError> {
        match v {
            Some(Loose::Str(s)) if self.topic_ok(&s) => Ok(s),
            _ => Err(RpcError::param(name)),
        }
    }

    #[inline(always)]
    fn topic_ok(self, s: &str) -> bool {
        if self.irn {
            s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
        } else {
            !s.is_empty() && s.len() <= self.max_topic
        }
    }

    #[inline(always)]
    fn ttl(self, v: Option<Loose<'_>>) -> Result<u32, RpcError> {
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
    fn topics<'a>(self, v: Option<List<'a>>) -> Result<Vec<Cow<'a, str>>, RpcError> {
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
fn string_param<'a>(
    v: Option<Loose<'a>>,
    name: &str,
    max: usize,
) -> Result<Cow<'a, str>, RpcError> {
    match v {
        Some(Loose::Str(s)) if !s.is_empty() && s.len() <= max => Ok(s),
        _ => Err(RpcError::param(name)),
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

/// `irn_batchReceive`'s receipts, 1 to 500 (`wire::MAX_LIST`, relay_rpc's
/// `MAX_RECEIVE_BATCH_SIZE`): an empty or longer list is -32600
/// with the tag relay_client parses (`BatchEmpty`, `BatchLimitExceeded`).
fn receipts<'a>(r: Rules, v: Option<List<'a>>) -> Result<Vec<(Cow<'a, str>, u64)>, RpcError> {
    let items = match v {
        Some(List::Items(items)) if items.is_empty() => {
            let m = "Invalid payload: Batch is empty";
            return Err(RpcError::tagged(code::INVALID_REQUEST, m, "BatchEmpty"));
        }
        Some(List::Items(items)) => items,
        Some(List::TooLong) => {
            let m = "Invalid payload: Batch size limit exceeded";
            return Err(RpcError::tagged(
                code::INVALID_REQUEST,
                m,
                "BatchLimitExceeded",
            ));
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

impl<'a> Call<'a> {
    /// The method name.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// Validates method and params into a request. `max_topic` bounds topic length (beta
    /// topics; `irn_` topics are 64 hex characters). Takes the params out of the call where
    /// they lie (handed over by value, the call's 232 bytes would be copied), so it is done
    /// with the call. Inlined into its caller: a request returned through memory is written
    /// in pieces and read back whole, a store-forwarding stall on every call.
    #[inline(always)]
    pub fn op(&mut self, max_topic: usize) -> Result<Request<'a>, RpcError> {
        let Some((dialect, kind)) = method(&self.method) else {
            return Err(RpcError::new(code::METHOD_NOT_FOUND, "Method not found"));
        };
        // The params are taken where they lie, member by member (moving the whole model
        // out was a copy of 232 bytes).
        let mut none;
        let p = match &mut self.params {
            Some(ParamsField::Object(p)) => p,
            None => {
                none = Params::default();
                &mut none
            }
            Some(ParamsField::Other) => {
                return Err(RpcError::new(
                    code::INVALID_PARAMS,
                    "Invalid params: expected an object",
                ))
            }
        };
        let r = Rules {
            max_topic,
            irn: dialect == Dialect::Irn,
        };
        // Only batch and session methods look at these (a publish has none).
        let extra = p.extra.take();
        let x = move || extra.map(|b| *b).unwrap_or_default();
        let op = match kind {
            Kind::Subscribe => Op::Subscribe {
                topic: r.topic(p.topic.take(), "topic")?,
            },
            Kind::Publish => Op::Publish {
                topic: r.topic(p.topic.take(), "topic")?,
                message: string_param(p.message.take(), "message", usize::MAX)?,
                ttl: r.ttl(p.ttl.take())?,
                prompt: prompt(p.prompt.take())?,
                tag: tag(p.tag.take())?,
                attestation: attestation(p.attestation.take())?,
            },
            Kind::Unsubscribe => {
                let topic = match p.topic.take() {
                    None | Some(Loose::Null) => None,
                    t => Some(r.topic(t, "topic")?),
                };
                let id = sub_id(p.id.take(), topic.is_some() && r.irn, "id")?;
                Op::Unsubscribe { topic, id }
            }
            Kind::BatchSubscribe => Op::BatchSubscribe {
                topics: r.topics(x().topics)?,
            },
            Kind::BatchUnsubscribe => {
                let Some(List::Items(items)) = x().subscriptions else {
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
                Op::BatchUnsubscribe { subs }
            }
            Kind::Fetch => Op::Fetch {
                topics: vec![r.topic(p.topic.take(), "topic")?],
                batch: false,
            },
            Kind::BatchFetch => Op::Fetch {
                topics: r.topics(x().topics)?,
                batch: true,
            },
            Kind::SubscribeBlocking => Op::SubscribeBlocking {
                topic: r.topic(p.topic.take(), "topic")?,
            },
            Kind::BatchSubscribeBlocking => Op::BatchSubscribeBlocking {
                topics: r.topics(x().topics)?,
            },
            Kind::CreateTopic => Op::CreateTopic {
                topic: r.topic(p.topic.take(), "topic")?,
            },
            Kind::BatchReceive => Op::BatchReceive {
                receipts: receipts(r, x().receipts)?,
            },
            Kind::Propose => {
                let x = x();
                Op::ProposeSession {
                    pairing_topic: r.topic(x.pairing_topic, "pairingTopic")?,
                    proposal: string_param(x.session_proposal, "sessionProposal", usize::MAX)?,
                    ttl: r.ttl(p.ttl.take())?,
                }
            }
            Kind::WatchRegister => Op::WatchRegister {
                auth: string_param(
                    x().register_auth,
                    "registerAuth",
                    crate::auth::MAX_TOKEN_LEN,
                )?,
            },
            Kind::WatchUnregister => Op::WatchUnregister {
                auth: string_param(
                    x().unregister_auth,
                    "unregisterAuth",
                    crate::auth::MAX_TOKEN_LEN,
                )?,
            },
            Kind::Approve => {
                let x = x();
                Op::ApproveSession {
                    session_topic: r.topic(x.session_topic, "sessionTopic")?,
                    pairing_topic: r.topic(x.pairing_topic, "pairingTopic")?,
                    response: string_param(
                        x.proposal_response,
                        "sessionProposalResponse",
                        usize::MAX,
                    )?,
                    settlement: string_param(
                        x.settlement_request,
                        "sessionSettlementRequest",
                        usize::MAX,
                    )?,
                    ttl: r.ttl(p.ttl.take())?,
                }
            }
        };
        Ok(Request {
            dialect,
            op,
            plain: self.plain,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::one;
    use super::*;
    use crate::rpc::Item;

    fn op(s: &str) -> Result<Op<'static>, RpcError> {
        match one(s) {
            Item::Call(mut c) => c.op(256).map(|r| r.op),
            other => panic!("not a call: {other:?}"),
        }
    }

    #[test]
    fn decodes_publish_with_escapes() {
        let o = op(
            r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"t\"1","message":"a\nb","ttl":21600,"extra":[1,{"x":2}]}}"#,
        );
        assert_eq!(
            o,
            Ok(Op::Publish {
                topic: "t\"1".into(),
                message: "a\nb".into(),
                ttl: 21600,
                prompt: true,
                tag: 0,
                attestation: None,
            })
        );
    }

    #[test]
    fn params_errors_name_the_param() {
        let e = |s: &str| op(s).unwrap_err();
        assert_eq!(
            e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":{}}"#).message,
            "Missing or invalid \"topic\" param"
        );
        assert_eq!(
            e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":{"topic":""}}"#).code,
            -32602
        );
        assert_eq!(e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":"b","ttl":0}}"#).message, "Missing or invalid \"ttl\" param");
        assert_eq!(e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":"b","ttl":2592001}}"#).code, -32602);
        assert_eq!(e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":"b","ttl":1.5}}"#).code, -32602);
        assert_eq!(e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":7,"ttl":5}}"#).message, "Missing or invalid \"message\" param");
        assert_eq!(
            e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_unsubscribe","params":{"topic":"a"}}"#)
                .message,
            "Missing or invalid \"id\" param"
        );
        assert_eq!(
            e(r#"{"id":1,"jsonrpc":"2.0","method":"nope","params":{}}"#).code,
            -32601
        );
        assert_eq!(
            e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":[1]}"#).code,
            -32602
        );
        let long = format!(
            r#"{{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":{{"topic":"{}"}}}}"#,
            "a".repeat(257)
        );
        assert_eq!(e(&long).code, -32602);
    }

    #[test]
    fn decodes_the_methods_of_today_s_relay() {
        let t = "ab".repeat(32);
        let call = |m: &str, p: &str| {
            op(&format!(
                r#"{{"id":1,"jsonrpc":"2.0","method":"{m}","params":{p}}}"#
            ))
        };
        assert_eq!(
            call("irn_unsubscribe", &format!(r#"{{"topic":"{t}"}}"#)),
            Ok(Op::Unsubscribe {
                topic: Some(t.clone().into()),
                id: None
            })
        );
        assert_eq!(
            call(
                "irn_batchUnsubscribe",
                &format!(r#"{{"subscriptions":[{{"topic":"{t}"}}]}}"#)
            ),
            Ok(Op::BatchUnsubscribe {
                subs: vec![(t.clone().into(), None)]
            })
        );
        // An id alone is still required without a topic, and under the beta prefix.
        assert_eq!(call("irn_unsubscribe", "{}").unwrap_err().code, -32602);
        assert_eq!(
            call("waku_unsubscribe", &format!(r#"{{"topic":"{t}"}}"#))
                .unwrap_err()
                .code,
            -32602
        );
        assert_eq!(
            call(
                "iridium_subscribeBlocking",
                &format!(r#"{{"topic":"{t}"}}"#)
            ),
            Ok(Op::SubscribeBlocking {
                topic: t.clone().into()
            })
        );
        assert_eq!(
            call(
                "irn_batchSubscribeBlocking",
                &format!(r#"{{"topics":["{t}"]}}"#)
            ),
            Ok(Op::BatchSubscribeBlocking {
                topics: vec![t.clone().into()]
            })
        );
        assert_eq!(
            call("wc_createTopic", &format!(r#"{{"topic":"{t}"}}"#)),
            Ok(Op::CreateTopic {
                topic: t.clone().into()
            })
        );
        assert_eq!(
            call(
                "irn_batchReceive",
                &format!(
                    r#"{{"receipts":[{{"topic":"{t}","message_id":5}},{{"messageId":"6","topic":"{t}"}}]}}"#
                )
            ),
            Ok(Op::BatchReceive {
                receipts: vec![(t.clone().into(), 5), (t.clone().into(), 6)]
            })
        );
        let e = call("irn_batchReceive", r#"{"receipts":[]}"#).unwrap_err();
        assert_eq!(
            (e.code, e.data),
            (-32600, Some(crate::rpc::ErrorData::Tag("BatchEmpty")))
        );
        for m in ["waku_subscribeBlocking", "waku_batchReceive", "wc_nothing"] {
            assert_eq!(call(m, "{}").unwrap_err().code, -32601, "{m}");
        }
    }
}
