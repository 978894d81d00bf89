//! The fast path of [`decode`](super::decode): a scanner for messages of the usual shape,
//! which builds the same wire model (an [`Envelope`]) as the `serde` + `simd-json` parser, or
//! declines (false) so that the general parser runs. The general parser is the reference:
//! for every input this scanner accepts, both give the same model (proven by the
//! differential fuzz target `fuzz/fuzz_targets/rpc_fastpath.rs` and the property tests of
//! `tests/rpc_fastpath.rs`). Member names go through the same table as the `serde` visitors
//! (`wire::Slot`), so that both fill the same fields the same way (last duplicate wins,
//! unknown members dropped once checked to be JSON).
//!
//! The usual shape: one JSON object, possibly with whitespace between tokens, whose strings
//! have no escapes and whose numbers are integers. It is what every client sends: a publish
//! or subscribe (`{"id":…,"jsonrpc":"2.0","method":"irn_publish","params":{…}}` in any member
//! order, with the SDK's extra members such as `correlationId` or `txHashes: [...]`), an
//! acknowledgement of a push (`{"id":…,"jsonrpc":"2.0","result":true}`), a v1 frame.
//!
//! Declined (the general parser decides, valid JSON or not): batches and anything but an
//! object at top level; a backslash anywhere in a string (escapes); a raw control character
//! or invalid UTF-8 in a string; a number with a fraction or an exponent, of more than 19
//! digits, below `-(2^63 - 1)`, with a leading zero, or `-0`; nesting deeper than
//! [`MAX_NEST`]; anything but whitespace after the object. The scanner never answers an
//! error itself, so it cannot turn a valid message into a parse error.

use std::borrow::Cow;

use super::wire::{sub_slot, Elem, Envelope, List, Loose, Params, ParamsField, Slot, MAX_LIST};

mod bytes;

use bytes::{eight_digits, eight_digits_value, leading_digits, plain_len, POW10};

/// Deepest nesting the scanner walks (skipped values included), far below
/// [`MAX_DEPTH`](super::MAX_DEPTH); deeper is the general parser's.
const MAX_NEST: usize = 8;

/// Most digits of a non-negative integer taken here: any 19 digits fit a `u64`.
const MAX_DIGITS: usize = 19;

/// The acknowledgement a client sends for every push, byte for byte as the SDK (and
/// loadtest) write it: `{"id":N,"jsonrpc":"2.0","result":true}`, `N` an integer of 1 to
/// [`MAX_DIGITS`] digits without a leading zero. It is `Item::Ack` for the general parser
/// too (an object with a `result` and no method); recognised here by two comparisons and a digit
/// check, without the member-by-member scan and the model ([`parse`] takes any other
/// acknowledgement). At saturation there is one per delivery.
pub(super) fn is_ack(buf: &[u8]) -> Option<u64> {
    let id = buf
        .strip_prefix(b"{\"id\":")
        .and_then(|r| r.strip_suffix(b",\"jsonrpc\":\"2.0\",\"result\":true}"))?;
    let ok = (1..=MAX_DIGITS).contains(&id.len())
        && id.iter().all(u8::is_ascii_digit)
        && (id.len() == 1 || id.first() != Some(&b'0'));
    // Any 19 digits fit a u64.
    ok.then(|| {
        id.iter()
            .fold(0u64, |n, &d| n.wrapping_mul(10) + u64::from(d - b'0'))
    })
}

/// The members of a request in the order JSON-RPC clients write them (the SDK's
/// `formatJsonRpcRequest`, loadtest, most libraries), each as it appears quoted with its
/// colon: see [`Scan::object_usual`].
const USUAL_TOP: [(&[u8], &str); 4] = [
    (b"\"id\":", "id"),
    (b"\"jsonrpc\":", "jsonrpc"),
    (b"\"method\":", "method"),
    (b"\"params\":", "params"),
];

/// The members of a publish's params in the order the SDK (`Publisher.publish`: `topic`,
/// `message`, `ttl`, `prompt`, `tag`, then its extras) and loadtest write them.
const USUAL_PARAMS: [(&[u8], &str); 5] = [
    (b"\"topic\":", "topic"),
    (b"\"message\":", "message"),
    (b"\"ttl\":", "ttl"),
    (b"\"prompt\":", "prompt"),
    (b"\"tag\":", "tag"),
];

/// Scans `buf` as one message of the usual shape into `e` (an empty
/// [`Envelope::object`], filled where it lies: the model is a few hundred bytes, and moving
/// it costs more than scanning a short message); false when it is not one (`e` is then
/// partly filled and must be dropped). What the general parser gives as `wire::Top::One(e)`.
pub(super) fn parse<'a>(buf: &'a [u8], e: &mut Envelope<'a>) -> bool {
    let mut s = Scan { b: buf, i: 0 };
    s.ws();
    if s.object_usual(1, &USUAL_TOP, |s, key| s.fill(e.slot(key), 2))
        .is_none()
    {
        return false;
    }
    s.ws();
    s.i == buf.len()
}

/// A position in the message.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Skips JSON whitespace.
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// Consumes `c`, which must be next.
    #[inline]
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// Consumes the literal `w`, which must be next.
    fn word(&mut self, w: &[u8]) -> Option<()> {
        (self.b.get(self.i..self.i + w.len())? == w).then(|| self.i += w.len())
    }

    /// An object at nesting `depth`: `member` reads each member's value, given its name.
    fn object(
        &mut self,
        depth: usize,
        mut member: impl FnMut(&mut Self, &'a str) -> Option<()>,
    ) -> Option<()> {
        self.seq([b'{', b'}'], depth, |s| s.named(&mut member))
    }

    /// [`object`](Self::object), quicker when its first members are `usual` (each a quoted
    /// name with its colon, and the name), in that order, with no whitespace before their
    /// values' separators: each of those is recognised by one comparison of the bytes after
    /// the brace or comma, where the general loop reads the name as a string, skips
    /// whitespace around the colon and matches the name. The first member that differs, and
    /// every one after it, goes through the general loop, so the members are the same, read
    /// in the same order by the same `member`: only how a name is found differs.
    fn object_usual(
        &mut self,
        depth: usize,
        usual: &[(&[u8], &'a str)],
        mut member: impl FnMut(&mut Self, &'a str) -> Option<()>,
    ) -> Option<()> {
        if depth > MAX_NEST {
            return None;
        }
        let mut read = 0;
        for &(quoted, name) in usual {
            let sep = if read == 0 { b'{' } else { b',' };
            let at = self.i + 1;
            let next = self.b.get(at..at + quoted.len());
            if self.peek() != Some(sep) || next != Some(quoted) {
                break;
            }
            self.i = at + quoted.len();
            self.ws();
            member(self, name)?;
            read += 1;
        }
        if read == 0 {
            return self.object(depth, member);
        }
        self.rest(b'}', |s| s.named(&mut member))
    }

    /// A member: its name, the colon, and its value read by `member`.
    #[inline]
    fn named(&mut self, member: &mut impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        let key = self.string()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        member(self, key)
    }

    /// An array at nesting `depth`: `elem` reads each element.
    fn array(&mut self, depth: usize, elem: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.seq([b'[', b']'], depth, elem)
    }

    /// An object or array at nesting `depth` (`open` and `close` are its brackets): `item`
    /// reads each member or element.
    fn seq(
        &mut self,
        [open, close]: [u8; 2],
        depth: usize,
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        if depth > MAX_NEST {
            return None;
        }
        self.eat(open)?;
        self.ws();
        if self.peek()? == close {
            self.i += 1;
            return Some(());
        }
        item(self)?;
        self.rest(close, item)
    }

    /// The rest of an object or array whose first member or element has been read: the
    /// others, each after a comma, up to `close`.
    fn rest(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        loop {
            self.ws();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.ws();
                    item(self)?;
                }
                b if b == close => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Reads a member's value into its slot; `depth` is the nesting of an object or array
    /// value.
    fn fill(&mut self, slot: Slot<'_, 'a>, depth: usize) -> Option<()> {
        match slot {
            Slot::Loose(v) => *v = Some(self.loose(depth)?),
            Slot::Params(v) => self.params(v, depth)?,
            Slot::List(v) => *v = Some(self.list(depth)?),
            Slot::Ignore => self.skip(depth)?,
            Slot::Mark(flag) => {
                self.skip(depth)?;
                *flag = true;
            }
        }
        Some(())
    }

    /// The `params` member (`wire::ParamsField`'s visitor), read into `v` where it stays
    /// (a publish's params are most of the message's model: built in place, not moved).
    fn params(&mut self, v: &mut Option<ParamsField<'a>>, depth: usize) -> Option<()> {
        if self.peek()? != b'{' {
            self.skip(depth)?;
            *v = Some(ParamsField::Other);
            return Some(());
        }
        let ParamsField::Object(p) = v.insert(ParamsField::Object(Params::default())) else {
            return None;
        };
        self.object_usual(depth, &USUAL_PARAMS, |s, key| {
            s.fill(p.slot(key), depth + 1)
        })
    }

    /// A list member (`wire::List`'s visitor).
    fn list(&mut self, depth: usize) -> Option<List<'a>> {
        if self.peek()? != b'[' {
            self.skip(depth)?;
            return Some(List::NotArray);
        }
        let mut v = Vec::new();
        let mut too_long = false;
        self.array(depth, |s| {
            if too_long || v.len() == MAX_LIST {
                too_long = true;
                return s.skip(depth + 1);
            }
            v.push(s.elem(depth + 1)?);
            Some(())
        })?;
        Some(if too_long {
            List::TooLong
        } else {
            List::Items(v)
        })
    }

    /// An element of a list member (`wire::Elem`'s visitor).
    fn elem(&mut self, depth: usize) -> Option<Elem<'a>> {
        match self.peek()? {
            b'"' => Some(Elem::Str(Cow::Borrowed(self.string()?))),
            b'{' => {
                let (mut topic, mut id) = (None, None);
                self.object(depth, |s, key| {
                    s.fill(sub_slot(&mut topic, &mut id, key), depth + 1)
                })?;
                Some(Elem::Sub { topic, id })
            }
            _ => {
                self.skip(depth)?;
                Some(Elem::Other)
            }
        }
    }

    /// Any value, reduced (`wire::Loose`'s visitor).
    #[inline(always)]
    fn loose(&mut self, depth: usize) -> Option<Loose<'a>> {
        Some(match self.peek()? {
            b'"' => Loose::Str(Cow::Borrowed(self.string()?)),
            b'{' => {
                self.skip(depth)?;
                Loose::Object
            }
            b'[' => {
                self.skip(depth)?;
                Loose::Array
            }
            b't' => {
                self.word(b"true")?;
                Loose::Bool(true)
            }
            b'f' => {
                self.word(b"false")?;
                Loose::Bool(false)
            }
            b'n' => {
                self.word(b"null")?;
                Loose::Null
            }
            _ => self.number()?,
        })
    }

    /// Any value, checked and dropped (`serde::de::IgnoredAny`).
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => self.object(depth, |s, _| s.skip(depth + 1)),
            b'[' => self.array(depth, |s| s.skip(depth + 1)),
            _ => self.loose(depth).map(drop),
        }
    }

    /// An integer: `U64` when non-negative, `I64` when negative (as the `serde` visitor
    /// maps `simd-json`'s numbers).
    fn number(&mut self) -> Option<Loose<'a>> {
        let neg = self.peek()? == b'-';
        if neg {
            self.i += 1;
        }
        let start = self.i;
        let mut n: u64 = 0;
        // Eight digits at a time while they fit the 19 (an id has 13 to 19), then one by one.
        while self.i - start + 8 <= MAX_DIGITS {
            let Some(&block) = self.b.get(self.i..).and_then(|r| r.first_chunk::<8>()) else {
                break;
            };
            let x = u64::from_le_bytes(block);
            if !eight_digits(x) {
                break;
            }
            n = n * 100_000_000 + eight_digits_value(x);
            self.i += 8;
        }
        // The last digits (fewer than eight, or past the eight that still fit): their count
        // from one word (the message's last bytes padded with NULs, which are not digits),
        // then their value by the same multiplications, moved to the word's top.
        let rest = self.b.get(self.i..)?;
        let x = match (rest.first_chunk::<8>(), self.b.last_chunk::<8>()) {
            (Some(&w), _) => u64::from_le_bytes(w),
            // Near the end (a ttl or tag is often the last member): the message's last
            // word, its bytes before `rest` shifted out (fewer than eight are left here).
            (None, Some(&last)) => {
                let gone = 8 * (8 - rest.len()) as u32;
                u64::from_le_bytes(last).checked_shr(gone).unwrap_or(0)
            }
            (None, None) => {
                let mut w = [0u8; 8];
                w.get_mut(..rest.len())?.copy_from_slice(rest);
                u64::from_le_bytes(w)
            }
        };
        let more = leading_digits(x);
        if self.i - start + more > MAX_DIGITS {
            return None;
        }
        if more > 0 {
            n = n * POW10[more] + eight_digits_value(x << (64 - 8 * more));
            self.i += more;
        }
        let digits = self.i - start;
        let leading_zero = digits > 1 && self.b.get(start) == Some(&b'0');
        if digits == 0 || leading_zero || matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        if !neg {
            return Some(Loose::U64(n));
        }
        // -0 (a float for some parsers) and what does not fit an i64 are declined.
        let n = i64::try_from(n).ok().filter(|&n| n != 0)?;
        Some(Loose::I64(-n))
    }

    /// A string without escapes: its contents, borrowed.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let rest = self.b.get(self.i..)?;
        let n = plain_len(rest);
        let s = match *rest.get(n)? {
            b'"' => {
                let head = rest.get(..n)?;
                debug_assert!(head.is_ascii());
                // SAFETY: `plain_len` counts only bytes from 0x20 to 0x7f (see `plain`):
                // `head` is ASCII, and ASCII is valid UTF-8.
                unsafe { std::str::from_utf8_unchecked(head) }
            }
            0x80.. => {
                // Not ASCII (rare): the closing quote, then the checks on the whole string.
                let end = memchr::memchr2(b'"', b'\\', rest)?;
                let body = rest.get(..end)?;
                if rest.get(end) != Some(&b'"') || body.iter().any(|&b| b < 0x20) {
                    return None;
                }
                simdutf8::basic::from_utf8(body).ok()?
            }
            _ => return None,
        };
        self.i += s.len() + 1;
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::bytes::*;
    use super::*;

    #[test]
    fn plain_len_stops_at_the_first_byte_that_is_not_plain() {
        // Every length around the block size, the stopping byte at every place.
        for len in 0..140 {
            let s = vec![b'a'; len];
            assert_eq!(plain_len_bytewise(&s), len);
            assert_eq!(plain_len(&s), len);
            let mut sc = Scan { b: &s, i: 0 };
            assert_eq!(sc.string(), None, "no opening quote");
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            // SAFETY: `plain_len_sse2` needs SSE2, which this build targets (the `cfg`).
            assert_eq!(unsafe { plain_len_sse2(&s) }, len);
            for at in 0..len {
                for stop in [b'"', b'\\', 0x00, 0x1f, 0x7f, 0x80, 0xff] {
                    let mut t = s.clone();
                    t[at] = stop;
                    let want = if plain(stop) { len } else { at };
                    assert_eq!(plain_len_bytewise(&t), want);
                    assert_eq!(plain_len(&t), want, "{len} {at} {stop}");
                    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
                    // SAFETY: as above.
                    assert_eq!(unsafe { plain_len_sse2(&t) }, want);
                    let mut quoted = vec![b'"'];
                    quoted.extend_from_slice(&t);
                    let mut sc = Scan { b: &quoted, i: 0 };
                    let got = sc.string();
                    if stop == b'"' {
                        assert_eq!(got.map(str::len), Some(at), "{len} {at}");
                        assert_eq!(sc.i, at + 2);
                    } else {
                        assert_eq!(got, None, "{len} {at} {stop}");
                    }
                }
            }
        }
        for b in 0..=255u8 {
            assert_eq!(
                plain(b),
                (0x20..0x80).contains(&b) && b != b'"' && b != b'\\'
            );
        }
    }

    #[test]
    fn eight_digits_are_recognised_and_read() {
        for n in [
            0u64, 1, 7, 10, 99_999_999, 12_345_678, 87_654_321, 10_000_000, 9,
        ] {
            let s = format!("{n:08}");
            let x = u64::from_le_bytes(s.as_bytes().try_into().unwrap());
            assert!(eight_digits(x), "{s}");
            assert_eq!(eight_digits_value(x), n, "{s}");
        }
        // Any byte that is not a digit, at any place.
        for at in 0..8 {
            for b in (0..=255u8).filter(|b| !b.is_ascii_digit()) {
                let mut s = *b"12345678";
                s[at] = b;
                assert!(!eight_digits(u64::from_le_bytes(s)), "{s:?}");
            }
        }
        // The count of leading digits: any byte at any place after digits, then bytes that
        // carry (0xfa and up) or not after it.
        for at in 0..8 {
            for b in 0..=255u8 {
                for after in [b'0', b'9', 0xff, 0xfa, 0x00] {
                    let mut s = [after; 8];
                    s[..at].copy_from_slice(&b"12345678"[..at]);
                    s[at] = b;
                    let want = s.iter().take_while(|c| c.is_ascii_digit()).count();
                    assert_eq!(leading_digits(u64::from_le_bytes(s)), want, "{s:?}");
                }
            }
        }
        // Numbers of every length up to and past the limit, in and out of the block path.
        for len in 1..=21usize {
            let digits: String = (0..len).map(|i| char::from(b'1' + (i % 9) as u8)).collect();
            for tail in [
                "",
                ",",
                "}",
                ".5",
                "e3",
                "x",
                ",\"tag\":1108}}",
                ".25}}}}}}}}",
            ] {
                let text = format!("{digits}{tail}");
                let mut sc = Scan {
                    b: text.as_bytes(),
                    i: 0,
                };
                let got = sc.number();
                let want = (len <= MAX_DIGITS && !tail.starts_with(['.', 'e']))
                    .then(|| digits.parse::<u64>().unwrap());
                match got {
                    Some(Loose::U64(v)) => assert_eq!(Some(v), want, "{text}"),
                    None => assert_eq!(want, None, "{text}"),
                    _ => panic!("{text}"),
                }
            }
        }
    }

    #[test]
    fn non_ascii_strings_are_checked_whole() {
        let ok = "\"é日本\u{1F600}x\"rest";
        let mut sc = Scan {
            b: ok.as_bytes(),
            i: 0,
        };
        assert_eq!(sc.string(), Some("é日本\u{1F600}x"));
        for bad in [
            &b"\"\xc3\""[..],
            b"\"\xe6\x97\"",
            b"\"\xff\"",
            b"\"\xc3\xa9\x01\"",
            b"\"\xc3\xa9\\n\"",
        ] {
            let mut sc = Scan { b: bad, i: 0 };
            assert_eq!(sc.string(), None, "{bad:?}");
        }
    }
}
