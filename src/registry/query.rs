//! Query-string parsing for the listings endpoints: `entries`, `page` and `search`
//! (DECISIONS §2), with the rules that the spec left open settled in `docs/REGISTRY.md`:
//! `+` is a space, then `%XX` is decoded (invalid encoding or invalid UTF-8 -> 400 naming the
//! parameter); a known parameter given twice -> 400; unknown parameters are ignored.
//!
//! Pure: a `&str` in, a [`ListQuery`] or a [`QueryError`] out.

use std::borrow::Cow;

use thiserror::Error;

/// Largest accepted `entries`.
pub const MAX_ENTRIES: u32 = 1000;

/// A validated listings query.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListQuery {
    /// The decoded `search` text; `None` when absent or empty (no filter).
    pub search: Option<String>,
    /// `(entries, page)`, both at least 1, `entries` at most [`MAX_ENTRIES`]; `page` saturates
    /// at `u64::MAX` (a page that large is past the end anyway).
    pub paging: Option<(u32, u64)>,
}

/// Why a query is refused (400). Each message names the parameter.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QueryError {
    /// A known parameter appears more than once.
    #[error("parameter \"{0}\" is given more than once")]
    Repeated(&'static str),
    /// `%` not followed by two hex digits.
    #[error("parameter \"{0}\" has invalid percent-encoding")]
    BadEncoding(&'static str),
    /// The decoded bytes are not UTF-8.
    #[error("parameter \"{0}\" is not valid UTF-8 after percent-decoding")]
    NotUtf8(&'static str),
    /// Not a positive decimal integer.
    #[error("parameter \"{0}\" must be a positive integer")]
    NotPositive(&'static str),
    /// `entries` above [`MAX_ENTRIES`].
    #[error("parameter \"entries\" must be at most {MAX_ENTRIES}")]
    TooManyEntries,
    /// `entries` without `page` or the other way round.
    #[error("parameter \"{missing}\" is required when \"{given}\" is given")]
    Unpaired {
        /// The parameter that was given.
        given: &'static str,
        /// The parameter that is missing.
        missing: &'static str,
    },
}

/// Parses the raw query string (without `?`).
pub fn parse(raw: &str) -> Result<ListQuery, QueryError> {
    let mut entries: Option<&str> = None;
    let mut page: Option<&str> = None;
    let mut search: Option<&str> = None;
    for pair in raw.split('&') {
        if pair.is_empty() {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        // Keys are decoded too (`%73earch` is `search`); an undecodable key is unknown.
        let key = match decode(k) {
            Ok(k) => k,
            Err(_) => continue,
        };
        let (slot, name) = match key.as_ref() {
            "entries" => (&mut entries, "entries"),
            "page" => (&mut page, "page"),
            "search" => (&mut search, "search"),
            _ => continue,
        };
        if slot.replace(v).is_some() {
            return Err(QueryError::Repeated(name));
        }
    }
    let mut q = ListQuery::default();
    if let Some(s) = search {
        let s = decode(s).map_err(|e| e.named("search"))?;
        if !s.is_empty() {
            q.search = Some(s.into_owned());
        }
    }
    let entries = entries
        .map(|v| positive(v, "entries"))
        .transpose()?
        .map(|n| {
            if n > u64::from(MAX_ENTRIES) {
                Err(QueryError::TooManyEntries)
            } else {
                Ok(n as u32)
            }
        })
        .transpose()?;
    let page = page.map(|v| positive(v, "page")).transpose()?;
    q.paging = match (entries, page) {
        (Some(e), Some(p)) => Some((e, p)),
        (None, None) => None,
        (Some(_), None) => {
            return Err(QueryError::Unpaired {
                given: "entries",
                missing: "page",
            })
        }
        (None, Some(_)) => {
            return Err(QueryError::Unpaired {
                given: "page",
                missing: "entries",
            })
        }
    };
    Ok(q)
}

/// A positive decimal integer (leading zeros allowed), saturating at `u64::MAX`.
fn positive(raw: &str, name: &'static str) -> Result<u64, QueryError> {
    let v = decode(raw).map_err(|e| e.named(name))?;
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(QueryError::NotPositive(name));
    }
    let n = v.bytes().fold(0u64, |a, d| {
        a.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    });
    if n == 0 {
        return Err(QueryError::NotPositive(name));
    }
    Ok(n)
}

/// A decoding failure before the parameter is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecodeError {
    Encoding,
    Utf8,
}

impl DecodeError {
    fn named(self, name: &'static str) -> QueryError {
        match self {
            DecodeError::Encoding => QueryError::BadEncoding(name),
            DecodeError::Utf8 => QueryError::NotUtf8(name),
        }
    }
}

/// `application/x-www-form-urlencoded` value decoding: `+` is a space, `%XX` a byte.
fn decode(raw: &str) -> Result<Cow<'_, str>, DecodeError> {
    if !raw.bytes().any(|b| b == b'%' || b == b'+') {
        return Ok(Cow::Borrowed(raw));
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = bytes.next().and_then(hex).ok_or(DecodeError::Encoding)?;
                let lo = bytes.next().and_then(hex).ok_or(DecodeError::Encoding)?;
                out.push(hi << 4 | lo);
            }
            _ => out.push(b),
        }
    }
    String::from_utf8(out)
        .map(Cow::Owned)
        .map_err(|_| DecodeError::Utf8)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> ListQuery {
        parse(raw).unwrap()
    }

    #[test]
    fn empty_and_unknown() {
        assert_eq!(ok(""), ListQuery::default());
        assert_eq!(ok("&&foo=bar&foo=baz&x"), ListQuery::default());
        assert_eq!(ok("search="), ListQuery::default());
        assert_eq!(ok("search"), ListQuery::default());
        assert_eq!(ok("bad%zzkey=1"), ListQuery::default());
    }

    #[test]
    fn decodes_search() {
        assert_eq!(
            ok("search=Trust+Wallet").search.as_deref(),
            Some("Trust Wallet")
        );
        assert_eq!(
            ok("search=Trust%20Wallet").search.as_deref(),
            Some("Trust Wallet")
        );
        assert_eq!(ok("search=a%2Bb").search.as_deref(), Some("a+b"));
        assert_eq!(ok("search=%C3%A9").search.as_deref(), Some("é"));
        assert_eq!(ok("%73earch=x").search.as_deref(), Some("x"));
        assert_eq!(ok("search=a=b").search.as_deref(), Some("a=b"));
        assert_eq!(parse("search=%zz"), Err(QueryError::BadEncoding("search")));
        assert_eq!(parse("search=%4"), Err(QueryError::BadEncoding("search")));
        assert_eq!(parse("search=%ff"), Err(QueryError::NotUtf8("search")));
    }

    #[test]
    fn paging_rules() {
        assert_eq!(ok("entries=10&page=2").paging, Some((10, 2)));
        assert_eq!(ok("page=01&entries=1000").paging, Some((1000, 1)));
        assert_eq!(
            ok("entries=5&page=99999999999999999999999").paging,
            Some((5, u64::MAX))
        );
        assert_eq!(
            parse("entries=10"),
            Err(QueryError::Unpaired {
                given: "entries",
                missing: "page"
            })
        );
        assert_eq!(
            parse("page=1"),
            Err(QueryError::Unpaired {
                given: "page",
                missing: "entries"
            })
        );
        assert_eq!(
            parse("entries=0&page=1"),
            Err(QueryError::NotPositive("entries"))
        );
        assert_eq!(
            parse("entries=1&page=0"),
            Err(QueryError::NotPositive("page"))
        );
        assert_eq!(
            parse("entries=-1&page=1"),
            Err(QueryError::NotPositive("entries"))
        );
        assert_eq!(
            parse("entries=1&page=x"),
            Err(QueryError::NotPositive("page"))
        );
        assert_eq!(
            parse("entries=1&page="),
            Err(QueryError::NotPositive("page"))
        );
        assert_eq!(
            parse("entries=1.5&page=1"),
            Err(QueryError::NotPositive("entries"))
        );
        assert_eq!(
            parse("entries=+1&page=1"),
            Err(QueryError::NotPositive("entries"))
        );
        assert_eq!(
            parse("entries=1001&page=1"),
            Err(QueryError::TooManyEntries)
        );
        assert_eq!(
            parse("entries=99999999999999999999&page=1"),
            Err(QueryError::TooManyEntries)
        );
        assert_eq!(
            parse("entries=1&page=1&page=2"),
            Err(QueryError::Repeated("page"))
        );
        assert_eq!(
            parse("search=a&search=b"),
            Err(QueryError::Repeated("search"))
        );
        assert_eq!(
            parse("entries=%zz&page=1"),
            Err(QueryError::BadEncoding("entries"))
        );
        assert_eq!(ok("entries=%31&page=1").paging, Some((1, 1)));
    }

    #[test]
    fn messages_name_the_parameter() {
        for (q, name) in [
            ("entries=0&page=1", "entries"),
            ("entries=1&page=0", "page"),
            ("entries=2000&page=1", "entries"),
            ("entries=1", "page"),
            ("page=1", "entries"),
            ("search=%", "search"),
            ("search=1&search=2", "search"),
        ] {
            let msg = parse(q).unwrap_err().to_string();
            assert!(msg.contains(&format!("\"{name}\"")), "{q}: {msg}");
        }
    }
}
