//! The engines' refusals, one typed enum for every engine and every caller (`engine` and
//! `relay` re-export it). Nothing here knows about wire formats: the edges map a
//! [`RelayError`] to what their protocol says (`conn::waku` to a JSON-RPC error, `conn::http`
//! to an HTTP status and body).

use thiserror::Error;

/// Why the relay refused an operation. Every variant is a refusal the client can see and act
/// on (retry later, subscribe to fewer topics...); none of them closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RelayError {
    /// The topic's store could not take the operation (a disk that fails under `--fsync
    /// always`, an unreachable Redis): nothing was stored, nothing was acknowledged.
    #[error("storage unavailable")]
    StorageUnavailable,
    /// The topic's home worker is too far behind to take more (its queue is full past
    /// `--core-queue`): the publish was not stored.
    #[error("server overloaded, try again")]
    Overloaded,
    /// The connection already holds `--max-subscriptions` subscriptions.
    #[error("Subscription limit reached ({0} per connection)")]
    TooManySubscriptions(usize),
    /// The topic already has `--max-webhooks-per-topic` webhooks.
    #[error("Too many webhooks for this topic")]
    TooManyWebhooksForTopic,
    /// The relay already holds `--max-webhooks` webhooks.
    #[error("Too many webhook registrations")]
    TooManyWebhooks,
    /// The client id already keeps `--max-mailbox-topics` topics (DECISIONS 13).
    #[error("Subscriber limit exceeded ({0} topics per client id)")]
    SubscriberLimitExceeded(usize),
    /// The connection is closing; it takes no more requests.
    #[error("connection is closing")]
    Closing,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_the_documented_ones() {
        assert_eq!(
            RelayError::StorageUnavailable.to_string(),
            "storage unavailable"
        );
        assert_eq!(
            RelayError::TooManySubscriptions(1000).to_string(),
            "Subscription limit reached (1000 per connection)"
        );
    }
}
