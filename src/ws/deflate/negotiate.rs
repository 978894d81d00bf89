//! permessage-deflate negotiation (RFC 7692 §5 and §7.1): reads the client's
//! `Sec-WebSocket-Extensions` offers and picks the first one the server can honour, always
//! with both no-context-takeover parameters, so no compression state outlives a message.
//!
//! Pure byte parsing: no I/O, no allocation, no state. It does not decide whether the
//! feature is on; callers pass `--permessage-deflate` in (see [`negotiate`]).

/// Largest LZ77 window (bits) of DEFLATE, and the window used when nothing smaller is asked.
pub const MAX_WINDOW_BITS: u8 = 15;

/// Smallest `server_max_window_bits` the server accepts. RFC 7692 allows 8, but zlib (and
/// zlib-rs) cannot compress raw DEFLATE with a 256-byte window (`deflateInit2` refuses
/// `windowBits` 8 for raw streams), and answering 9 to an offer of 8 is not allowed (the
/// answer must be the same or smaller); so an offer of 8 is declined and the next one tried.
pub const MIN_SERVER_WINDOW_BITS: u8 = 9;

/// What the server agreed with one client. Two bytes: this is all a connection keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    /// `server_max_window_bits` the client asked for (then echoed in the answer), if any.
    server_max_window_bits: Option<u8>,
}

impl Agreement {
    /// The agreement for an offer without window parameters (`permessage-deflate` alone).
    pub const DEFAULT: Agreement = Agreement {
        server_max_window_bits: None,
    };

    /// The LZ77 window (bits) the server may use when compressing for this client.
    pub fn window_bits(&self) -> u8 {
        self.server_max_window_bits.unwrap_or(MAX_WINDOW_BITS)
    }

    /// Writes the `Sec-WebSocket-Extensions` response header line (with its CRLF) into
    /// `out`.
    pub fn write_header(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"Sec-WebSocket-Extensions: ");
        self.write_value(out);
        out.extend_from_slice(b"\r\n");
    }

    /// Writes the header's value alone.
    pub fn write_value(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(
            b"permessage-deflate; server_no_context_takeover; client_no_context_takeover",
        );
        if let Some(bits) = self.server_max_window_bits {
            out.extend_from_slice(b"; server_max_window_bits=");
            out.extend_from_slice(itoa::Buffer::new().format(bits).as_bytes());
        }
    }
}

/// Picks the first acceptable permessage-deflate offer among the `Sec-WebSocket-Extensions`
/// header values (one per header line, in order); `None` declines (no header is sent).
/// With `enabled` false (no `--permessage-deflate`) every offer is declined.
pub fn negotiate<'a>(
    enabled: bool,
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Option<Agreement> {
    if !enabled {
        return None;
    }
    values.into_iter().find_map(accept_offer)
}

/// The first acceptable permessage-deflate offer in one header value, whatever the flag
/// says (the HTTP parser records it; the connection applies the flag).
///
/// An offer is declined, and the next one considered, when it names another extension,
/// carries an unknown or repeated parameter, a parameter value that is not allowed
/// (`server_max_window_bits` outside 9..=15, a value on a no-context-takeover parameter),
/// or is malformed (RFC 6455 §9.1 syntax, quoted values unquoted first).
pub fn accept_offer(value: &[u8]) -> Option<Agreement> {
    let mut p = Parser { s: value, i: 0 };
    loop {
        p.skip_ows();
        if p.at_end() {
            return None;
        }
        if let Some(a) = p.offer() {
            return Some(a);
        }
        // Declined or malformed: resume after the next comma outside quotes.
        if !p.skip_past_comma() {
            return None;
        }
    }
}

/// A cursor over one header value.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

/// The parameters of one permessage-deflate offer, as seen so far.
#[derive(Default)]
struct Params {
    server_no_context_takeover: bool,
    client_no_context_takeover: bool,
    server_max_window_bits: Option<u8>,
    client_max_window_bits: Option<Option<u8>>,
}

impl<'a> Parser<'a> {
    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    /// An RFC 7230 token (possibly empty).
    fn token(&mut self) -> &'a [u8] {
        let start = self.i;
        while self.peek().is_some_and(is_tchar) {
            self.i += 1;
        }
        &self.s[start..self.i]
    }

    /// A quoted string's content (escapes kept; only token characters are valid in our
    /// parameters anyway). `None` when unterminated.
    fn quoted(&mut self) -> Option<&'a [u8]> {
        self.i += 1; // the opening quote
        let start = self.i;
        loop {
            match self.peek()? {
                b'"' => {
                    let v = &self.s[start..self.i];
                    self.i += 1;
                    return Some(v);
                }
                b'\\' => self.i += 2,
                _ => self.i += 1,
            }
        }
    }

    /// Parses one offer up to (not past) the comma that ends it; `Some` when it is an
    /// acceptable permessage-deflate offer.
    fn offer(&mut self) -> Option<Agreement> {
        let name = self.token();
        if !name.eq_ignore_ascii_case(b"permessage-deflate") {
            return None;
        }
        let mut params = Params::default();
        loop {
            self.skip_ows();
            match self.peek() {
                None | Some(b',') => return params.agreement(),
                Some(b';') => self.i += 1,
                Some(_) => return None,
            }
            self.skip_ows();
            let key = self.token();
            if key.is_empty() {
                return None;
            }
            self.skip_ows();
            let value = if self.peek() == Some(b'=') {
                self.i += 1;
                self.skip_ows();
                let v = if self.peek() == Some(b'"') {
                    self.quoted()?
                } else {
                    self.token()
                };
                if v.is_empty() || !v.iter().all(|&b| is_tchar(b)) {
                    return None;
                }
                Some(v)
            } else {
                None
            };
            params.set(key, value)?;
        }
    }

    /// Moves past the next comma outside a quoted string; `false` at the end of the value.
    fn skip_past_comma(&mut self) -> bool {
        while let Some(b) = self.peek() {
            match b {
                b',' => {
                    self.i += 1;
                    return true;
                }
                b'"' => {
                    if self.quoted().is_none() {
                        return false;
                    }
                }
                _ => self.i += 1,
            }
        }
        false
    }
}

impl Params {
    /// Records one parameter; `None` declines the offer.
    fn set(&mut self, key: &[u8], value: Option<&[u8]>) -> Option<()> {
        if key.eq_ignore_ascii_case(b"server_no_context_takeover") {
            flag(&mut self.server_no_context_takeover, value)
        } else if key.eq_ignore_ascii_case(b"client_no_context_takeover") {
            flag(&mut self.client_no_context_takeover, value)
        } else if key.eq_ignore_ascii_case(b"server_max_window_bits") {
            if self.server_max_window_bits.is_some() {
                return None;
            }
            self.server_max_window_bits = Some(window_bits(value?)?);
            Some(())
        } else if key.eq_ignore_ascii_case(b"client_max_window_bits") {
            if self.client_max_window_bits.is_some() {
                return None;
            }
            self.client_max_window_bits = Some(match value {
                None => None,
                Some(v) => Some(window_bits(v)?),
            });
            Some(())
        } else {
            None
        }
    }

    /// The answer to an offer whose parameters were all valid.
    ///
    /// `client_max_window_bits` needs nothing from us: the inflater always has a 15-bit
    /// window, so the client may use any window it likes and the parameter is left out of
    /// the answer (RFC 7692 §7.1.2.2 allows that).
    fn agreement(&self) -> Option<Agreement> {
        match self.server_max_window_bits {
            Some(bits) if bits < MIN_SERVER_WINDOW_BITS => None,
            bits => Some(Agreement {
                server_max_window_bits: bits,
            }),
        }
    }
}

/// A no-context-takeover parameter: no value, at most once.
fn flag(seen: &mut bool, value: Option<&[u8]>) -> Option<()> {
    if *seen || value.is_some() {
        return None;
    }
    *seen = true;
    Some(())
}

/// A window size value: `8` to `15` without leading zeros (RFC 7692 §7.1.2).
fn window_bits(v: &[u8]) -> Option<u8> {
    match v {
        [d @ b'8'..=b'9'] => Some(d - b'0'),
        [b'1', d @ b'0'..=b'5'] => Some(10 + d - b'0'),
        _ => None,
    }
}

/// RFC 7230 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(offers: &[&str]) -> Option<String> {
        negotiate(true, offers.iter().map(|s| s.as_bytes())).map(|a| {
            let mut v = Vec::new();
            a.write_value(&mut v);
            String::from_utf8(v).unwrap()
        })
    }

    const BOTH: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

    #[test]
    fn negotiation_table() {
        let w = |n: u8| Some(format!("{BOTH}; server_max_window_bits={n}"));
        let plain = Some(BOTH.to_string());
        let table: &[(&[&str], Option<String>)] = &[
            // What browsers and node `ws` send.
            (&["permessage-deflate; client_max_window_bits"], plain.clone()),
            (&["permessage-deflate"], plain.clone()),
            (&["PerMessage-Deflate"], plain.clone()),
            // Autobahn 13.x offers.
            (
                &["permessage-deflate; client_no_context_takeover; client_max_window_bits"],
                plain.clone(),
            ),
            (
                &["permessage-deflate; client_no_context_takeover; client_max_window_bits; server_no_context_takeover"],
                plain.clone(),
            ),
            (
                &["permessage-deflate; client_no_context_takeover; client_max_window_bits; server_max_window_bits=9"],
                w(9),
            ),
            (
                &["permessage-deflate; client_max_window_bits; server_no_context_takeover; server_max_window_bits=15"],
                w(15),
            ),
            (
                &["permessage-deflate; server_no_context_takeover; server_max_window_bits=9, permessage-deflate; server_no_context_takeover, permessage-deflate"],
                w(9),
            ),
            // Quoted values and spacing.
            (&["permessage-deflate;server_max_window_bits=\"10\""], w(10)),
            (&["permessage-deflate ; server_max_window_bits = 12 "], w(12)),
            (&["permessage-deflate; client_max_window_bits=\"9\""], plain.clone()),
            // 8 cannot be honoured: that offer is declined, the next one taken.
            (&["permessage-deflate; server_max_window_bits=8"], None),
            (
                &["permessage-deflate; server_max_window_bits=8, permessage-deflate"],
                plain.clone(),
            ),
            // Invalid values, unknown and repeated parameters: declined.
            (&["permessage-deflate; server_max_window_bits=16"], None),
            (&["permessage-deflate; server_max_window_bits=7"], None),
            (&["permessage-deflate; server_max_window_bits=09"], None),
            (&["permessage-deflate; server_max_window_bits"], None),
            (&["permessage-deflate; server_max_window_bits=\"1 0\""], None),
            (&["permessage-deflate; client_max_window_bits=20"], None),
            (&["permessage-deflate; server_no_context_takeover=1"], None),
            (&["permessage-deflate; client_no_context_takeover; client_no_context_takeover"], None),
            (&["permessage-deflate; server_max_window_bits=10; server_max_window_bits=10"], None),
            (&["permessage-deflate; mystery"], None),
            (&["permessage-deflate; mystery, permessage-deflate"], plain.clone()),
            // Other extensions are skipped, also with quoted commas in their parameters.
            (&["x-webkit-deflate-frame"], None),
            (&["foo; bar=\"a, b\", permessage-deflate"], plain.clone()),
            (&["foo; bar=\"a, permessage-deflate"], None),
            (&["deflate-frame, permessage-deflate; server_max_window_bits=11"], w(11)),
            // Malformed syntax declines the offer it is in.
            (&["permessage-deflate;"], None),
            (&["permessage-deflate;; client_max_window_bits"], None),
            (&["permessage-deflate client_max_window_bits"], None),
            (&["permessage-deflate; =9"], None),
            (&["permessage-deflate; server_max_window_bits=10 garbage, permessage-deflate"], plain.clone()),
            (&["", ",,", " "], None),
            // Several header lines: the first acceptable offer wins.
            (&["foo", "permessage-deflate; server_max_window_bits=13"], w(13)),
            (&["permessage-deflate; server_max_window_bits=14", "permessage-deflate"], w(14)),
            (&[], None),
        ];
        for (offers, expect) in table {
            assert_eq!(&answer(offers), expect, "offers {offers:?}");
        }
    }

    #[test]
    fn without_the_flag_every_offer_is_declined() {
        let offers: [&[u8]; 2] = [
            b"permessage-deflate",
            b"permessage-deflate; client_max_window_bits",
        ];
        assert_eq!(negotiate(false, offers), None);
        assert_eq!(negotiate(true, offers), Some(Agreement::DEFAULT));
    }

    #[test]
    fn header_line_and_window() {
        let a = accept_offer(b"permessage-deflate; server_max_window_bits=9").unwrap();
        assert_eq!(a.window_bits(), 9);
        assert_eq!(Agreement::DEFAULT.window_bits(), 15);
        let mut v = Vec::new();
        a.write_header(&mut v);
        assert_eq!(
            v,
            b"Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; \
              client_no_context_takeover; server_max_window_bits=9\r\n"
        );
    }

    #[test]
    fn any_bytes_never_panic() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let alphabet = b"permessage-deflate;,=\" \t\\_0123456789xyz";
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 48) as usize;
            let v: Vec<u8> = (0..len)
                .map(|i| alphabet[((seed >> (i % 50)) as usize + i * 7) % alphabet.len()])
                .collect();
            let _ = accept_offer(&v);
        }
    }
}
