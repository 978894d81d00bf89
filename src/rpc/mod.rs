//! JSON-RPC 2.0 for the waku relay: decoding a WebSocket message (one request, a batch, or a
//! client's acknowledgement) with `simd-json` + `serde`, the params checks every method
//! shares, and encoding results, errors and the `waku_subscription` push.
//!
//! Three separate steps, as in mini-redis: wire parsing ([`decode`], in `decode.rs` over the
//! wire model of `wire.rs`; messages of the usual shape by the scanner of `fast.rs`, which
//! gives the same result as the general parser, proven by differential tests), command
//! parsing (`conn/methods/`, one file per method family, with the shared checks of
//! `params.rs`), and execution, also there. Encoding is `encode.rs`. This file holds the
//! types, limits, error codes and errors they share.

use std::borrow::Cow;

use thiserror::Error;

mod decode;
mod encode;
mod fast;
pub(crate) mod params;
pub mod v1;
pub(crate) mod wire;

pub use decode::{decode, decode_fast, decode_general, decode_serde_json};
pub use encode::{
    encode_data, push_shape, write_error, write_error_object, write_id, write_push_prefix,
    write_result, write_str, BETA_PUSH_SUFFIX, PUSH_SUFFIX,
};

use wire::ParamsField;

pub use params::IRN_MIN_TTL;

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

/// A message that is not JSON at all (answered -32700 with `id: null`).
#[derive(Debug, Error, PartialEq, Eq)]
#[error("Parse error")]
pub struct ParseError;

/// Decodes `s` as a single element (tests).
#[cfg(test)]
pub(crate) fn one(s: &str) -> Item<'static> {
    let buf: &'static mut [u8] = Box::leak(s.as_bytes().to_vec().into_boxed_slice());
    match decode(buf, &mut simd_json::Buffers::default()).expect("json") {
        Incoming::Single(i) => i,
        Incoming::Batch(_) => panic!("batch"),
    }
}
