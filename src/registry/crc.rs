//! CRC-32 of concatenated pieces without reading their bytes again.
//!
//! Gzip's CRC-32 (reflected, polynomial `0xEDB88320`) is arithmetic on polynomials over
//! GF(2) modulo P: reading `n` more bytes multiplies the register by x^(8n) mod P and adds
//! the CRC of those bytes. So `crc(A ‖ B) = crc(A)·x^(8·|B|) ⊕ crc(B)` with the usual
//! initial value and final xor (they cancel out), which is zlib's `crc32_combine_op`.
//!
//! An assembled answer is slices of one precomputed body. A [`Mark`] at an offset `o` of that
//! body keeps `crc(body[..o])`, x^(8o) and x^(-8o); from the marks at both ends of a slice
//! [`Span::between`] gives the slice's effect on a running CRC with one multiplication, and
//! [`Span::apply`] applies it with one more, however long the slice. A multiplication is a
//! software carry-less product (integer multiplications on bits four apart) reduced with four
//! table lookups. It knows nothing of gzip or of the registry.

/// The polynomial, reflected (bit 31 is x^0), without its x^32 term.
const POLY: u32 = 0xEDB8_8320;

/// The polynomial 1.
const ONE: u32 = 1 << 31;

/// x^-1 mod P: P = x·Q + 1, so x·Q ≡ 1 and x^-1 = Q = (P - 1) / x.
const X_INV: u32 = (POLY << 1) | 1;

/// `REDUCE[k][b]`: the byte `b`, as the coefficients of x^(32+8k)..x^(39+8k) (bit 0 the
/// highest), reduced mod P; `REDUCE[0]` is the classic byte-at-a-time CRC table.
const REDUCE: [[u32; 256]; 4] = {
    let mut t = [[0u32; 256]; 4];
    let mut b = 0;
    while b < 256 {
        let mut c = b as u32;
        let mut i = 0;
        while i < 8 {
            c = if c & 1 == 1 { (c >> 1) ^ POLY } else { c >> 1 };
            i += 1;
        }
        t[0][b] = c;
        b += 1;
    }
    let mut k = 1;
    while k < 4 {
        let mut b = 0;
        while b < 256 {
            let c = t[k - 1][b];
            t[k][b] = t[0][(c & 0xff) as usize] ^ (c >> 8);
            b += 1;
        }
        k += 1;
    }
    t
};

/// `POW[k]` = x^(2^k) mod P and `INV[k]` = x^(-2^k) mod P, for k < 64.
const POW: [u32; 64] = squares(1 << 30);
const INV: [u32; 64] = squares(X_INV);

const fn squares(mut p: u32) -> [u32; 64] {
    let mut t = [0; 64];
    let mut k = 0;
    while k < 64 {
        t[k] = p;
        p = mul_slow(p, p);
        k += 1;
    }
    t
}

/// `a·b mod P`, one bit at a time (zlib's `multmodp`): for the tables and as the reference
/// of [`mul`] in tests.
const fn mul_slow(a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    let mut m = ONE;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        b = if b & 1 == 1 { (b >> 1) ^ POLY } else { b >> 1 };
        m >>= 1;
    }
    p
}

/// Carry-less product of two 32-bit words. Integer products of words whose set bits are
/// four apart: each of the 16 has at most 8 terms per bit position, so the carries stay in
/// the three bits above, which the final masks drop (BearSSL's `bmul32`).
fn clmul(x: u32, y: u32) -> u64 {
    const M: [u64; 4] = [0x1111_1111, 0x2222_2222, 0x4444_4444, 0x8888_8888];
    let (x, y) = (u64::from(x), u64::from(y));
    let [x0, x1, x2, x3] = M.map(|m| x & m);
    let [y0, y1, y2, y3] = M.map(|m| y & m);
    let z0 = (x0 * y0) ^ (x1 * y3) ^ (x2 * y2) ^ (x3 * y1);
    let z1 = (x0 * y1) ^ (x1 * y0) ^ (x2 * y3) ^ (x3 * y2);
    let z2 = (x0 * y2) ^ (x1 * y1) ^ (x2 * y0) ^ (x3 * y3);
    let z3 = (x0 * y3) ^ (x1 * y2) ^ (x2 * y1) ^ (x3 * y0);
    (z0 & 0x1111_1111_1111_1111)
        | (z1 & 0x2222_2222_2222_2222)
        | (z2 & 0x4444_4444_4444_4444)
        | (z3 & 0x8888_8888_8888_8888)
}

/// `a·b mod P`.
pub fn mul(a: u32, b: u32) -> u32 {
    // Reflected, the product's bit 63 - d holds x^d: the high word is x^0..x^31, the low
    // word x^32..x^63, reduced a byte at a time.
    let p = clmul(a, b) << 1;
    let [b0, b1, b2, b3] = (p as u32).to_le_bytes().map(usize::from);
    let [r0, r1, r2, r3] = &REDUCE;
    (p >> 32) as u32 ^ r3[b0] ^ r2[b1] ^ r1[b2] ^ r0[b3]
}

/// x^(8n) mod P: the factor by which appending `n` bytes multiplies a CRC (zlib's
/// `crc32_combine_gen`).
pub fn shift(n: u64) -> u32 {
    power(&POW, n)
}

/// x^(-8n) mod P, the inverse of [`shift`]`(n)`.
fn unshift(n: u64) -> u32 {
    power(&INV, n)
}

/// The product of `table[k]` over the bits k of `8n`.
fn power(table: &[u32; 64], n: u64) -> u32 {
    let mut p = ONE;
    let mut n = n;
    // 8n: start at x^(±8) = table[3]; a length never reaches 2^61.
    for &t in table.iter().skip(3) {
        if n == 0 {
            break;
        }
        if n & 1 == 1 {
            p = mul(p, t);
        }
        n >>= 1;
    }
    p
}

/// `crc(A ‖ B)` from `crc(A)`, `crc(B)` and [`shift`]`(|B|)` (zlib's `crc32_combine_op`).
pub fn combine(crc_a: u32, crc_b: u32, shift_b: u32) -> u32 {
    mul(crc_a, shift_b) ^ crc_b
}

/// `crc(A ‖ data)` from `crc(A)`, reading `data` (for the few bytes written per request:
/// a byte at a time up to 64, where setting up `crc32fast` costs more).
pub fn update(crc: u32, data: &[u8]) -> u32 {
    if data.len() > 64 {
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(data);
        return h.finalize();
    }
    let [table, ..] = &REDUCE;
    !data
        .iter()
        .fold(!crc, |c, &b| table[usize::from(c as u8 ^ b)] ^ (c >> 8))
}

/// What a body's CRC is at one offset `o`: `crc(body[..o])`, x^(8o) and x^(-8o).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    off: u64,
    crc: u32,
    pow: u32,
    inv: u32,
}

impl Mark {
    /// The marks of `body` at `offsets` (ascending, at most `body.len()`), in one pass over
    /// the body. An offset below the one before it is taken as that one, one past the end as
    /// the end.
    pub fn at(body: &[u8], offsets: impl IntoIterator<Item = usize>) -> Vec<Mark> {
        let mut h = crc32fast::Hasher::new();
        let mut m = Mark {
            off: 0,
            crc: 0,
            pow: ONE,
            inv: ONE,
        };
        let mut done = 0;
        offsets
            .into_iter()
            .map(|o| {
                let o = o.clamp(done, body.len());
                h.update(body.get(done..o).unwrap_or(&[]));
                let d = (o - done) as u64;
                done = o;
                m = Mark {
                    off: o as u64,
                    crc: h.clone().finalize(),
                    pow: mul(m.pow, shift(d)),
                    inv: mul(m.inv, unshift(d)),
                };
                m
            })
            .collect()
    }
}

/// The effect of a known byte string on a running CRC (and length), without its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    from: u32,
    to: u32,
    shift: u32,
    len: u64,
}

impl Span {
    /// No bytes.
    pub const EMPTY: Span = Span {
        from: 0,
        to: 0,
        shift: ONE,
        len: 0,
    };

    /// The bytes between two marks of one body (`a` first; an empty span otherwise).
    pub fn between(a: &Mark, b: &Mark) -> Span {
        if b.off < a.off {
            return Span::EMPTY;
        }
        // body[a..b] turns a running crc c into (c ⊕ crc[..a])·x^(8(b-a)) ⊕ crc[..b]: the
        // register after `..b` is the one after `..a` times x^(8(b-a)) plus the slice's own.
        Span {
            from: a.crc,
            to: b.crc,
            shift: mul(b.pow, a.inv),
            len: b.off - a.off,
        }
    }

    /// The bytes of `data` (reads them).
    #[cfg(test)]
    pub fn of(data: &[u8]) -> Span {
        Span {
            from: 0,
            to: crc32fast::hash(data),
            shift: shift(data.len() as u64),
            len: data.len() as u64,
        }
    }

    /// The number of bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// `crc(A ‖ these bytes)` from `crc(A)`.
    pub fn apply(&self, crc: u32) -> u32 {
        combine(crc ^ self.from, self.to, self.shift)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn mul_matches_the_bitwise_reference() {
        let mut rng = super::super::tests::xorshift(0x9E37_79B9_7F4A_7C15);
        let mut next = move || rng() as u32;
        for (a, b) in [(0, 0), (ONE, 0), (u32::MAX, u32::MAX), (ONE, u32::MAX)] {
            assert_eq!(mul(a, b), mul_slow(a, b));
        }
        for _ in 0..100_000 {
            let (a, b) = (next(), next());
            assert_eq!(mul(a, b), mul_slow(a, b), "{a:#x} {b:#x}");
        }
        assert_eq!(mul(X_INV, 1 << 30), ONE, "x^-1·x = 1");
        for k in 0..64 {
            assert_eq!(mul(POW[k], INV[k]), ONE, "k = {k}");
        }
        assert_eq!(shift(0), ONE);
        let data: Vec<u8> = (0..200).map(|_| next() as u8).collect();
        for n in 0..data.len() {
            assert_eq!(update(0, &data[..n]), crc32fast::hash(&data[..n]), "{n}");
            let c = crc32fast::hash(&data[n..]);
            assert_eq!(update(c, &data[..n]), {
                let mut h = crc32fast::Hasher::new_with_initial(c);
                h.update(&data[..n]);
                h.finalize()
            });
        }
        for n in [1u64, 2, 3, 100, 65_535, 91_627, 1 << 40] {
            assert_eq!(mul(shift(n), unshift(n)), ONE);
            assert_eq!(mul(shift(n), shift(n + 3)), shift(2 * n + 3));
        }
    }

    fn pieces() -> impl Strategy<Value = Vec<Vec<u8>>> {
        prop::collection::vec(
            prop_oneof![
                1 => Just(Vec::new()),
                4 => prop::collection::vec(any::<u8>(), 0..300),
            ],
            0..12,
        )
    }

    proptest! {
        #[test]
        fn combined_crc_of_any_subset_in_any_order(
            parts in pieces(),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
        ) {
            // Precomputed once per piece: its CRC and its shift.
            let pre: Vec<(u32, u32)> = parts
                .iter()
                .map(|p| (crc32fast::hash(p), shift(p.len() as u64)))
                .collect();
            let order: Vec<usize> = if parts.is_empty() {
                Vec::new()
            } else {
                picks.iter().map(|i| i.index(parts.len())).collect()
            };
            let mut crc = 0;
            let mut via_span = 0;
            let mut plain = Vec::new();
            for &i in &order {
                crc = combine(crc, pre[i].0, pre[i].1);
                via_span = Span::of(&parts[i]).apply(via_span);
                plain.extend_from_slice(&parts[i]);
            }
            prop_assert_eq!(crc, crc32fast::hash(&plain));
            prop_assert_eq!(via_span, crc);
            prop_assert_eq!(Span::EMPTY, Span::of(b""));
        }

        #[test]
        fn spans_between_marks_continue_any_crc(
            body in prop::collection::vec(any::<u8>(), 0..2000),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
            runs in prop::collection::vec(
                (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
                0..8,
            ),
            lead in prop::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut offs: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
            offs.sort_unstable();
            let marks = Mark::at(&body, offs.iter().copied());
            for (m, &o) in marks.iter().zip(&offs) {
                prop_assert_eq!(m.crc, crc32fast::hash(&body[..o]));
            }
            // Per-request bytes, then slices between marks, as an answer is assembled.
            let mut crc = update(0, &lead);
            let mut plain = lead.clone();
            let mut len = lead.len() as u64;
            if !marks.is_empty() {
                for (a, b) in &runs {
                    let (a, b) = (a.index(marks.len()), b.index(marks.len()));
                    let (a, b) = (a.min(b), a.max(b));
                    let s = Span::between(&marks[a], &marks[b]);
                    crc = s.apply(crc);
                    len += s.len();
                    plain.extend_from_slice(&body[offs[a]..offs[b]]);
                    crc = update(crc, b",");
                    plain.push(b',');
                    len += 1;
                }
            }
            prop_assert_eq!(crc, crc32fast::hash(&plain));
            prop_assert_eq!(len, plain.len() as u64);
        }
    }
}
