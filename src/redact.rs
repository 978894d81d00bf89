//! What of a URL may be shown: the one notion of a secret inside an address that the log,
//! error messages and `--print-config` share (DECISIONS, "Logs").
//!
//! A URL can carry three kinds of secret: its userinfo (`redis://user:password@host`, a token
//! as the user of a webhook `https://TOKEN@hooks.example`), a query parameter that names one
//! (`?token=`, `?auth=`, `sentinel_password=`, `api_key=`), and, for a webhook or a push server,
//! its path (`https://hooks.slack.com/services/T0/B0/SECRET`). Two wrappers write a URL with
//! them left out, so that a call site logs an address by wrapping it, not by remembering to
//! filter it:
//! - [`Host`]: `scheme://host[:port]` only (webhooks and push servers: nothing after the
//!   authority is shown, not even the path);
//! - [`Masked`]: the whole URL with the password of its userinfo (the whole userinfo when it
//!   has no `:`) and the values of secret-named query parameters replaced by `***` (a Redis
//!   URL that did not parse, a `--print-config` value).
//!
//! A leaf: no I/O, no state; `config`, `cluster`, `webhook` and `notify` use it.

use std::fmt;

/// Words that mark a query parameter's value as a secret (matched case-insensitively within
/// the parameter's name).
pub const PARAM_SECRETS: [&str; 6] = ["pass", "secret", "token", "key", "auth", "sig"];

/// A URL shown as `scheme://host[:port]`: no userinfo, path, query or fragment. Text that is
/// not `scheme://...` is shown as `(not a URL)`: it could be anything, a secret included.
#[derive(Clone, Copy)]
pub struct Host<'a>(pub &'a str);

impl fmt::Display for Host<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return f.write_str("(not a URL)");
        };
        if scheme.is_empty()
            || !scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        {
            return f.write_str("(not a URL)");
        }
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        write!(f, "{scheme}://{host}")
    }
}

impl fmt::Debug for Host<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// A URL with its secrets replaced by `***` (see the module's header); any other text as it
/// is, except that everything before an `@` (not the first character) is masked when there
/// is no `://` (a mistyped `redis:/user:pw@host` still hides its password).
#[derive(Clone, Copy)]
pub struct Masked<'a>(pub &'a str);

impl fmt::Display for Masked<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&mask_url(self.0))
    }
}

impl fmt::Debug for Masked<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&mask_url(self.0), f)
    }
}

/// [`Masked`] as a `String`.
pub fn mask_url(value: &str) -> String {
    let Some(scheme) = value.find("://") else {
        return match value.rfind('@') {
            // `@FILE` (`--project-ids`, `--push-urls`) names a file: nothing before the `@`.
            Some(at) if at > 0 => format!("***{}", &value[at..]),
            _ => value.to_string(),
        };
    };
    let start = scheme + 3;
    let end = value[start..]
        .find(['/', '?', '#'])
        .map_or(value.len(), |i| start + i);
    let authority = &value[start..end];
    let mut out = value[..start].to_string();
    match authority.rfind('@') {
        Some(at) => {
            let user = &authority[..at];
            match user.find(':') {
                Some(colon) => {
                    out.push_str(&user[..colon]);
                    out.push_str(":***");
                }
                None => out.push_str("***"),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let rest = &value[end..];
    let Some(q) = rest.find('?') else {
        out.push_str(rest);
        return out;
    };
    out.push_str(&rest[..=q]);
    let (query, fragment) = rest[q + 1..]
        .split_once('#')
        .map_or((&rest[q + 1..], None), |(a, b)| (a, Some(b)));
    for (i, p) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match p.split_once('=') {
            Some((name, _)) if secret_param(name) => {
                out.push_str(name);
                out.push_str("=***");
            }
            _ => out.push_str(p),
        }
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// Whether a query parameter of this name holds a secret.
pub fn secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    PARAM_SECRETS.iter().any(|w| name.contains(w))
}

/// Words that mark a secret in a key's name (a value that is itself a secret; a `-file` key
/// only names where one is kept); a URL's secrets are [`mask_url`]'s.
const KEY_SECRETS: [&str; 3] = ["password", "secret", "token"];

/// `value` of `key` with its secrets replaced by `***`: the whole value of a secret key, else
/// [`mask_url`] (a URL's password, `redis://user:***@host`; a user part
/// without a colon may be a token and goes whole; the value of a query parameter that names
/// a secret, `sentinel_password=***`). The log shows addresses the same way.
pub fn mask_setting(key: &str, value: &str) -> String {
    if !key.ends_with("-file") && KEY_SECRETS.iter().any(|w| key.contains(w)) {
        return "***".to_string();
    }
    mask_url(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_shows_scheme_host_and_port_only() {
        for (url, shown) in [
            (
                "https://hooks.example/services/T0/B0/SECRET",
                "https://hooks.example",
            ),
            (
                "http://user:pw@127.0.0.1:8080/p?token=t#f",
                "http://127.0.0.1:8080",
            ),
            ("https://TOKEN@[::1]:443", "https://[::1]:443"),
            ("http://a:b@c@host?x=1", "http://host"),
            ("https://h.example?auth=jwt", "https://h.example"),
            ("redis://:pw@r:6379/0", "redis://r:6379"),
            ("not a url with pw@host", "(not a URL)"),
            ("://pw@host", "(not a URL)"),
            ("a b://pw@host", "(not a URL)"),
        ] {
            assert_eq!(Host(url).to_string(), shown, "{url}");
        }
        assert_eq!(format!("{:?}", Host("http://u:p@h/x")), "\"http://h\"");
    }

    #[test]
    fn masked_hides_passwords_userinfo_tokens_and_secret_parameters() {
        for (url, shown) in [
            ("redis://u:pw@h:1/0", "redis://u:***@h:1/0"),
            ("redis://:pw@h:1", "redis://:***@h:1"),
            ("https://TOKEN@h/x", "https://***@h/x"),
            ("redis://:p@ss@h:1", "redis://:***@h:1"),
            (
                "redis+sentinel://h/m?sentinel_password=x&addr=h2",
                "redis+sentinel://h/m?sentinel_password=***&addr=h2",
            ),
            (
                "https://p.example/x?api_key=k&v=1&Auth=a#frag",
                "https://p.example/x?api_key=***&v=1&Auth=***#frag",
            ),
            ("redis://h:1/0", "redis://h:1/0"),
            ("redis:/u:pw@h", "***@h"),
            ("@/etc/walletrelay/ids", "@/etc/walletrelay/ids"),
            ("plain words", "plain words"),
        ] {
            assert_eq!(Masked(url).to_string(), shown, "{url}");
            assert_eq!(format!("{:?}", Masked(url)), format!("{shown:?}"));
        }
    }
}
