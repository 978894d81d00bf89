//! The client side of the subcommands `walletrelay probe URL` and `walletrelay drain
//! ADMIN_ADDR`: one blocking HTTP/1.1 request over a `std` TCP stream, everything within
//! one deadline, so that an image's health check and a Kubernetes `preStop` hook need no
//! shell or curl.
//!
//! Owns the URL's parsing (plain `http://` only), the request, reading one bounded answer,
//! and what each subcommand makes of it; printing and exit codes are `main`'s.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long a request may take in all (connect, send, answer).
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Most bytes of an answer read (its head and as much of its body).
const MAX_ANSWER: usize = 1 << 20;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL or address is not one this client speaks.
    #[error("{0}")]
    BadUrl(String),
    /// The address does not resolve, or no connection could be made.
    #[error("{what} {target}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// `host:port`.
        target: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// What came back is no HTTP/1.x answer.
    #[error("{target}: {why}")]
    BadAnswer {
        /// `host:port`.
        target: String,
        /// What was wrong.
        why: String,
    },
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host as written (a name, an IPv4 address or a bracketed IPv6 one).
    pub host: String,
    /// The port (80 when the URL has none).
    pub port: u16,
    /// The path and query (`/` when the URL has none).
    pub path: String,
}

impl Target {
    /// Parses `http://host[:port][/path]`.
    pub fn parse_url(url: &str) -> Result<Target, ClientError> {
        let Some(rest) = url.strip_prefix("http://") else {
            let why = if url.starts_with("https://") {
                "https is not supported: probe the plain or admin address"
            } else {
                "expected http://HOST[:PORT][/PATH]"
            };
            return Err(ClientError::BadUrl(format!("{url}: {why}")));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        Target::authority(authority, 80, path)
            .map_err(|why| ClientError::BadUrl(format!("{url}: {why}")))
    }

    /// Parses an admin address: `host:port`, or an `http://` URL (its path ignored).
    pub fn parse_admin(addr: &str, path: &str) -> Result<Target, ClientError> {
        let t = if addr.contains("://") {
            Target::parse_url(addr)?
        } else {
            Target::authority(addr, 0, String::new())
                .map_err(|why| ClientError::BadUrl(format!("{addr}: {why}")))?
        };
        if t.port == 0 {
            return Err(ClientError::BadUrl(format!(
                "{addr}: expected HOST:PORT (the --admin-listen address)"
            )));
        }
        Ok(Target {
            path: path.to_string(),
            ..t
        })
    }

    fn authority(a: &str, default_port: u16, path: String) -> Result<Target, &'static str> {
        if a.is_empty() || a.contains('@') {
            return Err("expected HOST[:PORT] (no user part)");
        }
        let (host, port) = if let Some(v6) = a.strip_prefix('[') {
            let (inner, after) = v6.split_once(']').ok_or("unclosed [")?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| "bad port")?,
                None if after.is_empty() => default_port,
                None => return Err("bad address"),
            };
            (format!("[{inner}]"), port)
        } else {
            match a.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| "bad port")?),
                None => (a.to_string(), default_port),
            }
        };
        if host.is_empty() || host.bytes().any(|b| b <= b' ' || b == b'/') {
            return Err("bad host");
        }
        Ok(Target { host, port, path })
    }

    /// `host:port`.
    pub fn authority_text(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The status line as sent (`HTTP/1.1 503 Service Unavailable`).
    pub status_line: String,
    /// The body, as much of it as [`MAX_ANSWER`] allows.
    pub body: Vec<u8>,
}

impl Answer {
    /// A 2xx status.
    pub fn success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Sends `method` to `target` (no body) and reads its answer, all within [`TIMEOUT`].
pub fn request(method: &str, target: &Target) -> Result<Answer, ClientError> {
    let deadline = Instant::now() + TIMEOUT;
    let name = target.authority_text();
    let io = |what| {
        let name = name.clone();
        move |source| ClientError::Io {
            what,
            target: name,
            source,
        }
    };
    let addrs: Vec<SocketAddr> = name.to_socket_addrs().map_err(io("resolving"))?.collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    let mut stream = None;
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last = std::io::ErrorKind::TimedOut.into();
            break;
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut s = stream.ok_or_else(|| io("connecting to")(last))?;
    let left = |d: Instant| {
        Some(
            d.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        )
    };
    s.set_write_timeout(left(deadline))
        .map_err(io("writing to"))?;
    let req = format!(
        "{method} {} HTTP/1.1\r\nHost: {name}\r\nUser-Agent: walletrelay/{}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
        target.path,
        crate::version::VERSION
    );
    s.write_all(req.as_bytes()).map_err(io("writing to"))?;
    let mut got = Vec::with_capacity(4096);
    let mut buf = [0u8; 8192];
    loop {
        if let Some(a) = parse_answer(&got, &name)? {
            return Ok(a);
        }
        if Instant::now() >= deadline {
            return Err(io("reading from")(std::io::ErrorKind::TimedOut.into()));
        }
        s.set_read_timeout(left(deadline))
            .map_err(io("reading from"))?;
        match s.read(&mut buf) {
            Ok(0) => return finish_at_eof(got, &name),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.len() >= MAX_ANSWER {
                    return finish_at_eof(got, &name);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io("reading from")(e)),
        }
    }
}

/// The answer in `got` once its head and its `Content-Length` body are whole.
fn parse_answer(got: &[u8], name: &str) -> Result<Option<Answer>, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(got) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => {
            return Err(ClientError::BadAnswer {
                target: name.to_string(),
                why: format!("not an HTTP answer ({e})"),
            })
        }
    };
    let status = resp.code.unwrap_or(0);
    let length = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        });
    let bodiless = status == 204 || status == 304 || (100..200).contains(&status);
    let want = if bodiless {
        0
    } else {
        length.unwrap_or(usize::MAX)
    };
    let body = &got[head..];
    // Without a length the answer ends where the connection does (or at the cap).
    if body.len() < want.min(MAX_ANSWER.saturating_sub(head)) {
        return Ok(None);
    }
    let line_end = got.iter().position(|&b| b == b'\r').unwrap_or(head);
    Ok(Some(Answer {
        status,
        status_line: String::from_utf8_lossy(&got[..line_end]).into_owned(),
        body: body[..body.len().min(want)].to_vec(),
    }))
}

/// The peer closed (or the cap was reached): what came is the answer, if its head did.
fn finish_at_eof(got: Vec<u8>, name: &str) -> Result<Answer, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&got) {
        Ok(httparse::Status::Complete(head)) => {
            let line_end = got.iter().position(|&b| b == b'\r').unwrap_or(head);
            Ok(Answer {
                status: resp.code.unwrap_or(0),
                status_line: String::from_utf8_lossy(&got[..line_end]).into_owned(),
                body: got[head..].to_vec(),
            })
        }
        _ => Err(ClientError::BadAnswer {
            target: name.to_string(),
            why: "the connection closed before an answer".to_string(),
        }),
    }
}

/// `walletrelay probe URL`: one GET.
pub fn probe(url: &str) -> Result<Answer, ClientError> {
    request("GET", &Target::parse_url(url)?)
}

/// What `POST /drain` answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrainAnswer {
    /// The node's `--drain`, in seconds.
    pub drain_seconds: f64,
    /// What is left of the drain, in milliseconds.
    pub remaining_ms: u64,
}

/// `walletrelay drain ADMIN_ADDR`: `POST /drain` to the admin address; what is left of the
/// drain (the caller waits for it).
pub fn drain(admin: &str) -> Result<DrainAnswer, ClientError> {
    let target = Target::parse_admin(admin, "/drain")?;
    let a = request("POST", &target)?;
    let bad = |why: String| ClientError::BadAnswer {
        target: target.authority_text(),
        why,
    };
    if a.status != 202 {
        let body = String::from_utf8_lossy(&a.body);
        return Err(bad(format!("{} {}", a.status_line, body.trim())));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&a.body).map_err(|e| bad(format!("not JSON: {e}")))?;
    let remaining_ms = v["remaining_ms"]
        .as_u64()
        .ok_or_else(|| bad("no remaining_ms in the answer".to_string()))?;
    Ok(DrainAnswer {
        drain_seconds: v["drain_seconds"].as_f64().unwrap_or(0.0),
        remaining_ms,
    })
}

/// `walletrelay switch-layout ADMIN_ADDR`: `POST /layout/switch`; the answer's body on
/// 200, else why not.
pub fn switch_layout(admin: &str) -> Result<String, ClientError> {
    let target = Target::parse_admin(admin, "/layout/switch")?;
    let a = request("POST", &target)?;
    let body = String::from_utf8_lossy(&a.body).trim().to_string();
    if a.status != 200 {
        return Err(ClientError::BadAnswer {
            target: target.authority_text(),
            why: format!("{} {body}", a.status_line),
        });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_admin_addresses_parse() {
        let t = Target::parse_url("http://127.0.0.1:9091/ready").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("127.0.0.1", 9091, "/ready")
        );
        let t = Target::parse_url("http://relay.example").unwrap();
        assert_eq!((t.port, t.path.as_str()), (80, "/"));
        let t = Target::parse_url("http://[::1]:8080?x=1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("[::1]", 8080, "/?x=1")
        );
        assert!(Target::parse_url("https://x/").is_err());
        assert!(Target::parse_url("ftp://x/").is_err());
        assert!(Target::parse_url("http://u@x/").is_err());
        assert!(Target::parse_url("http://x:port/").is_err());
        assert!(Target::parse_url("http:///ready").is_err());
        let t = Target::parse_admin("127.0.0.1:9091", "/drain").unwrap();
        assert_eq!((t.port, t.path.as_str()), (9091, "/drain"));
        let t = Target::parse_admin("http://localhost:9091/x", "/drain").unwrap();
        assert_eq!((t.host.as_str(), t.path.as_str()), ("localhost", "/drain"));
        assert!(Target::parse_admin("localhost", "/drain").is_err());
    }

    #[test]
    fn answers_are_read_by_length_or_to_the_end() {
        let whole = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusyX";
        let a = parse_answer(whole, "x").unwrap().unwrap();
        assert_eq!((a.status, a.body.as_slice()), (503, &b"busy"[..]));
        assert_eq!(a.status_line, "HTTP/1.1 503 Service Unavailable");
        assert!(!a.success());
        assert_eq!(
            parse_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab", "x").unwrap(),
            None
        );
        let a = parse_answer(b"HTTP/1.1 204 No Content\r\n\r\n", "x")
            .unwrap()
            .unwrap();
        assert!(a.success() && a.body.is_empty());
        assert!(parse_answer(b"SSH-2.0-OpenSSH\r\n\r\n", "x").is_err());
        let a = finish_at_eof(b"HTTP/1.0 200 OK\r\n\r\nall of it".to_vec(), "x").unwrap();
        assert_eq!(a.body, b"all of it");
        assert!(finish_at_eof(b"HTTP/1.1 20".to_vec(), "x").is_err());
    }
}
