//! One webhook HTTP try: the shared `ureq` agent (connection pool per host, rustls with
//! webpki roots, no redirects, no proxy, the guarded resolver) and the classification of
//! what happened into success, a failure reason, or an SSRF refusal.
//!
//! This module makes no decision about retries or bookkeeping; the pool does.

use std::io::{self, Read};
use std::time::Duration;

use ureq::unversioned::transport::DefaultConnector;
use ureq::Agent;

use super::guard::{GuardedResolver, SsrfRefused};
use super::stats::FailReason;
use super::types::{Delivery, Signed, WebhookConfig};

/// Most bytes of a response body read (and discarded) so the connection can be reused; a
/// longer body closes the connection instead.
const MAX_DRAIN: u64 = 64 * 1024;

/// What one try came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TryOutcome {
    /// The receiver answered 2xx.
    Success,
    /// The try failed; [`FailReason::retryable`] says whether another try may help.
    Failed(FailReason),
    /// Every address of the host is forbidden (SSRF guard); nothing was sent.
    Refused(String),
}

/// The HTTP client shared by the delivery threads. Clones of the agent share one
/// connection pool, so a connection to a host is reused by whichever thread calls it next.
pub(crate) struct Client {
    agent: Agent,
}

impl Client {
    /// A client with `cfg`'s per-try timeout and SSRF setting.
    pub(crate) fn new(cfg: &WebhookConfig) -> Client {
        let config = Agent::config_builder()
            // Statuses are outcomes here, not errors.
            .http_status_as_error(false)
            // A redirect could lead anywhere, including past the SSRF guard's intent.
            .max_redirects(0)
            // An environment proxy would resolve the host itself, bypassing the guard.
            .proxy(None)
            .timeout_global(Some(cfg.timeout))
            .user_agent(concat!("walletrelay-webhook/", env!("CARGO_PKG_VERSION")))
            .accept_encoding("")
            .max_idle_connections(256)
            .max_idle_connections_per_host(cfg.threads.max(1))
            .max_idle_age(Duration::from_secs(30))
            .build();
        let agent = Agent::with_parts(
            config,
            DefaultConnector::default(),
            GuardedResolver::new(cfg.allow_private),
        );
        Client { agent }
    }

    /// Makes one try: `POST url` with `{"topic":"<topic>"}`, or with the signed call's body
    /// and headers.
    pub(crate) fn try_once(&self, d: &Delivery, signed: Option<&Signed>) -> TryOutcome {
        let topic_body;
        let mut req = self
            .agent
            .post(&*d.url)
            .header("content-type", "application/json");
        let body: &[u8] = match signed {
            Some(s) => {
                for (name, value) in &s.headers {
                    req = req.header(*name, value);
                }
                &s.body
            }
            None => {
                topic_body = body_for(&d.topic);
                topic_body.as_bytes()
            }
        };
        let res = req.send(body);
        match res {
            Ok(resp) => {
                let status = resp.status().as_u16();
                // Read what little the receiver sent so the connection returns to the pool.
                let mut reader = resp.into_body().into_reader().take(MAX_DRAIN);
                let _ = io::copy(&mut reader, &mut io::sink());
                classify_status(status)
            }
            Err(e) => classify_error(&e),
        }
    }

    /// Aborts every call in flight (their I/O fails at once); used when the shutdown grace
    /// period is over.
    pub(crate) fn abort_in_flight(&self) {
        self.agent.clone().shutdown();
    }
}

/// The request body: `{"topic":"<topic>"}` with the topic escaped as a JSON string.
pub(crate) fn body_for(topic: &str) -> String {
    let mut s = String::with_capacity(topic.len() + 12);
    s.push_str("{\"topic\":");
    // Serialising a str into a String cannot fail.
    s.push_str(&serde_json::Value::from(topic).to_string());
    s.push('}');
    s
}

fn classify_status(status: u16) -> TryOutcome {
    match status {
        200..=299 => TryOutcome::Success,
        300..=399 => TryOutcome::Failed(FailReason::Redirect),
        400..=499 => TryOutcome::Failed(FailReason::Status4xx),
        500..=599 => TryOutcome::Failed(FailReason::Status5xx),
        _ => TryOutcome::Failed(FailReason::StatusOther),
    }
}

fn classify_error(e: &ureq::Error) -> TryOutcome {
    use ureq::Error as E;
    let reason = match e {
        E::Other(inner) => match inner.downcast_ref::<SsrfRefused>() {
            Some(r) => return TryOutcome::Refused(r.to_string()),
            None => FailReason::Other,
        },
        E::Timeout(_) => FailReason::Timeout,
        E::HostNotFound => FailReason::Dns,
        E::ConnectionFailed => FailReason::Connect,
        E::Io(io) => match io.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => FailReason::Timeout,
            io::ErrorKind::ConnectionRefused
            | io::ErrorKind::AddrNotAvailable
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable => FailReason::Connect,
            // rustls reports handshake and certificate failures through the stream as
            // InvalidData (the plain transport never does).
            io::ErrorKind::InvalidData => FailReason::Tls,
            _ => FailReason::Io,
        },
        E::BodyStalled => FailReason::Io,
        E::Tls(_) | E::Rustls(_) | E::Pem(_) | E::TlsRequired => FailReason::Tls,
        E::Protocol(_) | E::LargeResponseHeader(..) | E::BodyExceedsLimit(_) => {
            FailReason::Protocol
        }
        E::BadUri(_) | E::Http(_) | E::RequireHttpsOnly(_) => FailReason::BadUrl,
        _ => FailReason::Other,
    };
    TryOutcome::Failed(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_escapes_the_topic() {
        assert_eq!(body_for("abc"), r#"{"topic":"abc"}"#);
        assert_eq!(
            body_for("a\"b\\c\n\u{1}é"),
            "{\"topic\":\"a\\\"b\\\\c\\n\\u0001é\"}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&body_for("q\"\\\t</script>")).unwrap_or_default();
        assert_eq!(v["topic"], "q\"\\\t</script>");
    }

    #[test]
    fn statuses_map_to_outcomes() {
        assert_eq!(classify_status(200), TryOutcome::Success);
        assert_eq!(classify_status(204), TryOutcome::Success);
        assert_eq!(
            classify_status(302),
            TryOutcome::Failed(FailReason::Redirect)
        );
        assert_eq!(
            classify_status(404),
            TryOutcome::Failed(FailReason::Status4xx)
        );
        assert_eq!(
            classify_status(429),
            TryOutcome::Failed(FailReason::Status4xx)
        );
        assert_eq!(
            classify_status(503),
            TryOutcome::Failed(FailReason::Status5xx)
        );
        assert_eq!(
            classify_status(600),
            TryOutcome::Failed(FailReason::StatusOther)
        );
    }

    #[test]
    fn errors_map_to_reasons() {
        let refused = ureq::Error::Other(Box::new(SsrfRefused {
            host: "localhost".into(),
            first: std::net::Ipv4Addr::LOCALHOST.into(),
        }));
        assert!(matches!(classify_error(&refused), TryOutcome::Refused(_)));
        let timeout = ureq::Error::Timeout(ureq::Timeout::Global);
        assert_eq!(
            classify_error(&timeout),
            TryOutcome::Failed(FailReason::Timeout)
        );
        let conn = ureq::Error::Io(io::ErrorKind::ConnectionRefused.into());
        assert_eq!(
            classify_error(&conn),
            TryOutcome::Failed(FailReason::Connect)
        );
        let reset = ureq::Error::Io(io::ErrorKind::ConnectionReset.into());
        assert_eq!(classify_error(&reset), TryOutcome::Failed(FailReason::Io));
        let tls = ureq::Error::Io(io::Error::new(io::ErrorKind::InvalidData, "bad cert"));
        assert_eq!(classify_error(&tls), TryOutcome::Failed(FailReason::Tls));
        assert_eq!(
            classify_error(&ureq::Error::HostNotFound),
            TryOutcome::Failed(FailReason::Dns)
        );
        assert!(FailReason::Timeout.retryable() && FailReason::Status5xx.retryable());
        assert!(!FailReason::Status4xx.retryable() && !FailReason::Redirect.retryable());
    }
}
