//! Encoding: results, errors, ids and strings as JSON, and the `waku_subscription` push in
//! pieces (a prefix per subscriber, the `data` object encoded once per publish, a suffix).
//! Writers append to a caller's buffer and never fail.

use super::{Id, RpcError};

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

#[cfg(test)]
mod tests {
    use super::*;

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
