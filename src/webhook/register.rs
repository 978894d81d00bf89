//! Validation of a `POST /subscribe` body (DECISIONS §4): a JSON object with non-empty string
//! `topic` and `webhook`, `webhook` an absolute `http` or `https` URL.
//!
//! Pure: no I/O, no state. Storing registrations (idempotence, per-topic and global caps) is
//! the relay's job on the topic's home worker.

use ureq::http::Uri;

/// Longest webhook address accepted, bytes (a sane bound; real webhook URLs are far shorter).
pub const MAX_WEBHOOK_LEN: usize = 2048;

/// Why a registration body was refused. `Display` is the exact `error` text of the 400 answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistrationError {
    /// The body is not valid JSON: `Invalid JSON: ` and the parser's message.
    #[error("{0}")]
    Json(String),
    /// `topic` is missing, not a string, or empty (also: the body is not a JSON object).
    #[error("Missing or invalid \"topic\" param")]
    Topic,
    /// `webhook` is missing, not a string, empty, or not an absolute http(s) URL.
    #[error("Missing or invalid \"webhook\" param")]
    Webhook,
}

/// Validates a `POST /subscribe` body and returns `(topic, webhook)`.
///
/// `topic` is checked first, so a body missing both names `topic`. Extra keys are ignored.
pub fn validate_registration(body: &[u8]) -> Result<(String, String), RegistrationError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| RegistrationError::Json(format!("Invalid JSON: {e}")))?;
    let serde_json::Value::Object(mut obj) = value else {
        return Err(RegistrationError::Topic);
    };
    let topic = match obj.remove("topic") {
        Some(serde_json::Value::String(t)) if !t.is_empty() => t,
        _ => return Err(RegistrationError::Topic),
    };
    let webhook = match obj.remove("webhook") {
        Some(serde_json::Value::String(w)) if is_webhook_url(&w) => w,
        _ => return Err(RegistrationError::Webhook),
    };
    Ok((topic, webhook))
}

/// Whether `s` is an absolute `http`/`https` URL with a host, as the delivery client will
/// request it. Parsed with the same URI parser the client uses (`http::Uri`, RFC 3986), so
/// anything accepted here can be requested; non-ASCII hosts must be given in punycode.
pub fn is_webhook_url(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_WEBHOOK_LEN {
        return false;
    }
    let Ok(uri) = Uri::try_from(s) else {
        return false;
    };
    let scheme_ok = matches!(uri.scheme_str(), Some(sc) if sc.eq_ignore_ascii_case("http") || sc.eq_ignore_ascii_case("https"));
    let Some(authority) = uri.authority() else {
        return false;
    };
    let host = authority.host();
    let host_ok = !host.is_empty() && host != "[]";
    scheme_ok && host_ok && port_ok(authority.as_str())
}

/// Whether the authority's port, if any, is a number from 1 to 65535 (the URI parser
/// accepts any digits, and an empty port).
fn port_ok(authority: &str) -> bool {
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let after_host = if host_port.starts_with('[') {
        match host_port.find(']') {
            Some(i) => &host_port[i + 1..],
            None => return false,
        }
    } else {
        host_port.find(':').map_or("", |i| &host_port[i..])
    };
    match after_host.strip_prefix(':') {
        None => after_host.is_empty(),
        Some(p) => p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|p| p != 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &str) -> (String, String) {
        validate_registration(body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e}"))
    }

    fn err(body: &str) -> String {
        match validate_registration(body.as_bytes()) {
            Ok(v) => panic!("{body} accepted: {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    const WEBHOOK: &str = "Missing or invalid \"webhook\" param";
    const TOPIC: &str = "Missing or invalid \"topic\" param";

    #[test]
    fn accepts_valid_registrations() {
        assert_eq!(
            ok(r#"{"topic":"abc","webhook":"https://push.example.com/hook?x=1"}"#),
            (
                "abc".to_string(),
                "https://push.example.com/hook?x=1".to_string()
            )
        );
        ok(r#"{"webhook":"http://127.0.0.1:8081/","topic":"t","extra":[1,2]}"#);
        ok(r#"{"topic":"t","webhook":"http://[::1]:8081/a/b"}"#);
        ok(r#"{"topic":"t","webhook":"HTTPS://Example.COM"}"#);
        ok(r#"{"topic":"t","webhook":"http://user:pw@example.com/x"}"#);
        ok(r#"{"topic":"t","webhook":"http://user:pw@example.com:65535/x"}"#);
        ok(r#"{"topic":"t","webhook":"https://[2001:db8::1]:443"}"#);
    }

    #[test]
    fn refuses_bad_webhooks() {
        for w in [
            "",
            "example.com/hook",
            "/hook",
            "ftp://example.com/x",
            "ws://example.com/",
            "javascript:alert(1)",
            "mailto:a@example.com",
            "http://",
            "http:///path",
            "http://exa mple.com/",
            "http://example.com:0/",
            "http://example.com:99999/",
            "http://example.com:/",
            "http://example.com:+80/",
            "http://[::1]:99999/",
            "http://[::1]x/",
            "http://[::1/",
            "https://example.com/\n",
            "http://b\u{fc}cher.de/",
        ] {
            let body = serde_json::json!({"topic": "t", "webhook": w}).to_string();
            assert_eq!(err(&body), WEBHOOK, "{w:?}");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_WEBHOOK_LEN));
        let body = serde_json::json!({"topic": "t", "webhook": long}).to_string();
        assert_eq!(err(&body), WEBHOOK);
        assert_eq!(err(r#"{"topic":"t"}"#), WEBHOOK);
        assert_eq!(err(r#"{"topic":"t","webhook":null}"#), WEBHOOK);
        assert_eq!(err(r#"{"topic":"t","webhook":42}"#), WEBHOOK);
    }

    #[test]
    fn refuses_bad_topics() {
        assert_eq!(err(r#"{"webhook":"https://example.com"}"#), TOPIC);
        assert_eq!(
            err(r#"{"topic":"","webhook":"https://example.com"}"#),
            TOPIC
        );
        assert_eq!(err(r#"{"topic":7,"webhook":"https://example.com"}"#), TOPIC);
        assert_eq!(err(r#"{}"#), TOPIC);
        assert_eq!(err(r#"[]"#), TOPIC);
        assert_eq!(err(r#""topic""#), TOPIC);
    }

    #[test]
    fn json_errors_carry_the_parser_message() {
        let e = err("{\"topic\":");
        assert!(e.starts_with("Invalid JSON: EOF while parsing"), "{e}");
        let e = err("");
        assert!(e.contains("EOF"), "{e}");
        let e = err("not json");
        assert!(e.contains("expected"), "{e}");
        assert!(matches!(
            validate_registration(b"\xff"),
            Err(RegistrationError::Json(_))
        ));
    }
}
