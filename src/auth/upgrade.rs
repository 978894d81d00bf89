//! What an upgrade request says about auth: the JWT (query `auth` or `Authorization: Bearer`),
//! the `projectId` and `useOnCloseEvent`. Pure parsing of the query string and one header
//! value; deciding what to do with them is the caller's.

use std::borrow::Cow;

/// The auth-related parameters of a WebSocket upgrade request. `Debug` shows whether there
/// is a token, never the token (a bearer credential).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct UpgradeAuth<'a> {
    /// The JWT: the query's `auth`, else an `Authorization: Bearer` token. `None` when neither
    /// is there (or both are empty). Kept as sent when it cannot be decoded, so that a broken
    /// token is refused rather than taken for no token.
    pub token: Option<Cow<'a, str>>,
    /// The query's `projectId`, percent-decoded (as sent when it cannot be).
    pub project_id: Option<Cow<'a, str>>,
    /// The query's `useOnCloseEvent=true`: refuse by closing the upgraded socket with code
    /// 3000 instead of answering 401/403 (the SDK then stops retrying).
    pub use_on_close_event: bool,
}

impl std::fmt::Debug for UpgradeAuth<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpgradeAuth")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("project_id", &self.project_id)
            .field("use_on_close_event", &self.use_on_close_event)
            .finish()
    }
}

impl<'a> UpgradeAuth<'a> {
    /// Reads `query` (the request target after `?`; a leading `?` is skipped) and the
    /// `Authorization` header's value. Unknown keys are ignored; of a repeated key the first
    /// counts. The header is read only when the query has no (non-empty) `auth`.
    pub fn from_request(query: &'a str, authorization: Option<&'a [u8]>) -> Self {
        let mut out = UpgradeAuth::default();
        let query = query.strip_prefix('?').unwrap_or(query);
        let mut seen_close_event = false;
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = percent_decode(k).unwrap_or(Cow::Borrowed(k));
            match &*k {
                "auth" if out.token.is_none() && !v.is_empty() => {
                    out.token = Some(percent_decode(v).unwrap_or(Cow::Borrowed(v)));
                }
                "projectId" if out.project_id.is_none() => {
                    out.project_id = Some(percent_decode(v).unwrap_or(Cow::Borrowed(v)));
                }
                "useOnCloseEvent" if !seen_close_event => {
                    seen_close_event = true;
                    out.use_on_close_event = v.eq_ignore_ascii_case("true");
                }
                _ => {}
            }
        }
        if out.token.is_none() {
            out.token = authorization.and_then(bearer);
        }
        out
    }
}

/// The token of an `Authorization: Bearer <token>` value (scheme case-insensitive); lossily
/// decoded when not UTF-8, so that it fails verification.
fn bearer(value: &[u8]) -> Option<Cow<'_, str>> {
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.first()?.is_ascii_whitespace() {
        return None;
    }
    let token = rest.trim_ascii_start();
    if token.is_empty() {
        return None;
    }
    Some(String::from_utf8_lossy(token))
}

/// Percent-decodes a query component (`+` is a space); `None` when an escape is invalid or
/// the result is not UTF-8.
fn percent_decode(s: &str) -> Option<Cow<'_, str>> {
    if !s.bytes().any(|b| b == b'%' || b == b'+') {
        return Some(Cow::Borrowed(s));
    }
    let mut out = Vec::with_capacity(s.len());
    let mut it = s.bytes();
    while let Some(b) = it.next() {
        match b {
            b'%' => {
                let h = it.next().and_then(hex)?;
                let l = it.next().and_then(hex)?;
                out.push(h << 4 | l);
            }
            b'+' => out.push(b' '),
            _ => out.push(b),
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

/// The value of one hex digit.
fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(q: &str, h: Option<&[u8]>) -> (Option<String>, Option<String>, bool) {
        let u = UpgradeAuth::from_request(q, h);
        (
            u.token.map(|t| t.into_owned()),
            u.project_id.map(|p| p.into_owned()),
            u.use_on_close_event,
        )
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn sdk_query() {
        let q = "auth=eyJh.eyJp.sig_-&projectId=0123abcd&ua=wc-2%2Fjs-2.25.0%2Fnode&useOnCloseEvent=true";
        assert_eq!(
            get(q, None),
            (some("eyJh.eyJp.sig_-"), some("0123abcd"), true)
        );
        assert_eq!(
            get(&format!("?{q}"), None),
            (some("eyJh.eyJp.sig_-"), some("0123abcd"), true)
        );
    }

    #[test]
    fn debug_never_shows_the_token() {
        let u = UpgradeAuth::from_request("auth=eyJh.eyJp.sig_-&projectId=p", None);
        let shown = format!("{u:?}");
        assert!(!shown.contains("eyJ"), "{shown}");
        assert!(
            shown.contains("\"***\"") && shown.contains("\"p\""),
            "{shown}"
        );
    }

    #[test]
    fn empty_and_unknown() {
        assert_eq!(get("", None), (None, None, false));
        assert_eq!(get("a=1&&=&b&auth", None), (None, None, false));
        assert_eq!(get("useOnCloseEvent=false", None), (None, None, false));
        assert_eq!(get("useOnCloseEvent=TRUE", None), (None, None, true));
        assert_eq!(get("useOnCloseEvent", None), (None, None, false));
        assert_eq!(get("projectId=", None), (None, some(""), false));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(get("auth=a%2Eb%2ec", None).0, some("a.b.c"));
        assert_eq!(get("projectId=a+b%20c", None).1, some("a b c"));
        assert_eq!(get("%61uth=x", None).0, some("x"));
        // Undecodable values are kept as sent, so a broken token is refused, not ignored.
        assert_eq!(get("auth=a%zz", None).0, some("a%zz"));
        assert_eq!(get("auth=a%", None).0, some("a%"));
        assert_eq!(get("auth=%ff%fe", None).0, some("%ff%fe"));
        assert_eq!(get("projectId=%C3%A9", None).1, some("\u{e9}"));
    }

    #[test]
    fn first_of_a_repeated_key_counts() {
        assert_eq!(
            get(
                "auth=1&auth=2&projectId=p&projectId=q&useOnCloseEvent=true&useOnCloseEvent=false",
                None
            ),
            (some("1"), some("p"), true)
        );
        assert_eq!(get("auth=&auth=2", None).0, some("2"));
    }

    #[test]
    fn bearer_header() {
        let h = |v: &'static [u8]| get("projectId=p", Some(v)).0;
        assert_eq!(h(b"Bearer abc.def.ghi"), some("abc.def.ghi"));
        assert_eq!(h(b"  bearer \t abc.def.ghi \r"), some("abc.def.ghi"));
        assert_eq!(h(b"BEARER x"), some("x"));
        assert_eq!(h(b"Basic dXNlcjpwYXNz"), None);
        assert_eq!(h(b"Bearer"), None);
        assert_eq!(h(b"Bearer   "), None);
        assert_eq!(h(b"Bearerx"), None);
        assert_eq!(h(b""), None);
        assert_eq!(h(b"Bearer a\xffb"), some("a\u{fffd}b"));
        // The query's token wins; an empty one does not.
        assert_eq!(get("auth=q", Some(b"Bearer h")).0, some("q"));
        assert_eq!(get("auth=", Some(b"Bearer h")).0, some("h"));
    }
}
