//! The client's WebSocket upgrade, sans I/O: the request (RFC 6455 §4.1, offering
//! permessage-deflate on demand) and the check of the server's 101 answer, extensions
//! included.
//!
//! Owns the handshake's bytes only; frames are `ws`'s, the deflate offer and the check of its
//! answer are `deflate`'s.

use thiserror::Error;

use crate::deflate;

/// Sec-WebSocket-Key we send: the RFC 6455 sample nonce. Fixed, like the mask, and harmless.
pub const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// The Sec-WebSocket-Accept that [`KEY`] must produce (RFC 6455 section 1.3).
pub const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// The upgrade request, as real WalletConnect clients send it (plus a fixed key), offering
/// permessage-deflate ([`deflate::OFFER`]) when `deflate` is set. `query` (already
/// escaped, e.g. `auth=<jwt>&projectId=..`) is appended to the path's own query, if any.
pub fn upgrade_request(host: &str, path: &str, query: Option<&str>, deflate: bool) -> Vec<u8> {
    let path = match query {
        Some(q) if !q.is_empty() => {
            let sep = if path.contains('?') { '&' } else { '?' };
            format!("{path}{sep}{q}")
        }
        _ => path.to_string(),
    };
    let ext = if deflate {
        format!("Sec-WebSocket-Extensions: {}\r\n", deflate::OFFER)
    } else {
        String::new()
    };
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{ext}User-Agent: walletrelay-loadtest\r\n\r\n"
    )
    .into_bytes()
}

/// Why an upgrade answer was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum UpgradeError {
    /// Unparseable head.
    #[error("malformed HTTP answer to the upgrade")]
    Malformed,
    /// Status other than 101.
    #[error("upgrade answered with status {0}")]
    Status(u16),
    /// Missing or wrong Sec-WebSocket-Accept, or missing Upgrade header.
    #[error("bad Sec-WebSocket-Accept or Upgrade header")]
    Accept,
    /// The head is larger than we accept.
    #[error("upgrade answer head too large")]
    TooLarge,
    /// The `Sec-WebSocket-Extensions` answer does not fit what we offered.
    #[error(transparent)]
    Extension(#[from] deflate::AnswerError),
}

/// Parse the server's answer to the upgrade. `Ok(Some(n))`: upgraded, frames start at `n`.
/// `deflate`: we offered permessage-deflate, and the server must have agreed; without the
/// offer, any extension in the answer is refused.
pub fn parse_upgrade_response(buf: &[u8], deflate: bool) -> Result<Option<usize>, UpgradeError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Partial) => {
            if buf.len() > 16 * 1024 {
                Err(UpgradeError::TooLarge)
            } else {
                Ok(None)
            }
        }
        Ok(httparse::Status::Complete(n)) => {
            let code = resp.code.unwrap_or(0);
            if code != 101 {
                return Err(UpgradeError::Status(code));
            }
            let mut accept_ok = false;
            let mut upgrade_ok = false;
            let mut extensions = None;
            for h in resp.headers.iter() {
                if h.name.eq_ignore_ascii_case("sec-websocket-extensions") {
                    if extensions.replace(h.value).is_some() {
                        return Err(UpgradeError::Malformed);
                    }
                } else if h.name.eq_ignore_ascii_case("sec-websocket-accept") {
                    accept_ok = h.value == ACCEPT.as_bytes();
                } else if h.name.eq_ignore_ascii_case("upgrade") {
                    upgrade_ok = h.value.eq_ignore_ascii_case(b"websocket");
                }
            }
            if deflate {
                deflate::check_answer(extensions)?;
            } else if let Some(v) = extensions {
                let v = String::from_utf8_lossy(v).into_owned();
                return Err(deflate::AnswerError::Unexpected(v).into());
            }
            if accept_ok && upgrade_ok {
                Ok(Some(n))
            } else {
                Err(UpgradeError::Accept)
            }
        }
        Err(_) => Err(UpgradeError::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_request_query() {
        let plain = String::from_utf8(upgrade_request("h:1", "/", None, false)).unwrap();
        assert!(
            plain.starts_with("GET / HTTP/1.1\r\nHost: h:1\r\n"),
            "{plain}"
        );
        let q = String::from_utf8(upgrade_request(
            "h",
            "/",
            Some("auth=a.b.c&projectId=p"),
            false,
        ))
        .unwrap();
        assert!(
            q.starts_with("GET /?auth=a.b.c&projectId=p HTTP/1.1\r\n"),
            "{q}"
        );
        let q = String::from_utf8(upgrade_request("h", "/x?v=2", Some("auth=t"), true)).unwrap();
        assert!(q.starts_with("GET /x?v=2&auth=t HTTP/1.1\r\n"), "{q}");
        assert!(q.contains("Sec-WebSocket-Extensions: "));
    }

    #[test]
    fn upgrade_answer() {
        let ok = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {ACCEPT}\r\n\r\n\x01\x00"
        );
        let n = parse_upgrade_response(ok.as_bytes(), false)
            .unwrap()
            .unwrap();
        assert_eq!(&ok.as_bytes()[n..], b"\x01\x00");
        assert_eq!(
            parse_upgrade_response(&ok.as_bytes()[..20], false),
            Ok(None)
        );
        let bad = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            parse_upgrade_response(bad.as_bytes(), false),
            Err(UpgradeError::Status(404))
        );
        let wrong = "HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: x\r\n\r\n";
        assert_eq!(
            parse_upgrade_response(wrong.as_bytes(), false),
            Err(UpgradeError::Accept)
        );
    }
}
