//! The byte-level work of the fast path's scanner: how far a string runs without a byte
//! that needs a closer look (SSE2, or AVX2 where the CPU has it), and integers read eight
//! digits at a time. No JSON here: `fast` decides what the bytes mean.

/// The eight bytes of `x` (the first in its lowest byte) are all ASCII digits: every byte's
/// high nibble is 3, and adding 6 leaves it 3 (`0`-`9`, not `:`-`?`).
#[inline(always)]
pub(super) fn eight_digits(x: u64) -> bool {
    const HIGH: u64 = 0xf0f0_f0f0_f0f0_f0f0;
    (x & HIGH) | ((x.wrapping_add(0x0606_0606_0606_0606) & HIGH) >> 4) == 0x3333_3333_3333_3333
}

/// How many of the bytes of `x` from its lowest are ASCII digits, before the first that is
/// not (0 to 8): the test of [`eight_digits`] byte by byte, the first failure found by one
/// bit scan.
#[inline(always)]
pub(super) fn leading_digits(x: u64) -> usize {
    const HIGH: u64 = 0xf0f0_f0f0_f0f0_f0f0;
    let t = (x & HIGH) | ((x.wrapping_add(0x0606_0606_0606_0606) & HIGH) >> 4);
    ((t ^ 0x3333_3333_3333_3333).trailing_zeros() / 8) as usize
}

/// Powers of ten up to the eighth (one digit to eight more).
pub(super) const POW10: [u64; 9] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
];

/// The value of eight ASCII digits (see [`eight_digits`]), the first the most significant:
/// pairs, then fours, then all eight combined by three multiplications.
#[inline(always)]
pub(super) fn eight_digits_value(x: u64) -> u64 {
    let x = (x & 0x0f0f_0f0f_0f0f_0f0f).wrapping_mul(2561) >> 8;
    let x = (x & 0x00ff_00ff_00ff_00ff).wrapping_mul(6_553_601) >> 16;
    (x & 0x0000_ffff_0000_ffff).wrapping_mul(42_949_672_960_001) >> 32
}

/// A byte a string of the usual shape holds as it is: printable ASCII (and DEL) but the
/// quote and the backslash.
#[cfg(any(test, not(all(target_arch = "x86_64", target_feature = "sse2"))))]
#[inline(always)]
pub(super) fn plain(b: u8) -> bool {
    (0x20..0x80).contains(&b) && b != b'"' && b != b'\\'
}

/// How many bytes at the start of `s` are [`plain`]: on x86-64 32 at a time with AVX2 where
/// the CPU has it (a publish's message is most of its bytes: half the blocks of SSE2's),
/// else 16 at a time with SSE2 (part of the x86-64 baseline); a few instructions per block
/// and the end found by one bit scan.
#[inline]
pub(super) fn plain_len(s: &[u8]) -> usize {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `plain_len_avx2` only needs AVX2, which this CPU has (checked above).
            return unsafe { plain_len_avx2(s) };
        }
        // SAFETY: `plain_len_sse2` only needs SSE2, which this build targets (the `cfg`).
        unsafe { plain_len_sse2(s) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    plain_len_bytewise(s)
}

/// [`plain_len`] with AVX2: whole blocks of 32, then the last 32 bytes of `s` (see
/// [`in_last`]); a slice shorter than 32 with SSE2.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "avx2")]
fn plain_len_avx2(s: &[u8]) -> usize {
    let (blocks, tail) = s.as_chunks::<32>();
    let mut at = 0;
    for block in blocks {
        let stops = stops_avx2(block);
        if stops != 0 {
            return at + stops.trailing_zeros() as usize;
        }
        at += 32;
    }
    match s.last_chunk::<32>() {
        Some(last) => at + in_last(stops_avx2(last), 32, tail.len()),
        None => at + plain_len_sse2(tail),
    }
}

/// A bit for each byte of `block` that is not [`plain`], the first byte's the lowest.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "avx2")]
#[inline]
fn stops_avx2(block: &[u8; 32]) -> u32 {
    use std::arch::x86_64::{
        _mm256_cmpeq_epi8, _mm256_cmpgt_epi8, _mm256_movemask_epi8, _mm256_or_si256,
        _mm256_set1_epi8, _mm256_set_epi64x,
    };
    let [a, b, c, d] = [0, 8, 16, 24].map(|o| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&block[o..o + 8]);
        i64::from_le_bytes(w)
    });
    let v = _mm256_set_epi64x(d, c, b, a);
    // Signed: below 0x20 are the control characters and every byte from 0x80.
    let stop = _mm256_or_si256(
        _mm256_or_si256(
            _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'"' as i8)),
            _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8)),
        ),
        _mm256_cmpgt_epi8(_mm256_set1_epi8(0x20), v),
    );
    _mm256_movemask_epi8(stop) as u32
}

/// How many of the last `tail` bytes of a slice are plain, given `stops` for its last
/// `width` bytes (`tail` < `width`): the bytes before the tail were found plain already,
/// so only the tail's bits count, and a tail with no stop is plain to its end. The last
/// block of the slice is read where it lies, not copied into a padded block: a wide load of
/// bytes just stored in pieces waits for the stores (a store-forwarding stall), and the
/// message, the last string of the usual publish, would pay it on every publish.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn in_last(stops: u32, width: usize, tail: usize) -> usize {
    ((u64::from(stops) >> (width - tail)) | (1 << tail)).trailing_zeros() as usize
}

/// [`plain_len`] with SSE2: whole blocks of 16, then the last 16 bytes of `s` (see
/// [`in_last`]); a slice shorter than 16 is copied into a block padded with NULs, which
/// stop.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
pub(super) fn plain_len_sse2(s: &[u8]) -> usize {
    let (blocks, tail) = s.as_chunks::<16>();
    let mut at = 0;
    for block in blocks {
        let stops = stops_sse2(block);
        if stops != 0 {
            return at + stops.trailing_zeros() as usize;
        }
        at += 16;
    }
    if let Some(last) = s.last_chunk::<16>() {
        return at + in_last(stops_sse2(last), 16, tail.len());
    }
    let mut last = [0u8; 16];
    if let Some(head) = last.get_mut(..tail.len()) {
        head.copy_from_slice(tail);
    }
    at + stops_sse2(&last).trailing_zeros() as usize
}

/// A bit for each byte of `block` that is not [`plain`], the first byte's the lowest.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
#[inline]
fn stops_sse2(block: &[u8; 16]) -> u32 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
        _mm_set_epi64x,
    };
    let x = u128::from_le_bytes(*block);
    let v = _mm_set_epi64x((x >> 64) as i64, x as i64);
    // Signed: below 0x20 are the control characters and every byte from 0x80.
    let stop = _mm_or_si128(
        _mm_or_si128(
            _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
            _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
        ),
        _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)),
    );
    _mm_movemask_epi8(stop) as u32
}

/// `plain_len` a byte at a time (other architectures; the tests' reference).
#[cfg(any(test, not(all(target_arch = "x86_64", target_feature = "sse2"))))]
pub(super) fn plain_len_bytewise(s: &[u8]) -> usize {
    s.iter().position(|&b| !plain(b)).unwrap_or(s.len())
}
