//! HTTP/1.1 requests: an incremental, pure parser (`httparse` underneath) that turns the bytes
//! a connection has read into a typed [`Request`], and the [`Route`] table that says which
//! handler answers it. No I/O happens here; `conn` feeds bytes in and writes answers out.

pub mod response;

use thiserror::Error;

use crate::config::Limits;

/// Most header lines accepted in one request head.
const MAX_HEADERS: usize = 64;

/// Request methods the server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// HEAD (answered like GET, without body)
    Head,
    /// POST
    Post,
    /// OPTIONS (CORS preflight)
    Options,
    /// Any other method (answered 405 on known paths, 404 elsewhere).
    Other,
}

/// A parsed request head (and its body, once complete). Borrows the connection's read buffer.
#[derive(Debug)]
pub struct Request<'a> {
    /// The method.
    pub method: Method,
    /// Path without the query string.
    pub path: &'a str,
    /// Raw query string without the `?`, empty when absent.
    pub query: &'a str,
    /// The client wants the connection closed after this answer (HTTP/1.0 without
    /// keep-alive, or `Connection: close`).
    pub close: bool,
    /// `Upgrade: websocket` with `Connection: upgrade`.
    pub upgrade_websocket: bool,
    /// `Sec-WebSocket-Key` (empty when the header came more than once: RFC 6455 §11.3.1
    /// allows one, so a repeated key is no valid key).
    pub ws_key: Option<&'a [u8]>,
    /// `Sec-WebSocket-Version`.
    pub ws_version: Option<&'a [u8]>,
    /// The first acceptable permessage-deflate offer of the `Sec-WebSocket-Extensions`
    /// header lines, whether or not `--permessage-deflate` is on (the connection applies
    /// the flag).
    pub ws_deflate: Option<crate::ws::deflate::Agreement>,
    /// `If-None-Match`.
    pub if_none_match: Option<&'a [u8]>,
    /// `Accept-Encoding` lists gzip.
    pub accept_gzip: bool,
    /// `Content-Type`.
    pub content_type: Option<&'a [u8]>,
    /// `Authorization` (relay auth: `Bearer <jwt>`).
    pub authorization: Option<&'a [u8]>,
    /// `X-Forwarded-For` (the last such line; used only from `--trusted-proxies`).
    pub forwarded_for: Option<&'a [u8]>,
    /// The request body (`Content-Length` bytes).
    pub body: &'a [u8],
    /// HTTP/1.0 (a WebSocket upgrade needs HTTP/1.1: RFC 6455 §4.1).
    pub http10: bool,
}

/// Why a request head could not be accepted; each maps to one status code.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HttpError {
    /// Malformed request line or header.
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    /// Head larger than the limit, or too many header lines.
    #[error("request head too large")]
    HeadTooLarge,
    /// Body larger than the limit.
    #[error("request body too large")]
    BodyTooLarge,
    /// `Transfer-Encoding` (chunked) bodies are not accepted.
    #[error("chunked request bodies are not supported; send Content-Length")]
    LengthRequired,
    /// Not HTTP/1.x.
    #[error("HTTP version not supported")]
    Version,
}

impl HttpError {
    /// The status code that answers this error.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::Malformed(_) => 400,
            HttpError::HeadTooLarge => 431,
            HttpError::BodyTooLarge => 413,
            HttpError::LengthRequired => 411,
            HttpError::Version => 505,
        }
    }
}

/// Parses one request from the front of `buf`.
///
/// `Ok(None)`: more bytes are needed. `Ok(Some((n, req)))`: the request (head and body)
/// took the first `n` bytes. `Err`: the request is invalid and the connection must be
/// answered with [`HttpError::status`] and closed.
///
/// One function (about 110 lines) on purpose: the checks of a request head run in the
/// order RFC 9112 gives them, each a few lines with the error it maps to; the hot path
/// reads them once, top to bottom, without a call per header.
pub fn parse<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(usize, Request<'a>)>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => {
            if n > limits.max_head {
                return Err(HttpError::HeadTooLarge);
            }
            n
        }
        Ok(httparse::Status::Partial) => {
            if buf.len() > limits.max_head {
                return Err(HttpError::HeadTooLarge);
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeadTooLarge),
        Err(httparse::Error::Version) => return Err(version_error(buf)),
        Err(_) => return Err(HttpError::Malformed("bad request line or header")),
    };
    let method = match req.method.unwrap_or("") {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "OPTIONS" => Method::Options,
        _ => Method::Other,
    };
    let target = req.path.unwrap_or("/");
    if !target.starts_with('/') && target != "*" {
        return Err(HttpError::Malformed(
            "request target must be an absolute path",
        ));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, q),
        None => (target, ""),
    };
    let http10 = req.version == Some(0);
    let mut out = Request {
        method,
        path,
        query,
        close: http10,
        upgrade_websocket: false,
        ws_key: None,
        ws_version: None,
        ws_deflate: None,
        if_none_match: None,
        accept_gzip: false,
        content_type: None,
        authorization: None,
        forwarded_for: None,
        body: &[],
        http10,
    };
    let mut content_length: Option<usize> = None;
    let mut conn_upgrade = false;
    let mut upgrade_ws = false;
    for h in req.headers.iter() {
        let name = h.name;
        let v = h.value;
        if name.eq_ignore_ascii_case("content-length") {
            let n = parse_decimal(v).ok_or(HttpError::Malformed("invalid Content-Length"))?;
            if content_length.is_some_and(|c| c != n) {
                return Err(HttpError::Malformed("conflicting Content-Length"));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::LengthRequired);
        } else if name.eq_ignore_ascii_case("connection") {
            for tok in v.split(|&b| b == b',') {
                let tok = trim(tok);
                if tok.eq_ignore_ascii_case(b"close") {
                    out.close = true;
                } else if tok.eq_ignore_ascii_case(b"keep-alive") {
                    out.close = false;
                } else if tok.eq_ignore_ascii_case(b"upgrade") {
                    conn_upgrade = true;
                }
            }
        } else if name.eq_ignore_ascii_case("upgrade") {
            upgrade_ws = v
                .split(|&b| b == b',')
                .any(|t| trim(t).eq_ignore_ascii_case(b"websocket"));
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            out.ws_key = Some(if out.ws_key.is_some() { &[] } else { trim(v) });
        } else if name.eq_ignore_ascii_case("sec-websocket-version") {
            out.ws_version = Some(trim(v));
        } else if name.eq_ignore_ascii_case("sec-websocket-extensions") {
            out.ws_deflate = out
                .ws_deflate
                .or_else(|| crate::ws::deflate::accept_offer(v));
        } else if name.eq_ignore_ascii_case("if-none-match") {
            out.if_none_match = Some(trim(v));
        } else if name.eq_ignore_ascii_case("accept-encoding") {
            // Several lines are one list (RFC 9110 §5.3).
            out.accept_gzip |= accepts_gzip(v);
        } else if name.eq_ignore_ascii_case("authorization") {
            out.authorization = Some(trim(v));
        } else if name.eq_ignore_ascii_case("x-forwarded-for") {
            out.forwarded_for = Some(trim(v));
        } else if name.eq_ignore_ascii_case("content-type") {
            out.content_type = Some(trim(v));
        }
    }
    out.upgrade_websocket = conn_upgrade && upgrade_ws;
    let body_len = content_length.unwrap_or(0);
    // `POST /rpc` carries one JSON-RPC request: up to `--max-message`, as on a socket.
    let max_body = if path == "/rpc" {
        limits.max_message
    } else {
        limits.max_body
    };
    if body_len > max_body {
        return Err(HttpError::BodyTooLarge);
    }
    let total = head_len + body_len;
    if buf.len() < total {
        return Ok(None);
    }
    out.body = &buf[head_len..total];
    Ok(Some((total, out)))
}

/// What `httparse`'s version error means: 505 only for a request line of three parts whose
/// last is some `HTTP/x.y` (a version this server does not speak); anything else that ends
/// the line where a version should be (a space inside the target, say) is malformed.
fn version_error(buf: &[u8]) -> HttpError {
    let line = buf
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or(b"");
    let mut parts = line.split(|&b| b == b' ');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(_), Some(v), None) if v.starts_with(b"HTTP/") => HttpError::Version,
        _ => HttpError::Malformed("bad request line"),
    }
}

/// Registry paths, below `/api/v1/`: the three listings and `logo/:size/:id` (the shapes
/// `registry::Registry::respond` answers; anything else there is an unknown path).
pub fn is_registry_path(rest: &str) -> bool {
    match rest {
        "wallets" | "dapps" | "all" => true,
        _ => rest
            .strip_prefix("logo/")
            .and_then(|l| l.split_once('/'))
            .is_some_and(|(_, id)| !id.contains('/')),
    }
}

fn parse_decimal(v: &[u8]) -> Option<usize> {
    let v = trim(v);
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        v.iter()
            .fold(0usize, |a, &d| a * 10 + usize::from(d - b'0')),
    )
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// `Accept-Encoding` lists `gzip` (or `x-gzip`, RFC 9110 §8.4.1.3, or `*`) with a non-zero
/// quality.
fn accepts_gzip(v: &[u8]) -> bool {
    v.split(|&b| b == b',').any(|item| {
        let mut parts = item.split(|&b| b == b';');
        let coding = trim(parts.next().unwrap_or(b""));
        if !(coding.eq_ignore_ascii_case(b"gzip")
            || coding.eq_ignore_ascii_case(b"x-gzip")
            || coding == b"*")
        {
            return false;
        }
        !parts.any(|p| {
            let p = trim(p);
            p.len() >= 2
                && p[..2].eq_ignore_ascii_case(b"q=")
                && trim(&p[2..]).iter().all(|&c| c == b'0' || c == b'.')
        })
    })
}

/// What answers a request, decided by path and method alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /hello`
    Hello,
    /// `GET /health`
    Health,
    /// `GET /ready`: whether the node should get new clients (the drain, the engine).
    Ready,
    /// `GET /metrics`
    Metrics,
    /// `POST /subscribe`
    Subscribe,
    /// `GET /public-key`: the relay's Ed25519 public key in hex.
    PublicKey,
    /// `POST /rpc`: JSON-RPC over HTTP.
    Rpc,
    /// WebSocket upgrade at `/` (the relay).
    Relay,
    /// WebSocket upgrade at `/echo` (test-only, `--ws-echo`).
    Echo,
    /// `/api/v1/...` (the registry decides the rest).
    Registry,
    /// CORS preflight on a known path.
    Preflight(&'static str),
    /// Known path, wrong method; the value is the `Allow` header.
    MethodNotAllowed(&'static str),
    /// Unknown path.
    NotFound,
}

/// Picks the handler for `method` and `path`. `echo` enables the test-only `/echo` route.
pub fn route(method: Method, path: &str, echo: bool) -> Route {
    let (allow, r) = match path {
        "/hello" => ("GET, HEAD, OPTIONS", Route::Hello),
        "/health" => ("GET, HEAD, OPTIONS", Route::Health),
        "/ready" => ("GET, HEAD, OPTIONS", Route::Ready),
        "/metrics" => ("GET, HEAD, OPTIONS", Route::Metrics),
        "/subscribe" => ("POST, OPTIONS", Route::Subscribe),
        "/public-key" => ("GET, HEAD, OPTIONS", Route::PublicKey),
        "/rpc" => ("POST, OPTIONS", Route::Rpc),
        "/" => ("GET, HEAD, OPTIONS", Route::Relay),
        "/echo" if echo => ("GET, HEAD, OPTIONS", Route::Echo),
        p if p.strip_prefix("/api/v1/").is_some_and(is_registry_path) => {
            ("GET, HEAD, OPTIONS", Route::Registry)
        }
        _ => return Route::NotFound,
    };
    match (method, r) {
        (Method::Options, _) => Route::Preflight(allow),
        (Method::Post, Route::Subscribe | Route::Rpc) => r,
        (_, Route::Subscribe | Route::Rpc) => Route::MethodNotAllowed(allow),
        // HEAD works wherever GET does (DECISIONS §1): at `/` it gets GET's answer to a
        // request that is no upgrade (426), without the body.
        (Method::Get | Method::Head, _) => r,
        _ => Route::MethodNotAllowed(allow),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    #[test]
    fn partial_head_needs_more() {
        assert!(matches!(
            parse(b"GET /hello HTTP/1.1\r\nHost: x\r\n", &limits()),
            Ok(None)
        ));
    }

    #[test]
    fn parses_path_query_and_flags() {
        let raw = b"GET /api/v1/all?search=a&page=1 HTTP/1.1\r\nHost: x\r\n\
                    Accept-Encoding: br, gzip;q=0.8\r\nIf-None-Match: \"abc\"\r\n\r\nGET";
        let (n, r) = parse(raw, &limits()).unwrap().unwrap();
        assert_eq!(n, raw.len() - 3);
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.path, "/api/v1/all");
        assert_eq!(r.query, "search=a&page=1");
        assert!(r.accept_gzip);
        assert!(!r.close);
        assert_eq!(r.if_none_match, Some(&b"\"abc\""[..]));
    }

    #[test]
    fn records_the_first_acceptable_deflate_offer() {
        let raw = b"GET / HTTP/1.1\r\nSec-WebSocket-Extensions: x-foo, permessage-deflate; bad\r\n\
                    sec-websocket-extensions: permessage-deflate; server_max_window_bits=10\r\n\
                    Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n";
        let (_, r) = parse(raw, &limits()).unwrap().unwrap();
        assert_eq!(r.ws_deflate.map(|a| a.window_bits()), Some(10));
        let (_, r) = parse(b"GET / HTTP/1.1\r\n\r\n", &limits())
            .unwrap()
            .unwrap();
        assert_eq!(r.ws_deflate, None);
    }

    #[test]
    fn gzip_with_zero_quality_is_refused() {
        assert!(!accepts_gzip(b"gzip;q=0"));
        assert!(!accepts_gzip(b"identity"));
        assert!(accepts_gzip(b"*"));
    }

    #[test]
    fn waits_for_the_whole_body() {
        let raw = b"POST /subscribe HTTP/1.1\r\nContent-Length: 5\r\n\r\nab";
        assert!(matches!(parse(raw, &limits()), Ok(None)));
        let raw = b"POST /subscribe HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcdeX";
        let (n, r) = parse(raw, &limits()).unwrap().unwrap();
        assert_eq!(r.body, b"abcde");
        assert_eq!(n, raw.len() - 1);
    }

    #[test]
    fn errors_map_to_statuses() {
        let l = limits();
        let e = |raw: &[u8]| parse(raw, &l).unwrap_err().status();
        assert_eq!(e(b"GARBAGE\x01 / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(
            e(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            411
        );
        assert_eq!(
            e(b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n"),
            413
        );
        assert_eq!(
            e(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            400
        );
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(20_000, b'a');
        assert_eq!(e(&big), 431);
    }

    #[test]
    fn http10_closes_unless_keep_alive() {
        let (_, r) = parse(b"GET / HTTP/1.0\r\n\r\n", &limits())
            .unwrap()
            .unwrap();
        assert!(r.close);
        let (_, r) = parse(
            b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            &limits(),
        )
        .unwrap()
        .unwrap();
        assert!(!r.close);
    }

    #[test]
    fn routes() {
        assert_eq!(route(Method::Get, "/hello", false), Route::Hello);
        assert_eq!(route(Method::Head, "/hello", false), Route::Hello);
        assert_eq!(route(Method::Get, "/ready", false), Route::Ready);
        assert_eq!(route(Method::Head, "/ready", false), Route::Ready);
        assert_eq!(
            route(Method::Post, "/hello", false),
            Route::MethodNotAllowed("GET, HEAD, OPTIONS")
        );
        assert_eq!(
            route(Method::Get, "/subscribe", false),
            Route::MethodNotAllowed("POST, OPTIONS")
        );
        assert_eq!(route(Method::Get, "/echo", false), Route::NotFound);
        assert_eq!(route(Method::Get, "/echo", true), Route::Echo);
        assert_eq!(
            route(Method::Options, "/api/v1/all", false),
            Route::Preflight("GET, HEAD, OPTIONS")
        );
        assert_eq!(route(Method::Get, "/nope", false), Route::NotFound);
        assert_eq!(route(Method::Head, "/", false), Route::Relay);
        assert_eq!(
            route(Method::Post, "/", false),
            Route::MethodNotAllowed("GET, HEAD, OPTIONS")
        );
    }

    #[test]
    fn unknown_registry_paths_are_not_found_whatever_the_method() {
        for m in [
            Method::Get,
            Method::Head,
            Method::Post,
            Method::Options,
            Method::Other,
        ] {
            for p in [
                "/api/v1/nope",
                "/api/v1/",
                "/api/v1/wallets/",
                "/api/v1/logo/sm",
                "/api/v1/logo/sm/a/b",
                "/api/v1/anything/deep",
            ] {
                assert_eq!(route(m, p, false), Route::NotFound, "{m:?} {p}");
            }
        }
        for p in [
            "/api/v1/wallets",
            "/api/v1/dapps",
            "/api/v1/all",
            "/api/v1/logo/xl/x",
        ] {
            assert_eq!(route(Method::Get, p, false), Route::Registry, "{p}");
            assert_eq!(
                route(Method::Post, p, false),
                Route::MethodNotAllowed("GET, HEAD, OPTIONS")
            );
        }
    }

    #[test]
    fn only_a_foreign_version_is_505() {
        let e = |b: &[u8]| parse(b, &limits()).err();
        assert_eq!(e(b"GET / HTTP/2.0\r\n\r\n"), Some(HttpError::Version));
        assert_eq!(
            e(b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(HttpError::Malformed("bad request line"))
        );
    }

    #[test]
    fn accept_encoding_lines_are_one_list() {
        let gz = |h: &[u8]| {
            let mut r = b"GET / HTTP/1.1\r\n".to_vec();
            r.extend_from_slice(h);
            r.extend_from_slice(b"\r\n");
            parse(&r, &limits()).unwrap().unwrap().1.accept_gzip
        };
        assert!(gz(b"Accept-Encoding: gzip\r\nAccept-Encoding: br\r\n"));
        assert!(gz(b"Accept-Encoding: br\r\nAccept-Encoding: gzip\r\n"));
        assert!(gz(b"Accept-Encoding: x-gzip\r\n"));
        assert!(!gz(b"Accept-Encoding: br\r\nAccept-Encoding: gzip;q=0\r\n"));
    }

    #[test]
    fn a_repeated_websocket_key_is_empty() {
        let (_, r) = parse(
            b"GET / HTTP/1.1\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            &limits(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.ws_key, Some(&b""[..]));
    }
}
