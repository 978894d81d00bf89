//! Outbound permessage-deflate: a whole message compressed for one client ([`Deflater::
//! compress`]), and a relay push compressed once per core for all its subscribers
//! ([`Shared`], [`push_head`]).
//!
//! A push is `prefix + data + suffix` where only `prefix` differs per subscriber. A raw
//! DEFLATE stream is a sequence of blocks, so `data + suffix` is compressed once by a fresh
//! compressor (it refers to nothing before it) and ended the way RFC 7692 §7.2.1 ends a
//! message (sync flush, its final `00 00 ff ff` removed); each subscriber's payload is a
//! stored (uncompressed) block holding its prefix, 5 bytes of overhead, followed by those
//! shared bytes. Nothing here touches a connection or a socket.

use bytes::Bytes;

use crate::arcbuf::ArcBuf;
use flate2::{Compress, Compression, FlushCompress};

use super::negotiate::MAX_WINDOW_BITS;
use crate::ws::{self, Opcode};

/// zlib level of every message: level 1 is zlib-rs's `deflate_quick`, fixed Huffman code
/// only, which leaves hex (what clients send: ciphertext) at 8 bits a character; levels 2 to
/// 6 compress it alike at the same cost. 2 is the lowest level with a dynamic code
/// (`benches/deflate.rs`; docs/PERFORMANCE.md, "Smaller choices").
pub const LEVEL: u32 = 2;

/// Messages shorter than this are sent uncompressed (RFC 7692 lets each message choose).
/// Every compression costs at least a zlib-rs reset (clearing its 128 KiB hash table): an
/// ack comes out longer and a subscribe result hardly shorter for that, while a push of a
/// short hex message already saves a third (docs/PERFORMANCE.md, "Smaller choices").
pub const MIN_COMPRESS: usize = 256;

/// The most a stored block holds.
const STORED_MAX: usize = 0xffff;

/// A stored block's header: the block type byte, LEN and NLEN.
const STORED_HEADER: usize = 5;

/// Per-core compressors, one per LZ77 window size in use, each reset before every message
/// (no context takeover).
pub struct Deflater {
    /// Index `bits - 9`; made on first need (zlib-rs: about 370 KiB at 15 bits, 240 KiB at
    /// 9, including a 128 KiB hash table that every reset clears).
    by_window: [Option<Compress>; 7],
}

impl Default for Deflater {
    fn default() -> Self {
        Deflater::new()
    }
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let made: Vec<u8> = (9u8..)
            .zip(&self.by_window)
            .filter_map(|(bits, c)| c.as_ref().map(|_| bits))
            .collect();
        f.debug_struct("Deflater").field("windows", &made).finish()
    }
}

impl Deflater {
    /// No compressor yet; each is made when a message first needs its window size.
    pub fn new() -> Deflater {
        Deflater {
            by_window: Default::default(),
        }
    }

    /// Compresses a whole message for a client whose agreement allows `window_bits`
    /// ([`super::Agreement::window_bits`]). Returns `true` with the frame payload in `out`
    /// (send it with RSV1, see [`write_head`]), or `false` when the message should go
    /// uncompressed: shorter than [`MIN_COMPRESS`] or not smaller compressed (then `out`
    /// holds nothing useful).
    pub fn compress(&mut self, msg: &[u8], window_bits: u8, out: &mut Vec<u8>) -> bool {
        out.clear();
        msg.len() >= MIN_COMPRESS && self.deflate(&[msg], window_bits, msg.len(), msg.len(), out)
    }

    /// Compresses `parts` (`raw_len` bytes in all) as one message into `out`, giving up
    /// (returning `false`) once the payload would reach `limit` bytes.
    fn deflate(
        &mut self,
        parts: &[&[u8]],
        window_bits: u8,
        raw_len: usize,
        limit: usize,
        out: &mut Vec<u8>,
    ) -> bool {
        let c = self.compressor(effective_window(window_bits, raw_len));
        c.reset();
        out.clear();
        // Room for a payload one byte under the limit, plus the tail removed below.
        let cap = limit + 3;
        out.reserve_exact(cap);
        for (i, part) in parts.iter().enumerate() {
            let flush = if i + 1 == parts.len() {
                FlushCompress::Sync
            } else {
                FlushCompress::None
            };
            let mut input = *part;
            loop {
                if out.len() >= cap {
                    return false;
                }
                let before = c.total_in();
                if c.compress_vec(input, out, flush).is_err() {
                    return false;
                }
                input = input
                    .get((c.total_in() - before) as usize..)
                    .unwrap_or_default();
                // Room left after the call: everything so far (and the flush) is out.
                if input.is_empty() && out.len() < out.capacity() {
                    break;
                }
            }
        }
        // RFC 7692 §7.2.1: the sync flush ends with an empty stored block; drop its 4 bytes.
        if out.len() >= cap || !out.ends_with(&[0x00, 0x00, 0xff, 0xff]) {
            return false;
        }
        out.truncate(out.len() - 4);
        true
    }

    /// The compressor for `bits` (9 to 15), made on first need.
    fn compressor(&mut self, bits: u8) -> &mut Compress {
        let bits = bits.clamp(9, MAX_WINDOW_BITS);
        self.by_window[usize::from(bits - 9)].get_or_insert_with(|| {
            Compress::new_with_window_bits(Compression::new(LEVEL), false, bits)
        })
    }
}

/// The window to compress `len` bytes with for a client that allows `window_bits`: a
/// message no longer than the client's window cannot refer further back than it, whatever
/// window compressed it, so such messages all share the 15-bit compressor (and one shared
/// form per push).
fn effective_window(window_bits: u8, len: usize) -> u8 {
    let bits = window_bits.clamp(9, MAX_WINDOW_BITS);
    if len <= 1usize << bits {
        MAX_WINDOW_BITS
    } else {
        bits
    }
}

/// One push's compressed `data + suffix`, made at most once per window size on this core and
/// shared by all of its subscribers. Lives for one fan-out.
pub struct Shared {
    data: ArcBuf,
    suffix: Bytes,
    /// Index `bits - 9`: not tried yet, tried and not worth it, or the shared bytes.
    forms: [Option<Option<ArcBuf>>; 7],
}

impl Shared {
    /// Nothing compressed yet: a fan-out that reaches no compressing subscriber costs nothing.
    pub fn new(data: ArcBuf, suffix: Bytes) -> Shared {
        Shared {
            data,
            suffix,
            forms: Default::default(),
        }
    }

    /// Whether this is the push of `data` (the same bytes, shared by reference).
    pub fn is_for(&self, data: &ArcBuf) -> bool {
        self.data.same(data)
    }

    /// The shared compressed bytes for a subscriber whose agreement allows `window_bits`,
    /// compressing on first need; `None` when the push should go uncompressed (short, or not
    /// smaller). Follow with [`push_head`] for each subscriber.
    pub fn get(&mut self, deflater: &mut Deflater, window_bits: u8) -> Option<&ArcBuf> {
        let raw_len = self.data.len() + self.suffix.len();
        let bits = effective_window(window_bits, raw_len);
        let (data, suffix) = (&self.data[..], &self.suffix[..]);
        self.forms[usize::from(bits - 9)]
            .get_or_insert_with(|| {
                if raw_len < MIN_COMPRESS {
                    return None;
                }
                let mut out = Vec::new();
                // Worth it when the stored prefix's 5 bytes are paid back.
                let limit = raw_len - STORED_HEADER;
                deflater
                    .deflate(&[data, suffix], bits, raw_len, limit, &mut out)
                    .then(|| ArcBuf::from(out))
            })
            .as_ref()
    }
}

/// Compresses `data + suffix` once, as [`Shared::get`] does, for a 15-bit window.
pub fn compress_shared(deflater: &mut Deflater, data: &[u8], suffix: &[u8]) -> Option<ArcBuf> {
    Shared::new(
        ArcBuf::copy_from_slice(data),
        Bytes::copy_from_slice(suffix),
    )
    .get(deflater, MAX_WINDOW_BITS)
    .cloned()
}

/// Writes one subscriber's frame up to the shared bytes into `out`: the frame header (FIN,
/// RSV1, text) and the stored block(s) holding `prefix`. The frame is complete once the
/// caller appends `shared` itself (by reference, e.g. `OutBuf::push_shared`).
pub fn push_head(prefix: &[u8], shared: &[u8], out: &mut Vec<u8>) {
    let blocks = prefix.len().div_ceil(STORED_MAX);
    let len = blocks * STORED_HEADER + prefix.len() + shared.len();
    let mut h = [0u8; 10];
    let n = write_head(&mut h, Opcode::Text, len);
    out.extend_from_slice(&h[..n]);
    write_stored(prefix, out);
}

/// One subscriber's whole frame payload (the stored prefix and the shared bytes), copied into
/// `out`: the same bytes [`push_head`] frames, for callers that do not share buffers.
pub fn push_payload(prefix: &[u8], shared: &[u8], out: &mut Vec<u8>) {
    write_stored(prefix, out);
    out.extend_from_slice(shared);
}

/// Non-final stored blocks holding `data` (none when it is empty), starting and ending on a
/// byte boundary.
fn write_stored(data: &[u8], out: &mut Vec<u8>) {
    for chunk in data.chunks(STORED_MAX) {
        let len = chunk.len() as u16;
        out.push(0x00); // BFINAL 0, BTYPE 00, padding to the byte boundary
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
}

/// [`ws::write_head`] for a compressed message's (first and only) frame: FIN and RSV1 set.
pub fn write_head(out: &mut [u8; 10], opcode: Opcode, len: usize) -> usize {
    let n = ws::write_head(out, true, opcode, len);
    out[0] |= super::RSV1;
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::deflate::Inflater;
    use proptest::prelude::*;

    /// Inflates a payload with miniz_oxide, an implementation independent of zlib-rs: the
    /// RFC 7692 tail, then a final empty stored block to end the stream.
    fn miniz_inflate(payload: &[u8]) -> Vec<u8> {
        let mut s = payload.to_vec();
        s.extend_from_slice(&[0x00, 0x00, 0xff, 0xff, 0x01, 0x00, 0x00, 0xff, 0xff]);
        miniz_oxide::inflate::decompress_to_vec(&s).unwrap()
    }

    fn ours(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        Inflater::new().inflate(payload, 1 << 24, &mut out).unwrap();
        out
    }

    /// JSON-ish text that compresses well and has matches far apart.
    fn text(len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 64);
        let mut i = 0u64;
        while v.len() < len {
            v.extend_from_slice(format!("{{\"n\":{i},\"topic\":\"{:x}\"}},", i * 7919).as_bytes());
            i += 1;
        }
        v.truncate(len);
        v
    }

    #[test]
    fn compresses_and_real_inflaters_agree() {
        let mut d = Deflater::new();
        let mut z = Vec::new();
        for msg in [text(256), text(5000), text(200_000)] {
            assert!(d.compress(&msg, 15, &mut z), "len {}", msg.len());
            assert!(z.len() < msg.len());
            assert_eq!(ours(&z), msg);
            assert_eq!(miniz_inflate(&z), msg);
        }
    }

    #[test]
    fn short_or_incompressible_messages_go_uncompressed() {
        let mut d = Deflater::new();
        let mut z = Vec::new();
        assert!(!d.compress(&text(MIN_COMPRESS - 1), 15, &mut z));
        let mut seed = 7u64;
        let random: Vec<u8> = (0..4096)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 56) as u8
            })
            .collect();
        assert!(!d.compress(&random, 15, &mut z));
        // The compressor is usable afterwards.
        assert!(d.compress(&text(1000), 15, &mut z));
        assert_eq!(ours(&z), text(1000));
    }

    #[test]
    fn push_payload_decodes_to_prefix_data_suffix() {
        let prefix = br#"{"id":1637012345678901,"jsonrpc":"2.0","method":"waku_subscription","params":{"id":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","data":"#;
        let data = text(600);
        let suffix = b"}}";
        let mut d = Deflater::new();
        let shared = compress_shared(&mut d, &data, suffix).unwrap();
        let mut whole = prefix.to_vec();
        whole.extend_from_slice(&data);
        whole.extend_from_slice(suffix);
        let mut payload = Vec::new();
        push_payload(prefix, &shared, &mut payload);
        assert_eq!(payload.len(), 5 + prefix.len() + shared.len());
        assert_eq!(ours(&payload), whole);
        assert_eq!(miniz_inflate(&payload), whole);
        // The frame: FIN + RSV1 + text, 16-bit length, then exactly that payload.
        let mut frame = Vec::new();
        push_head(prefix, &shared, &mut frame);
        frame.extend_from_slice(&shared);
        assert_eq!(frame[0], 0xC1);
        assert_eq!(frame[1], 126);
        assert_eq!(
            u16::from_be_bytes([frame[2], frame[3]]) as usize,
            payload.len()
        );
        assert_eq!(&frame[4..], &payload[..]);
    }

    #[test]
    fn long_prefix_spans_several_stored_blocks() {
        let prefix = text(150_000);
        let mut d = Deflater::new();
        let shared = compress_shared(&mut d, &text(1000), b"}").unwrap();
        let mut payload = Vec::new();
        push_payload(&prefix, &shared, &mut payload);
        let mut frame = Vec::new();
        push_head(&prefix, &shared, &mut frame);
        assert_eq!(frame.len(), 10 + 3 * 5 + prefix.len());
        let mut whole = prefix.clone();
        whole.extend_from_slice(&text(1000));
        whole.push(b'}');
        assert_eq!(ours(&payload), whole);
        // And an empty prefix adds no block at all.
        payload.clear();
        push_payload(b"", &shared, &mut payload);
        assert_eq!(payload, &shared[..]);
    }

    #[test]
    fn small_windows_are_honoured() {
        let mut d = Deflater::new();
        let mut z = Vec::new();
        let msg = text(100_000);
        for bits in 9..=15u8 {
            assert!(d.compress(&msg, bits, &mut z));
            // An inflater with exactly that window refuses any distance beyond it.
            let mut inf = flate2::Decompress::new_with_window_bits(false, bits);
            let mut out = Vec::with_capacity(msg.len() + 16);
            z.extend_from_slice(&[0x00, 0x00, 0xff, 0xff]);
            inf.decompress_vec(&z, &mut out, flate2::FlushDecompress::Sync)
                .unwrap_or_else(|e| panic!("window {bits}: {e}"));
            assert_eq!(out, msg, "window {bits}");
        }
        // A message within the client's window shares the 15-bit form.
        let mut d = Deflater::new();
        let (data, suffix) = (text(400), &b"}}"[..]);
        let mut s = Shared::new(ArcBuf::from(data.clone()), Bytes::copy_from_slice(suffix));
        let a = s.get(&mut d, 9).unwrap().clone();
        let b = s.get(&mut d, 15).unwrap().clone();
        assert_eq!(a.as_ptr(), b.as_ptr());
        // A longer one gets its own form for the small window.
        let data = text(5000);
        let mut s = Shared::new(ArcBuf::from(data.clone()), Bytes::copy_from_slice(suffix));
        let a = s.get(&mut d, 9).unwrap().clone();
        let b = s.get(&mut d, 15).unwrap().clone();
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert_eq!(format!("{d:?}"), "Deflater { windows: [9, 15] }");
    }

    #[test]
    fn window_bits_out_of_range_are_clamped_not_a_panic() {
        let mut d = Deflater::new();
        let mut z = Vec::new();
        let msg = text(3000);
        for bits in [0u8, 8, 16, 64, 255] {
            assert!(d.compress(&msg, bits, &mut z), "bits {bits}");
            assert_eq!(ours(&z), msg);
            let data = text(3000);
            assert!(
                Shared::new(ArcBuf::from(data.clone()), Bytes::from_static(b""))
                    .get(&mut d, bits)
                    .is_some()
            );
        }
    }

    #[test]
    fn shared_is_made_once_and_not_for_short_pushes() {
        let mut d = Deflater::new();
        let data = text(10);
        let mut s = Shared::new(ArcBuf::from(data.clone()), Bytes::from_static(b"}}"));
        assert!(s.get(&mut d, 15).is_none());
        assert_eq!(format!("{d:?}"), "Deflater { windows: [] }");
        let data = text(1000);
        let mut s = Shared::new(ArcBuf::from(data.clone()), Bytes::from_static(b"}}"));
        let a = s.get(&mut d, 15).unwrap().as_ptr();
        assert_eq!(s.get(&mut d, 15).unwrap().as_ptr(), a);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_message_round_trips(
            msg in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..3000),
                proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'{'), Just(b'"'), any::<u8>()], 0..8_000),
            ],
            bits in 9u8..=15,
        ) {
            let mut d = Deflater::new();
            let mut z = Vec::new();
            if d.compress(&msg, bits, &mut z) {
                prop_assert!(z.len() < msg.len());
                prop_assert_eq!(ours(&z), msg);
            }
        }

        #[test]
        fn any_push_composes(
            prefix in proptest::collection::vec(any::<u8>(), 0..300),
            data in proptest::collection::vec(prop_oneof![Just(b'0'), Just(b'f'), any::<u8>()], 0..3000),
            suffix in proptest::collection::vec(any::<u8>(), 0..5),
        ) {
            let mut d = Deflater::new();
            if let Some(shared) = compress_shared(&mut d, &data, &suffix) {
                let mut payload = Vec::new();
                push_payload(&prefix, &shared, &mut payload);
                let mut whole = prefix.clone();
                whole.extend_from_slice(&data);
                whole.extend_from_slice(&suffix);
                prop_assert_eq!(ours(&payload), whole.clone());
                prop_assert_eq!(miniz_inflate(&payload), whole);
            }
        }
    }
}
