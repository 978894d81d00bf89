//! JSON string literals: written fast (the escape check every stored message passes once as
//! it is encoded, `message::Body`, and every answer's strings), and told apart from the rest
//! of JSON text ([`StringState`]: where a byte stands, for scans that must skip strings). A
//! leaf: `rpc`, `message` and `registry` write and scan through it.

/// Appends `s` as a JSON string literal.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    if !needs_escape(s.as_bytes()) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Any byte that JSON requires escaped. Looked at in whole blocks of 64 bytes (16 for a
/// short string), each a few SIMD compares per 16 bytes and one test; a tail shorter than a
/// block is looked at as the string's last whole block, overlapping the one before (a yes/no
/// question does not mind seeing a byte twice). Every stored message not proven plain by
/// its parser is scanned once as it is encoded (`message::Body::encode`), so the scan
/// avoids a byte-by-byte tail.
pub fn needs_escape(b: &[u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if b.len() >= 64 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the function only needs AVX2 to be sound to call, and this CPU has it
        // (checked just above).
        return unsafe { needs_escape_avx2(b) };
    }
    scan(b)
}

/// [`needs_escape`] compiled for AVX2: 32 bytes a compare instead of 16 (the build targets
/// baseline x86-64; `is_x86_feature_detected` decides at run time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn needs_escape_avx2(b: &[u8]) -> bool {
    scan(b)
}

/// [`needs_escape`] for whatever instructions the caller is compiled for.
#[inline(always)]
fn scan(b: &[u8]) -> bool {
    if b.len() >= 64 {
        any_block::<64>(b)
    } else if b.len() >= 16 {
        any_block::<16>(b)
    } else {
        b.iter().any(|&x| escaped(x))
    }
}

/// [`needs_escape`] of `b`, at least `N` bytes long, block by block.
#[inline(always)]
fn any_block<const N: usize>(b: &[u8]) -> bool {
    let (blocks, tail) = b.as_chunks::<N>();
    let last = || {
        let at = b.len().saturating_sub(N);
        b.get(at..).and_then(|l| <&[u8; N]>::try_from(l).ok())
    };
    blocks.iter().any(block) || (!tail.is_empty() && last().is_some_and(block))
}

/// Whether a block holds a byte JSON requires escaped (no branch per byte).
#[inline(always)]
fn block<const N: usize>(c: &[u8; N]) -> bool {
    c.iter().fold(0u8, |a, &x| a | u8::from(escaped(x))) != 0
}

/// A control character, a quote or a backslash. Flipping bit 1 keeps the control
/// characters below 0x20 and moves the quote (0x22), and only it, to 0x20: one comparison
/// for both.
#[inline(always)]
fn escaped(x: u8) -> bool {
    ((x ^ 0x02) <= 0x20) | (x == b'\\')
}

/// Where the bytes of JSON text stand, fed one by one in order: inside a string literal
/// (its two quotes included) or outside. The one walk over strings of the scans that look at
/// the text outside them (the registry's minifier, the parser's nesting bound); `\"` inside
/// a string does not end it. Only meaningful on text whose strings are well formed.
#[derive(Debug, Default, Clone, Copy)]
pub struct StringState {
    /// Inside a string (its opening quote seen, its closing one not yet).
    in_str: bool,
    /// The byte before was a backslash inside a string.
    escaped: bool,
}

impl StringState {
    /// Whether `b`, the text's next byte, belongs to a string literal.
    #[inline(always)]
    pub fn inside(&mut self, b: u8) -> bool {
        if !self.in_str {
            self.in_str = b == b'"';
            return self.in_str;
        }
        if self.escaped {
            self.escaped = false;
        } else if b == b'\\' {
            self.escaped = true;
        } else if b == b'"' {
            self.in_str = false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_bytes_are_told_from_the_rest() {
        let text = br#"{"a\"b\\":["]",1],"c":"\\"}"#;
        let mut st = StringState::default();
        let marks: String = text
            .iter()
            .map(|&b| if st.inside(b) { 's' } else { '.' })
            .collect();
        assert_eq!(marks, ".ssssssss..sss....sss.ssss.");
    }

    #[test]
    fn strings_are_escaped_only_when_needed() {
        for s in [
            "plain",
            "",
            "quote\"",
            "back\\slash",
            "ctl\u{1}",
            "é\u{1F600}",
            &"x".repeat(100),
        ] {
            let mut a = Vec::new();
            write_str(&mut a, s);
            assert_eq!(a, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn an_escape_is_found_wherever_it_is() {
        // Every length around the block sizes, with the byte to escape at every place
        // (first, last, inside the overlapping tail).
        for len in 0..200 {
            let plain = "a".repeat(len);
            // Both the build's own instructions and (where the CPU has them) AVX2.
            assert!(
                !needs_escape(plain.as_bytes()) && !scan(plain.as_bytes()),
                "{len}"
            );
            for at in 0..len {
                for bad in [b'"', b'\\', 0x1f, 0x00] {
                    let mut b = plain.clone().into_bytes();
                    b[at] = bad;
                    assert!(needs_escape(&b) && scan(&b), "{len} {at} {bad}");
                }
            }
        }
        assert!(!needs_escape("é\u{1F600} ~\u{7f}".repeat(20).as_bytes()));
        for x in 0..=255u8 {
            assert_eq!(escaped(x), x < 0x20 || x == b'"' || x == b'\\', "{x}");
        }
    }
}
