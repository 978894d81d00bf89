//! WebSocket (RFC 6455) framing, sans-IO: the handshake's accept key, an incremental frame
//! header parser, in-place unmasking, close-frame validation, and server frame headers.
//! The message rules (fragmentation, control frames between fragments, UTF-8 of text,
//! the message limit) live in [`decoder`], built on these pieces.
//!
//! Nothing here reads or writes a socket; `conn` hands bytes in and queues the bytes this
//! module produces. Every error carries the close code that answers it.

mod decoder;
pub mod deflate;

pub use decoder::{Decoder, Event, Reassembly};

use thiserror::Error;

/// Frame opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// Continuation of a fragmented message.
    Continuation,
    /// UTF-8 text.
    Text,
    /// Binary data.
    Binary,
    /// Close.
    Close,
    /// Ping.
    Ping,
    /// Pong.
    Pong,
}

impl Opcode {
    fn from_u8(b: u8) -> Option<Opcode> {
        Some(match b {
            0x0 => Opcode::Continuation,
            0x1 => Opcode::Text,
            0x2 => Opcode::Binary,
            0x8 => Opcode::Close,
            0x9 => Opcode::Ping,
            0xA => Opcode::Pong,
            _ => return None,
        })
    }

    fn to_u8(self) -> u8 {
        match self {
            Opcode::Continuation => 0x0,
            Opcode::Text => 0x1,
            Opcode::Binary => 0x2,
            Opcode::Close => 0x8,
            Opcode::Ping => 0x9,
            Opcode::Pong => 0xA,
        }
    }

    /// Close, ping and pong.
    pub fn is_control(self) -> bool {
        matches!(self, Opcode::Close | Opcode::Ping | Opcode::Pong)
    }
}

/// Close status codes the server sends.
pub mod close {
    /// Normal closure.
    pub const NORMAL: u16 = 1000;
    /// Server going away (shutdown).
    pub const GOING_AWAY: u16 = 1001;
    /// Protocol error.
    pub const PROTOCOL: u16 = 1002;
    /// Text that is not UTF-8.
    pub const INVALID_DATA: u16 = 1007;
    /// Policy violation (a reader too slow for its outbound buffer).
    pub const POLICY: u16 = 1008;
    /// Message too big.
    pub const TOO_BIG: u16 = 1009;
    /// Unexpected server condition.
    pub const INTERNAL: u16 = 1011;
}

/// A frame-level violation and the close code that answers it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WsError {
    /// A protocol rule was broken (1002).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A message or frame exceeds the size limit (1009).
    #[error("message too big")]
    TooBig,
    /// Text or a close reason that is not UTF-8 (1007).
    #[error("invalid UTF-8")]
    InvalidUtf8,
    /// A permessage-deflate message that is not DEFLATE data (1007: the data does not
    /// match its declared encoding).
    #[error("invalid compressed data")]
    BadCompression,
}

impl WsError {
    /// The close code answering this error.
    pub fn close_code(&self) -> u16 {
        match self {
            WsError::Protocol(_) => close::PROTOCOL,
            WsError::TooBig => close::TOO_BIG,
            WsError::InvalidUtf8 | WsError::BadCompression => close::INVALID_DATA,
        }
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// Final fragment.
    pub fin: bool,
    /// Opcode.
    pub opcode: Opcode,
    /// Masking key (client frames must have one).
    pub mask: [u8; 4],
    /// Header length in bytes.
    pub header_len: usize,
    /// Payload length in bytes.
    pub payload_len: usize,
}

impl FrameHead {
    /// Header plus payload.
    pub fn frame_len(&self) -> usize {
        self.header_len + self.payload_len
    }
}

/// Parses a client frame header from the front of `buf`.
///
/// `Ok(None)`: need more bytes. Frames whose payload exceeds `max_payload` are refused from
/// the header alone, before their payload is buffered.
#[inline(always)]
pub fn parse_head(buf: &[u8], max_payload: usize) -> Result<Option<FrameHead>, WsError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let (b0, b1) = (buf[0], buf[1]);
    if b0 & 0x70 != 0 {
        return Err(WsError::Protocol("reserved bits set"));
    }
    let opcode = Opcode::from_u8(b0 & 0x0F).ok_or(WsError::Protocol("unknown opcode"))?;
    let fin = b0 & 0x80 != 0;
    if b1 & 0x80 == 0 {
        return Err(WsError::Protocol("client frame not masked"));
    }
    let len7 = (b1 & 0x7F) as usize;
    if opcode.is_control() && (!fin || len7 > 125) {
        return Err(WsError::Protocol("fragmented or oversized control frame"));
    }
    let (len, off) = match len7 {
        126 => {
            if buf.len() < 4 {
                return Ok(None);
            }
            (u16::from_be_bytes([buf[2], buf[3]]) as u64, 4)
        }
        127 => {
            if buf.len() < 10 {
                return Ok(None);
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            let l = u64::from_be_bytes(b);
            if l >> 63 != 0 {
                return Err(WsError::Protocol("payload length has the top bit set"));
            }
            (l, 10)
        }
        l => (l as u64, 2),
    };
    if len > max_payload as u64 {
        return Err(WsError::TooBig);
    }
    if buf.len() < off + 4 {
        return Ok(None);
    }
    let mut mask = [0u8; 4];
    mask.copy_from_slice(&buf[off..off + 4]);
    Ok(Some(FrameHead {
        fin,
        opcode,
        mask,
        header_len: off + 4,
        payload_len: len as usize,
    }))
}

/// XORs `data` with the masking key in place, the key's phase starting at `offset`, 16
/// bytes at a time. Returns whether every unmasked byte is ASCII (below 0x80), noted along
/// the way at one OR per block: ASCII is valid UTF-8, so a text frame of the usual JSON
/// needs no UTF-8 check of its own.
pub fn unmask(data: &mut [u8], mask: [u8; 4], offset: usize) -> bool {
    let mut m = [0u8; 16];
    for (i, b) in m.iter_mut().enumerate() {
        *b = mask[(i + offset) & 3];
    }
    let (blocks, tail) = data.as_chunks_mut::<16>();
    let mut ascii = unmask_blocks(blocks, m);
    // A block's length is a multiple of 4: the tail starts at the key's phase `offset`.
    // Eight bytes of it as one word, then the last few one by one.
    let (words, bytes) = tail.as_chunks_mut::<8>();
    let mut key = [0u8; 8];
    key.copy_from_slice(&m[..8]);
    for w in words {
        let v = u64::from_ne_bytes(*w) ^ u64::from_ne_bytes(key);
        ascii &= v & 0x8080_8080_8080_8080 == 0;
        *w = v.to_ne_bytes();
    }
    for (b, k) in bytes.iter_mut().zip(key) {
        *b ^= k;
        ascii &= *b < 0x80;
    }
    ascii
}

/// [`unmask`]'s whole blocks, `m` the key repeated from their phase: two at a time with
/// AVX2 where the CPU has it, then one SSE2 load, XOR, OR and store per block (portable
/// forms compile to scalar code of two to four times the instructions);
/// whether every byte is ASCII from one `movemask`.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn unmask_blocks(blocks: &mut [[u8; 16]], m: [u8; 16]) -> bool {
    if blocks.len() >= 4 && std::arch::is_x86_feature_detected!("avx2") {
        let (pairs, rest) = blocks.as_chunks_mut::<2>();
        // SAFETY: `unmask_pairs_avx2` only needs AVX2, which this CPU has (checked above).
        let ascii = unsafe { unmask_pairs_avx2(pairs, m) };
        return unmask_blocks_sse2(rest, m) & ascii;
    }
    unmask_blocks_sse2(blocks, m)
}

/// [`unmask_blocks`] 32 bytes at a time with AVX2 (a publish's message is most of a frame).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "avx2")]
fn unmask_pairs_avx2(pairs: &mut [[[u8; 16]; 2]], m: [u8; 16]) -> bool {
    use std::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_or_si256, _mm256_setzero_si256,
        _mm256_storeu_si256, _mm256_xor_si256,
    };
    let mut mm = [0u8; 32];
    mm[..16].copy_from_slice(&m);
    mm[16..].copy_from_slice(&m);
    // SAFETY: AVX2 is enabled for this function, which is only called where the CPU has it.
    // Every load and store reads or writes exactly 32 bytes: `mm`, or a pair of blocks of
    // `pairs` (`[[u8; 16]; 2]`, 32 contiguous bytes), which is borrowed mutably here, so the
    // bytes are in bounds, initialised and not aliased; `loadu`/`storeu` need no alignment.
    unsafe {
        let k = _mm256_loadu_si256(mm.as_ptr().cast::<__m256i>());
        let mut seen = _mm256_setzero_si256();
        for pair in pairs {
            let p = pair.as_mut_ptr().cast::<__m256i>();
            let v = _mm256_xor_si256(_mm256_loadu_si256(p), k);
            seen = _mm256_or_si256(seen, v);
            _mm256_storeu_si256(p, v);
        }
        _mm256_movemask_epi8(seen) == 0
    }
}

/// [`unmask_blocks`] one SSE2 block at a time.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn unmask_blocks_sse2(blocks: &mut [[u8; 16]], m: [u8; 16]) -> bool {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_setzero_si128,
        _mm_storeu_si128, _mm_xor_si128,
    };
    // SAFETY: SSE2 is enabled for this build (the `cfg`). Every load and store reads or
    // writes exactly one `[u8; 16]`: `m`, or a block of `blocks`, which is borrowed mutably
    // here, so the 16 bytes are in bounds, initialised and not aliased; `loadu`/`storeu`
    // need no alignment.
    unsafe {
        let k = _mm_loadu_si128(m.as_ptr().cast::<__m128i>());
        let mut seen = _mm_setzero_si128();
        for block in blocks {
            let p = block.as_mut_ptr().cast::<__m128i>();
            let v = _mm_xor_si128(_mm_loadu_si128(p), k);
            seen = _mm_or_si128(seen, v);
            _mm_storeu_si128(p, v);
        }
        _mm_movemask_epi8(seen) == 0
    }
}

/// [`unmask_blocks`] on other architectures.
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
fn unmask_blocks(blocks: &mut [[u8; 16]], m: [u8; 16]) -> bool {
    let word = u128::from_ne_bytes(m);
    let mut seen = 0u128;
    for block in blocks {
        let v = u128::from_ne_bytes(*block) ^ word;
        seen |= v;
        *block = v.to_ne_bytes();
    }
    seen & u128::from_ne_bytes([0x80; 16]) == 0
}

/// Writes a server (unmasked) frame header for a payload of `len` bytes into `out` and
/// returns its length (2, 4 or 10 bytes).
pub fn write_head(out: &mut [u8; 10], fin: bool, opcode: Opcode, len: usize) -> usize {
    out[0] = (if fin { 0x80 } else { 0 }) | opcode.to_u8();
    if len < 126 {
        out[1] = len as u8;
        2
    } else if len <= u16::MAX as usize {
        out[1] = 126;
        out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        4
    } else {
        out[1] = 127;
        out[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    }
}

/// A whole server frame (header and payload) as bytes.
pub fn frame(opcode: Opcode, payload: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 10];
    let n = write_head(&mut h, true, opcode, payload.len());
    let mut v = Vec::with_capacity(n + payload.len());
    v.extend_from_slice(&h[..n]);
    v.extend_from_slice(payload);
    v
}

/// A close frame with `code` and a short reason.
pub fn close_frame(code: u16, reason: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(2 + reason.len());
    p.extend_from_slice(&code.to_be_bytes());
    p.extend_from_slice(&reason.as_bytes()[..reason.len().min(123)]);
    frame(Opcode::Close, &p)
}

/// Validates a received close payload; returns the code to echo back.
pub fn check_close_payload(p: &[u8]) -> Result<u16, WsError> {
    match p.len() {
        0 => Ok(close::NORMAL),
        1 => Err(WsError::Protocol("close payload of one byte")),
        _ => {
            let code = u16::from_be_bytes([p[0], p[1]]);
            let valid = matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999);
            if !valid {
                return Err(WsError::Protocol("invalid close code"));
            }
            if simdutf8::basic::from_utf8(&p[2..]).is_err() {
                return Err(WsError::InvalidUtf8);
            }
            Ok(code)
        }
    }
}

/// A `Sec-WebSocket-Key` as RFC 6455 §4.1 has it: 16 bytes in base64, that is 22
/// characters of the base64 alphabet and `==`.
pub fn valid_key(key: &[u8]) -> bool {
    key.len() == 24
        && key.ends_with(b"==")
        && key[..22]
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// The `Sec-WebSocket-Accept` value for a client key.
pub fn accept_key(key: &[u8]) -> String {
    tungstenite::handshake::derive_accept_key(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame: FIN bit, opcode bits (reserved bits may be set through
    /// `op`), payload in the shortest length form.
    pub(super) fn client_frame(fin: bool, op: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut v = vec![(if fin { 0x80 } else { 0 }) | op];
        let n = payload.len();
        if n < 126 {
            v.push(0x80 | n as u8);
        } else if n < 65536 {
            v.push(0x80 | 126);
            v.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            v.push(0x80 | 127);
            v.extend_from_slice(&(n as u64).to_be_bytes());
        }
        v.extend_from_slice(&mask);
        v.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        v
    }

    #[test]
    fn unmask_reports_whether_the_payload_is_ascii() {
        // Every length around the block sizes (one, two blocks with AVX2, the word and the
        // bytes of the tail), every phase, a non-ASCII byte at every place.
        for len in 0..140usize {
            for offset in 0..4 {
                let mask = [0x9c, 0x01, 0xff, 0x37];
                let plain: Vec<u8> = (0..len).map(|i| b' ' + (i % 90) as u8).collect();
                let masked = |p: &[u8]| -> Vec<u8> {
                    p.iter()
                        .enumerate()
                        .map(|(i, b)| b ^ mask[(i + offset) % 4])
                        .collect()
                };
                let mut v = masked(&plain);
                assert!(unmask(&mut v, mask, offset), "{len} {offset}");
                assert_eq!(v, plain);
                for at in 0..len {
                    let mut p = plain.clone();
                    p[at] = 0x80 | (at as u8);
                    let mut v = masked(&p);
                    assert!(!unmask(&mut v, mask, offset), "{len} {offset} {at}");
                    assert_eq!(v, p);
                }
            }
        }
    }

    #[test]
    fn parses_and_unmasks_all_length_forms() {
        for n in [0usize, 5, 125, 126, 1000, 65535, 65536, 70000] {
            let payload: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let mut f = client_frame(true, 1, &payload, [1, 2, 3, 4]);
            // Every prefix shorter than the header is "need more".
            let h = parse_head(&f, 1 << 20).unwrap().unwrap();
            for cut in 0..h.header_len {
                assert_eq!(parse_head(&f[..cut], 1 << 20), Ok(None), "n={n} cut={cut}");
            }
            assert_eq!(h.payload_len, n);
            assert_eq!(h.frame_len(), f.len());
            let (hl, pl) = (h.header_len, h.payload_len);
            unmask(&mut f[hl..hl + pl], h.mask, 0);
            assert_eq!(&f[hl..], &payload[..]);
        }
    }

    #[test]
    fn unmask_with_phase_offset_matches_whole() {
        let data: Vec<u8> = (0..37).collect();
        let mask = [9, 8, 7, 6];
        let mut whole = data.clone();
        unmask(&mut whole, mask, 0);
        let mut parts = data.clone();
        let (a, b) = parts.split_at_mut(13);
        unmask(a, mask, 0);
        unmask(b, mask, 13);
        assert_eq!(whole, parts);
    }

    #[test]
    fn refuses_protocol_violations() {
        let m = [0, 0, 0, 0];
        let unmasked = [0x81u8, 0x01, b'a'];
        assert_eq!(
            parse_head(&unmasked, 100),
            Err(WsError::Protocol("client frame not masked"))
        );
        let rsv = client_frame(true, 0x41, b"a", m);
        assert!(matches!(parse_head(&rsv, 100), Err(WsError::Protocol(_))));
        let op = client_frame(true, 0x3, b"a", m);
        assert!(matches!(parse_head(&op, 100), Err(WsError::Protocol(_))));
        let frag_ping = client_frame(false, 0x9, b"a", m);
        assert!(matches!(
            parse_head(&frag_ping, 100),
            Err(WsError::Protocol(_))
        ));
        let big_ping = client_frame(true, 0x9, &[0u8; 126], m);
        assert!(matches!(
            parse_head(&big_ping, 1000),
            Err(WsError::Protocol(_))
        ));
        let big = client_frame(true, 0x1, &[0u8; 101], m);
        assert_eq!(parse_head(&big, 100), Err(WsError::TooBig));
        assert_eq!(WsError::TooBig.close_code(), 1009);
    }

    #[test]
    fn server_headers_round_trip_lengths() {
        for n in [0usize, 125, 126, 65535, 65536] {
            let mut h = [0u8; 10];
            let k = write_head(&mut h, true, Opcode::Text, n);
            assert_eq!(h[0], 0x81);
            let expect = if n < 126 {
                2
            } else if n < 65536 {
                4
            } else {
                10
            };
            assert_eq!(k, expect);
        }
    }

    #[test]
    fn validates_close_payloads() {
        assert_eq!(check_close_payload(&[]), Ok(1000));
        assert!(check_close_payload(&[3]).is_err());
        assert_eq!(check_close_payload(&[0x03, 0xE8, b'o', b'k']), Ok(1000));
        assert!(check_close_payload(&1005u16.to_be_bytes()).is_err());
        assert!(check_close_payload(&999u16.to_be_bytes()).is_err());
        assert_eq!(check_close_payload(&4000u16.to_be_bytes()), Ok(4000));
        assert_eq!(
            check_close_payload(&[0x03, 0xE8, 0xFF]),
            Err(WsError::InvalidUtf8)
        );
    }

    #[test]
    fn only_sixteen_bytes_in_base64_are_a_key() {
        assert!(valid_key(b"dGhlIHNhbXBsZSBub25jZQ=="));
        assert!(valid_key(b"AAAAAAAAAAAAAAAAAAAA+/=="));
        for bad in [
            &b"!!!!!!!!!!!!!!!!!!!!!!=="[..],
            b"dGhlIHNhbXBsZSBub25jZQ=",
            b"dGhlIHNhbXBsZSBub25jZQAA",
            b"dGhlIHNhbXBsZSBub25jZQ==A",
            b"dGhlIHNhbXBsZSBub25jZ===",
            b"",
        ] {
            assert!(!valid_key(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn accept_key_matches_rfc_example() {
        assert_eq!(
            accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
}
