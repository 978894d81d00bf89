//! Gzip for registry answers without compressing per request.
//!
//! Fixed bodies are compressed once, whole ([`compress`]). An assembled body (a page, a
//! search result) is built from deflate *fragments*: each entry is compressed once at start,
//! on its own, into raw deflate blocks ending in a sync flush (byte-aligned, not final, no
//! reference outside the fragment). Concatenating fragments is therefore a valid deflate
//! stream; the short variable parts (the `{"count":..` prefix, the commas, the closing `}}`)
//! go in between as stored blocks. The CRC-32 of the gzip trailer is computed over the
//! uncompressed bytes, which are at hand as slices. A page of 100 costs a CRC and a memcpy
//! instead of a deflate run.
//!
//! It owns the byte layout of gzip members and deflate stored blocks; nothing else here
//! knows it.

use std::io::Write;

use flate2::{Compress, Compression, FlushCompress};

/// A gzip member header: no name, no mtime, OS unknown (byte-identical everywhere).
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// Bytes a stored block adds to its content.
const STORED_OVERHEAD: usize = 5;

/// Compresses a whole body into one gzip member at the best level.
pub fn compress(body: &[u8]) -> Vec<u8> {
    let mut enc = flate2::GzBuilder::new()
        .operating_system(0xff)
        .write(Vec::with_capacity(body.len() / 4 + 64), Compression::best());
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(body);
    enc.finish().unwrap_or_default()
}

/// Compresses `data` into a self-contained, byte-aligned, non-final run of raw deflate
/// blocks that can be concatenated with others.
pub fn fragment(data: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::best(), false);
    let mut out = Vec::with_capacity(data.len() + data.len() / 8 + 128);
    for _ in 0..16 {
        let rest = data.get(c.total_in() as usize..).unwrap_or(&[]);
        if c.compress_vec(rest, &mut out, FlushCompress::Sync).is_err() {
            break;
        }
        // The flush is complete once all input is in and it did not fill the buffer.
        if c.total_in() as usize == data.len() && out.len() < out.capacity() {
            return out;
        }
        out.reserve(out.capacity());
    }
    // Not reached with a fresh stream; stored blocks are a valid fragment too.
    stored_blocks(data, false)
}

/// `data` as stored (uncompressed) deflate blocks, the last one final if `last`.
fn stored_blocks(data: &[u8], last: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + STORED_OVERHEAD * (data.len() / 65535 + 1));
    push_stored(&mut out, data, last);
    out
}

/// Appends `data` as stored deflate blocks (at most 65,535 bytes each) at a byte boundary.
pub fn push_stored(out: &mut Vec<u8>, data: &[u8], last: bool) {
    let mut chunks = data.chunks(65535).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[u8::from(last), 0, 0, 0xff, 0xff]);
        return;
    }
    while let Some(c) = chunks.next() {
        let fin = last && chunks.peek().is_none();
        let len = c.len() as u16;
        out.push(u8::from(fin));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(c);
    }
}

/// Size of `push_stored(data)` for `data.len() == n` (n <= 65,535).
pub fn stored_len(n: usize) -> usize {
    n + STORED_OVERHEAD
}

/// Builds one gzip member incrementally: stored blocks and precompressed fragments in,
/// uncompressed bytes accounted for the trailer.
pub struct Member {
    out: Vec<u8>,
    crc: crc32fast::Hasher,
    len: u64,
}

impl Member {
    /// Starts a member; `capacity` is the expected compressed size.
    pub fn new(capacity: usize) -> Member {
        let mut out = Vec::with_capacity(capacity + HEADER.len() + 8);
        out.extend_from_slice(&HEADER);
        Member {
            out,
            crc: crc32fast::Hasher::new(),
            len: 0,
        }
    }

    /// Appends `data` uncompressed (a stored block).
    pub fn stored(&mut self, data: &[u8]) {
        push_stored(&mut self.out, data, false);
        self.plain(data);
    }

    /// Appends a fragment made by [`fragment`] whose uncompressed bytes are `plain`.
    pub fn fragment(&mut self, frag: &[u8], plain: &[u8]) {
        self.out.extend_from_slice(frag);
        self.plain(plain);
    }

    /// Accounts for uncompressed bytes whose compressed form was appended separately.
    pub fn plain(&mut self, plain: &[u8]) {
        self.crc.update(plain);
        self.len += plain.len() as u64;
    }

    /// Appends `data` as the final stored block and the trailer.
    pub fn finish(mut self, data: &[u8]) -> Vec<u8> {
        push_stored(&mut self.out, data, true);
        self.plain(data);
        self.out
            .extend_from_slice(&self.crc.finalize().to_le_bytes());
        self.out.extend_from_slice(&(self.len as u32).to_le_bytes());
        self.out
    }
}

/// Compressed size of a member holding `stored` bytes in stored blocks (each < 64 KiB, given
/// as their count and total) and `fragments` bytes of fragments, with a final stored block
/// of `last` bytes.
pub fn member_len(
    stored_blocks: usize,
    stored_bytes: usize,
    fragments: usize,
    last: usize,
) -> usize {
    HEADER.len() + stored_blocks * STORED_OVERHEAD + stored_bytes + fragments + stored_len(last) + 8
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gunzip(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(b)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn whole_body_round_trips() {
        let body = br#"{"a":"b","c":"dddddddddddddddddddddddddddddddddddd"}"#.repeat(50);
        let gz = compress(&body);
        assert!(gz.len() < body.len() / 5);
        assert_eq!(gunzip(&gz), body);
        assert_eq!(compress(&body), gz, "deterministic");
    }

    #[test]
    fn fragments_concatenate_into_a_valid_member() {
        let parts: Vec<Vec<u8>> = (0..50)
            .map(|i| {
                format!(
                    "\"{i:064x}\":{{\"name\":\"n{i}\",\"x\":\"{}\"}}",
                    "y".repeat(i)
                )
                .into_bytes()
            })
            .collect();
        let frags: Vec<Vec<u8>> = parts.iter().map(|p| fragment(p)).collect();
        let mut m = Member::new(0);
        m.stored(b"{\"listings\":{");
        let mut want = b"{\"listings\":{".to_vec();
        for (i, (p, f)) in parts.iter().zip(&frags).enumerate() {
            if i > 0 {
                m.stored(b",");
                want.push(b',');
            }
            m.fragment(f, p);
            want.extend_from_slice(p);
        }
        let gz = m.finish(b"}}");
        want.extend_from_slice(b"}}");
        assert_eq!(gunzip(&gz), want);
        serde_json::from_slice::<serde_json::Value>(&want).unwrap();
    }

    #[test]
    fn empty_and_large_stored_blocks() {
        let mut m = Member::new(0);
        m.stored(b"");
        let big = vec![b'x'; 200_000];
        m.stored(&big);
        m.fragment(&fragment(b""), b"");
        let gz = m.finish(b"");
        assert_eq!(gunzip(&gz), big);
    }

    #[test]
    fn member_len_predicts_size() {
        let f = fragment(b"hello hello hello hello");
        let mut m = Member::new(0);
        m.stored(b"abc");
        m.stored(b",");
        m.fragment(&f, b"hello hello hello hello");
        let gz = m.finish(b"}}");
        assert_eq!(gz.len(), member_len(2, 4, f.len(), 2));
    }
}
