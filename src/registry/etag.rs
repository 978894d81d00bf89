//! Entity tags: the deterministic hashes they are made of and `If-None-Match` matching.
//!
//! A tag must be the same on every core and every run for the same bytes, so the hashes
//! here are fixed functions (no per-process random keys). They are not cryptographic: a
//! collision could only make one client's cache keep a stale copy of a URL whose answer
//! changed, which needs a registry reload to happen at all.

/// Multiplier of the mixing step (FxHash's).
const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// Streaming 64-bit hash of integers and bytes.
#[derive(Debug, Clone, Copy)]
pub struct TagHasher(u64);

impl TagHasher {
    /// Starts from `seed`.
    pub fn new(seed: u64) -> TagHasher {
        TagHasher(seed ^ 0x243F_6A88_85A3_08D3)
    }

    /// Mixes in one word.
    #[inline]
    pub fn word(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
    }

    /// Mixes in bytes (and their length).
    pub fn bytes(&mut self, data: &[u8]) {
        self.word(data.len() as u64);
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(w));
        }
    }

    /// The final, avalanched value.
    pub fn finish(self) -> u64 {
        // MurmurHash3's fmix64.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// An entity tag built without allocating: `"<16 hex digits>"` or `"<16 hex digits>-gz"`.
#[derive(Debug, Clone, Copy)]
pub struct Tag {
    buf: [u8; 21],
    len: usize,
}

impl Tag {
    /// The tag of `hash`, with the `-gz` suffix for a gzip-encoded representation.
    pub fn new(hash: u64, gzip: bool) -> Tag {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 21];
        buf[0] = b'"';
        for (i, b) in buf[1..17].iter_mut().enumerate() {
            *b = HEX[((hash >> (60 - 4 * i)) & 15) as usize];
        }
        let mut len = 17;
        if gzip {
            buf[17..20].copy_from_slice(b"-gz");
            len = 20;
        }
        buf[len] = b'"';
        Tag { buf, len: len + 1 }
    }

    /// The tag as sent, quotes included.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

/// Whether an `If-None-Match` value matches `tag` (quoted). Uses the weak comparison that
/// RFC 9110 prescribes for `If-None-Match`: a `W/` prefix is ignored, `*` matches any tag.
/// Malformed members of the list are skipped.
pub fn if_none_match(header: &[u8], tag: &[u8]) -> bool {
    let mut rest = header;
    loop {
        while let [b' ' | b'\t' | b',', tail @ ..] = rest {
            rest = tail;
        }
        if rest.is_empty() {
            return false;
        }
        if rest[0] == b'*' {
            return true;
        }
        if let Some(t) = rest.strip_prefix(b"W/") {
            rest = t;
        }
        if rest.first() == Some(&b'"') {
            if let Some(end) = rest.iter().skip(1).position(|&b| b == b'"') {
                let (candidate, tail) = rest.split_at(end + 2);
                if candidate == tag {
                    return true;
                }
                rest = tail;
                continue;
            }
            return false;
        }
        // Not an entity tag: skip to the next list member.
        match rest.iter().position(|&b| b == b',') {
            Some(i) => rest = &rest[i..],
            None => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_stable_and_spread() {
        let mut a = TagHasher::new(1);
        a.bytes(b"hello world, this is a test");
        let mut b = TagHasher::new(1);
        b.bytes(b"hello world, this is a tesu");
        let mut c = TagHasher::new(2);
        c.bytes(b"hello world, this is a test");
        assert_ne!(a.finish(), b.finish());
        assert_ne!(a.finish(), c.finish());
        let mut d = TagHasher::new(1);
        d.bytes(b"hello world, this is a test");
        assert_eq!(a.finish(), d.finish());
        assert_eq!(Tag::new(0xab, true).as_bytes(), b"\"00000000000000ab-gz\"");
        assert_eq!(
            Tag::new(0x0123_4567_89ab_cdef, false).as_bytes(),
            b"\"0123456789abcdef\""
        );
    }

    #[test]
    fn matches_if_none_match_lists() {
        let tag = b"\"abc\"";
        assert!(if_none_match(b"\"abc\"", tag));
        assert!(if_none_match(b"W/\"abc\"", tag));
        assert!(if_none_match(b"\"x\", W/\"abc\"", tag));
        assert!(if_none_match(b"*", tag));
        assert!(if_none_match(b"junk, \"abc\"", tag));
        assert!(!if_none_match(b"\"abcd\"", tag));
        assert!(!if_none_match(b"abc", tag));
        assert!(!if_none_match(b"\"abc", tag));
        assert!(!if_none_match(b"", tag));
        assert!(!if_none_match(b"\"x\",,", tag));
    }
}
