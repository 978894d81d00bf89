//! WalletConnect 1.0 bridge frames on the relay's socket (DECISIONS §8): a JSON object with
//! `topic`, `type` (`pub`, `sub` or `ack`), `payload` and optional `silent`, and neither
//! `jsonrpc` nor `method`. Classified here from the same decoded message as JSON-RPC
//! (`rpc::decode`), executed by `conn::methods::v1`; encoded here as the relay sends it on.

use std::borrow::Cow;

use super::wire::{Envelope, Loose};
use super::{code, write_str, RpcError};

/// What a v1 frame asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V1Kind {
    /// Publish `payload` on `topic`.
    Pub,
    /// Subscribe to `topic`.
    Sub,
    /// An acknowledgement: consumed.
    Ack,
}

/// A valid v1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1Frame<'a> {
    /// The topic.
    pub topic: Cow<'a, str>,
    /// What it asks.
    pub kind: V1Kind,
    /// The payload (an encrypted message for `pub`; anything for `sub` and `ack`).
    pub payload: Cow<'a, str>,
    /// `true`: no push notification for this `pub`.
    pub silent: bool,
}

/// Whether an object without `method` is meant as a v1 frame (it has `type` and no
/// `jsonrpc`): then it must be a valid one.
pub(super) fn is_v1(e: &Envelope<'_>) -> bool {
    e.v1.as_ref().is_some_and(|v| v.kind.is_some()) && e.jsonrpc.is_none()
}

fn invalid(what: &'static str) -> RpcError {
    RpcError::new(code::INVALID_REQUEST, what)
}

/// Validates an object meant as a v1 frame.
pub(super) fn frame<'a>(e: Envelope<'a>) -> Result<V1Frame<'a>, RpcError> {
    let e = *e.v1.unwrap_or_default();
    let kind = match &e.kind {
        Some(Loose::Str(k)) if k == "pub" => V1Kind::Pub,
        Some(Loose::Str(k)) if k == "sub" => V1Kind::Sub,
        Some(Loose::Str(k)) if k == "ack" => V1Kind::Ack,
        _ => {
            return Err(invalid(
                "Invalid v1 frame: \"type\" must be pub, sub or ack",
            ))
        }
    };
    let Some(Loose::Str(topic)) = e.topic else {
        return Err(invalid("Invalid v1 frame: missing or invalid \"topic\""));
    };
    if topic.is_empty() {
        return Err(invalid("Invalid v1 frame: missing or invalid \"topic\""));
    }
    let Some(Loose::Str(payload)) = e.payload else {
        return Err(invalid("Invalid v1 frame: missing or invalid \"payload\""));
    };
    let silent = match e.silent {
        None => false,
        Some(Loose::Bool(b)) => b,
        Some(_) => return Err(invalid("Invalid v1 frame: \"silent\" must be a boolean")),
    };
    Ok(V1Frame {
        topic,
        kind,
        payload,
        silent,
    })
}

/// The frame a `pub` is sent on as: `{"topic":..,"type":"pub","payload":..,"silent":..}`.
pub fn encode_pub(topic: &str, payload: &str, silent: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(topic.len() + payload.len() + 56);
    v.extend_from_slice(b"{\"topic\":");
    write_str(&mut v, topic);
    v.extend_from_slice(b",\"type\":\"pub\",\"payload\":");
    write_str(&mut v, payload);
    v.extend_from_slice(if silent {
        b",\"silent\":true}"
    } else {
        b",\"silent\":false}"
    });
    v
}

#[cfg(test)]
mod tests {
    use super::super::{one, Item};
    use super::*;

    #[test]
    fn v1_frames_are_told_from_json_rpc() {
        let f = |s: &str| match one(s) {
            Item::V1(f) => Ok((f.topic.to_string(), f.kind, f.payload.to_string(), f.silent)),
            Item::Invalid(_, e) => Err(e.code),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(
            f(r#"{"topic":"t","type":"pub","payload":"p","silent":true}"#),
            Ok(("t".into(), V1Kind::Pub, "p".into(), true))
        );
        assert_eq!(
            f(r#"{"topic":"t","type":"sub","payload":""}"#),
            Ok(("t".into(), V1Kind::Sub, "".into(), false))
        );
        assert_eq!(
            f(r#"{"topic":"t","type":"ack","payload":""}"#).map(|x| x.1),
            Ok(V1Kind::Ack)
        );
        for bad in [
            r#"{"topic":"t","type":"put","payload":""}"#,
            r#"{"topic":"","type":"sub","payload":""}"#,
            r#"{"topic":5,"type":"sub","payload":""}"#,
            r#"{"topic":"t","type":"pub"}"#,
            r#"{"topic":"t","type":"pub","payload":"p","silent":"yes"}"#,
        ] {
            assert_eq!(f(bad), Err(-32600), "{bad}");
        }
        // With `jsonrpc` it is no v1 frame, and without `method`, `result` or `error` no
        // JSON-RPC request or response either: -32600 (DECISIONS §8). With a `result` it
        // is a response, consumed.
        assert!(matches!(
            one(r#"{"jsonrpc":"2.0","topic":"t","type":"sub","payload":""}"#),
            Item::Invalid(_, e) if e.code == -32600
        ));
        assert!(matches!(
            one(r#"{"jsonrpc":"2.0","topic":"t","type":"sub","payload":"","result":true}"#),
            Item::Ack(None)
        ));
    }

    #[test]
    fn a_pub_is_sent_on_byte_for_byte() {
        assert_eq!(
            encode_pub("a\"b", "c", false),
            br#"{"topic":"a\"b","type":"pub","payload":"c","silent":false}"#.to_vec()
        );
        assert_eq!(
            encode_pub("t", "p", true),
            br#"{"topic":"t","type":"pub","payload":"p","silent":true}"#.to_vec()
        );
    }
}
