//! What one `--redis` entry names (DECISIONS §12): a standalone server, the primary of a
//! Sentinel group, or a Redis Cluster, each over TCP or TLS, with its credentials.
//!
//! Owns: parsing and normalising the URL forms into a [`ShardAddr`], the password taken from
//! `--redis-password-file`, and the rule that a password never reaches a log line, an error,
//! `/metrics` or `/health` (`Debug` and `Display` leave it out, [`redact`] masks it in a URL
//! that could not be parsed). Must not touch sockets.
//!
//! Forms:
//! - `redis://[user[:password]@]host[:port][/db]` (`rediss://` for TLS);
//! - `redis+sentinel://[user[:password]@]host[:port]/MASTER[/db]?addr=host:port&...`, with
//!   `sentinel_user` / `sentinel_password` when the Sentinels want their own credentials
//!   (`rediss+sentinel://`: TLS to the Sentinels and the primary);
//! - `redis+cluster://[user[:password]@]host[:port]?addr=host:port&...` (`rediss+cluster://`).
//!
//! An unknown query parameter is refused rather than ignored: a typo in `addr` would
//! otherwise leave a node with one Sentinel and nobody would know until it failed over.

use std::fmt;

/// Why a `--redis` URL was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddrError {
    /// The URL does not parse as one of the forms.
    #[error("invalid Redis URL {url:?}: {reason}")]
    Invalid {
        /// The URL with its password removed.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A unix socket, or a form this build does not serve.
    #[error("unsupported Redis URL {url:?}: {reason}")]
    Unsupported {
        /// The URL with its password removed.
        url: String,
        /// Why.
        reason: String,
    },
    /// No URL given.
    #[error("no Redis URL given")]
    Empty,
}

/// A host and port.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// Host name or address, lower-cased, without brackets.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Which kind of deployment a shard is.
#[derive(Clone, PartialEq, Eq)]
pub enum Kind {
    /// One server; [`ShardAddr::endpoints`] holds it.
    Standalone,
    /// The primary of Sentinel group `master`; the endpoints are the Sentinels.
    Sentinel {
        /// The group's name (`sentinel monitor NAME ...`).
        master: String,
        /// The Sentinels' own ACL user, if they want one.
        user: Option<String>,
        /// The Sentinels' own password (never printed).
        password: Option<String>,
    },
    /// A Redis Cluster; the endpoints are seed nodes.
    Cluster,
}

/// One shard of the consistent hash: where it is and how to log in.
#[derive(Clone)]
pub struct ShardAddr {
    /// The deployment kind.
    pub kind: Kind,
    /// TLS to every server of the shard (`rediss...`).
    pub tls: bool,
    /// The server (standalone), the Sentinels, or the cluster's seed nodes; never empty.
    pub endpoints: Vec<Endpoint>,
    /// Database number (always 0 on a cluster).
    pub db: i64,
    /// ACL user name, if any.
    pub username: Option<String>,
    /// Password, if any (never printed).
    pub password: Option<String>,
}

impl fmt::Debug for ShardAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ShardAddr {
    /// The normalised name used in the fingerprint, logs and errors: `host:port/db` for a
    /// standalone server (as before DECISIONS §12, so such lists keep their fingerprint),
    /// `sentinel:MASTER/db` (the group, whichever Sentinels are listed), `cluster:` and the
    /// seeds in order of address.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Standalone => write!(f, "{}/{}", self.endpoints[0], self.db),
            Kind::Sentinel { master, .. } => write!(f, "sentinel:{master}/{}", self.db),
            Kind::Cluster => {
                let mut seeds = self.endpoints.clone();
                seeds.sort();
                f.write_str("cluster:")?;
                for (i, s) in seeds.iter().enumerate() {
                    if i > 0 {
                        f.write_str("+")?;
                    }
                    write!(f, "{s}")?;
                }
                Ok(())
            }
        }
    }
}

/// `url` with any password (in the user part or a secret-named parameter such as
/// `sentinel_password`) replaced by `***`, for error messages: [`crate::redact::Masked`], the
/// masking `--print-config` and the log use too.
pub fn redact(url: &str) -> String {
    crate::redact::mask_url(url)
}

/// `%XX` escapes decoded (a `+` stays a `+`: these are URL parts, not form data).
fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a bad %-escape")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "an escape that is not UTF-8".to_string())
}

/// `host[:port]` or `[v6][:port]`.
fn endpoint(s: &str, default_port: u16) -> Result<Endpoint, String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']').ok_or("an IPv6 address without its ']'")?;
        let port = match &rest[end + 1..] {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after ']'")?),
        };
        (&rest[..end], port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    if host.contains(['/', '@', '?', '#', ' ']) {
        return Err(format!("a bad host {host:?}"));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("a bad port {p:?}"))?,
    };
    Ok(Endpoint {
        host: host.to_ascii_lowercase(),
        port,
    })
}

fn db_number(s: &str) -> Result<i64, String> {
    s.parse::<i64>()
        .ok()
        .filter(|d| (0..=1_000_000).contains(d))
        .ok_or_else(|| format!("a bad database number {s:?}"))
}

impl ShardAddr {
    /// Parses one URL of the forms in the module's comment.
    pub fn parse(url: &str) -> Result<ShardAddr, AddrError> {
        let url = url.trim();
        let invalid = |reason: String| AddrError::Invalid {
            url: redact(url),
            reason,
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            invalid("no scheme (redis://, rediss://, redis+sentinel://, redis+cluster://)".into())
        })?;
        let (tls, kind) = match scheme.to_ascii_lowercase().as_str() {
            "redis" => (false, 0),
            "rediss" => (true, 0),
            "redis+sentinel" => (false, 1),
            "rediss+sentinel" => (true, 1),
            "redis+cluster" => (false, 2),
            "rediss+cluster" => (true, 2),
            "unix" | "redis+unix" => {
                return Err(AddrError::Unsupported {
                    url: redact(url),
                    reason: "unix sockets are not supported: give host:port".into(),
                })
            }
            s => return Err(invalid(format!("unknown scheme {s:?}"))),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, q),
            None => (rest, ""),
        };
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pw) = match u.split_once(':') {
                    Some((user, pw)) => (user, Some(pw)),
                    None => (u, None),
                };
                let user = Some(percent_decode(user).map_err(invalid)?).filter(|u| !u.is_empty());
                let pw = pw.map(percent_decode).transpose().map_err(invalid)?;
                (user, pw.filter(|p| !p.is_empty()))
            }
        };
        let (hostport, path) = match rest.find('/') {
            Some(s) => (&rest[..s], &rest[s + 1..]),
            None => (rest, ""),
        };
        let default_port = if kind == 1 { 26379 } else { 6379 };
        let mut endpoints = vec![endpoint(hostport, default_port).map_err(invalid)?];
        let (mut s_user, mut s_pw, mut db_param) = (None, None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v).map_err(invalid)?;
            match (k, kind) {
                ("addr", 1 | 2) => endpoints.push(endpoint(&v, default_port).map_err(invalid)?),
                ("sentinel_user", 1) => s_user = Some(v).filter(|v| !v.is_empty()),
                ("sentinel_password", 1) => s_pw = Some(v).filter(|v| !v.is_empty()),
                ("db", 1) => db_param = Some(db_number(&v).map_err(invalid)?),
                _ => return Err(invalid(format!("unknown parameter {k:?} for this form"))),
            }
        }
        endpoints.dedup();
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let (kind, db) = match kind {
            0 => {
                let db = parts.next().map(db_number).transpose().map_err(invalid)?;
                (Kind::Standalone, db.unwrap_or(0))
            }
            1 => {
                let master = parts
                    .next()
                    .map(percent_decode)
                    .transpose()
                    .map_err(invalid)?
                    .ok_or_else(|| {
                        invalid("no master name: redis+sentinel://HOST:PORT/MASTER".into())
                    })?;
                let db = parts.next().map(db_number).transpose().map_err(invalid)?;
                let kind = Kind::Sentinel {
                    master,
                    user: s_user,
                    password: s_pw,
                };
                (kind, db.or(db_param).unwrap_or(0))
            }
            _ => {
                let db = parts.next().map(db_number).transpose().map_err(invalid)?;
                if db.unwrap_or(0) != 0 {
                    return Err(invalid("a Redis Cluster has only database 0".into()));
                }
                (Kind::Cluster, 0)
            }
        };
        if parts.next().is_some() {
            return Err(invalid("junk after the path".into()));
        }
        Ok(ShardAddr {
            kind,
            tls,
            endpoints,
            db,
            username,
            password,
        })
    }

    /// Parses a list of URLs; each entry may itself be a comma-separated list (`--redis a,b`
    /// given once or the flag repeated). `password` (from `--redis-password-file`) is used
    /// by every shard whose URL has none.
    pub fn parse_list<S: AsRef<str>>(
        urls: &[S],
        password: Option<&str>,
    ) -> Result<Vec<ShardAddr>, AddrError> {
        let mut out = Vec::new();
        for u in urls {
            for part in u.as_ref().split(',') {
                if !part.trim().is_empty() {
                    let mut a = ShardAddr::parse(part)?;
                    if a.password.is_none() {
                        a.password = password.map(str::to_string);
                    }
                    out.push(a);
                }
            }
        }
        if out.is_empty() {
            return Err(AddrError::Empty);
        }
        Ok(out)
    }

    /// The kind's name for logs and labels: `standalone`, `sentinel` or `cluster`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Standalone => "standalone",
            Kind::Sentinel { .. } => "sentinel",
            Kind::Cluster => "cluster",
        }
    }

    /// Whether the shard can fail over (Sentinel or Cluster): `WAIT` is on by default there.
    pub fn fails_over(&self) -> bool {
        !matches!(self.kind, Kind::Standalone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_urls_normalise_without_password() {
        let l =
            ShardAddr::parse_list(&["redis://:secret@LocalHost:7000/3, redis://h2"], None).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].to_string(), "localhost:7000/3");
        assert_eq!(l[0].password.as_deref(), Some("secret"));
        assert_eq!(l[0].username, None);
        assert_eq!(l[1].to_string(), "h2:6379/0");
        assert!(!format!("{:?}", l[0]).contains("secret"));
        let v6 = ShardAddr::parse("rediss://u:p%40ss@[::1]:6380/2").unwrap();
        assert!(v6.tls);
        assert_eq!(v6.to_string(), "[::1]:6380/2");
        assert_eq!(v6.username.as_deref(), Some("u"));
        assert_eq!(v6.password.as_deref(), Some("p@ss"));
    }

    #[test]
    fn sentinel_and_cluster_forms() {
        let s = ShardAddr::parse(
            "rediss+sentinel://relay:pw@10.0.0.1:26379/mymaster/4?addr=10.0.0.2:26380&addr=[fe80::1]&sentinel_user=s&sentinel_password=sp",
        )
        .unwrap();
        assert!(s.tls);
        assert_eq!(s.db, 4);
        assert_eq!(s.endpoints.len(), 3);
        assert_eq!(s.endpoints[2].to_string(), "[fe80::1]:26379");
        assert_eq!(s.to_string(), "sentinel:mymaster/4");
        match &s.kind {
            Kind::Sentinel {
                master,
                user,
                password,
            } => {
                assert_eq!(master, "mymaster");
                assert_eq!(user.as_deref(), Some("s"));
                assert_eq!(password.as_deref(), Some("sp"));
            }
            _ => panic!("not a sentinel"),
        }
        let c = ShardAddr::parse("redis+cluster://b:7001?addr=a:7000").unwrap();
        assert!(matches!(c.kind, Kind::Cluster));
        assert_eq!(c.to_string(), "cluster:a:7000+b:7001");
        assert!(c.fails_over());
        let with_file =
            ShardAddr::parse_list(&["redis://u@h:1", "redis://:own@h:2"], Some("f")).unwrap();
        assert_eq!(with_file[0].password.as_deref(), Some("f"));
        assert_eq!(with_file[1].password.as_deref(), Some("own"));
    }

    #[test]
    fn bad_urls_are_refused_with_the_password_redacted() {
        for bad in [
            "http://x",
            "redis://u:pw@host:0/0",
            "redis://u:pw@host:1/x",
            "redis+sentinel://u:pw@host:1",
            "redis+sentinel://u:pw@h:1/m?adr=h:2",
            "redis+cluster://u:pw@h:1/3",
            "redis://u:pw@h:1?addr=h:2",
            "redis://u:pw@:1",
        ] {
            let e = ShardAddr::parse(bad).unwrap_err();
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
        assert!(matches!(
            ShardAddr::parse("unix:///tmp/r.sock").unwrap_err(),
            AddrError::Unsupported { .. }
        ));
        assert_eq!(
            ShardAddr::parse_list::<&str>(&[], None).unwrap_err(),
            AddrError::Empty
        );
        assert_eq!(redact("redis://u:pw@h:1"), "redis://u:***@h:1");
        assert_eq!(
            redact("redis+sentinel://h/m?sentinel_password=x&addr=h2"),
            "redis+sentinel://h/m?sentinel_password=***&addr=h2"
        );
    }
}
