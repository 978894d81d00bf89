//! WalletConnect 1.0 frames (DECISIONS §8) as the worker's relay share sees them: its
//! connections' v1 subscriptions, their `sub` and `pub`.

use std::sync::Arc;

use bytes::Bytes;

use super::{ConnRef, Relay, Ticket, Waiter};
use crate::engine;

impl Relay {
    /// A WalletConnect 1.0 `sub`: subscribes the connection (if it was not) and takes the
    /// topic's pending frames for it. Returns the topic's name when the subscription is new
    /// (the connection keeps it, to unsubscribe when it closes).
    pub fn v1_subscribe(&mut self, conn: ConnRef, topic: &str) -> Option<Arc<str>> {
        let added = self.v1.add(topic, conn);
        let name = added.clone().unwrap_or_else(|| Arc::from(topic));
        if added.is_some() {
            self.engine.v1_watch(&name, 1, &mut self.events);
            self.m().subscriptions.inc();
        }
        let ticket = self.waiting.tickets.insert(Waiter::V1Take { conn }) as Ticket;
        self.engine.v1_take(&name, ticket, &mut self.events);
        self.absorb();
        added
    }

    /// Ends a connection's v1 subscription of `topic`.
    ///
    /// The topic's home hears it at once (the engine's work is handed on here, not at the
    /// next round's flush): the worker removes closed connections after its round's last
    /// flush and may then sleep until its next timer tick, and until the home knows, a `pub`
    /// with no other subscriber would still be routed here, to nobody, instead of waiting
    /// for the next `sub`. Flushing early keeps the engine's order and promises.
    pub fn v1_unsubscribe(&mut self, conn: ConnRef, topic: &Arc<str>) {
        if self.v1.remove(topic, conn) {
            self.engine.v1_watch(topic, -1, &mut self.events);
            // A full mailbox keeps the batch for the next round's flush, as any round does.
            let _ = self.engine.flush(&mut self.events);
            self.m().subscriptions.sub(1);
            self.absorb();
        }
    }

    /// A WalletConnect 1.0 `pub` from a local connection.
    pub fn v1_publish(&mut self, conn: ConnRef, topic: &str, payload: &str, silent: bool) {
        self.m().v1_published.inc();
        let req = engine::V1Publish {
            topic: Arc::from(topic),
            frame: Bytes::from(crate::rpc::v1::encode_pub(topic, payload, silent)),
            silent,
            origin: self.origin_of(conn.uid),
            self_subscribed: self.v1.of(topic).contains(&conn),
        };
        self.engine.v1_publish(req, &mut self.events);
        self.absorb();
    }
}
