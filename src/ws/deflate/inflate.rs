//! Inbound permessage-deflate: which frames may carry RSV1, and inflating a message under a
//! hard output bound.
//!
//! One [`Inflater`] per core, reset before every message (no context takeover), so a
//! connection keeps nothing between messages. It never touches a socket or a connection.

use flate2::{Decompress, FlushDecompress, Status};

use super::DeflateError;
use crate::ws::{self, FrameHead, Opcode, WsError};

/// The RSV1 bit of a frame's first byte: "this message is compressed" on the first frame of
/// a data message (RFC 7692 §6).
pub const RSV1: u8 = 0x40;

/// What RFC 7692 §7.2.2 appends to a message before inflating it: the empty stored block
/// whose bytes the sender removed.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// First output reservation; later ones double, up to the bound.
const FIRST_RESERVE: usize = 4096;

/// [`ws::parse_head`] for a connection that may have negotiated permessage-deflate:
/// returns the header and whether RSV1 (compressed) is set.
///
/// RSV1 is refused (1002) when `negotiated` is false, on control frames and on continuation
/// frames (only a message's first frame carries it). RSV2 and RSV3 are always refused.
///
/// Inlined, as [`ws::parse_head`] is: a header returned through memory is written in
/// pieces and read back whole, a store-forwarding stall on every frame.
#[inline(always)]
pub fn parse_head(
    buf: &[u8],
    max_payload: usize,
    negotiated: bool,
) -> Result<Option<(FrameHead, bool)>, WsError> {
    let Some(&b0) = buf.first() else {
        return Ok(None);
    };
    if b0 & RSV1 == 0 || !negotiated {
        // Without RSV1, or without the extension (then `ws::parse_head` refuses the bit).
        return Ok(ws::parse_head(buf, max_payload)?.map(|h| (h, false)));
    }
    // A header is at most 14 bytes: parse a copy without the bit.
    let mut head = [0u8; 14];
    let n = buf.len().min(head.len());
    head[..n].copy_from_slice(&buf[..n]);
    head[0] &= !RSV1;
    let Some(h) = ws::parse_head(&head[..n], max_payload)? else {
        return Ok(None);
    };
    if h.opcode.is_control() {
        return Err(WsError::Protocol("RSV1 set on a control frame"));
    }
    if h.opcode == Opcode::Continuation {
        return Err(WsError::Protocol("RSV1 set on a continuation frame"));
    }
    Ok(Some((h, true)))
}

/// A raw-DEFLATE inflater shared by a core's connections, reset for every message.
pub struct Inflater {
    /// zlib-rs underneath (raw stream, 15-bit window: accepts any client window).
    inner: Decompress,
}

impl Default for Inflater {
    fn default() -> Self {
        Inflater::new()
    }
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater").finish_non_exhaustive()
    }
}

impl Inflater {
    /// A fresh inflater (about 40 KiB: its state and a 32 KiB window).
    pub fn new() -> Inflater {
        Inflater {
            inner: Decompress::new(false),
        }
    }

    /// Inflates one whole message's payload (its frames' payloads concatenated, unmasked)
    /// into `out` (cleared first).
    ///
    /// `out` never grows past `max + 1` bytes: when the message inflates past `max` the
    /// answer is [`DeflateError::TooBig`] (1009) after at most `max + 1` bytes of output, so
    /// a zip bomb costs one bounded buffer and the time to inflate `max` bytes. Data that is
    /// not DEFLATE is [`DeflateError::Invalid`] (1007). A final (BFINAL) block ends the
    /// message; whatever follows it is ignored.
    pub fn inflate(
        &mut self,
        payload: &[u8],
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), DeflateError> {
        self.inner.reset(false);
        out.clear();
        let limit = max.saturating_add(1);
        // A buffer reused from a larger bound must not let this message inflate past its own.
        out.shrink_to(limit);
        for (input, flush) in [
            (payload, FlushDecompress::None),
            (&TAIL[..], FlushDecompress::Sync),
        ] {
            if self.feed(input, flush, limit, out)? {
                break;
            }
        }
        if out.len() > max {
            return Err(DeflateError::TooBig);
        }
        Ok(())
    }

    /// Runs `input` through the inflater; `true` when the stream ended (BFINAL).
    fn feed(
        &mut self,
        mut input: &[u8],
        flush: FlushDecompress,
        limit: usize,
        out: &mut Vec<u8>,
    ) -> Result<bool, DeflateError> {
        loop {
            if out.len() == out.capacity() {
                if out.len() >= limit {
                    return Err(DeflateError::TooBig);
                }
                let target = (out.capacity() * 2).max(FIRST_RESERVE).min(limit);
                out.reserve_exact(target - out.len());
            }
            let before_in = self.inner.total_in();
            let before_out = out.len();
            let status = self
                .inner
                .decompress_vec(input, out, flush)
                .map_err(|_| DeflateError::Invalid)?;
            let used = (self.inner.total_in() - before_in) as usize;
            input = input.get(used..).unwrap_or_default();
            match status {
                Status::StreamEnd => return Ok(true),
                // Room left after the call means all available output was produced.
                _ if input.is_empty() && out.len() < out.capacity() => return Ok(false),
                // No progress with input and room left: treat it as bad data, never loop.
                _ if used == 0 && out.len() == before_out => return Err(DeflateError::Invalid),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compress, Compression, FlushCompress};

    /// A permessage-deflate payload made by flate2 directly (independent of `compress`).
    fn reference_payload(msg: &[u8]) -> Vec<u8> {
        let mut c = Compress::new(Compression::default(), false);
        let mut out = Vec::with_capacity(msg.len() + 64);
        c.compress_vec(msg, &mut out, FlushCompress::Sync).unwrap();
        assert!(out.ends_with(&TAIL));
        out.truncate(out.len() - 4);
        out
    }

    fn masked(b0: u8, payload_len: u8) -> Vec<u8> {
        let mut v = vec![b0, 0x80 | payload_len, 1, 2, 3, 4];
        v.extend(std::iter::repeat_n(0u8, payload_len as usize));
        v
    }

    #[test]
    fn inflates_what_a_real_deflater_made() {
        let msg = br#"{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":{"topic":"abc"}}"#;
        let mut inf = Inflater::new();
        let mut out = Vec::new();
        inf.inflate(&reference_payload(msg), 1 << 20, &mut out)
            .unwrap();
        assert_eq!(out, msg);
        // The same inflater again (reset, no context kept), and an empty message.
        inf.inflate(&reference_payload(b""), 10, &mut out).unwrap();
        assert!(out.is_empty());
        inf.inflate(&reference_payload(msg), msg.len(), &mut out)
            .unwrap();
        assert_eq!(out, msg);
    }

    #[test]
    fn rfc7692_examples() {
        let mut inf = Inflater::new();
        let mut out = Vec::new();
        // §7.2.3.1 "Hello" (one compressed block), §7.2.3.3 with BFINAL set, §7.2.3.4 two
        // blocks, §7.2.3.2 a stored block.
        for p in [
            &[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00][..],
            &[0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00][..],
            &[
                0xf2, 0x48, 0x05, 0x00, 0x00, 0x00, 0xff, 0xff, 0xca, 0xc9, 0xc9, 0x07, 0x00,
            ][..],
            &[
                0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00,
            ][..],
        ] {
            inf.inflate(p, 100, &mut out).unwrap();
            assert_eq!(out, b"Hello", "payload {p:02x?}");
        }
    }

    #[test]
    fn message_past_the_bound_is_too_big_without_growing_past_it() {
        let msg = vec![b'a'; 10_000];
        let p = reference_payload(&msg);
        let mut inf = Inflater::new();
        let mut out = Vec::new();
        inf.inflate(&p, 10_000, &mut out).unwrap();
        assert_eq!(out.len(), 10_000);
        assert_eq!(inf.inflate(&p, 9_999, &mut out), Err(DeflateError::TooBig));
        assert!(out.capacity() <= 10_000, "capacity {}", out.capacity());
        assert_eq!(DeflateError::TooBig.close_code(), 1009);
    }

    #[test]
    fn garbage_is_invalid_data() {
        let mut inf = Inflater::new();
        let mut out = Vec::new();
        // BTYPE 11 is reserved.
        assert_eq!(
            inf.inflate(&[0xff; 16], 1000, &mut out),
            Err(DeflateError::Invalid)
        );
        // A stored block whose NLEN does not complement LEN.
        assert_eq!(
            inf.inflate(
                &[0x00, 0x05, 0x00, 0x00, 0x00, 1, 2, 3, 4, 5],
                1000,
                &mut out
            ),
            Err(DeflateError::Invalid)
        );
        assert_eq!(DeflateError::Invalid.close_code(), 1007);
        // The inflater is usable again afterwards.
        inf.inflate(&reference_payload(b"ok"), 10, &mut out)
            .unwrap();
        assert_eq!(out, b"ok");
    }

    #[test]
    fn rsv1_rules() {
        let max = 1000;
        // Compressed text and binary first frames, final or not.
        for b0 in [0xC1, 0xC2, 0x41, 0x42] {
            let (h, c) = parse_head(&masked(b0, 3), max, true).unwrap().unwrap();
            assert!(c, "{b0:#x}");
            assert_eq!(h.payload_len, 3);
        }
        // Uncompressed frames with the extension: fine.
        let (_, c) = parse_head(&masked(0x81, 3), max, true).unwrap().unwrap();
        assert!(!c);
        let (_, c) = parse_head(&masked(0x80, 3), max, true).unwrap().unwrap();
        assert!(!c);
        // RSV1 without the extension, on control frames, on continuations: 1002.
        for (b0, negotiated) in [
            (0xC1, false),
            (0xC9, true),
            (0xCA, true),
            (0xC8, true),
            (0xC0, true),
            (0x40, true),
        ] {
            let e = parse_head(&masked(b0, 3), max, negotiated).unwrap_err();
            assert_eq!(e.close_code(), 1002, "{b0:#x} negotiated={negotiated}");
        }
        // RSV2 / RSV3 stay refused.
        assert!(parse_head(&masked(0xE1, 3), max, true).is_err());
        assert!(parse_head(&masked(0xD1, 3), max, true).is_err());
        // Partial headers are "need more", with and without RSV1.
        let f = masked(0xC1, 3);
        for cut in 0..6 {
            assert_eq!(parse_head(&f[..cut], max, true), Ok(None), "cut {cut}");
        }
        // The size limit still applies to the compressed frame.
        assert_eq!(parse_head(&masked(0xC1, 3), 2, true), Err(WsError::TooBig));
    }
}
