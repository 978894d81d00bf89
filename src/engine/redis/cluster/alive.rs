//! Where a node keeps its liveness key on a Redis Cluster shard (`cluster::v1`'s
//! `node_key_in`): a script there reads only keys of its topic's slot, so the node keeps one
//! key alive in each slot where it has WalletConnect 1.0 subscribers (a v1 `pub` counts
//! their subscriptions only while it is fresh) or sockets following topics for client ids
//! (`clients.lua` and the publish script count those sockets likewise; from the absolute
//! counts the client ops carry).
//!
//! Owns: the slots, from the commands passing through the Redis Cluster command thread
//! (`multi`). Pure: no I/O; the thread sends the `AliveIn` refreshes this says.

use std::collections::HashMap;
use std::sync::Arc;

use super::clients::ClientCmd;
use super::command::Command;
use super::slots::topic_slot;

/// The slots where the node's liveness key is wanted.
#[derive(Debug, Default)]
pub(crate) struct AliveSlots {
    /// Per worker and topic with v1 subscribers, its slot.
    v1_topics: HashMap<(usize, Arc<str>), u16>,
    /// Per slot, how many of those.
    v1_slots: HashMap<u16, u32>,
    /// Per worker, topic and client id whose sockets follow the topic here, its slot.
    client_topics: HashMap<(usize, Arc<str>, Arc<str>), u16>,
    /// Per slot, how many of those.
    client_slots: HashMap<u16, u32>,
}

impl AliveSlots {
    /// Follows `cmd`; returns a slot that wants the liveness key set now (before `cmd`,
    /// which would otherwise count on a node without a fresh key there).
    pub(crate) fn follow(&mut self, cmd: &Command) -> Option<u16> {
        match cmd {
            Command::V1Sub {
                worker,
                topic,
                count,
                ..
            } => self.v1(*worker, topic, *count),
            Command::Client {
                worker,
                topic,
                client,
                op,
                ..
            } => self.client(*worker, topic, client, op),
            _ => None,
        }
    }

    /// Every slot where the key is wanted (refreshed with the heartbeat).
    pub(crate) fn slots(&self) -> Vec<u16> {
        let mut s: Vec<u16> = self.v1_slots.keys().copied().collect();
        s.extend(
            self.client_slots
                .keys()
                .filter(|k| !self.v1_slots.contains_key(k)),
        );
        s
    }

    fn wanted(&self, slot: u16) -> bool {
        self.v1_slots.contains_key(&slot) || self.client_slots.contains_key(&slot)
    }

    /// A worker's v1 subscriber count of a topic.
    fn v1(&mut self, worker: usize, topic: &Arc<str>, count: u32) -> Option<u16> {
        let key = (worker, Arc::clone(topic));
        if count == 0 {
            let slot = self.v1_topics.remove(&key)?;
            if let Some(n) = self.v1_slots.get_mut(&slot) {
                *n -= 1;
                if *n == 0 {
                    self.v1_slots.remove(&slot);
                }
            }
            return None;
        }
        if self.v1_topics.contains_key(&key) {
            return None;
        }
        let slot = topic_slot(topic.as_bytes());
        let first = !self.wanted(slot);
        self.v1_topics.insert(key, slot);
        *self.v1_slots.entry(slot).or_insert(0) += 1;
        first.then_some(slot)
    }

    /// A client op: a worker's sockets following a topic for a client id (absolute), or
    /// the end of the client's subscription.
    fn client(
        &mut self,
        worker: usize,
        topic: &Arc<str>,
        client: &Arc<str>,
        op: &ClientCmd,
    ) -> Option<u16> {
        let key = (worker, Arc::clone(topic), Arc::clone(client));
        let n = match op {
            ClientCmd::Unsub => 0,
            other => other.sockets()?,
        };
        if n == 0 {
            let slot = self.client_topics.remove(&key)?;
            if let Some(c) = self.client_slots.get_mut(&slot) {
                *c -= 1;
                if *c == 0 {
                    self.client_slots.remove(&slot);
                }
            }
            return None;
        }
        if self.client_topics.contains_key(&key) {
            return None;
        }
        let slot = topic_slot(topic.as_bytes());
        let first = !self.wanted(slot);
        self.client_topics.insert(key, slot);
        *self.client_slots.entry(slot).or_insert(0) += 1;
        first.then_some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_kept_while_v1_subscribers_or_client_sockets_are_there() {
        let mut a = AliveSlots::default();
        let t: Arc<str> = Arc::from("t");
        let slot = topic_slot(b"t");
        let client = |op| Command::Client {
            worker: 0,
            topic: t.clone(),
            client: Arc::from("c"),
            project: Arc::from("p"),
            op,
        };
        assert_eq!(a.follow(&client(ClientCmd::Sub(1))), Some(slot));
        assert_eq!(a.follow(&client(ClientCmd::Sub(2))), None);
        let v1 = |count| Command::V1Sub {
            worker: 0,
            ticket: None,
            topic: t.clone(),
            count,
        };
        assert_eq!(a.follow(&v1(1)), None, "already kept");
        assert_eq!(a.follow(&client(ClientCmd::Gone(1, 1, 1))), None);
        assert_eq!(a.follow(&client(ClientCmd::Gone(1, 1, 0))), None);
        assert_eq!(a.slots(), [slot], "the v1 subscriber keeps it");
        a.follow(&v1(0));
        assert!(a.slots().is_empty());
        assert_eq!(a.follow(&client(ClientCmd::Sockets(1))), Some(slot));
        a.follow(&client(ClientCmd::Unsub));
        assert!(a.slots().is_empty());
    }
}
