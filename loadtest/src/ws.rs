//! Client side of RFC 6455 frames, sans I/O: frame encoding (always masked) and incremental
//! frame-head parsing (the upgrade handshake is `upgrade`'s).
//!
//! Owns byte formats only; it never touches a socket. The mask key is a fixed non-zero
//! constant ([`MASK`]): RFC 6455 wants an unpredictable key to defeat cache poisoning by
//! intermediaries, which cannot exist on loopback, and a fixed key lets publish frames be
//! encoded once. The server still has to unmask every byte, exactly as with a random key.

use thiserror::Error;

/// The fixed client mask key (non-zero, so a server that skips XOR for a zero key gains nothing).
pub const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// The RSV1 bit of a frame's first byte: "compressed" on a data message's first frame when
/// permessage-deflate was agreed (RFC 7692 §6).
pub const RSV1: u8 = 0x40;

/// Opcodes.
pub mod op {
    /// Continuation frame.
    pub const CONT: u8 = 0x0;
    /// Text frame.
    pub const TEXT: u8 = 0x1;
    /// Binary frame.
    pub const BINARY: u8 = 0x2;
    /// Close frame.
    pub const CLOSE: u8 = 0x8;
    /// Ping frame.
    pub const PING: u8 = 0x9;
    /// Pong frame.
    pub const PONG: u8 = 0xA;
}

/// A frame the server sent that breaks RFC 6455 (or our size cap).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    /// RSV bits set without a negotiated extension (or RSV1 on a control or continuation
    /// frame).
    #[error("reserved bits set (0x{0:02x})")]
    Reserved(u8),
    /// Opcode 3-7 or B-F.
    #[error("unknown opcode 0x{0:x}")]
    Opcode(u8),
    /// Control frame longer than 125 bytes or fragmented.
    #[error("bad control frame")]
    Control,
    /// Payload larger than we accept.
    #[error("frame of {0} bytes is too large")]
    TooLarge(u64),
    /// The 64-bit length had its top bit set, or a length used a longer form than needed.
    #[error("bad length encoding")]
    Length,
}

/// A parsed frame head: where the payload is and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// FIN bit.
    pub fin: bool,
    /// RSV1 bit: a compressed message (only when allowed, see [`parse_head`]).
    pub compressed: bool,
    /// Opcode.
    pub opcode: u8,
    /// Bytes of head (2 to 14).
    pub head_len: usize,
    /// Bytes of payload after the head.
    pub payload_len: usize,
    /// Mask key, if the server (wrongly) masked the frame; we unmask and count it.
    pub mask: Option<[u8; 4]>,
}

/// Parse a frame head from the start of `buf`. `Ok(None)` means more bytes are needed.
/// `rsv1_ok`: permessage-deflate was agreed, so RSV1 may mark the first frame of a text or
/// binary message as compressed.
pub fn parse_head(
    buf: &[u8],
    max_payload: usize,
    rsv1_ok: bool,
) -> Result<Option<Head>, FrameError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let b0 = buf[0];
    let b1 = buf[1];
    let opcode = b0 & 0x0f;
    let compressed = b0 & RSV1 != 0;
    let rsv1_allowed = rsv1_ok && matches!(opcode, op::TEXT | op::BINARY);
    let reserved = b0 & if rsv1_allowed { 0x30 } else { 0x70 };
    if reserved != 0 {
        return Err(FrameError::Reserved(reserved));
    }
    let fin = b0 & 0x80 != 0;
    match opcode {
        op::CONT | op::TEXT | op::BINARY => {}
        op::CLOSE | op::PING | op::PONG => {
            if !fin || (b1 & 0x7f) > 125 {
                return Err(FrameError::Control);
            }
        }
        other => return Err(FrameError::Opcode(other)),
    }
    let masked = b1 & 0x80 != 0;
    let (len, mut at) = match b1 & 0x7f {
        126 => {
            if buf.len() < 4 {
                return Ok(None);
            }
            let l = u16::from_be_bytes([buf[2], buf[3]]) as u64;
            if l < 126 {
                return Err(FrameError::Length);
            }
            (l, 4)
        }
        127 => {
            if buf.len() < 10 {
                return Ok(None);
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            let l = u64::from_be_bytes(b);
            if l >> 63 != 0 || l <= 0xffff {
                return Err(FrameError::Length);
            }
            (l, 10)
        }
        l => (l as u64, 2),
    };
    if len > max_payload as u64 {
        return Err(FrameError::TooLarge(len));
    }
    let mask = if masked {
        if buf.len() < at + 4 {
            return Ok(None);
        }
        let m = [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]];
        at += 4;
        Some(m)
    } else {
        None
    };
    Ok(Some(Head {
        fin,
        compressed,
        opcode,
        head_len: at,
        payload_len: len as usize,
        mask,
    }))
}

/// XOR `data` with `key`, where `data[0]` is payload byte number `offset`.
pub fn apply_mask(data: &mut [u8], key: [u8; 4], offset: usize) {
    for (i, b) in data.iter_mut().enumerate() {
        *b ^= key[(offset + i) & 3];
    }
}

/// Length of the head a client frame with `payload_len` bytes gets.
pub fn client_head_len(payload_len: usize) -> usize {
    let base = if payload_len < 126 {
        2
    } else if payload_len <= 0xffff {
        4
    } else {
        10
    };
    base + 4
}

/// Append one final, masked client frame (key [`MASK`]) to `out`.
pub fn encode_client(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    encode_client_first(out, 0x80 | (opcode & 0x0f), payload);
}

/// [`encode_client`] with the whole first byte given (FIN, RSV bits, opcode).
pub fn encode_client_first(out: &mut Vec<u8>, b0: u8, payload: &[u8]) {
    out.push(b0);
    let n = payload.len();
    if n < 126 {
        out.push(0x80 | n as u8);
    } else if n <= 0xffff {
        out.push(0x80 | 126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    out.extend_from_slice(&MASK);
    let start = out.len();
    out.extend_from_slice(payload);
    apply_mask(&mut out[start..], MASK, 0);
}

/// Append a masked close frame with `code` and no reason.
pub fn encode_close(out: &mut Vec<u8>, code: u16) {
    encode_client(out, op::CLOSE, &code.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![(if fin { 0x80 } else { 0 }) | opcode];
        let n = payload.len();
        if n < 126 {
            v.push(n as u8);
        } else if n <= 0xffff {
            v.push(126);
            v.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            v.push(127);
            v.extend_from_slice(&(n as u64).to_be_bytes());
        }
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn parses_all_length_forms_incrementally() {
        for n in [0usize, 1, 125, 126, 500, 0xffff, 0x10000, 70_000] {
            let payload = vec![b'a'; n];
            let f = server_frame(op::TEXT, true, &payload);
            // Every strict prefix of the head is "need more".
            let head_len = match n {
                0..=125 => 2,
                126..=0xffff => 4,
                _ => 10,
            };
            for cut in 0..head_len {
                assert_eq!(
                    parse_head(&f[..cut], 1 << 20, false),
                    Ok(None),
                    "n={n} cut={cut}"
                );
            }
            let h = parse_head(&f, 1 << 20, false).unwrap().unwrap();
            assert_eq!(h.head_len, head_len);
            assert_eq!(h.payload_len, n);
            assert!(h.fin);
            assert_eq!(h.opcode, op::TEXT);
            assert_eq!(h.mask, None);
        }
    }

    #[test]
    fn refuses_bad_frames() {
        assert_eq!(
            parse_head(&[0xC1, 0x00], 100, false),
            Err(FrameError::Reserved(0x40))
        );
        assert_eq!(
            parse_head(&[0x83, 0x00], 100, false),
            Err(FrameError::Opcode(3))
        );
        assert_eq!(
            parse_head(&[0x09, 0x00], 100, false),
            Err(FrameError::Control)
        );
        assert_eq!(
            parse_head(&[0x89, 126, 0, 200], 100, false),
            Err(FrameError::Control)
        );
        assert_eq!(
            parse_head(&[0x81, 126, 0, 5], 100, false),
            Err(FrameError::Length)
        );
        assert_eq!(
            parse_head(&[0x81, 126, 1, 0], 100, false),
            Err(FrameError::TooLarge(256))
        );
        let mut big = vec![0x81, 127];
        big.extend_from_slice(&(1u64 << 63).to_be_bytes());
        assert_eq!(parse_head(&big, 100, false), Err(FrameError::Length));
    }

    #[test]
    fn client_frames_round_trip() {
        for n in [0usize, 5, 125, 126, 1000, 0x10000] {
            let payload: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let mut out = Vec::new();
            encode_client(&mut out, op::TEXT, &payload);
            assert_eq!(out.len(), client_head_len(n) + n);
            let h = parse_head(&out, 1 << 20, false).unwrap().unwrap();
            assert_eq!(h.mask, Some(MASK));
            assert_eq!(h.payload_len, n);
            assert_eq!(h.head_len, client_head_len(n));
            let mut body = out[h.head_len..].to_vec();
            apply_mask(&mut body, MASK, 0);
            assert_eq!(body, payload);
        }
    }

    #[test]
    fn mask_with_offset_matches_whole_mask() {
        let data: Vec<u8> = (0..37).collect();
        let mut whole = data.clone();
        apply_mask(&mut whole, MASK, 0);
        let mut parts = data.clone();
        let (a, b) = parts.split_at_mut(11);
        apply_mask(a, MASK, 0);
        apply_mask(b, MASK, 11);
        assert_eq!(whole, parts);
    }
}
