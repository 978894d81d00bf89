//! Wire parsing and classification: one WebSocket message (simd-json in place, or
//! serde_json for the benchmark) into [`Incoming`], each element an [`Item`]: a call, a
//! client's acknowledgement, or an invalid request with its error. Nesting depth and batch
//! length are bounded here; validation of a call's params is `op`'s.

use super::wire::{Envelope, Loose, Top};
use super::{code, Call, Id, Incoming, Item, ParseError, Plain, RpcError, MAX_BATCH, MAX_DEPTH};
use crate::json::StringState;

/// Decodes one WebSocket message: the fast path (`fast.rs`) when the message has the usual
/// shape, else [`decode_general`]; the result is the same either way. `buf` may be parsed in
/// place (simd-json), so it is clobbered; `scratch` holds the parser's buffers between calls
/// (one per worker).
pub fn decode<'a>(
    buf: &'a mut [u8],
    scratch: &mut simd_json::Buffers,
) -> Result<Incoming<'a>, ParseError> {
    let whole: *const [u8] = &*buf;
    // SAFETY: `whole` points to `buf`'s bytes, valid and unchanged for 'a while only read.
    // The shared view is read by the fast path, then either (a) its result, which borrows
    // from the view, is returned and `buf` is never used again, so the view is the only
    // access for the rest of 'a; or (b) it declined: `None` holds no borrow of the view and
    // the view is never used again, so `buf`'s mutable use below is the only access. No
    // shared and mutable access ever overlap (the borrow checker cannot see this split by
    // the result's variant: the NLL "conditional return of a borrow" limitation).
    let view: &'a [u8] = unsafe { &*whole };
    // `decode_fast`, written out: the element is built where the result lies (returned
    // through an `Option` first, its 232 bytes would be copied twice, the first copy a load
    // of stores still in flight).
    if let Some(id) = super::fast::is_ack(view) {
        return Ok(Incoming::Single(Item::Ack(Some(id))));
    }
    let mut e = Envelope::object();
    if super::fast::parse(view, &mut e) {
        return Ok(Incoming::Single(classify_in_place(&mut e, Plain(true))));
    }
    decode_general(buf, scratch)
}

/// [`decode`] without the fast path: `serde` + `simd-json` on any message, the reference
/// the fast path is proven against.
pub fn decode_general<'a>(
    buf: &'a mut [u8],
    scratch: &mut simd_json::Buffers,
) -> Result<Incoming<'a>, ParseError> {
    if nesting_too_deep(buf) || lone_surrogate(buf) {
        return Err(ParseError);
    }
    let top: Top<'_> =
        simd_json::serde::from_slice_with_buffers(buf, scratch).map_err(|_| ParseError)?;
    Ok(classify_top(top))
}

/// The fast path alone: `Some` with what [`decode_general`] gives when the message has the
/// usual shape (`fast.rs`: an acknowledgement in the SDK's exact form, else the scanner),
/// `None` when it declines. What [`decode`] tries first, and what the differential tests
/// hold against the general parser.
pub fn decode_fast(buf: &[u8]) -> Option<Incoming<'_>> {
    if let Some(id) = super::fast::is_ack(buf) {
        return Some(Incoming::Single(Item::Ack(Some(id))));
    }
    let mut e = Envelope::object();
    if !super::fast::parse(buf, &mut e) {
        return None;
    }
    // Every string the scanner read stood as it is (`Scan::string`).
    Some(Incoming::Single(classify_in_place(&mut e, Plain(true))))
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

/// Whether a `\u` escape names half of a surrogate pair without the other half right
/// after it. Such a string is no Unicode text; `simd-json` would write it as nothing or as
/// U+0000 rather than refuse it (`serde_json` refuses it), so the message is refused here,
/// as a parse error, before it can change a topic or a message. Escapes appear only inside
/// strings in valid JSON; a backslash anywhere else is a parse error either way.
fn lone_surrogate(buf: &[u8]) -> bool {
    fn hex4(b: Option<&[u8]>) -> Option<u32> {
        let s = std::str::from_utf8(b?).ok()?;
        u32::from_str_radix(s, 16)
            .ok()
            .filter(|_| s.len() == 4 && !s.starts_with('+'))
    }
    let mut i = 0;
    while let Some(off) = buf.get(i..).and_then(|r| memchr::memchr(b'\\', r)) {
        let at = i + off;
        i = at + 2;
        if buf.get(at + 1) != Some(&b'u') {
            continue;
        }
        match hex4(buf.get(at + 2..at + 6)) {
            Some(0xD800..=0xDBFF) => {
                let low = buf.get(at + 6..at + 8) == Some(&b"\\u"[..])
                    && matches!(hex4(buf.get(at + 8..at + 12)), Some(0xDC00..=0xDFFF));
                if !low {
                    return true;
                }
                i = at + 12;
            }
            Some(0xDC00..=0xDFFF) => return true,
            _ => {}
        }
    }
    false
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
    let mut strings = StringState::default();
    for &b in buf {
        if strings.inside(b) {
            continue;
        }
        match b {
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

fn classify(mut e: Envelope<'_>) -> Item<'_> {
    classify_in_place(&mut e, Plain(false))
}

/// [`classify`] of an envelope where it lies (the fast path's), its members taken out of
/// it rather than the whole model (a few hundred bytes) copied to be taken apart; a call is
/// marked `plain` as its parser knows its strings to be (see [`Plain`]). Always inlined:
/// returned from a call, the element was built in the callee's frame and copied out.
#[inline(always)]
fn classify_in_place<'a>(e: &mut Envelope<'a>, plain: Plain) -> Item<'a> {
    if !e.is_object {
        return Item::Invalid(Id::Null, invalid_request("Invalid request: not an object"));
    }
    if e.method.is_none() && super::v1::is_v1(e) {
        return match super::v1::frame(std::mem::replace(e, Envelope::object())) {
            Ok(f) => Item::V1(f),
            Err(err) => Item::Invalid(Id::Null, err),
        };
    }
    let id = match e.id.take() {
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
    let method = match e.method.take() {
        // A response from the client (an acknowledgement) is consumed; an object that is
        // neither a request nor a response nor a v1 frame is an invalid request (§8).
        None if e.response => {
            return Item::Ack(match id {
                Some(Id::U64(n)) => Some(n),
                _ => None,
            })
        }
        None => {
            return Item::Invalid(
                id.unwrap_or(Id::Null),
                invalid_request("Invalid request: no \"method\", and no \"result\" or \"error\""),
            )
        }
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
        params: e.params.take(),
        plain,
    })
}

#[cfg(test)]
mod tests {
    use super::super::one;
    use super::*;

    #[test]
    fn half_a_surrogate_pair_is_a_parse_error() {
        let parse = |s: &str| {
            let mut b = s.as_bytes().to_vec();
            decode(&mut b, &mut simd_json::Buffers::default()).is_ok()
        };
        let publish = |topic: &str| {
            format!(
                r#"{{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{{"topic":"{topic}","message":"m","ttl":60}}}}"#
            )
        };
        for bad in [
            r"a\udbff",
            r"a\ud800x",
            r"\udc00",
            r"\ud800\u0041",
            r"\ud800\ud800",
            r"\ud83d\",
        ] {
            assert!(!parse(&publish(bad)), "{bad}");
            assert!(lone_surrogate(publish(bad).as_bytes()), "{bad}");
        }
        for good in [
            r"\ud83d\ude00",
            r"\\ud800",
            r"\u00e9",
            r"\uD83D\uDE00",
            r"\\\\",
        ] {
            assert!(parse(&publish(good)), "{good}");
        }
        // An id: refused too (it was echoed as U+0000), where serde_json refuses it.
        let id =
            r#"{"id":"\ud800","jsonrpc":"2.0","method":"waku_subscribe","params":{"topic":"a"}}"#;
        assert!(!parse(id));
        assert!(serde_json::from_str::<serde_json::Value>(id).is_err());
    }

    #[test]
    fn integers_past_64_bits_are_numbers_not_parse_errors() {
        let item = |s: &str| {
            let mut b = s.as_bytes().to_vec();
            let ok = match decode(&mut b, &mut simd_json::Buffers::default()) {
                Ok(Incoming::Single(Item::Call(c))) => c.method == "waku_publish",
                _ => false,
            };
            ok
        };
        assert!(item(
            r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":"m","ttl":60,"x":123456789012345678901234}}"#
        ));
        assert!(item(
            r#"{"id":18446744073709551616,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":"m","ttl":123456789012345678901234}}"#
        ));
    }

    #[test]
    fn classifies_acks_and_invalid_requests() {
        assert!(matches!(
            one(r#"{"id":5,"jsonrpc":"2.0","result":true}"#),
            Item::Ack(Some(5))
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
                assert!(matches!(v[2], Item::Ack(None)));
            }
            Incoming::Single(_) => panic!("single"),
        }
    }
}
