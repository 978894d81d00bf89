//! Subscriptions that belong to a client id (DECISIONS 13), as a topic's home keeps them:
//! per topic, each subscribed client id with its project, how many sockets follow the topic
//! for it, the position it was given everything up to, the receipts above that position,
//! and when its mailbox expires once no socket is left. Plus the process-wide count of the
//! topics each client id keeps ([`MailboxTable`], `--max-mailbox-topics`).
//!
//! Pure state: no channel, no clock read. The home (`home/`) owns a [`TopicClients`] per
//! topic that has client subscriptions; `local/` routes the [`ClientOp`]s to it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::message::Position;

/// Most messages one fetch answer gives (`irn_fetchMessages`; `hasMore` says the rest).
pub const MAX_FETCH: usize = 500;

/// Most client ids one topic keeps (a subscription past it follows the topic by its socket
/// only, as a connection without a client id does).
pub const MAX_CLIENTS_PER_TOPIC: usize = 1024;

/// Most receipts (`irn_batchReceive`) kept above a client's delivered position per topic;
/// past it the oldest is forgotten (that message may be fetched again).
pub const MAX_RECEIPTS: usize = 64;

/// A client id as its subscriptions name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientRef {
    /// `did:key:z...`.
    pub id: Arc<str>,
    /// The project id it connected with (`""` when none was given).
    pub project: Arc<str>,
}

impl ClientRef {
    /// A client id and the project it came with (`""` when none).
    pub fn new(id: &str, project: Option<&str>) -> Arc<ClientRef> {
        Arc::new(ClientRef {
            id: Arc::from(id),
            project: Arc::from(project.unwrap_or("")),
        })
    }
}

/// What happened to a client id's subscription of a topic (sent to the topic's home, in the
/// same queue as the worker's `watch` and `read`, so their order holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp {
    /// A subscription of the client: by a socket (`socket`: one more socket follows the
    /// topic), or over HTTP (no socket).
    Subscribe {
        /// Made by a socket.
        socket: bool,
    },
    /// A socket's subscription ended with its socket; it had been given everything up to
    /// `at`. The client's subscription stays (its mailbox).
    SocketGone {
        /// What the socket's subscription had reached.
        at: Position,
    },
    /// The client unsubscribed: its subscription ends altogether.
    Unsubscribe {
        /// Made by a socket that followed the topic (its count goes too).
        socket: bool,
    },
    /// A fetch gave the client everything up to `at`.
    Delivered {
        /// Position reached.
        at: Position,
    },
    /// Receipts (`irn_batchReceive`): these message ids are delivered.
    Receive {
        /// `irn_subscription` ids (`notice::message_id`).
        ids: Vec<u64>,
    },
}

/// One client id's subscription of a topic.
#[derive(Debug, Clone)]
pub struct ClientSub {
    /// The client.
    pub client: ClientRef,
    /// Sockets following the topic for it now.
    pub sockets: u32,
    /// Everything up to here was given to it (by a socket, a fetch or receipts).
    pub delivered: Position,
    /// Message ids received above `delivered` (oldest first, at most [`MAX_RECEIPTS`]).
    pub received: Vec<u64>,
    /// When its mailbox expires (worker clock, ms) while it has no socket; 0 while it has.
    pub expires: u64,
    /// Its record in the durable log, when there is one.
    pub record: Option<crate::store::Loc>,
}

impl ClientSub {
    /// A new subscription of `client`.
    pub fn new(client: ClientRef) -> ClientSub {
        ClientSub {
            client,
            sockets: 0,
            delivered: Position::ZERO,
            received: Vec::new(),
            expires: 0,
            record: None,
        }
    }

    /// Moves the delivered position to `at` if it is later; receipts at or below it go.
    pub fn deliver_to(&mut self, at: Position) -> bool {
        if at <= self.delivered {
            return false;
        }
        self.delivered = at;
        true
    }

    /// Whether message `id` was received by the client.
    pub fn has_received(&self, id: u64) -> bool {
        self.received.contains(&id)
    }

    /// Notes a receipt above the delivered position.
    pub fn receive(&mut self, id: u64) {
        if self.received.contains(&id) {
            return;
        }
        if self.received.len() >= MAX_RECEIPTS {
            self.received.remove(0);
        }
        self.received.push(id);
    }
}

/// The client subscriptions of one home topic (few: a pairing has two).
#[derive(Debug, Default)]
pub struct TopicClients {
    /// The subscriptions, in the order they came.
    pub subs: Vec<ClientSub>,
    /// How many of them have no socket (a publish asks about notices only when some client
    /// may want one: see `HomeTopics::client_notices`).
    pub idle: u32,
}

impl TopicClients {
    /// The index of `client`'s subscription.
    pub fn find(&self, client: &str) -> Option<usize> {
        self.subs.iter().position(|s| *s.client.id == *client)
    }

    /// Counts the subscriptions without a socket again.
    pub fn recount(&mut self) {
        self.idle = self.subs.iter().filter(|s| s.sockets == 0).count() as u32;
    }
}

/// The topics each client id keeps, for the whole process (`--max-mailbox-topics`): taken
/// at a subscription of a client id (the subscribing worker), released by the topic's home
/// when the subscription ends or expires. The lock is taken per client subscription made or
/// ended, never per message.
#[derive(Debug, Default)]
pub struct MailboxTable {
    table: Mutex<HashMap<Arc<str>, HashSet<Arc<str>>, ahash::RandomState>>,
}

impl MailboxTable {
    fn with<R>(
        &self,
        f: impl FnOnce(&mut HashMap<Arc<str>, HashSet<Arc<str>>, ahash::RandomState>) -> R,
    ) -> R {
        let mut g = match self.table.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut g)
    }

    /// `client` subscribes to `topic`: `false` when it keeps `max` other topics already.
    pub fn admit(&self, client: &Arc<str>, topic: &Arc<str>, max: usize) -> bool {
        self.with(|t| {
            let set = t.entry(client.clone()).or_default();
            if set.contains(topic) {
                return true;
            }
            if set.len() >= max {
                if set.is_empty() {
                    t.remove(client);
                }
                return false;
            }
            set.insert(topic.clone());
            true
        })
    }

    /// The home holds `client`'s subscription of `topic` (restored, or made by a
    /// subscription admitted while an older one of the same topic expired).
    pub fn hold(&self, client: &Arc<str>, topic: &Arc<str>) {
        self.with(|t| {
            t.entry(client.clone()).or_default().insert(topic.clone());
        });
    }

    /// `client`'s subscription of `topic` ended.
    pub fn release(&self, client: &str, topic: &str) {
        self.with(|t| {
            if let Some(set) = t.get_mut(client) {
                set.remove(topic);
                if set.is_empty() {
                    t.remove(client);
                }
            }
        });
    }

    /// Topics `client` keeps now.
    pub fn count(&self, client: &str) -> usize {
        self.with(|t| t.get(client).map_or(0, HashSet::len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mailbox_table_bounds_the_topics_of_a_client() {
        let t = MailboxTable::default();
        let c: Arc<str> = Arc::from("did:key:z1");
        let (a, b, d): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "d".into());
        assert!(t.admit(&c, &a, 2));
        assert!(t.admit(&c, &b, 2));
        assert!(t.admit(&c, &a, 2));
        assert!(!t.admit(&c, &d, 2));
        t.release(&c, "a");
        assert!(t.admit(&c, &d, 2));
        assert_eq!(t.count(&c), 2);
    }

    #[test]
    fn receipts_are_bounded_and_the_position_only_moves_on() {
        let mut s = ClientSub::new(ClientRef {
            id: "c".into(),
            project: "p".into(),
        });
        for i in 0..(MAX_RECEIPTS as u64 + 5) {
            s.receive(i);
        }
        assert_eq!(s.received.len(), MAX_RECEIPTS);
        assert!(!s.has_received(0));
        assert!(s.has_received(MAX_RECEIPTS as u64 + 4));
        let p = Position { epoch: 1, seq: 5 };
        assert!(s.deliver_to(p));
        assert!(!s.deliver_to(Position { epoch: 1, seq: 4 }));
        assert_eq!(s.delivered, p);
    }
}
