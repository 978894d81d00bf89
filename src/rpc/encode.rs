//! Encoding: results, errors, ids and strings as JSON, and the `waku_subscription` push in
//! pieces (a prefix per subscriber, the `data` object encoded once per publish, a suffix).
//! Writers append to a caller's buffer and never fail.

pub use crate::json::write_str;

use super::{Dialect, Id, RpcError};

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
    out.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"error\":");
    write_error_object(out, err);
    out.push(b'}');
}

/// Appends an error object, `{"code":..,"message":..[,"data":..]}`.
pub fn write_error_object(out: &mut Vec<u8>, err: &RpcError) {
    out.extend_from_slice(b"{\"code\":");
    out.extend_from_slice(itoa::Buffer::new().format(err.code).as_bytes());
    out.extend_from_slice(b",\"message\":");
    write_str(out, &err.message);
    match err.data {
        None => {}
        Some(super::ErrorData::RetryAfterMs(ms)) => {
            out.extend_from_slice(b",\"data\":{\"retryAfterMs\":");
            out.extend_from_slice(itoa::Buffer::new().format(ms).as_bytes());
            out.push(b'}');
        }
        Some(super::ErrorData::Tag(tag)) => {
            out.extend_from_slice(b",\"data\":");
            write_str(out, tag);
        }
    }
    out.push(b'}');
}

/// Encodes the beta `data` object of a push, `{"topic":..,"message":..}` (tests and
/// benchmarks; the relay encodes a `message::Body` once per publish).
pub fn encode_data(topic: &str, message: &str) -> Vec<u8> {
    let b = crate::message::Body::encode(topic, message, crate::message::Meta::default());
    let (buf, n) = b.beta();
    let mut v = buf[..n].to_vec();
    v.push(b'}');
    v
}

/// The bytes of a `*_subscription` request that precede the shared `data` object.
/// The push is `prefix ++ data ++ "}}"`.
pub fn write_push_prefix(out: &mut Vec<u8>, dialect: Dialect, rpc_id: u64, sub_id_hex: &[u8]) {
    out.extend_from_slice(b"{\"id\":");
    out.extend_from_slice(itoa::Buffer::new().format(rpc_id).as_bytes());
    out.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"method\":\"");
    out.extend_from_slice(dialect.push_method().as_bytes());
    out.extend_from_slice(b"\",\"params\":{\"id\":\"");
    out.extend_from_slice(sub_id_hex);
    out.extend_from_slice(b"\",\"data\":");
}

/// What closes a push after its `data` object.
pub const PUSH_SUFFIX: &[u8] = b"}}";

/// What closes a beta push after the beta part of a body (`Body::beta`): the data object's
/// `}` and [`PUSH_SUFFIX`].
pub const BETA_PUSH_SUFFIX: &[u8] = b"}}}";

/// A push's `data` object for a subscription of `dialect`: the first `n` bytes of the
/// returned buffer, then the returned suffix closes the push.
pub fn push_shape(
    body: &crate::message::Body,
    dialect: Dialect,
) -> (&crate::arcbuf::ArcBuf, usize, &'static [u8]) {
    match dialect {
        Dialect::Waku => {
            let (b, n) = body.beta();
            (b, n, BETA_PUSH_SUFFIX)
        }
        Dialect::Irn | Dialect::Iridium => (body.irn(), body.irn().len(), PUSH_SUFFIX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        write_error(&mut o, &Id::U64(3), &RpcError::rate_limited(250));
        assert_eq!(
            std::str::from_utf8(&o).unwrap(),
            r#"{"id":3,"jsonrpc":"2.0","error":{"code":-32000,"message":"rate limited","data":{"retryAfterMs":250}}}"#
        );
        o.clear();
        write_id(&mut o, &Id::I64(-7));
        assert_eq!(o, b"-7");
    }
}
