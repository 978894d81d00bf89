//! JSON-RPC 2.0 for the waku relay: decoding a WebSocket message (one request, a batch, or a
//! client's acknowledgement) with `simd-json` + `serde`, validating it into a typed [`Op`],
//! and encoding results, errors and the `waku_subscription` push.
//!
//! Three separate steps, as in mini-redis: wire parsing ([`decode`], in `decode.rs` over the
//! wire model of `wire.rs`; messages of the usual shape by the scanner of `fast.rs`, which
//! gives the same result as the general parser, proven by differential tests), command parsing ([`Call::op`], in `op.rs`), and execution, which
//! is not here (`worker` runs ops against `relay`). Encoding is `encode.rs`. This file holds
//! the types, limits, error codes and errors they share.

use std::borrow::Cow;

use thiserror::Error;

mod decode;
mod encode;
mod fast;
mod op;
pub mod v1;
mod wire;

pub use decode::{decode, decode_fast, decode_general, decode_serde_json};
pub use encode::{
    encode_data, push_shape, write_error, write_error_object, write_id, write_push_prefix,
    write_result, write_str, BETA_PUSH_SUFFIX, PUSH_SUFFIX,
};

use wire::ParamsField;

/// Largest nesting of arrays and objects accepted in a message (deeper is a parse error).
pub const MAX_DEPTH: usize = 64;

/// Most elements in one batch; a longer batch is answered with one -32600 error (it could
/// otherwise turn one message into an answer many times its size).
pub const MAX_BATCH: usize = 100;

/// Longest ttl, seconds (30 days).
pub const MAX_TTL: u64 = 2_592_000;

/// Error codes of DECISIONS §3.
pub mod code {
    /// Invalid JSON.
    pub const PARSE_ERROR: i32 = -32700;
    /// Not a valid request object.
    pub const INVALID_REQUEST: i32 = -32600;
    /// Unknown method.
    pub const METHOD_NOT_FOUND: i32 = -32601;
    /// Missing or invalid parameter.
    pub const INVALID_PARAMS: i32 = -32602;
    /// A server-side refusal (a quota).
    pub const SERVER_ERROR: i32 = -32000;
}

/// A JSON-RPC error to send back.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{message}")]
pub struct RpcError {
    /// The code.
    pub code: i32,
    /// The message.
    pub message: Cow<'static, str>,
    /// The `data` member, when the error has one.
    pub data: Option<ErrorData>,
}

/// The `data` member of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorData {
    /// `{"retryAfterMs": N}` (rate limited, DECISIONS §11).
    RetryAfterMs(u64),
    /// A string tag, as the production relay's typed errors carry it (relay-api.md (e):
    /// `BatchEmpty`, `SubscriberLimitExceeded`...).
    Tag(&'static str),
}

impl RpcError {
    fn new(code: i32, message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }
    /// -32602 naming a parameter (never on the way of a valid request).
    #[cold]
    pub fn param(name: &str) -> RpcError {
        RpcError::new(
            code::INVALID_PARAMS,
            format!("Missing or invalid \"{name}\" param"),
        )
    }
    /// -32600 with a message.
    pub fn invalid_request(message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError::new(code::INVALID_REQUEST, message)
    }
    /// -32000 with a message.
    pub fn server(message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError::new(code::SERVER_ERROR, message)
    }
    /// An error with a string tag as its `data` (relay-api.md (e)).
    pub fn tagged(code: i32, message: impl Into<Cow<'static, str>>, tag: &'static str) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: Some(ErrorData::Tag(tag)),
        }
    }
    /// -32000 `rate limited` with `data: {"retryAfterMs": N}` (DECISIONS §11).
    pub fn rate_limited(retry_after_ms: u64) -> RpcError {
        RpcError {
            code: code::SERVER_ERROR,
            message: Cow::Borrowed("rate limited"),
            data: Some(ErrorData::RetryAfterMs(retry_after_ms)),
        }
    }
}

/// A request id, echoed back exactly.
#[derive(Debug, Clone, PartialEq)]
pub enum Id<'a> {
    /// Non-negative integer.
    U64(u64),
    /// Negative integer.
    I64(i64),
    /// Number with a fraction or exponent.
    F64(f64),
    /// String.
    Str(Cow<'a, str>),
    /// `null` (also used when the id could not be read).
    Null,
}

/// A decoded WebSocket message.
#[derive(Debug, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one element is nearly every message: boxed, it would cost an allocation each"
)]
pub enum Incoming<'a> {
    /// One element.
    Single(Item<'a>),
    /// A batch (JSON array), answered with an array.
    Batch(Vec<Item<'a>>),
}

/// One element of a message, classified.
#[derive(Debug, PartialEq)]
pub enum Item<'a> {
    /// A request: execute and answer (unless it is a notification, without `id`).
    Call(Call<'a>),
    /// A response from the client (an acknowledgement of a push): consumed; its id when it
    /// is a non-negative integer (the push it acknowledges: DECISIONS 13, `delivered`).
    Ack(Option<u64>),
    /// Not a valid request: answer with this error and id.
    Invalid(Id<'a>, RpcError),
    /// A WalletConnect 1.0 bridge frame.
    V1(v1::V1Frame<'a>),
}

/// A request with a method.
#[derive(Debug, PartialEq)]
pub struct Call<'a> {
    /// The id; `None` for a notification (executed, never answered).
    pub id: Option<Id<'a>>,
    method: Cow<'a, str>,
    params: Option<ParamsField<'a>>,
    plain: Plain,
}

/// Whether every string of a request stood in its message as it is, with no escape in it,
/// so that none needs one written out again (true of whatever the fast path reads: it
/// declines a string with an escape). A fact about the message's encoding, not its content:
/// it takes no part in equality, so the fast and the general path still give equal results,
/// and `false` only costs the encoder a look at each string.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain(pub bool);

impl PartialEq for Plain {
    fn eq(&self, _: &Plain) -> bool {
        true
    }
}

impl Eq for Plain {}

/// The method prefix a request used (DECISIONS §10: one API under three prefixes). A
/// subscription's pushes use the prefix of the method that made it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// `waku_` (the 2021 beta): pushes carry `{topic, message}`.
    #[default]
    Waku,
    /// `irn_` (today's SDK, and `wc_*Session`): pushes carry `{topic, message, publishedAt,
    /// tag}` (+ `attestation`).
    Irn,
    /// `iridium_` (between the two): pushes as `irn_`.
    Iridium,
}

impl Dialect {
    /// The push method's name.
    pub fn push_method(self) -> &'static str {
        match self {
            Dialect::Waku => "waku_subscription",
            Dialect::Irn => "irn_subscription",
            Dialect::Iridium => "iridium_subscription",
        }
    }
}

/// A validated request: its operation and the prefix it came under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The method prefix.
    pub dialect: Dialect,
    /// The operation.
    pub op: Op<'a>,
    /// Whether its strings need no escape (see [`Plain`]).
    pub plain: Plain,
}

/// A validated relay operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    /// `*_subscribe`.
    Subscribe {
        /// Topic.
        topic: Cow<'a, str>,
    },
    /// `*_batchSubscribe`: 1 to 500 topics, answered with their ids in order.
    BatchSubscribe {
        /// Topics.
        topics: Vec<Cow<'a, str>>,
    },
    /// `*_publish`.
    Publish {
        /// Topic.
        topic: Cow<'a, str>,
        /// Message payload.
        message: Cow<'a, str>,
        /// Seconds to keep it cached.
        ttl: u32,
        /// `false` suppresses push notifications.
        prompt: bool,
        /// `tag` (0 when absent).
        tag: u32,
        /// `attestation`, stored and pushed with the message.
        attestation: Option<Cow<'a, str>>,
    },
    /// `*_unsubscribe`.
    Unsubscribe {
        /// Topic, when given (older clients send only the id).
        topic: Option<Cow<'a, str>>,
        /// Subscription id; `None` (`irn_`/`iridium_` with a topic: what `relay_client`
        /// sends) unsubscribes the caller from the topic, whatever the id.
        id: Option<Cow<'a, str>>,
    },
    /// `*_batchUnsubscribe`: `(topic, id)` pairs (the id optional as for `Unsubscribe`).
    BatchUnsubscribe {
        /// The subscriptions.
        subs: Vec<(Cow<'a, str>, Option<Cow<'a, str>>)>,
    },
    /// `irn_subscribeBlocking`: `Subscribe`, answered once the subscription is in place.
    SubscribeBlocking {
        /// Topic.
        topic: Cow<'a, str>,
    },
    /// `irn_batchSubscribeBlocking`: answered `[{id}|{error}]` per topic, in order, once
    /// every subscription is in place.
    BatchSubscribeBlocking {
        /// Topics.
        topics: Vec<Cow<'a, str>>,
    },
    /// `wc_createTopic`: subscribes the caller, answers `true`.
    CreateTopic {
        /// Topic.
        topic: Cow<'a, str>,
    },
    /// `irn_batchReceive`: 1 to 500 receipts `(topic, message id)`, answered `true`.
    BatchReceive {
        /// The receipts.
        receipts: Vec<(Cow<'a, str>, u64)>,
    },
    /// `*_fetchMessages` (one topic) or `*_batchFetchMessages`.
    Fetch {
        /// Topics.
        topics: Vec<Cow<'a, str>>,
        /// Asked as a batch.
        batch: bool,
    },
    /// `wc_proposeSession`: subscribe to the pairing topic, publish the proposal there.
    ProposeSession {
        /// Pairing topic.
        pairing_topic: Cow<'a, str>,
        /// The proposal message.
        proposal: Cow<'a, str>,
        /// Seconds to keep it.
        ttl: u32,
    },
    /// `wc_approveSession`: subscribe to the session topic, publish the response on the
    /// pairing topic and the settlement on the session topic.
    ApproveSession {
        /// Session topic.
        session_topic: Cow<'a, str>,
        /// Pairing topic.
        pairing_topic: Cow<'a, str>,
        /// The proposal's response.
        response: Cow<'a, str>,
        /// The settlement request.
        settlement: Cow<'a, str>,
        /// Seconds to keep them.
        ttl: u32,
    },
    /// `irn_watchRegister {registerAuth}`.
    WatchRegister {
        /// The watched client's JWT.
        auth: Cow<'a, str>,
    },
    /// `irn_watchUnregister {unregisterAuth}`.
    WatchUnregister {
        /// The watched client's JWT.
        auth: Cow<'a, str>,
    },
}

/// A message that is not JSON at all (answered -32700 with `id: null`).
#[derive(Debug, Error, PartialEq, Eq)]
#[error("Parse error")]
pub struct ParseError;

/// Decodes `s` as a single element (tests).
#[cfg(test)]
fn one(s: &str) -> Item<'static> {
    let buf: &'static mut [u8] = Box::leak(s.as_bytes().to_vec().into_boxed_slice());
    match decode(buf, &mut simd_json::Buffers::default()).expect("json") {
        Incoming::Single(i) => i,
        Incoming::Batch(_) => panic!("batch"),
    }
}
