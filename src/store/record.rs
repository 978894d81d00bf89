//! Framing of one log record: a sync marker, the payload length, a CRC-32 and the payload.
//!
//! ```text
//! offset 0  magic  [0xF5, b'W', b'R', 0x8A]   marks a record start (found again after damage)
//!        4  len    u32 little-endian           payload bytes, at most MAX_PAYLOAD
//!        8  crc    u32 little-endian           CRC-32 (IEEE) of the 4 length bytes + payload
//!       12  payload
//! ```
//!
//! Owns only the byte layout: [`decode`] is pure (no I/O, no allocation) and tells
//! "incomplete" (`Ok(None)`: more bytes might complete it) from "invalid" (`Err`); [`resync`]
//! finds the next valid record after damage. It must not know what a payload means (that is
//! `entry`) nor where records live (that is `log`).

/// The four bytes that start every record. 0xF5 never occurs in UTF-8, so user text
/// (topics, messages, URLs) can never contain a marker: after damage, the resync scan
/// cannot be steered into a record forged inside a published message, as long as stored
/// data stays UTF-8.
pub const MAGIC: [u8; 4] = [0xF5, b'W', b'R', 0x8A];
/// Bytes before the payload.
pub const HEADER_LEN: usize = 12;
/// Largest payload accepted (a stored message is at most `--max-message`, 1 MiB by default,
/// plus its topic; 16 MiB leaves room and bounds what a corrupt length can make us read).
pub const MAX_PAYLOAD: usize = 16 << 20;

/// Why bytes are not a valid record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The bytes do not start with [`MAGIC`].
    #[error("no record marker")]
    BadMagic,
    /// The length field is larger than [`MAX_PAYLOAD`].
    #[error("record length {0} over the limit")]
    TooLong(usize),
    /// The CRC does not match the length and payload.
    #[error("record checksum mismatch")]
    Checksum,
}

fn crc(len: [u8; 4], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len);
    h.update(payload);
    h.finalize()
}

/// Appends the framed `payload` to `out`.
///
/// Errors with [`RecordError::TooLong`] (and leaves `out` unchanged) over [`MAX_PAYLOAD`].
pub fn encode(payload: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    out.extend_from_slice(payload);
    seal(out, start)
}

/// Fills in the header of a record whose header placeholder starts at `start` in `buf` and
/// whose payload is everything after it (callers that encode the payload in place).
///
/// On [`RecordError::TooLong`], truncates `buf` back to `start`.
pub fn seal(buf: &mut Vec<u8>, start: usize) -> Result<(), RecordError> {
    let len = buf.len() - start - HEADER_LEN;
    if len > MAX_PAYLOAD {
        buf.truncate(start);
        return Err(RecordError::TooLong(len));
    }
    let len_bytes = (len as u32).to_le_bytes();
    let sum = crc(len_bytes, &buf[start + HEADER_LEN..]);
    let head = &mut buf[start..start + HEADER_LEN];
    head[..4].copy_from_slice(&MAGIC);
    head[4..8].copy_from_slice(&len_bytes);
    head[8..12].copy_from_slice(&sum.to_le_bytes());
    Ok(())
}

/// Decodes the record at the start of `buf`.
///
/// `Ok(Some((consumed, payload)))` for a whole valid record; `Ok(None)` when `buf` is a
/// proper prefix of a record that may still be valid (more bytes needed); `Err` when the
/// bytes cannot be a valid record whatever follows.
pub fn decode(buf: &[u8]) -> Result<Option<(usize, &[u8])>, RecordError> {
    let m = buf.len().min(4);
    if buf[..m] != MAGIC[..m] {
        return Err(RecordError::BadMagic);
    }
    let Some(len_bytes) = buf.get(4..8) else {
        return Ok(None);
    };
    let len_bytes = [len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]];
    let len = u32::from_le_bytes(len_bytes) as usize;
    if len > MAX_PAYLOAD {
        return Err(RecordError::TooLong(len));
    }
    let total = HEADER_LEN + len;
    if buf.len() < total {
        return Ok(None);
    }
    let sum = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
    let payload = &buf[HEADER_LEN..total];
    if crc(len_bytes, payload) != sum {
        return Err(RecordError::Checksum);
    }
    Ok(Some((total, payload)))
}

/// The offset of the first whole valid record in `buf` at or after `from`, if any.
///
/// Used after damage: every later occurrence of [`MAGIC`] is tried until one decodes with a
/// matching checksum. A record cut off by the end of `buf` does not count.
pub fn resync(buf: &[u8], from: usize) -> Option<usize> {
    let mut pos = from;
    while pos < buf.len() {
        let at = pos + memchr::memmem::find(&buf[pos..], &MAGIC)?;
        if let Ok(Some(_)) = decode(&buf[at..]) {
            return Some(at);
        }
        pos = at + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(payloads: &[&[u8]]) -> Vec<u8> {
        let mut v = Vec::new();
        for p in payloads {
            encode(p, &mut v).unwrap();
        }
        v
    }

    #[test]
    fn round_trip_and_incomplete_prefixes() {
        let buf = framed(&[b"hello"]);
        assert_eq!(buf.len(), HEADER_LEN + 5);
        assert_eq!(decode(&buf), Ok(Some((buf.len(), &b"hello"[..]))));
        for cut in 0..buf.len() {
            assert_eq!(decode(&buf[..cut]), Ok(None), "prefix of {cut} bytes");
        }
    }

    #[test]
    fn empty_payload_is_a_record() {
        let buf = framed(&[b""]);
        assert_eq!(decode(&buf), Ok(Some((HEADER_LEN, &b""[..]))));
    }

    #[test]
    fn every_single_byte_flip_is_detected() {
        let buf = framed(&[b"some payload bytes"]);
        for i in 0..buf.len() {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[i] ^= 1 << bit;
                match decode(&b) {
                    Err(_) | Ok(None) => {}
                    Ok(Some(_)) => panic!("flip of bit {bit} at {i} went unnoticed"),
                }
            }
        }
    }

    #[test]
    fn oversize_length_is_invalid_not_incomplete() {
        let mut buf = MAGIC.to_vec();
        buf.extend_from_slice(&((MAX_PAYLOAD + 1) as u32).to_le_bytes());
        assert_eq!(decode(&buf), Err(RecordError::TooLong(MAX_PAYLOAD + 1)));
        let mut out = Vec::new();
        let big = vec![0u8; MAX_PAYLOAD + 1];
        assert!(encode(&big, &mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn resync_skips_damage_to_the_next_record() {
        let buf = framed(&[b"first", b"second", b"third"]);
        let second = HEADER_LEN + 5;
        let mut bad = buf.clone();
        bad[HEADER_LEN + 1] ^= 0xFF; // payload of the first
        assert_eq!(decode(&bad), Err(RecordError::Checksum));
        assert_eq!(resync(&bad, 1), Some(second));
        // A record cut by the end is not a resync point.
        assert_eq!(resync(&buf[..buf.len() - 1], second + 1), None);
        // A marker inside a payload that is not a valid record is passed over.
        let mut tricky = Vec::new();
        encode(&[MAGIC.as_slice(), b"\x05\0\0\0junk"].concat(), &mut tricky).unwrap();
        encode(b"real", &mut tricky).unwrap();
        tricky[0] = 0;
        let real = tricky.len() - HEADER_LEN - 4;
        assert_eq!(resync(&tricky, 1), Some(real));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), from in 0usize..300) {
            let _ = decode(&bytes);
            if let Some(at) = resync(&bytes, from) {
                prop_assert!(at >= from);
                prop_assert!(matches!(decode(&bytes[at..]), Ok(Some(_))));
            }
        }

        #[test]
        fn frames_round_trip(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8)) {
            let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
            let buf = framed(&refs);
            let mut pos = 0;
            for p in &payloads {
                let (n, got) = decode(&buf[pos..]).unwrap().unwrap();
                prop_assert_eq!(got, p.as_slice());
                pos += n;
            }
            prop_assert_eq!(pos, buf.len());
        }
    }
}
