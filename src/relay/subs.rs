//! The subscriptions one worker's connections hold, by topic: for each topic with at least
//! one of them, its subscriptions (connection, id, feed state) and its [`Feed`]. A topic
//! leaves the table with its last subscription.
//!
//! Nothing here knows where a topic's state lives (that is the engine's) or how a message is
//! written to a connection (that is the worker's).

use std::collections::HashMap;
use std::sync::Arc;

use slab::Slab;

use super::feed::{Feed, Follow, Follower};
use crate::engine::Origin;

/// A connection of this worker: its slab key and its uid, which tells a live connection
/// from a later one that reused the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnRef {
    /// Slab key.
    pub key: usize,
    /// Unique id (per worker).
    pub uid: u64,
}

/// A subscription id: 32 bytes from the OS CSPRNG, held in the form every use needs, 64
/// lowercase hex characters (a push copies it as it is; nothing is encoded per message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubId([u8; 64]);

impl SubId {
    /// The id of 32 random bytes.
    pub fn from_bytes(raw: &[u8; 32]) -> SubId {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (pair, b) in out.chunks_exact_mut(2).zip(raw) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 15)];
        }
        SubId(out)
    }

    /// The 64-character lowercase hex form.
    pub fn hex(&self) -> &[u8; 64] {
        &self.0
    }

    /// The id an authenticated client computes for itself (DECISIONS §10): the lowercase
    /// hex SHA-256 of `topic ‖ client_id`.
    pub fn for_client(topic: &str, client_id: &str) -> SubId {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(topic.as_bytes());
        ctx.update(client_id.as_bytes());
        let d = ctx.finish();
        let mut raw = [0u8; 32];
        raw.copy_from_slice(d.as_ref());
        SubId::from_bytes(&raw)
    }

    /// Parses the hex form (any case); `None` when it is not 64 hex characters.
    pub fn from_hex(s: &str) -> Option<SubId> {
        let s = s.as_bytes();
        if s.len() != 64 || !s.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let mut out = [0u8; 64];
        for (o, c) in out.iter_mut().zip(s) {
            *o = c.to_ascii_lowercase();
        }
        Some(SubId(out))
    }
}

/// A subscription held by one of this worker's connections.
#[derive(Debug, Clone)]
pub struct LocalSub {
    /// The connection.
    pub conn: ConnRef,
    /// Subscription id.
    pub id: SubId,
    /// The prefix of the method that made it (its pushes use it).
    pub dialect: crate::rpc::Dialect,
    /// Where it stands in the topic's feed.
    pub follow: Follow,
    /// The client id it belongs to, on a connection that has one (DECISIONS 13).
    pub client: Option<Arc<crate::engine::ClientRef>>,
}

impl Follower for LocalSub {
    fn follow(&mut self) -> &mut Follow {
        &mut self.follow
    }
}

/// A topic as this worker's subscriptions see it.
#[derive(Debug)]
pub struct LocalTopic {
    /// The topic string.
    pub name: Arc<str>,
    /// The subscriptions, in subscription order.
    pub subs: Vec<LocalSub>,
    /// History and live messages, merged by position.
    pub feed: Feed,
}

/// The WalletConnect 1.0 subscriptions of one worker's connections: per topic, the
/// connections subscribed (v1 topics are apart from v2 topics of the same name).
#[derive(Debug, Default)]
pub struct V1Subscriptions {
    topics: HashMap<Arc<str>, Vec<ConnRef>, ahash::RandomState>,
}

impl V1Subscriptions {
    /// Subscribes `conn`; returns the topic's shared name if it was not subscribed yet.
    pub fn add(&mut self, topic: &str, conn: ConnRef) -> Option<Arc<str>> {
        if let Some((name, conns)) = self.topics.get_key_value(topic) {
            if conns.contains(&conn) {
                return None;
            }
            let name = name.clone();
            self.topics.get_mut(topic)?.push(conn);
            return Some(name);
        }
        let name: Arc<str> = Arc::from(topic);
        self.topics.insert(name.clone(), vec![conn]);
        Some(name)
    }

    /// Unsubscribes `conn`; `true` if it was subscribed.
    pub fn remove(&mut self, topic: &str, conn: ConnRef) -> bool {
        let Some(conns) = self.topics.get_mut(topic) else {
            return false;
        };
        let before = conns.len();
        conns.retain(|c| *c != conn);
        let removed = conns.len() < before;
        if conns.is_empty() {
            self.topics.remove(topic);
        }
        removed
    }

    /// The connections subscribed to `topic`.
    pub fn of(&self, topic: &str) -> &[ConnRef] {
        self.topics.get(topic).map_or(&[], Vec::as_slice)
    }
}

/// Where [`Subscriptions::add`] put a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// The topic's first subscription on this worker (the engine is to send it the topic),
    /// in this slot.
    FirstHere(u32),
    /// The topic had subscriptions here already; this slot.
    Another(u32),
}

impl Added {
    /// The topic's slot.
    pub fn slot(self) -> u32 {
        match self {
            Added::FirstHere(s) | Added::Another(s) => s,
        }
    }
}

/// What [`Subscriptions::remove`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Removed {
    /// There was no such subscription.
    NotFound,
    /// Removed; the topic has others here.
    Kept,
    /// Removed the topic's last one here: the topic left the table.
    Last(Arc<str>),
}

/// The table of one worker's subscriptions.
#[derive(Debug, Default)]
pub struct Subscriptions {
    topics: Slab<LocalTopic>,
    index: HashMap<Arc<str>, u32, ahash::RandomState>,
    /// The slot [`Subscriptions::name_and_slot`] last found: a client sends its publishes
    /// to its topic many at a time (about eighteen per read at saturation), so the next
    /// one is looked up by comparing names, not by hashing one.
    last: std::cell::Cell<u32>,
}

impl Subscriptions {
    /// The topic in `slot`.
    pub fn get(&self, slot: u32) -> Option<&LocalTopic> {
        self.topics.get(slot as usize)
    }

    /// The topic in `slot`, if it still is `name` (a slot is reused once its topic leaves).
    pub fn get_named(&mut self, slot: u32, name: &Arc<str>) -> Option<&mut LocalTopic> {
        self.topics
            .get_mut(slot as usize)
            .filter(|t| Arc::ptr_eq(&t.name, name))
    }

    /// The slot of `topic`, if some subscription of this worker is on it.
    pub fn find(&self, topic: &str) -> Option<u32> {
        self.index.get(topic).copied()
    }

    /// The shared name and slot of `topic` if some subscription of this worker is on it.
    pub fn name_and_slot(&self, topic: &str) -> Option<(Arc<str>, u32)> {
        let last = self.last.get();
        // A slot is reused once its topic leaves: its name is what says it is `topic`'s.
        if let Some(t) = self.topics.get(last as usize).filter(|t| *t.name == *topic) {
            return Some((t.name.clone(), last));
        }
        let (name, &slot) = self.index.get_key_value(topic)?;
        self.last.set(slot);
        Some((name.clone(), slot))
    }

    /// Adds a subscription: the topic's slot, and whether it is the topic's first on this
    /// worker. A new topic takes `name` as its name when given (the allocation the engine
    /// was already handed: its home then finds the topic by that very `Arc`).
    pub fn add(&mut self, topic: &str, name: Option<&Arc<str>>, sub: LocalSub) -> Added {
        let slot = match self.index.get(topic) {
            Some(&s) => s,
            None => {
                let name: Arc<str> = match name {
                    Some(n) if **n == *topic => n.clone(),
                    _ => Arc::from(topic),
                };
                let slot = self.topics.insert(LocalTopic {
                    name: name.clone(),
                    // Most topics have one subscriber here: room for exactly one (a
                    // first push would make room for four).
                    subs: Vec::with_capacity(1),
                    feed: Feed::default(),
                }) as u32;
                self.index.insert(name, slot);
                slot
            }
        };
        let t = &mut self.topics[slot as usize];
        t.subs.push(sub);
        if t.subs.len() == 1 {
            Added::FirstHere(slot)
        } else {
            Added::Another(slot)
        }
    }

    /// Removes `conn`'s subscription on `slot`.
    pub fn remove(&mut self, slot: u32, conn: ConnRef) -> Removed {
        let Some(t) = self.topics.get_mut(slot as usize) else {
            return Removed::NotFound;
        };
        let before = t.subs.len();
        t.subs.retain(|s| s.conn != conn);
        if t.subs.len() == before {
            return Removed::NotFound;
        }
        if !t.subs.is_empty() {
            t.feed.release_held(&mut t.subs);
            return Removed::Kept;
        }
        let t = self.topics.remove(slot as usize);
        self.index.remove(&t.name);
        Removed::Last(t.name)
    }

    /// The owner a subscription of connection `uid` of worker `me` on node `node` has.
    pub fn owner(node: u64, me: u16, uid: u64) -> Origin {
        Origin {
            node,
            conn: Origin::conn_id(me, uid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Position;
    use crate::relay::feed::SubState;

    fn sub(key: usize) -> LocalSub {
        LocalSub {
            conn: ConnRef { key, uid: 1 },
            id: SubId::from_bytes(&[key as u8; 32]),
            dialect: crate::rpc::Dialect::Waku,
            follow: Follow {
                state: SubState::Active(Position::ZERO),
                owner: Origin::NONE,
            },
            client: None,
        }
    }

    #[test]
    fn sub_ids_round_trip_hex() {
        let id = SubId::from_bytes(&[0xAB; 32]);
        let h = *id.hex();
        assert_eq!(
            &h,
            b"abababababababababababababababababababababababababababababababab"
        );
        let upper = String::from_utf8(h.to_ascii_uppercase()).unwrap();
        assert_eq!(SubId::from_hex(&upper), Some(id));
        assert_eq!(SubId::from_hex(std::str::from_utf8(&h).unwrap()), Some(id));
        assert_eq!(SubId::from_hex("xyz"), None);
    }

    #[test]
    fn a_client_id_gives_the_sdk_s_own_subscription_id() {
        // sha256("abc" ‖ "did:key:z6Mk"), computed independently (sha256sum).
        let id = SubId::for_client("abc", "did:key:z6Mk");
        let want = "52bafd0fe70f4a02bb50cced37b4c66537d92a556349b2a13bc2e7b0008680b7";
        assert_eq!(&id.hex()[..], want.as_bytes());
        assert_eq!(SubId::for_client("abc", "did:key:z6Mk"), id);
        assert_ne!(SubId::for_client("abd", "did:key:z6Mk"), id);
    }

    #[test]
    fn a_topic_leaves_with_its_last_subscription() {
        let mut t = Subscriptions::default();
        let Added::FirstHere(slot) = t.add("a", None, sub(1)) else {
            panic!("the topic's first subscription here")
        };
        assert_eq!(t.add("a", None, sub(2)), Added::Another(slot));
        assert_eq!(
            t.remove(slot, ConnRef { key: 9, uid: 1 }),
            Removed::NotFound
        );
        assert_eq!(t.remove(slot, ConnRef { key: 1, uid: 1 }), Removed::Kept);
        let gone = t.remove(slot, ConnRef { key: 2, uid: 1 });
        assert_eq!(gone, Removed::Last(Arc::from("a")));
        assert_eq!(t.find("a"), None);
        assert!(t.get(slot).is_none());
    }

    #[test]
    fn a_new_topic_takes_the_name_it_is_given() {
        let mut t = Subscriptions::default();
        let name: Arc<str> = Arc::from("n");
        let slot = t.add("n", Some(&name), sub(1)).slot();
        assert!(Arc::ptr_eq(&t.get(slot).unwrap().name, &name));
        let other: Arc<str> = Arc::from("x");
        let slot = t.add("m", Some(&other), sub(2)).slot();
        assert_eq!(&*t.get(slot).unwrap().name, "m");
    }

    #[test]
    fn a_topic_is_found_by_name_whatever_was_found_before() {
        let mut t = Subscriptions::default();
        assert_eq!(t.name_and_slot("a"), None);
        let a = t.add("a", None, sub(1)).slot();
        let b = t.add("b", None, sub(2)).slot();
        for (topic, slot) in [("a", a), ("a", a), ("b", b), ("a", a), ("b", b), ("b", b)] {
            let (name, found) = t.name_and_slot(topic).unwrap();
            assert_eq!((&*name, found), (topic, slot));
        }
        assert_eq!(t.name_and_slot("c"), None);
        // The slot last found leaves and is reused by another topic: it is that topic's now.
        assert!(matches!(
            t.remove(b, ConnRef { key: 2, uid: 1 }),
            Removed::Last(_)
        ));
        assert_eq!(t.name_and_slot("b"), None);
        let c = t.add("c", None, sub(3)).slot();
        assert_eq!(c, b);
        assert_eq!(t.name_and_slot("b"), None);
        assert_eq!(
            t.name_and_slot("c").map(|(n, s)| (n.to_string(), s)),
            Some(("c".into(), c))
        );
    }
}
