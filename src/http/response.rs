//! HTTP/1.1 responses: the status line and the headers every answer carries (`Date`,
//! `Content-Length`, `Access-Control-Allow-Origin: *`, `Connection: close` when closing),
//! then the handler's own header lines and body, written into a connection's [`OutBuf`].
//!
//! Handlers build a [`Response`]; precomputed ones (the registry's) keep their header block
//! as shared [`Bytes`] and their body as ranges of a sealed file ([`Body`]), so answering
//! them copies no body, not even into the kernel (`sendfile`).

use bytes::Bytes;

use crate::outbuf::{FileRange, OutBuf};

/// A response body.
#[derive(Debug, Clone)]
pub enum Body {
    /// Bytes in memory.
    Mem(Bytes),
    /// A range of an immutable file.
    File(FileRange),
}

impl Body {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Body::Mem(b) => b.len(),
            Body::File(f) => f.len,
        }
    }

    /// No bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, read into memory (file ranges are read from their file).
    pub fn to_vec(&self) -> std::io::Result<Vec<u8>> {
        match self {
            Body::Mem(b) => Ok(b.to_vec()),
            Body::File(f) => f.read(),
        }
    }

    /// Queues the body on `out`, file ranges and large buffers by reference.
    fn queue(&self, out: &mut OutBuf) {
        match self {
            Body::Mem(b) => out.push_ref(b),
            Body::File(f) => out.push_file(f.clone()),
        }
    }
}

impl Default for Body {
    fn default() -> Body {
        Body::Mem(Bytes::new())
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Body {
        Body::Mem(b)
    }
}

impl From<Vec<u8>> for Body {
    fn from(v: Vec<u8>) -> Body {
        Body::Mem(Bytes::from(v))
    }
}

/// One HTTP answer, before the common headers are added.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Extra header lines, each ending in `\r\n` (e.g. `Content-Type: text/plain\r\n`).
    pub headers: Bytes,
    /// Body (for `HEAD` its length is announced but it is not sent).
    pub body: Body,
}

/// Content type of JSON answers.
pub const JSON: &str = "application/json; charset=utf-8";
/// Content type of text answers.
pub const TEXT: &str = "text/plain; charset=utf-8";

impl Response {
    /// A response with a `Content-Type` and a body.
    pub fn new(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response {
        Response {
            status,
            headers: Bytes::from(format!("Content-Type: {content_type}\r\n")),
            body: Body::Mem(body.into()),
        }
    }

    /// `{"error":"<msg>"}` with the given status.
    pub fn json_error(status: u16, msg: &str) -> Response {
        let body = serde_json::to_vec(&serde_json::json!({ "error": msg }))
            .unwrap_or_else(|_| b"{\"error\":\"internal\"}".to_vec());
        Response::new(status, JSON, body)
    }

    /// A response without body or content type (204, 304).
    pub fn empty(status: u16) -> Response {
        Response {
            status,
            headers: Bytes::new(),
            body: Body::default(),
        }
    }

    /// Adds a header line.
    pub fn with_header(mut self, name: &str, value: &str) -> Response {
        let mut h = Vec::with_capacity(self.headers.len() + name.len() + value.len() + 4);
        h.extend_from_slice(&self.headers);
        h.extend_from_slice(name.as_bytes());
        h.extend_from_slice(b": ");
        h.extend_from_slice(value.as_bytes());
        h.extend_from_slice(b"\r\n");
        self.headers = Bytes::from(h);
        self
    }
}

/// The reason phrase of the status codes this server sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// Serializes `resp` into `out`. `date` is the preformatted IMF-fixdate of this second;
/// `head_only` leaves the body out (HEAD); `close` adds `Connection: close`.
pub fn write(out: &mut OutBuf, resp: &Response, date: &[u8], head_only: bool, close: bool) {
    let mut head = [0u8; 256];
    let mut w = Cursor {
        buf: &mut head,
        pos: 0,
    };
    w.put(b"HTTP/1.1 ");
    w.put_num(resp.status as usize);
    w.put(b" ");
    w.put(reason(resp.status).as_bytes());
    w.put(b"\r\nServer: walletrelay\r\nDate: ");
    w.put(date);
    w.put(b"\r\nAccess-Control-Allow-Origin: *\r\n");
    if resp.status != 204 && resp.status != 304 {
        w.put(b"Content-Length: ");
        w.put_num(resp.body.len());
        w.put(b"\r\n");
    }
    if close {
        w.put(b"Connection: close\r\n");
    }
    let n = w.pos;
    out.extend(&head[..n]);
    out.extend(&resp.headers);
    out.extend(b"\r\n");
    if !head_only && resp.status != 204 && resp.status != 304 {
        resp.body.queue(out);
    }
}

/// A fixed buffer writer for the status line and common headers (they always fit in 256 B).
struct Cursor<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn put(&mut self, b: &[u8]) {
        let end = (self.pos + b.len()).min(self.buf.len());
        let n = end - self.pos;
        self.buf[self.pos..end].copy_from_slice(&b[..n]);
        self.pos = end;
    }
    fn put_num(&mut self, v: usize) {
        let mut tmp = itoa::Buffer::new();
        let s = tmp.format(v);
        self.put(s.as_bytes());
    }
}

/// Formats `t` as an HTTP IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn http_date(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = secs / 86400;
    let rem = secs % 86400;
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // 1970-01-01 was a Thursday.
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(mo - 1) as usize];
    format!("{wd}, {d:02} {mon} {y} {h:02}:{m:02}:{s:02} GMT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_sent_has_its_reason_phrase() {
        for status in [
            101, 200, 204, 304, 400, 401, 403, 404, 405, 408, 411, 413, 426, 429, 431, 500, 501,
            503, 505,
        ] {
            assert_ne!(reason(status), "Unknown", "{status}");
        }
        assert_eq!(reason(401), "Unauthorized");
        assert_eq!(reason(403), "Forbidden");
    }

    #[test]
    fn formats_http_dates() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(784_111_777);
        assert_eq!(http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_709_251_200);
        assert_eq!(http_date(t), "Fri, 01 Mar 2024 00:00:00 GMT");
    }

    #[test]
    fn writes_status_common_headers_and_body() {
        let mut out = OutBuf::default();
        let r = Response::new(200, TEXT, "hi");
        write(&mut out, &r, b"Sun, 06 Nov 1994 08:49:37 GMT", false, true);
        let mut got = Vec::new();
        out.write_to(&mut got).unwrap();
        assert_eq!(
            std::str::from_utf8(&got).unwrap(),
            "HTTP/1.1 200 OK\r\nServer: walletrelay\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
             Access-Control-Allow-Origin: *\r\nContent-Length: 2\r\nConnection: close\r\n\
             Content-Type: text/plain; charset=utf-8\r\n\r\nhi"
        );
    }
}
