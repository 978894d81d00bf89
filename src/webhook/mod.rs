//! Push-notification webhooks (DECISIONS §4): validation of `POST /subscribe` registrations
//! and the delivery pool that makes the calls off the event loops.
//!
//! Registrations live on the topic's home worker (`relay`); this module only validates them
//! and delivers calls handed to it through a bounded queue. It never blocks a worker:
//! [`WebhookPool::submit`] is a `try_send`, and name resolution, TLS and HTTP happen on the
//! pool's own threads.
//!
//! Parts: [`register`] (body validation), `guard` (SSRF address checks and the resolver that
//! enforces them), `client` (one HTTP try with `ureq`), `pool` (queue, delivery threads,
//! retry delay queue, shutdown), `health` (bounded failure bookkeeping), `stats` (metrics).

mod client;
pub mod guard;
mod health;
mod pool;
pub mod register;
mod stats;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use guard::is_forbidden;
pub use register::{validate_registration, RegistrationError};

/// One webhook call to make: `POST url` with body `{"topic":"<topic>"}`.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The topic the message was published to.
    pub topic: Arc<str>,
    /// The registered webhook address.
    pub url: Arc<str>,
}

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

/// Handle to the delivery pool; cheap to clone (one `Arc`), one clone per worker. When the
/// last clone is dropped the pool stops taking work and its threads exit after the tries in
/// flight; [`shutdown`](WebhookPool::shutdown) does the same and waits for them.
#[derive(Clone)]
pub struct WebhookPool {
    handle: Arc<Handle>,
}

/// The one owner of the running pool behind all clones of a [`WebhookPool`].
struct Handle(Arc<pool::Inner>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.begin_stop();
    }
}

impl WebhookPool {
    /// Starts the delivery threads and the retry scheduler.
    pub fn start(cfg: WebhookConfig, on_gone: OnGone) -> WebhookPool {
        WebhookPool {
            handle: Arc::new(Handle(pool::Inner::start(cfg, on_gone))),
        }
    }

    /// Hands a call to the pool without blocking; a full queue drops it (and counts it as
    /// `walletrelay_webhook_dropped_total{reason="queue_full"}`).
    pub fn submit(&self, d: Delivery) {
        self.handle.0.submit(d);
    }

    /// Stops taking work and lets the tries in flight finish for up to `grace` (2 s at
    /// SIGTERM); tries still running then are aborted. Returns within `grace`. Calls still
    /// queued, and retries waiting for their backoff, are dropped and counted
    /// (`reason="shutdown"`). Calling it again does nothing more.
    pub fn shutdown(&self, grace: Duration) {
        self.handle.0.shutdown(grace);
    }

    /// Appends the pool's metrics in the Prometheus text format, every name prefixed
    /// `walletrelay_webhook_`.
    pub fn render_metrics(&self, out: &mut String) {
        let inner = &self.handle.0;
        inner
            .stats
            .render(inner.queue_depth(), inner.retry_pending(), out);
    }
}

impl Default for WebhookPool {
    /// A pool with the default configuration whose gone webhooks are only counted and logged.
    fn default() -> Self {
        WebhookPool::start(WebhookConfig::default(), Arc::new(|_, _| {}))
    }
}

impl fmt::Debug for WebhookPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookPool")
            .field("queue_depth", &self.handle.0.queue_depth())
            .field("retry_pending", &self.handle.0.retry_pending())
            .finish_non_exhaustive()
    }
}
