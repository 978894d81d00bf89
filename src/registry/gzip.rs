//! Gzip for registry answers without compressing per request.
//!
//! Fixed bodies are compressed once, whole ([`compress`]). An assembled body (a page, a
//! search result) is built from deflate *fragments* made once at start ([`Fragmenter`]):
//! raw deflate blocks ending in a sync flush (byte-aligned, not final), so concatenating
//! fragments gives a valid deflate stream. Two kinds:
//! - a *standalone* fragment of an entry references nothing outside itself; it can follow
//!   anything;
//! - a *chained* fragment of `,<entry>` is compressed with the previous entry of its list as
//!   preset dictionary, so it may copy from it; it is valid only right after that entry
//!   (where the decoder's window holds the same bytes), which is where it goes in a page of
//!   consecutive entries. Neighbouring entries share most of their keys and URL prefixes,
//!   so chained pages compress nearly as well as a whole-body gzip.
//!
//! The short variable parts (the `{"count":..` prefix, a comma before a standalone
//! fragment, the closing `}}`) go in between as stored blocks. The CRC-32 of the gzip
//! trailer is not computed over the uncompressed bytes: the caller gives, for each run of
//! fragments, a [`Span`] combined from CRCs precomputed at the ends of its uncompressed
//! bytes ([`super::crc`]). A page of 100 costs a memcpy of fragments and a few
//! multiplications, instead of a deflate run or a pass over the ~90 KB it stands for.
//!
//! It owns the byte layout of gzip members and deflate stored blocks; nothing else here
//! knows it.

use std::io::Write;

use flate2::{Compress, Compression, FlushCompress};

use super::crc::{self, Span};

/// A gzip member header: no name, no mtime, OS unknown (byte-identical everywhere).
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// Bytes a stored block adds to its content.
const STORED_OVERHEAD: usize = 5;

/// Bodies up to this size are compressed at the best level, larger ones at the default
/// (a 100,000-entry registry would otherwise take seconds longer to start).
const BEST_LEVEL_MAX: usize = 4 << 20;

/// Level of fragments: on entries of a few hundred bytes, higher levels gain nothing.
const FRAGMENT_LEVEL: u32 = 6;

/// Compresses a whole body into one gzip member.
pub fn compress(body: &[u8]) -> Vec<u8> {
    let level = if body.len() <= BEST_LEVEL_MAX {
        Compression::best()
    } else {
        Compression::default()
    };
    let mut enc = flate2::GzBuilder::new()
        .operating_system(0xff)
        .write(Vec::with_capacity(body.len() / 4 + 64), level);
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(body);
    enc.finish().unwrap_or_default()
}

/// Makes fragments, reusing one compressor. Each call appends at least one byte (a fragment
/// of nothing is an empty stored block), so an empty fragment means none was made.
pub struct Fragmenter {
    c: Compress,
    out: Vec<u8>,
}

impl Default for Fragmenter {
    fn default() -> Self {
        Fragmenter {
            c: Compress::new(Compression::new(FRAGMENT_LEVEL), false),
            out: Vec::new(),
        }
    }
}

impl Fragmenter {
    /// Appends to `dst` a standalone fragment of `data`.
    pub fn standalone(&mut self, data: &[u8], dst: &mut Vec<u8>) {
        self.c.reset();
        self.out.clear();
        if self.feed(data) && !self.out.is_empty() {
            dst.extend_from_slice(&self.out);
        } else {
            push_stored(dst, data, false);
        }
    }

    /// Appends to `dst` a fragment of `data` that is valid only right after `primer` in the
    /// uncompressed stream.
    pub fn chained(&mut self, primer: &[u8], data: &[u8], dst: &mut Vec<u8>) {
        self.c.reset();
        self.out.clear();
        // The window only reaches back 32 KiB; a longer primer would be wasted work.
        let primer = primer
            .get(primer.len().saturating_sub(32 << 10)..)
            .unwrap_or(primer);
        if self.c.set_dictionary(primer).is_ok() && self.feed(data) && !self.out.is_empty() {
            dst.extend_from_slice(&self.out);
        } else {
            push_stored(dst, data, false);
        }
    }

    /// Compresses `data` and sync-flushes into `self.out`; false if the compressor failed.
    fn feed(&mut self, data: &[u8]) -> bool {
        let base = self.c.total_in();
        self.out.reserve(data.len() + data.len() / 8 + 128);
        for _ in 0..32 {
            let done = (self.c.total_in() - base) as usize;
            let rest = data.get(done..).unwrap_or(&[]);
            if self
                .c
                .compress_vec(rest, &mut self.out, FlushCompress::Sync)
                .is_err()
            {
                return false;
            }
            // The flush is complete once all input is in and it did not fill the buffer.
            if (self.c.total_in() - base) as usize == data.len()
                && self.out.len() < self.out.capacity()
            {
                return true;
            }
            self.out.reserve(self.out.capacity().max(1024));
        }
        false
    }
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
    crc: u32,
    len: u64,
}

impl Member {
    /// Starts a member; `capacity` is the expected compressed size.
    pub fn new(capacity: usize) -> Member {
        let mut out = Vec::with_capacity(capacity + HEADER.len() + 8);
        out.extend_from_slice(&HEADER);
        Member {
            out,
            crc: 0,
            len: 0,
        }
    }

    /// Appends `data` uncompressed (a stored block; its CRC is computed from its bytes).
    pub fn stored(&mut self, data: &[u8]) {
        push_stored(&mut self.out, data, false);
        self.crc = crc::update(self.crc, data);
        self.len += data.len() as u64;
    }

    /// Appends fragments made by [`Fragmenter`]; their uncompressed bytes are accounted for
    /// with [`Member::plain`].
    pub fn fragments(&mut self, frags: &[u8]) {
        self.out.extend_from_slice(frags);
    }

    /// Accounts for uncompressed bytes whose compressed form was appended separately.
    pub fn plain(&mut self, span: &Span) {
        self.crc = span.apply(self.crc);
        self.len += span.len();
    }

    /// Appends `data` as the final stored block and the trailer.
    pub fn finish(mut self, data: &[u8]) -> Vec<u8> {
        push_stored(&mut self.out, data, true);
        self.crc = crc::update(self.crc, data);
        self.len += data.len() as u64;
        self.out.extend_from_slice(&self.crc.to_le_bytes());
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
    use super::super::test_gzip::gunzip;
    use super::*;

    /// Appends a fragment whose uncompressed bytes are `plain`.
    fn fragment(m: &mut Member, frag: &[u8], plain: &[u8]) {
        m.fragments(frag);
        m.plain(&Span::of(plain));
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
        let mut f = Fragmenter::default();
        let frags: Vec<Vec<u8>> = parts
            .iter()
            .map(|p| {
                let mut v = Vec::new();
                f.standalone(p, &mut v);
                v
            })
            .collect();
        let mut m = Member::new(0);
        m.stored(b"{\"listings\":{");
        let mut want = b"{\"listings\":{".to_vec();
        for (i, (p, f)) in parts.iter().zip(&frags).enumerate() {
            if i > 0 {
                m.stored(b",");
                want.push(b',');
            }
            fragment(&mut m, f, p);
            want.extend_from_slice(p);
        }
        let gz = m.finish(b"}}");
        want.extend_from_slice(b"}}");
        assert_eq!(gunzip(&gz), want);
        serde_json::from_slice::<serde_json::Value>(&want).unwrap();
        // Chained fragments: each copies from the one before, and the stream shrinks.
        let mut m = Member::new(0);
        m.stored(b"[");
        fragment(&mut m, &frags[0], &parts[0]);
        let mut want = [b"[", &parts[0][..]].concat();
        let mut chained_len = 0;
        for w in parts.windows(2) {
            let data = [b",", &w[1][..]].concat();
            let mut c = Vec::new();
            f.chained(&w[0], &data, &mut c);
            chained_len += c.len();
            fragment(&mut m, &c, &data);
            want.extend_from_slice(&data);
        }
        let gz = m.finish(b"]");
        want.push(b']');
        assert_eq!(gunzip(&gz), want);
        assert!(chained_len < frags[1..].iter().map(Vec::len).sum::<usize>());
        // A standalone fragment made after chained ones references nothing before it.
        let mut alone = Vec::new();
        f.standalone(&parts[7], &mut alone);
        assert_eq!(alone, frags[7]);
        let mut m = Member::new(0);
        fragment(&mut m, &alone, &parts[7]);
        assert_eq!(gunzip(&m.finish(b"")), parts[7]);
    }

    #[test]
    fn empty_and_large_stored_blocks() {
        let mut m = Member::new(0);
        m.stored(b"");
        let big = vec![b'x'; 200_000];
        m.stored(&big);
        let mut f = Vec::new();
        Fragmenter::default().standalone(b"", &mut f);
        fragment(&mut m, &f, b"");
        let gz = m.finish(b"");
        assert_eq!(gunzip(&gz), big);
    }

    #[test]
    fn member_len_predicts_size() {
        let mut f = Vec::new();
        Fragmenter::default().standalone(b"hello hello hello hello", &mut f);
        let mut m = Member::new(0);
        m.stored(b"abc");
        m.stored(b",");
        fragment(&mut m, &f, b"hello hello hello hello");
        let gz = m.finish(b"}}");
        assert_eq!(gz.len(), member_len(2, 4, f.len(), 2));
    }
}
