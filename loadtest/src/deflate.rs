//! RFC 7692 permessage-deflate, client side, sans I/O: the offer loadtest sends, the check of
//! the server's answer, and a per-event-loop [`Codec`] that compresses outgoing messages and
//! inflates incoming ones, each message on its own (no context takeover either way).
//!
//! Owns byte formats and the (de)compressor state only; it never touches a socket or a
//! connection. `net` calls [`Codec::recode`] on the frames a scenario queued (scenarios keep
//! writing plain masked frames, so every scenario gets compression without knowing of it) and
//! [`Codec::inflate`] on RSV1 messages.
//!
//! DEFLATE is flate2 over zlib-rs, as in the server (`src/ws/deflate.rs`), at the server's
//! level 2 (the lowest zlib-rs level with a dynamic Huffman code, which hex needs to shrink).

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use thiserror::Error;

use crate::ws::{self, op};

/// The `Sec-WebSocket-Extensions` value loadtest offers: no context kept on either side, so
/// the server's per-core (de)compressors are reset for every message.
pub const OFFER: &str =
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// zlib level of outgoing messages (the server's `ws::deflate::LEVEL`).
const LEVEL: u32 = 2;

/// What RFC 7692 §7.2.1 strips from, and §7.2.2 appends to, every compressed message.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Why the server's extension answer was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AnswerError {
    /// No `permessage-deflate` in the answer: the server declined (not started with
    /// `--permessage-deflate`?).
    #[error("the server declined permessage-deflate (is it started with --permessage-deflate?)")]
    Declined,
    /// An extension or parameter we did not offer, or a malformed value.
    #[error("unexpected Sec-WebSocket-Extensions answer {0:?}")]
    Unexpected(String),
    /// The server agreed but keeps its compression context between messages.
    #[error("the server's answer lacks server_no_context_takeover")]
    ContextKept,
}

/// Checks the server's `Sec-WebSocket-Extensions` answer (`None`: no such header) to our
/// [`OFFER`]. Accepted: `permessage-deflate` with `server_no_context_takeover`, optionally
/// `client_no_context_takeover` and `server_max_window_bits=9..15` (our inflater's 15-bit
/// window takes any). Refused: anything we did not offer (`client_max_window_bits`, other
/// extensions, repeated parameters).
pub fn check_answer(value: Option<&[u8]>) -> Result<(), AnswerError> {
    let Some(value) = value else {
        return Err(AnswerError::Declined);
    };
    let unexpected = || AnswerError::Unexpected(String::from_utf8_lossy(value).into_owned());
    let text = std::str::from_utf8(value).map_err(|_| unexpected())?;
    let mut parts = text.split(';').map(str::trim);
    if parts.next() != Some("permessage-deflate") {
        return Err(unexpected());
    }
    let (mut server_nct, mut client_nct, mut window) = (false, false, false);
    for p in parts {
        let (name, val) = match p.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (p, None),
        };
        let seen = match (name.to_ascii_lowercase().as_str(), val) {
            ("server_no_context_takeover", None) => &mut server_nct,
            ("client_no_context_takeover", None) => &mut client_nct,
            ("server_max_window_bits", Some(v))
                if v.parse::<u8>().is_ok_and(|b| (9..=15).contains(&b)) =>
            {
                &mut window
            }
            _ => return Err(unexpected()),
        };
        if std::mem::replace(seen, true) {
            return Err(unexpected());
        }
    }
    if server_nct {
        Ok(())
    } else {
        Err(AnswerError::ContextKept)
    }
}

/// Why a compressed message from the server was refused.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// It inflates past the bound.
    #[error("compressed message inflates past {0} bytes")]
    TooBig(usize),
    /// Not a raw DEFLATE stream.
    #[error("invalid compressed data")]
    Invalid,
}

/// One event loop's compressor and inflater, reset for every message, with their buffers.
pub struct Codec {
    compress: Compress,
    decompress: Decompress,
    /// Unmasked payload of the message being compressed.
    plain: Vec<u8>,
    /// Its compressed form.
    packed: Vec<u8>,
    /// Messages sent compressed, and sent plain because compression did not make them smaller.
    pub sent_compressed: u64,
    /// See [`Codec::sent_compressed`].
    pub sent_plain: u64,
}

impl Default for Codec {
    fn default() -> Self {
        Codec::new()
    }
}

impl Codec {
    /// A raw-DEFLATE compressor (15-bit window) and inflater; zlib-rs allocates on first use.
    pub fn new() -> Codec {
        Codec {
            compress: Compress::new(Compression::new(LEVEL), false),
            decompress: Decompress::new(false),
            plain: Vec::new(),
            packed: Vec::new(),
            sent_compressed: 0,
            sent_plain: 0,
        }
    }

    /// Compresses one whole message into `out` (cleared first) as RFC 7692 §7.2.1 wants it:
    /// raw DEFLATE, sync flush, its `00 00 ff ff` tail removed. `false` when it would not be
    /// shorter than `msg` (send it uncompressed then: each message may choose).
    pub fn compress(&mut self, msg: &[u8], out: &mut Vec<u8>) -> bool {
        self.compress.reset();
        out.clear();
        // Worth it only under msg.len(); the tail and a little slack make the bound.
        let cap = msg.len() + 16;
        out.reserve(cap);
        let mut input = msg;
        while out.len() < cap {
            let before = self.compress.total_in();
            if self
                .compress
                .compress_vec(input, out, FlushCompress::Sync)
                .is_err()
            {
                return false;
            }
            input = input
                .get((self.compress.total_in() - before) as usize..)
                .unwrap_or_default();
            // Room left after a call: all input and the flush are out.
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            out.reserve(64);
        }
        if !out.ends_with(&TAIL) {
            return false;
        }
        out.truncate(out.len() - TAIL.len());
        out.len() < msg.len()
    }

    /// Inflates one compressed message (its frames' payloads, concatenated) into `out`
    /// (cleared first). `out` never grows past `max + 1` bytes, so a bomb costs one bounded
    /// buffer; a final block ends the message.
    pub fn inflate(
        &mut self,
        payload: &[u8],
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), InflateError> {
        self.decompress.reset(false);
        out.clear();
        let limit = max.saturating_add(1);
        for (mut input, flush) in [
            (payload, FlushDecompress::None),
            (&TAIL[..], FlushDecompress::Sync),
        ] {
            loop {
                if out.len() == out.capacity() {
                    if out.len() >= limit {
                        return Err(InflateError::TooBig(max));
                    }
                    let want = (out.capacity() * 2).max(4096).min(limit);
                    out.reserve_exact(want - out.len());
                }
                let (in0, out0) = (self.decompress.total_in(), out.len());
                let status = self
                    .decompress
                    .decompress_vec(input, out, flush)
                    .map_err(|_| InflateError::Invalid)?;
                let used = (self.decompress.total_in() - in0) as usize;
                input = input.get(used..).unwrap_or_default();
                match status {
                    Status::StreamEnd => return Self::within(out, max),
                    _ if input.is_empty() && out.len() < out.capacity() => break,
                    // Input left, room left, and nothing moved: never loop on it.
                    _ if used == 0 && out.len() == out0 => return Err(InflateError::Invalid),
                    _ => {}
                }
            }
        }
        Self::within(out, max)
    }

    fn within(out: &[u8], max: usize) -> Result<(), InflateError> {
        if out.len() > max {
            Err(InflateError::TooBig(max))
        } else {
            Ok(())
        }
    }

    /// Appends to `out` the client frames in `frames` (whole masked frames as `ws` encodes
    /// them), each unfragmented text or binary message compressed with RSV1 set when that
    /// makes it shorter; control frames, and anything that does not parse as a whole frame,
    /// go through unchanged.
    pub fn recode(&mut self, frames: &[u8], out: &mut Vec<u8>) {
        let mut off = 0;
        while off < frames.len() {
            let rest = &frames[off..];
            let Ok(Some(h)) = ws::parse_head(rest, usize::MAX >> 1, false) else {
                out.extend_from_slice(rest);
                return;
            };
            let total = h.head_len + h.payload_len;
            let (Some(frame), Some(key)) = (rest.get(..total), h.mask) else {
                out.extend_from_slice(rest);
                return;
            };
            off += total;
            if !h.fin || !matches!(h.opcode, op::TEXT | op::BINARY) {
                out.extend_from_slice(frame);
                continue;
            }
            let mut plain = std::mem::take(&mut self.plain);
            let mut packed = std::mem::take(&mut self.packed);
            plain.clear();
            plain.extend_from_slice(&frame[h.head_len..]);
            ws::apply_mask(&mut plain, key, 0);
            if self.compress(&plain, &mut packed) {
                ws::encode_client_first(out, 0x80 | ws::RSV1 | h.opcode, &packed);
                self.sent_compressed += 1;
            } else {
                out.extend_from_slice(frame);
                self.sent_plain += 1;
            }
            self.plain = plain;
            self.packed = packed;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::MASK;

    /// RFC 7692 §7.2.3.1: "Hello" compressed in one block, tail removed.
    const HELLO: [u8; 7] = [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];

    fn random_hex(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                b"0123456789abcdef"[(seed & 15) as usize]
            })
            .collect()
    }

    #[test]
    fn inflates_the_rfc_examples() {
        let mut c = Codec::new();
        let mut out = Vec::new();
        // §7.2.3.1 "Hello"; §7.2.3.2 a stored block; §7.2.3.3 with BFINAL; §7.2.3.4 two blocks.
        for p in [
            &HELLO[..],
            &[
                0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00,
            ][..],
            &[0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00][..],
            &[
                0xf2, 0x48, 0x05, 0x00, 0x00, 0x00, 0xff, 0xff, 0xca, 0xc9, 0xc9, 0x07, 0x00,
            ][..],
        ] {
            c.inflate(p, 1 << 20, &mut out).unwrap();
            assert_eq!(out, b"Hello", "{p:02x?}");
        }
    }

    #[test]
    fn compresses_hello_as_the_rfc_does_and_round_trips() {
        let mut c = Codec::new();
        let mut out = Vec::new();
        // Too short to gain: five bytes in, seven out.
        assert!(!c.compress(b"Hello", &mut out));
        assert_eq!(out, HELLO, "the RFC's bytes, before the length check");
        let mut back = Vec::new();
        for n in [0usize, 1, 100, 512, 5000, 70_000] {
            let msg = random_hex(n, 7 + n as u64);
            let smaller = c.compress(&msg, &mut out);
            assert_eq!(smaller, n >= 100, "n={n}: {} bytes", out.len());
            c.inflate(&out, n, &mut back).unwrap();
            assert_eq!(back, msg, "n={n}");
        }
    }

    #[test]
    fn hex_compresses_to_about_half() {
        let mut c = Codec::new();
        let mut out = Vec::new();
        let msg = random_hex(512, 99);
        assert!(c.compress(&msg, &mut out));
        assert!((256..320).contains(&out.len()), "{} bytes", out.len());
    }

    #[test]
    fn inflate_is_bounded_and_refuses_garbage() {
        let mut c = Codec::new();
        let mut packed = Vec::new();
        assert!(c.compress(&vec![b'a'; 100_000], &mut packed));
        let mut out = Vec::new();
        assert_eq!(
            c.inflate(&packed, 99_999, &mut out),
            Err(InflateError::TooBig(99_999))
        );
        assert!(out.capacity() <= 100_000);
        c.inflate(&packed, 100_000, &mut out).unwrap();
        assert_eq!(out.len(), 100_000);
        assert_eq!(
            c.inflate(&[0xff, 0xff, 0xff], 1000, &mut out),
            Err(InflateError::Invalid)
        );
        // And the same codec still works afterwards (reset per message).
        c.inflate(&HELLO, 5, &mut out).unwrap();
        assert_eq!(out, b"Hello");
    }

    #[test]
    fn recode_compresses_data_frames_only() {
        let mut c = Codec::new();
        let msg = random_hex(600, 3);
        let mut plain = Vec::new();
        ws::encode_client(&mut plain, op::TEXT, &msg);
        ws::encode_client(&mut plain, op::PING, b"sub");
        ws::encode_client(&mut plain, op::TEXT, b"{}");
        let mut out = Vec::new();
        c.recode(&plain, &mut out);
        assert_eq!((c.sent_compressed, c.sent_plain), (1, 1));
        let h = ws::parse_head(&out, 1 << 20, true).unwrap().unwrap();
        assert!(h.compressed && h.fin && h.opcode == op::TEXT);
        let mut payload = out[h.head_len..h.head_len + h.payload_len].to_vec();
        ws::apply_mask(&mut payload, MASK, 0);
        let mut back = Vec::new();
        c.inflate(&payload, 1 << 20, &mut back).unwrap();
        assert_eq!(back, msg);
        // The ping and the short message follow unchanged.
        let rest = &out[h.head_len + h.payload_len..];
        assert_eq!(rest, &plain[ws::client_head_len(600) + 600..]);
    }

    #[test]
    fn answers() {
        assert_eq!(check_answer(Some(OFFER.as_bytes())), Ok(()));
        let ok = [
            "permessage-deflate; server_no_context_takeover",
            "permessage-deflate;server_no_context_takeover;server_max_window_bits=10",
            "permessage-deflate; Server_No_Context_Takeover; server_max_window_bits=\"15\"",
        ];
        for a in ok {
            assert_eq!(check_answer(Some(a.as_bytes())), Ok(()), "{a}");
        }
        assert_eq!(check_answer(None), Err(AnswerError::Declined));
        assert_eq!(
            check_answer(Some(b"permessage-deflate; client_no_context_takeover")),
            Err(AnswerError::ContextKept)
        );
        for bad in [
            "x-webkit-deflate-frame",
            "permessage-deflate; server_no_context_takeover; client_max_window_bits=10",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; server_no_context_takeover; server_max_window_bits=8",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; server_no_context_takeover, permessage-deflate",
        ] {
            assert!(
                matches!(
                    check_answer(Some(bad.as_bytes())),
                    Err(AnswerError::Unexpected(_))
                ),
                "{bad}"
            );
        }
    }
}
