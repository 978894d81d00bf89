//! JSON-RPC 2.0 for the waku relay: decoding a WebSocket message (one request, a batch, or a
//! client's acknowledgement) with `simd-json` + `serde`, validating it into a typed [`Op`],
//! and encoding results, errors and the `waku_subscription` push.
//!
//! Three separate steps, as in mini-redis: wire parsing ([`decode`]), command parsing
//! ([`Call::op`]), and execution, which is not here (`worker` runs ops against `relay`).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use thiserror::Error;

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
}

impl RpcError {
    fn new(code: i32, message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }
    /// -32602 naming a parameter.
    pub fn param(name: &str) -> RpcError {
        RpcError::new(
            code::INVALID_PARAMS,
            format!("Missing or invalid \"{name}\" param"),
        )
    }
    /// -32000 with a message.
    pub fn server(message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError::new(code::SERVER_ERROR, message)
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

/// Any JSON value, reduced to what validation needs.
#[derive(Debug, Clone, PartialEq)]
enum Loose<'a> {
    Str(Cow<'a, str>),
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Null,
    Array,
    Object,
}

/// The `params` member.
#[derive(Debug, Default, Clone, PartialEq)]
struct Params<'a> {
    topic: Option<Loose<'a>>,
    message: Option<Loose<'a>>,
    ttl: Option<Loose<'a>>,
    prompt: Option<Loose<'a>>,
    id: Option<Loose<'a>>,
}

#[derive(Debug, Clone, PartialEq)]
enum ParamsField<'a> {
    Object(Params<'a>),
    Other,
}

/// One element of a message: a request object, or something that is not one.
#[derive(Debug, Clone, PartialEq)]
struct Envelope<'a> {
    jsonrpc: Option<Loose<'a>>,
    id: Option<Loose<'a>>,
    method: Option<Loose<'a>>,
    params: Option<ParamsField<'a>>,
    /// False when the element is not a JSON object at all.
    is_object: bool,
}

/// A decoded WebSocket message.
#[derive(Debug)]
pub enum Incoming<'a> {
    /// One element.
    Single(Item<'a>),
    /// A batch (JSON array), answered with an array.
    Batch(Vec<Item<'a>>),
}

/// One element of a message, classified.
#[derive(Debug)]
pub enum Item<'a> {
    /// A request: execute and answer (unless it is a notification, without `id`).
    Call(Call<'a>),
    /// A response from the client (an acknowledgement of a push): consumed silently.
    Ack,
    /// Not a valid request: answer with this error and id.
    Invalid(Id<'a>, RpcError),
}

/// A request with a method.
#[derive(Debug)]
pub struct Call<'a> {
    /// The id; `None` for a notification (executed, never answered).
    pub id: Option<Id<'a>>,
    method: Cow<'a, str>,
    params: Option<ParamsField<'a>>,
}

/// A validated relay operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    /// `waku_subscribe`.
    Subscribe {
        /// Topic.
        topic: Cow<'a, str>,
    },
    /// `waku_publish`.
    Publish {
        /// Topic.
        topic: Cow<'a, str>,
        /// Message payload.
        message: Cow<'a, str>,
        /// Seconds to keep it cached.
        ttl: u32,
        /// `false` suppresses push notifications.
        prompt: bool,
    },
    /// `waku_unsubscribe`.
    Unsubscribe {
        /// Topic, when given (older clients send only the id).
        topic: Option<Cow<'a, str>>,
        /// Subscription id.
        id: Cow<'a, str>,
    },
}

/// A message that is not JSON at all (answered -32700 with `id: null`).
#[derive(Debug, Error, PartialEq, Eq)]
#[error("Parse error")]
pub struct ParseError;

/// Decodes one WebSocket message. `buf` is parsed in place (simd-json), so it is clobbered;
/// `scratch` holds the parser's buffers between calls (one per worker).
pub fn decode<'a>(
    buf: &'a mut [u8],
    scratch: &mut simd_json::Buffers,
) -> Result<Incoming<'a>, ParseError> {
    if nesting_too_deep(buf) {
        return Err(ParseError);
    }
    let top: Top<'_> =
        simd_json::serde::from_slice_with_buffers(buf, scratch).map_err(|_| ParseError)?;
    Ok(classify_top(top))
}

/// [`decode`] with `serde_json` instead of `simd-json` (for the benchmark that decides
/// which one the server uses).
pub fn decode_serde_json(buf: &[u8]) -> Result<Incoming<'_>, ParseError> {
    if nesting_too_deep(buf) {
        return Err(ParseError);
    }
    let top: Top<'_> = serde_json::from_slice(buf).map_err(|_| ParseError)?;
    Ok(classify_top(top))
}

/// Classifies a parsed message: one element, or a batch within [`MAX_BATCH`].
fn classify_top(top: Top<'_>) -> Incoming<'_> {
    match top {
        Top::One(e) => Incoming::Single(classify(e)),
        Top::Many(v) if v.is_empty() => Incoming::Single(Item::Invalid(
            Id::Null,
            RpcError::new(code::INVALID_REQUEST, "Invalid request: empty batch"),
        )),
        Top::Many(v) if v.len() > MAX_BATCH => Incoming::Single(Item::Invalid(
            Id::Null,
            RpcError::new(
                code::INVALID_REQUEST,
                "Invalid request: batch of more than 100 requests",
            ),
        )),
        Top::Many(v) => Incoming::Batch(v.into_iter().map(classify).collect()),
    }
}

/// Scans for nesting deeper than [`MAX_DEPTH`] outside strings, so no parser recursion can
/// run away on `[[[[...`.
fn nesting_too_deep(buf: &[u8]) -> bool {
    // Fast path: with few brackets in all, nesting cannot be deep.
    if memchr::memchr2_iter(b'[', b'{', buf)
        .nth(MAX_DEPTH)
        .is_none()
    {
        return false;
    }
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    for &b in buf {
        if in_str {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_str = false;
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

fn invalid_request(msg: &'static str) -> RpcError {
    RpcError::new(code::INVALID_REQUEST, msg)
}

fn classify(e: Envelope<'_>) -> Item<'_> {
    if !e.is_object {
        return Item::Invalid(Id::Null, invalid_request("Invalid request: not an object"));
    }
    let id = match e.id {
        None => None,
        Some(Loose::U64(n)) => Some(Id::U64(n)),
        Some(Loose::I64(n)) => Some(Id::I64(n)),
        Some(Loose::F64(n)) => Some(Id::F64(n)),
        Some(Loose::Str(s)) => Some(Id::Str(s)),
        Some(Loose::Null) => Some(Id::Null),
        Some(_) => {
            return Item::Invalid(Id::Null, invalid_request("Invalid request: invalid \"id\""))
        }
    };
    let method = match e.method {
        None => return Item::Ack,
        Some(Loose::Str(m)) => m,
        Some(_) => {
            let id = id.unwrap_or(Id::Null);
            return Item::Invalid(id, invalid_request("Invalid request: invalid \"method\""));
        }
    };
    if !matches!(&e.jsonrpc, Some(Loose::Str(v)) if v == "2.0") {
        let id = id.unwrap_or(Id::Null);
        return Item::Invalid(
            id,
            invalid_request("Invalid request: \"jsonrpc\" must be \"2.0\""),
        );
    }
    Item::Call(Call {
        id,
        method,
        params: e.params,
    })
}

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

// ---------------------------------------------------------------------------------------
// Encoding

/// Appends `id` as JSON.
pub fn write_id(out: &mut Vec<u8>, id: &Id<'_>) {
    match id {
        Id::U64(n) => out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes()),
        Id::I64(n) => out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes()),
        Id::F64(f) if f.is_finite() => {
            out.extend_from_slice(ryu::Buffer::new().format(*f).as_bytes())
        }
        Id::Str(s) => write_str(out, s),
        Id::F64(_) | Id::Null => out.extend_from_slice(b"null"),
    }
}

/// Appends `s` as a JSON string literal.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    if !needs_escape(s.as_bytes()) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Any byte that JSON requires escaped (checked 32 bytes at a time, which vectorizes).
fn needs_escape(b: &[u8]) -> bool {
    b.chunks(32).any(|c| {
        c.iter()
            .fold(false, |a, &x| a | (x < 0x20) | (x == b'"') | (x == b'\\'))
    })
}

/// Appends `{"id":<id>,"jsonrpc":"2.0","result":<result_json>}`.
pub fn write_result(out: &mut Vec<u8>, id: &Id<'_>, result_json: &[u8]) {
    out.extend_from_slice(b"{\"id\":");
    write_id(out, id);
    out.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":");
    out.extend_from_slice(result_json);
    out.push(b'}');
}

/// Appends a JSON-RPC error response.
pub fn write_error(out: &mut Vec<u8>, id: &Id<'_>, err: &RpcError) {
    out.extend_from_slice(b"{\"id\":");
    write_id(out, id);
    out.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"error\":{\"code\":");
    out.extend_from_slice(itoa::Buffer::new().format(err.code).as_bytes());
    out.extend_from_slice(b",\"message\":");
    write_str(out, &err.message);
    out.extend_from_slice(b"}}");
}

/// Encodes the `data` object of a push, `{"topic":..,"message":..}`, once per publish.
pub fn encode_data(topic: &str, message: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(topic.len() + message.len() + 32);
    v.extend_from_slice(b"{\"topic\":");
    write_str(&mut v, topic);
    v.extend_from_slice(b",\"message\":");
    write_str(&mut v, message);
    v.push(b'}');
    v
}

/// The bytes of a `waku_subscription` request that precede the shared `data` object.
/// The push is `prefix ++ data ++ "}}"`.
pub fn write_push_prefix(out: &mut Vec<u8>, rpc_id: u64, sub_id_hex: &[u8]) {
    out.extend_from_slice(b"{\"id\":");
    out.extend_from_slice(itoa::Buffer::new().format(rpc_id).as_bytes());
    out.extend_from_slice(
        b",\"jsonrpc\":\"2.0\",\"method\":\"waku_subscription\",\"params\":{\"id\":\"",
    );
    out.extend_from_slice(sub_id_hex);
    out.extend_from_slice(b"\",\"data\":");
}

/// What closes a push after its `data` object.
pub const PUSH_SUFFIX: &[u8] = b"}}";

// ---------------------------------------------------------------------------------------
// Deserialization (hand-written visitors: any JSON shape is accepted and classified, so a
// wrong type becomes -32600/-32602 with a precise message instead of a parse error).

enum Top<'a> {
    One(Envelope<'a>),
    Many(Vec<Envelope<'a>>),
}

impl<'de> Deserialize<'de> for Top<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON-RPC message")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Ok(Top::One(envelope_from_map(map)?))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = seq.next_element::<Envelope<'de>>()? {
                    v.push(e);
                }
                Ok(Top::Many(v))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
        }
        d.deserialize_any(V)
    }
}

impl Envelope<'_> {
    fn not_object() -> Self {
        Envelope {
            jsonrpc: None,
            id: None,
            method: None,
            params: None,
            is_object: false,
        }
    }
}

/// An object member's name, borrowed from the input when it has no escapes (serde's own
/// `Cow<str>` always allocates: that was ten allocations per publish).
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

fn envelope_from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Envelope<'de>, A::Error> {
    let mut e = Envelope {
        jsonrpc: None,
        id: None,
        method: None,
        params: None,
        is_object: true,
    };
    while let Some(k) = map.next_key::<Key<'de>>()? {
        match &*k.0 {
            "jsonrpc" => e.jsonrpc = Some(map.next_value()?),
            "id" => e.id = Some(map.next_value()?),
            "method" => e.method = Some(map.next_value()?),
            "params" => e.params = Some(map.next_value()?),
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(e)
}

impl<'de> Deserialize<'de> for Envelope<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Envelope<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON-RPC object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                envelope_from_map(map)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Envelope::not_object())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for ParamsField<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ParamsField<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("params")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut p = Params::default();
                while let Some(k) = map.next_key::<Key<'de>>()? {
                    match &*k.0 {
                        "topic" => p.topic = Some(map.next_value()?),
                        "message" => p.message = Some(map.next_value()?),
                        "ttl" => p.ttl = Some(map.next_value()?),
                        "prompt" => p.prompt = Some(map.next_value()?),
                        "id" => p.id = Some(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(ParamsField::Object(p))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ParamsField::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Loose<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Loose<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Loose::U64(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(if v >= 0 {
                    Loose::U64(v as u64)
                } else {
                    Loose::I64(v)
                })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Loose::F64(v))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(Loose::Bool(v))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Loose::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Loose::Null)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Loose::Object)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Loose::Array)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(s: &str) -> Item<'static> {
        let buf: &'static mut [u8] = Box::leak(s.as_bytes().to_vec().into_boxed_slice());
        match decode(buf, &mut simd_json::Buffers::default()).expect("json") {
            Incoming::Single(i) => i,
            Incoming::Batch(_) => panic!("batch"),
        }
    }

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

    #[test]
    fn classifies_acks_and_invalid_requests() {
        assert!(matches!(
            one(r#"{"id":5,"jsonrpc":"2.0","result":true}"#),
            Item::Ack
        ));
        assert!(matches!(
            one(r#"{"id":5,"jsonrpc":"1.0","method":"waku_subscribe"}"#),
            Item::Invalid(Id::U64(5), RpcError { code: -32600, .. })
        ));
        assert!(matches!(
            one(r#"{"id":5,"jsonrpc":"2.0","method":3}"#),
            Item::Invalid(_, RpcError { code: -32600, .. })
        ));
        assert!(matches!(
            one(r#"{"id":true,"jsonrpc":"2.0","method":"x"}"#),
            Item::Invalid(Id::Null, _)
        ));
        assert!(matches!(
            one("42"),
            Item::Invalid(Id::Null, RpcError { code: -32600, .. })
        ));
        assert!(matches!(
            one("[]"),
            Item::Invalid(Id::Null, RpcError { code: -32600, .. })
        ));
    }

    #[test]
    fn parse_errors_and_depth() {
        let mut b = b"{\"id\":1,".to_vec();
        assert_eq!(
            decode(&mut b, &mut simd_json::Buffers::default()).unwrap_err(),
            ParseError
        );
        let mut deep = vec![b'['; 100_000];
        deep.extend(vec![b']'; 100_000]);
        assert_eq!(
            decode(&mut deep, &mut simd_json::Buffers::default()).unwrap_err(),
            ParseError
        );
        // Brackets inside strings do not count.
        let s = format!(
            r#"{{"id":1,"jsonrpc":"2.0","method":"m","params":{{"topic":"{}"}}}}"#,
            "[".repeat(200)
        );
        let mut b = s.into_bytes();
        assert!(decode(&mut b, &mut simd_json::Buffers::default()).is_ok());
    }

    #[test]
    fn batches_are_classified_element_by_element() {
        let mut b = br#"[{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":{"topic":"a"}},5,{"id":"x","jsonrpc":"2.0","result":true}]"#.to_vec();
        match decode(&mut b, &mut simd_json::Buffers::default()).unwrap() {
            Incoming::Batch(v) => {
                assert_eq!(v.len(), 3);
                assert!(matches!(v[0], Item::Call(_)));
                assert!(matches!(v[1], Item::Invalid(Id::Null, _)));
                assert!(matches!(v[2], Item::Ack));
            }
            Incoming::Single(_) => panic!("single"),
        }
    }

    #[test]
    fn strings_are_escaped_only_when_needed() {
        for s in [
            "plain",
            "",
            "quote\"",
            "back\\slash",
            "ctl\u{1}",
            "é\u{1F600}",
            &"x".repeat(100),
        ] {
            let mut a = Vec::new();
            write_str(&mut a, s);
            assert_eq!(a, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn encodes_ids_exactly() {
        let mut o = Vec::new();
        write_result(&mut o, &Id::Str("a\"b".into()), b"true");
        assert_eq!(o, br#"{"id":"a\"b","jsonrpc":"2.0","result":true}"#);
        o.clear();
        write_error(
            &mut o,
            &Id::U64(1234567890123456),
            &RpcError::param("topic"),
        );
        assert_eq!(
            std::str::from_utf8(&o).unwrap(),
            r#"{"id":1234567890123456,"jsonrpc":"2.0","error":{"code":-32602,"message":"Missing or invalid \"topic\" param"}}"#
        );
        o.clear();
        write_id(&mut o, &Id::I64(-7));
        assert_eq!(o, b"-7");
    }
}
