//! Command validation: a classified [`Call`] into a typed [`Op`] (method known, params of
//! the right types and within limits), each refusal a -32601/-32602 [`RpcError`] naming the
//! param. Execution is not here (`worker` runs ops against `relay`).

use std::borrow::Cow;

use super::wire::{Loose, Params, ParamsField};
use super::{code, Call, Op, RpcError, MAX_TTL};

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

impl<'a> Call<'a> {
    /// The method name.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// Validates method and params into an operation. `max_topic` bounds topic length.
    /// Inlined: the call (168 bytes) is then not copied to be handed over.
    #[inline]
    pub fn op(self, max_topic: usize) -> Result<Op<'a>, RpcError> {
        let kind = match &*self.method {
            "waku_subscribe" => 0,
            "waku_publish" => 1,
            "waku_unsubscribe" => 2,
            _ => return Err(RpcError::new(code::METHOD_NOT_FOUND, "Method not found")),
        };
        let p = match self.params {
            Some(ParamsField::Object(p)) => p,
            None => Params::default(),
            Some(ParamsField::Other) => {
                return Err(RpcError::new(
                    code::INVALID_PARAMS,
                    "Invalid params: expected an object",
                ))
            }
        };
        match kind {
            0 => Ok(Op::Subscribe {
                topic: string_param(p.topic, "topic", max_topic)?,
            }),
            1 => {
                let topic = string_param(p.topic, "topic", max_topic)?;
                let message = string_param(p.message, "message", usize::MAX)?;
                let ttl = match p.ttl {
                    Some(Loose::U64(n)) if (1..=MAX_TTL).contains(&n) => n as u32,
                    Some(Loose::F64(f)) if f.fract() == 0.0 && f >= 1.0 && f <= MAX_TTL as f64 => {
                        f as u32
                    }
                    _ => return Err(RpcError::param("ttl")),
                };
                let prompt = match p.prompt {
                    None | Some(Loose::Null) => true,
                    Some(Loose::Bool(b)) => b,
                    Some(_) => return Err(RpcError::param("prompt")),
                };
                Ok(Op::Publish {
                    topic,
                    message,
                    ttl,
                    prompt,
                })
            }
            _ => {
                let id = string_param(p.id, "id", 1024)?;
                let topic = match p.topic {
                    None | Some(Loose::Null) => None,
                    t => Some(string_param(t, "topic", max_topic)?),
                };
                Ok(Op::Unsubscribe { topic, id })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::one;
    use super::*;
    use crate::rpc::Item;

    fn op(s: &str) -> Result<Op<'static>, RpcError> {
        match one(s) {
            Item::Call(c) => c.op(256),
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
                prompt: true
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
}
