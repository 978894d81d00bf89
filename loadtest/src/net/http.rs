//! HTTP/1.1 response framing for the loop's keep-alive connections: heads (status, then a
//! `Content-Length` or chunked body), bodies skipped as they arrive (counted, not kept),
//! each whole response handed to the handler as an [`HttpResp`].
//!
//! Pure parsers (`parse_http_head`, `chunked_len`: `Ok(None)` = need more bytes) and the
//! per-connection state of a body still arriving; no I/O.

use super::{CloseWhy, Handler, HttpResp, Io, Key};

#[derive(Debug, Default)]
pub(super) struct HttpState {
    /// Body bytes of the current response still to skip, with its status.
    body_left: Option<(u16, usize, usize)>,
}

impl Io {
    pub(super) fn http_responses<H: Handler>(
        &mut self,
        h: &mut H,
        key: Key,
        tag: u32,
        buf: &[u8],
        now: u64,
    ) -> usize {
        let mut off = 0;
        while self.alive(key) && off < buf.len() {
            let Some(c) = self.conns.get_mut(key) else {
                return buf.len();
            };
            // Each pass ends one whole response (status, body length), or returns.
            let (status, body_len) = if let Some((status, total, left)) = c.http.body_left {
                let take = left.min(buf.len() - off);
                off += take;
                if take < left {
                    c.http.body_left = Some((status, total, left - take));
                    return off;
                }
                c.http.body_left = None;
                (status, total)
            } else {
                let head = match parse_http_head(&buf[off..]) {
                    Ok(None) => return off,
                    Ok(Some(head)) => head,
                    Err(e) => {
                        self.mark_dead(key, CloseWhy::Protocol(e));
                        return buf.len();
                    }
                };
                match head.body {
                    Body::Length(0) => {
                        off += head.head_len;
                        (head.status, 0)
                    }
                    Body::Length(n) => {
                        off += head.head_len;
                        c.http.body_left = Some((head.status, n, n));
                        continue;
                    }
                    Body::Chunked => match chunked_len(&buf[off + head.head_len..]) {
                        Ok(None) => return off,
                        Ok(Some((wire, body))) => {
                            off += head.head_len + wire;
                            (head.status, body)
                        }
                        Err(e) => {
                            self.mark_dead(key, CloseWhy::Protocol(e));
                            return buf.len();
                        }
                    },
                }
            };
            h.on_http(self, key, tag, HttpResp { status, body_len }, now);
        }
        off.min(buf.len())
    }
}

enum Body {
    Length(usize),
    Chunked,
}

struct RespHead {
    status: u16,
    head_len: usize,
    body: Body,
}

fn parse_http_head(buf: &[u8]) -> Result<Option<RespHead>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 48];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Partial) => {
            if buf.len() > 64 * 1024 {
                Err("response head too large".into())
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(format!("bad response head: {e}")),
        Ok(httparse::Status::Complete(n)) => {
            let status = resp.code.unwrap_or(0);
            let mut body = None;
            for hd in resp.headers.iter() {
                if hd.name.eq_ignore_ascii_case("content-length") {
                    let v = std::str::from_utf8(hd.value)
                        .ok()
                        .and_then(|s| s.trim().parse::<usize>().ok())
                        .ok_or("bad content-length")?;
                    body = Some(Body::Length(v));
                } else if hd.name.eq_ignore_ascii_case("transfer-encoding")
                    && hd.value.eq_ignore_ascii_case(b"chunked")
                {
                    body = Some(Body::Chunked);
                }
            }
            let body = match body {
                Some(b) => b,
                None if status == 204 || status == 304 || (100..200).contains(&status) => {
                    Body::Length(0)
                }
                None => return Err(format!("status {status} without a body length")),
            };
            Ok(Some(RespHead {
                status,
                head_len: n,
                body,
            }))
        }
    }
}

/// Wire length and decoded length of a complete chunked body at the start of `buf`.
fn chunked_len(buf: &[u8]) -> Result<Option<(usize, usize)>, String> {
    let mut off = 0;
    let mut body = 0;
    loop {
        let Some(eol) = memchr::memmem::find(&buf[off..], b"\r\n") else {
            return Ok(None);
        };
        let line = &buf[off..off + eol];
        let hex = line.split(|&c| c == b';').next().unwrap_or(b"");
        let size = std::str::from_utf8(hex)
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .ok_or("bad chunk size")?;
        off += eol + 2;
        if size == 0 {
            // Trailers end with an empty line.
            let Some(end) = memchr::memmem::find(&buf[off..], b"\r\n") else {
                return Ok(None);
            };
            if end != 0 {
                return Err("trailers are not supported".into());
            }
            return Ok(Some((off + 2, body)));
        }
        if buf.len() < off + size + 2 {
            return Ok(None);
        }
        off += size + 2;
        body += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_heads() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        let h = parse_http_head(r).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.head_len, r.len() - 5);
        assert!(matches!(h.body, Body::Length(5)));
        assert!(parse_http_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
        let h = parse_http_head(b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(matches!(h.body, Body::Length(0)));
        assert!(parse_http_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        let h = parse_http_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(matches!(h.body, Body::Chunked));
    }

    #[test]
    fn chunked_bodies() {
        let b = b"5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\n\r\nNEXT";
        assert_eq!(chunked_len(b), Ok(Some((b.len() - 4, 8))));
        for cut in 0..b.len() - 4 {
            assert_eq!(chunked_len(&b[..cut]), Ok(None), "cut {cut}");
        }
        assert!(chunked_len(b"zz\r\n").is_err());
    }
}
