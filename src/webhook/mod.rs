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
//! retry delay queue, shutdown), `health` (bounded failure bookkeeping), `stats` (metrics),
//! `types` (what a call is, and the pool's settings).

mod client;
pub mod guard;
mod health;
mod pool;
pub mod register;
mod stats;
mod types;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use guard::is_forbidden;
pub use register::{validate_registration, RegistrationError};
pub use types::{Delivery, OnDone, OnGone, Sent, Signed, WebhookConfig};

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

    /// Hands a call with its own body and headers to the pool without blocking (`label`
    /// names it in logs, like a topic); a full queue drops it (`on_done` told [`Sent::Dropped`]).
    pub fn submit_signed(&self, label: Arc<str>, url: Arc<str>, call: Signed) {
        self.handle
            .0
            .submit_signed(Delivery { topic: label, url }, call);
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
