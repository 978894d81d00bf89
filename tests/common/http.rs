//! HTTP/1.1 for the tests: request builders and one strict answer reader ([`HttpConn`]) that
//! takes pipelined answers off a connection one at a time, so a stray or missing byte breaks
//! the next answer's parse. It owns only the client side of the wire; it must not interpret
//! what the server means (the tests assert that).

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Server, READ_TIMEOUT};

/// The content type of every JSON answer.
pub const JSON: &str = "application/json; charset=utf-8";

/// `GET path` with a `Host` header, keep-alive.
pub fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
}

/// `POST /subscribe` (a webhook registration) with `body` as the JSON body, keep-alive.
pub fn post_subscribe(body: &str) -> String {
    format!(
        "POST /subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Where the blank line ending an HTTP head starts, if `buf` holds one.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// The status code of an HTTP answer (its first line), if the bytes start with one.
pub fn status_of(raw: &[u8]) -> Option<u16> {
    let line = raw.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let rest = line.strip_prefix("HTTP/1.1 ")?;
    rest.get(..3)?.parse().ok()
}

/// The bytes after the head of an HTTP answer (empty if there is no complete head).
pub fn body_of(raw: &[u8]) -> &[u8] {
    head_end(raw).map_or(&[][..], |p| &raw[p + 4..])
}

/// The value of the first header field named `name` (case-insensitive) in `headers`.
pub fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// One HTTP answer as read off the socket.
#[derive(Debug, Clone, PartialEq)]
pub struct Resp {
    /// Status code.
    pub status: u16,
    /// Header fields in order (names as sent; each name at most once).
    pub headers: Vec<(String, String)>,
    /// The body (by `Content-Length`; empty for HEAD, 1xx, 204 and 304).
    pub body: Vec<u8>,
}

impl Resp {
    /// The value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body as UTF-8 text.
    pub fn body_str(&self) -> &str {
        std::str::from_utf8(&self.body).expect("UTF-8 body")
    }

    /// The body as JSON; the answer must say `application/json; charset=utf-8`.
    pub fn json(&self) -> Value {
        assert_eq!(self.header("Content-Type"), Some(JSON), "{self:?}");
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body_str()))
    }

    /// A JSON `{"error": "<non-empty string>"}` answer.
    pub fn assert_json_error(&self) {
        let v = self.json();
        let e = v["error"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(!e.is_empty(), "{v}");
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, msg)
}

/// Parses a head (status line and header lines, without the blank line), strictly:
/// `HTTP/1.1 <3 digits> <reason>`, `name: value` lines, no name twice.
pub fn parse_head(head: &str) -> io::Result<(u16, Vec<(String, String)>)> {
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let parts: Vec<&str> = status_line.splitn(3, ' ').collect();
    if parts.len() != 3 || parts[0] != "HTTP/1.1" || parts[1].len() != 3 || parts[2].is_empty() {
        return Err(invalid(format!("bad status line {status_line:?}")));
    }
    let status = parts[1]
        .parse()
        .map_err(|_| invalid(format!("bad status code in {status_line:?}")))?;
    let mut headers: Vec<(String, String)> = Vec::new();
    for l in lines {
        let (n, v) = l
            .split_once(':')
            .ok_or_else(|| invalid(format!("bad header line {l:?} in {head:?}")))?;
        if n.is_empty() || n.contains(' ') {
            return Err(invalid(format!("bad header name {l:?}")));
        }
        if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n)) {
            return Err(invalid(format!("header {n} sent twice in {head:?}")));
        }
        headers.push((n.to_string(), v.trim().to_string()));
    }
    Ok((status, headers))
}

/// One client connection with its own read buffer, so pipelined answers can be taken one
/// at a time (and bytes after an upgrade answer are kept).
pub struct HttpConn<S = TcpStream> {
    /// The stream.
    pub s: S,
    /// Bytes read but not yet parsed.
    pub buf: Vec<u8>,
}

impl HttpConn<TcpStream> {
    /// A fresh connection to `server`.
    pub fn open(server: &Server) -> HttpConn {
        HttpConn::new(server.tcp())
    }

    /// The server must close the connection, with nothing more sent, within 5 s.
    pub fn expect_closed(&mut self) {
        let start = Instant::now();
        let mut tmp = [0u8; 4096];
        loop {
            match self.s.read(&mut tmp) {
                Ok(0) => break,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) => panic!("connection not closed ({e})"),
            }
        }
        assert!(start.elapsed() < Duration::from_secs(5), "closed too late");
        assert!(
            self.buf.is_empty(),
            "bytes after the last answer: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
    }

    /// The connection must still be open: nothing arrives within `ms`.
    pub fn expect_open_and_silent(&mut self, ms: u64) {
        self.s
            .set_read_timeout(Some(Duration::from_millis(ms)))
            .unwrap();
        let mut tmp = [0u8; 16];
        match self.s.read(&mut tmp) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Ok(0) => panic!("server closed a keep-alive connection"),
            Ok(n) => panic!("unexpected bytes {:?}", &tmp[..n]),
            Err(e) => panic!("read: {e}"),
        }
        self.s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    }
}

impl<S: Read> HttpConn<S> {
    /// Wraps a stream (nothing read yet).
    pub fn new(s: S) -> HttpConn<S> {
        HttpConn { s, buf: Vec::new() }
    }

    /// Reads more bytes into the buffer; `UnexpectedEof` at EOF.
    pub fn read_more(&mut self) -> io::Result<()> {
        let mut tmp = [0u8; 65536];
        loop {
            match self.s.read(&mut tmp) {
                Ok(0) => return Err(io::Error::new(ErrorKind::UnexpectedEof, "EOF")),
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes one answer off the front of the stream. `head_only`: the answer to a HEAD
    /// request (no body whatever `Content-Length` says). A malformed answer is an
    /// `InvalidData` error; EOF or a read error on the way is returned as it came.
    pub fn try_response(&mut self, head_only: bool) -> io::Result<Resp> {
        let end = loop {
            if let Some(p) = head_end(&self.buf) {
                break p;
            }
            self.read_more()?;
        };
        let head = String::from_utf8(self.buf[..end].to_vec())
            .map_err(|_| invalid(format!("head is not UTF-8: {:?}", &self.buf[..end])))?;
        let (status, headers) = parse_head(&head)?;
        self.buf.drain(..end + 4);
        let mut r = Resp {
            status,
            headers,
            body: Vec::new(),
        };
        let len = r.header("Content-Length");
        if (status == 204 || status == 304) && len.is_some_and(|v| v != "0") {
            return Err(invalid(format!("{status} with a Content-Length: {r:?}")));
        }
        if head_only || status == 204 || status == 304 || status < 200 {
            return Ok(r);
        }
        let len: usize = len
            .ok_or_else(|| invalid(format!("no Content-Length: {r:?}")))?
            .parse()
            .map_err(|_| invalid(format!("bad Content-Length: {r:?}")))?;
        while self.buf.len() < len {
            self.read_more()?;
        }
        r.body = self.buf.drain(..len).collect();
        Ok(r)
    }

    /// Like [`HttpConn::try_response`], but anything other than a well-formed answer fails
    /// the test.
    pub fn response(&mut self, head_only: bool) -> Resp {
        self.try_response(head_only).unwrap_or_else(|e| {
            panic!(
                "no well-formed answer ({e}); buffered: {:?}",
                String::from_utf8_lossy(&self.buf[..self.buf.len().min(400)])
            )
        })
    }
}

impl<S: Write> HttpConn<S> {
    /// Writes request bytes.
    pub fn send(&mut self, raw: &[u8]) {
        self.s.write_all(raw).expect("write request");
        // A TLS stream may hold the last record until flushed (TCP: nothing to do).
        self.s.flush().expect("flush request");
    }
}

impl Server {
    /// Sends one request on a fresh connection and reads one answer (a HEAD answer when
    /// `raw` starts with `HEAD `).
    pub fn request(&self, raw: &str) -> Resp {
        let mut c = HttpConn::open(self);
        c.send(raw.as_bytes());
        c.response(raw.starts_with("HEAD "))
    }

    /// Like [`Server::request`], to the admin address (`--admin-listen`).
    pub fn admin_request(&self, raw: &str) -> Resp {
        let mut c = HttpConn::new(self.admin_tcp());
        c.send(raw.as_bytes());
        c.response(raw.starts_with("HEAD "))
    }

    /// `GET path` on a fresh connection with `Connection: close`; returns the status (if an
    /// answer came) and the body.
    pub fn get(&self, path: &str) -> (Option<u16>, Vec<u8>) {
        let raw = self.raw_exchange(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        (status_of(&raw), body_of(&raw).to_vec())
    }

    /// Registers `webhook` for `topic` with `POST /subscribe` on a fresh connection
    /// (`Connection: close`); returns the status (0 if no answer) and the body.
    pub fn register_webhook(&self, topic: &str, webhook: &str) -> (u16, String) {
        let body = serde_json::json!({ "topic": topic, "webhook": webhook }).to_string();
        let req = format!(
            "POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let raw = self.raw_exchange(req.as_bytes());
        (
            status_of(&raw).unwrap_or(0),
            String::from_utf8_lossy(body_of(&raw)).to_string(),
        )
    }
}
