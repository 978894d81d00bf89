//! What the relay tells the services around it about one client's messages (DECISIONS 13):
//! watch events (`accepted`, `queued`, `delivered`) for services that watch a client id, and
//! pushes to a wallet's push server for a `prompt` message that reached a client id with no
//! socket subscribed. A leaf: the engines and the relay say *what happened* through the
//! [`Notify`] seam; `notify/` decides who is told and sends the signed POSTs on the webhook
//! pool, off the event loop. Every call returns at once.

/// Which side of a message a watch follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Typ {
    /// The watched client published the message.
    Publisher,
    /// The watched client is subscribed to the message's topic.
    Subscriber,
}

impl Typ {
    /// The claim's text (`typ`).
    pub fn as_str(self) -> &'static str {
        match self {
            Typ::Publisher => "publisher",
            Typ::Subscriber => "subscriber",
        }
    }
}

/// Where a message stands for one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Stored for the client (published by it, or for its subscription).
    Accepted,
    /// The client has no socket subscribed to the topic: it waits in the client's mailbox.
    Queued,
    /// A socket of the client acknowledged it, or a fetch of the client returned it.
    Delivered,
}

impl Status {
    /// The event's text (`status`, `sts`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Accepted => "accepted",
            Status::Queued => "queued",
            Status::Delivered => "delivered",
        }
    }

    /// The bit of this status in a set of statuses.
    pub fn bit(self) -> u8 {
        match self {
            Status::Accepted => 1,
            Status::Queued => 2,
            Status::Delivered => 4,
        }
    }
}

/// One message's status for one client, as a watch event reports it.
#[derive(Debug, Clone, Copy)]
pub struct Notice<'a> {
    /// The watched client id (`did:key:z...`).
    pub client: &'a str,
    /// Whether the client published the message or is subscribed to its topic.
    pub typ: Typ,
    /// Where the message stands for the client.
    pub status: Status,
    /// The id of the `irn_subscription` request that carries (or would carry) the message
    /// (`message_id`).
    pub message_id: u64,
    /// The message's topic.
    pub topic: &'a str,
    /// The message (as published).
    pub message: &'a str,
    /// The publish's attestation, if any.
    pub attestation: Option<&'a str>,
    /// When the relay accepted it, ms since the Unix epoch.
    pub published_at: u64,
    /// The publish's tag.
    pub tag: u32,
    /// The message's ttl, seconds (retries of the event stop when it runs out).
    pub ttl: u32,
}

/// A `prompt` message for a client id with no socket subscribed to its topic.
#[derive(Debug, Clone, Copy)]
pub struct PushNotice<'a> {
    /// The subscribed client id (`did:key:z...`).
    pub client: &'a str,
    /// The project id the client subscribed under (selects the push URL).
    pub project: &'a str,
    /// The message's topic.
    pub topic: &'a str,
    /// The message (as published).
    pub message: &'a str,
    /// The publish's tag.
    pub tag: u32,
    /// The message's ttl, seconds.
    pub ttl: u32,
}

/// The services around the relay, as the engines and the relay see them.
pub trait Notify: Send + Sync {
    /// Whether any client is watched at all (one load: asked before anything of a
    /// message's clients is looked at).
    fn watching(&self) -> bool {
        true
    }
    /// Whether any watch may want events of `client` (cheap; asked before building a notice).
    fn watched(&self, client: &str) -> bool;
    /// Reports a message's status for a watched client; the matching registrations are sent
    /// one signed event each.
    fn event(&self, n: &Notice<'_>);
    /// Whether pushes are configured at all.
    fn pushes(&self) -> bool;
    /// Pushes a `prompt` message to the client's push server.
    fn push(&self, p: &PushNotice<'_>);
}

/// Nobody to tell: no watch, no push.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Notify for Silent {
    fn watching(&self) -> bool {
        false
    }
    fn watched(&self, _client: &str) -> bool {
        false
    }
    fn event(&self, _n: &Notice<'_>) {}
    fn pushes(&self) -> bool {
        false
    }
    fn push(&self, _p: &PushNotice<'_>) {}
}

/// The id of the `irn_subscription` request that carries a message: the relay's accept time
/// in ms shifted left 8 bits, or'ed with the low 8 bits of the message's seq (the shape of
/// `relay_client`'s own ids, ~4.6e14: above relay_rpc's 1e9 minimum and exact in a JS number).
/// The same for every subscriber of the message, so a receipt names a message of its topic.
pub fn message_id(published_at_ms: u64, seq: u64) -> u64 {
    (published_at_ms << 8) | (seq & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_valid_relay_ids_and_differ_within_a_millisecond() {
        let t = 1_764_000_000_000;
        let a = message_id(t, 41);
        let b = message_id(t, 42);
        assert_ne!(a, b);
        assert!(a >= 1_000_000_000);
        assert!(a < (1u64 << 53));
        assert_eq!(message_id(t, 41 + 256) >> 8, t);
    }
}
