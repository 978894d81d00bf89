//! The words of the webhook pool's interface: one call to make ([`Delivery`]), the pool's
//! settings ([`WebhookConfig`]) and the news of a webhook given up ([`OnGone`]).
//!
//! Owns these types only; a leaf under the pool and its client, re-exported by `webhook`.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// One webhook call to make: `POST url` with body `{"topic":"<topic>"}`.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The topic the message was published to.
    pub topic: Arc<str>,
    /// The registered webhook address.
    pub url: Arc<str>,
}

/// A call with its own body and headers (a signed watch event or push, `notify`): `POST url`
/// with `body`, retried on network errors and 5xx (never on 4xx) with backoff until `until`,
/// however many tries that takes; it never counts toward a URL's give-up bookkeeping.
pub struct Signed {
    /// The request body (JSON).
    pub body: Vec<u8>,
    /// Headers besides `Content-Type: application/json`.
    pub headers: Vec<(&'static str, String)>,
    /// No try starts after this.
    pub until: Instant,
    /// Told how the call ended (exactly once for a call the pool took).
    pub on_done: Option<OnDone>,
}

impl std::fmt::Debug for Signed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signed")
            .field("body_len", &self.body.len())
            .field("until", &self.until)
            .finish_non_exhaustive()
    }
}

/// How a [`Signed`] call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// The receiver answered 2xx.
    Delivered,
    /// The receiver answered 4xx, or another final failure (never retried).
    Rejected,
    /// Every try failed until the call's deadline (or the retry queue was full).
    Failed,
    /// Never sent: the queue was full, the address is forbidden, or the pool is stopping.
    Dropped,
}

/// Told how a [`Signed`] call ended; runs on a delivery thread (or the submitting one for a
/// call refused at once), so it must only count or hand the news on.
pub type OnDone = Arc<dyn Fn(Sent) + Send + Sync>;

/// Called with `(topic, url)` when a webhook has failed every try for
/// [`WebhookConfig::give_up_after`]; the relay then removes that registration. Runs on a
/// delivery thread, so it must only hand the news on (e.g. to the topic's home worker).
pub type OnGone = Arc<dyn Fn(Arc<str>, Arc<str>) + Send + Sync>;

/// Settings of the delivery pool.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Delivery threads (`--webhook-threads`, default 4; at least 1).
    pub threads: usize,
    /// Calls waiting for a thread before `submit` drops (and counts) them
    /// (`--webhook-queue`, default 10,000). Retries waiting out their backoff are bounded
    /// by the same number, separately.
    pub queue: usize,
    /// Allow webhooks resolving to loopback, private, link-local, multicast... addresses
    /// (`--webhook-allow-private`; off by default, tests need it).
    pub allow_private: bool,
    /// Total time one try may take: resolve, connect, TLS, request, response (default 5 s).
    pub timeout: Duration,
    /// Tries per call, counting the first (default 3); retries happen on connection
    /// errors, timeouts and 5xx, never on 4xx or redirects.
    pub tries: u32,
    /// A webhook that has failed every try for this long is given up (default 24 h).
    pub give_up_after: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            threads: 4,
            queue: 10_000,
            allow_private: false,
            timeout: Duration::from_secs(5),
            tries: 3,
            give_up_after: Duration::from_secs(24 * 3600),
        }
    }
}
