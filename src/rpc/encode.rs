//! Encoding: results, errors, ids and strings as JSON, and the `waku_subscription` push in
//! pieces (a prefix per subscriber, the `data` object encoded once per publish, a suffix).
//! Writers append to a caller's buffer and never fail.

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

/// Any byte that JSON requires escaped. Looked at in whole blocks of 64 bytes (16 for a
/// short string), each a few SIMD compares per 16 bytes and one test; a tail shorter than a
/// block is looked at as the string's last whole block, overlapping the one before (a yes/no
/// question does not mind seeing a byte twice). Every message is scanned once as it is
/// encoded (`encode_data`): 32-byte chunks with a byte-by-byte tail took 1.3 instructions a
/// byte, this about half.
fn needs_escape(b: &[u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if b.len() >= 64 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the function only needs AVX2 to be sound to call, and this CPU has it
        // (checked just above).
        return unsafe { needs_escape_avx2(b) };
    }
    scan(b)
}

/// [`needs_escape`] compiled for AVX2: 32 bytes a compare instead of 16 (the build targets
/// baseline x86-64; `is_x86_feature_detected` decides at run time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn needs_escape_avx2(b: &[u8]) -> bool {
    scan(b)
}

/// [`needs_escape`] for whatever instructions the caller is compiled for.
#[inline(always)]
fn scan(b: &[u8]) -> bool {
    if b.len() >= 64 {
        any_block::<64>(b)
    } else if b.len() >= 16 {
        any_block::<16>(b)
    } else {
        b.iter().any(|&x| escaped(x))
    }
}

/// [`needs_escape`] of `b`, at least `N` bytes long, block by block.
#[inline(always)]
fn any_block<const N: usize>(b: &[u8]) -> bool {
    let (blocks, tail) = b.as_chunks::<N>();
    let last = || {
        let at = b.len().saturating_sub(N);
        b.get(at..).and_then(|l| <&[u8; N]>::try_from(l).ok())
    };
    blocks.iter().any(block) || (!tail.is_empty() && last().is_some_and(block))
}

/// Whether a block holds a byte JSON requires escaped (no branch per byte).
#[inline(always)]
fn block<const N: usize>(c: &[u8; N]) -> bool {
    c.iter().fold(0u8, |a, &x| a | u8::from(escaped(x))) != 0
}

/// A control character, a quote or a backslash. Flipping bit 1 keeps the control
/// characters below 0x20 and moves the quote (0x22), and only it, to 0x20: one comparison
/// for both.
#[inline(always)]
fn escaped(x: u8) -> bool {
    ((x ^ 0x02) <= 0x20) | (x == b'\\')
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
    match err.data {
        None => {}
        Some(super::ErrorData::RetryAfterMs(ms)) => {
            out.extend_from_slice(b",\"data\":{\"retryAfterMs\":");
            out.extend_from_slice(itoa::Buffer::new().format(ms).as_bytes());
            out.push(b'}');
        }
    }
    out.extend_from_slice(b"}}");
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
) -> (&bytes::Bytes, usize, &'static [u8]) {
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
    fn an_escape_is_found_wherever_it_is() {
        // Every length around the block sizes, with the byte to escape at every place
        // (first, last, inside the overlapping tail).
        for len in 0..200 {
            let plain = "a".repeat(len);
            // Both the build's own instructions and (where the CPU has them) AVX2.
            assert!(
                !needs_escape(plain.as_bytes()) && !scan(plain.as_bytes()),
                "{len}"
            );
            for at in 0..len {
                for bad in [b'"', b'\\', 0x1f, 0x00] {
                    let mut b = plain.clone().into_bytes();
                    b[at] = bad;
                    assert!(needs_escape(&b) && scan(&b), "{len} {at} {bad}");
                }
            }
        }
        assert!(!needs_escape("é\u{1F600} ~\u{7f}".repeat(20).as_bytes()));
        for x in 0..=255u8 {
            assert_eq!(escaped(x), x < 0x20 || x == b'"' || x == b'\\', "{x}");
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
