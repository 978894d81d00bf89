//! A worker's access to the cluster ([`ClusterHandle`]): every call is at most a `try_send`
//! into the bounded queue of the topic's shard (commands) or of its subscriber (watches).
//!
//! Owns: routing a request to its topic's shard. Must not block, and must not touch worker
//! state: answers come back through the node's event sink.

use std::sync::Arc;

use crossbeam_channel::{Sender, TrySendError};

use super::ring::shard_of;
use super::stats::ShardStats;
use super::types::{PublishReq, Unavailable};
use super::v1::V1PublishReq;
use super::{command, pubsub};

/// A worker's access to the cluster. Every call returns at once: at most a `try_send`.
#[derive(Clone)]
pub struct ClusterHandle {
    pub(super) worker: usize,
    pub(super) ports: Arc<[ShardPorts]>,
}

/// What a worker's handle needs of one shard.
pub(super) struct ShardPorts {
    pub(super) commands: Sender<command::Command>,
    pub(super) watch: Sender<pubsub::Ctl>,
    pub(super) stats: Arc<ShardStats>,
}

impl ClusterHandle {
    fn port(&self, topic: &str) -> &ShardPorts {
        &self.ports[shard_of(topic.as_bytes(), self.ports.len())]
    }

    fn send(&self, topic: &str, c: command::Command) -> Result<(), Unavailable> {
        let p = self.port(topic);
        match p.commands.try_send(c) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                p.stats.refused.inc();
                Err(Unavailable)
            }
        }
    }

    /// Counts a client request on `topic` that its worker answered "storage unavailable"
    /// (the `redis_storage_unavailable_answers_total` metric of the topic's shard).
    pub fn count_unavailable_answer(&self, topic: &str) {
        self.port(topic).stats.unavailable_answers.inc();
    }

    /// Stores and publishes `req`; the outcome comes as `Published { ticket, .. }`. `Err`:
    /// refused at once (the shard's queue is full), no event follows.
    pub fn publish(&self, ticket: u64, req: PublishReq) -> Result<(), Unavailable> {
        let topic = Arc::clone(&req.topic);
        self.send(
            &topic,
            command::Command::Publish {
                worker: self.worker,
                ticket,
                req,
            },
        )
    }

    /// Reads the topic's unexpired messages after `(epoch, after_seq)` (from the start when
    /// `epoch` is not the topic's current one, e.g. 0); the answer comes as `Page`.
    pub fn read(
        &self,
        ticket: u64,
        ns: u8,
        topic: &Arc<str>,
        epoch: u64,
        after_seq: u64,
    ) -> Result<(), Unavailable> {
        self.read_client(ticket, ns, topic, epoch, after_seq, None)
    }

    /// [`ClusterHandle::read`], for `client` when given: the read starts after what the
    /// client was given, if that is later (DECISIONS 13).
    pub fn read_client(
        &self,
        ticket: u64,
        ns: u8,
        topic: &Arc<str>,
        epoch: u64,
        after_seq: u64,
        client: Option<&Arc<str>>,
    ) -> Result<(), Unavailable> {
        self.send(
            topic,
            command::Command::Read {
                worker: self.worker,
                ticket,
                ns,
                topic: Arc::clone(topic),
                epoch,
                after: after_seq,
                client: client.cloned(),
            },
        )
    }

    /// Registers `url` for `topic`; the outcome comes as `WebhookAdded`.
    pub fn add_webhook(&self, ticket: u64, topic: &Arc<str>, url: &str) -> Result<(), Unavailable> {
        self.send(
            topic,
            command::Command::WebhookAdd {
                worker: self.worker,
                ticket,
                topic: Arc::clone(topic),
                url: url.into(),
            },
        )
    }

    /// Drops a registration (no answer).
    pub fn remove_webhook(&self, topic: &Arc<str>, url: &str) -> Result<(), Unavailable> {
        self.send(
            topic,
            command::Command::WebhookRemove {
                topic: Arc::clone(topic),
                url: url.into(),
            },
        )
    }

    /// A WalletConnect 1.0 `pub`: live on the topic's v1 channel when another subscriber
    /// counts (any node), else pending; the outcome comes as `V1Published`. `Err`: refused
    /// at once, no event follows.
    pub fn v1_publish(&self, req: V1PublishReq) -> Result<(), Unavailable> {
        let topic = Arc::clone(&req.topic);
        let worker = self.worker;
        self.send(&topic, command::Command::V1Publish { worker, req })
    }

    /// Sets this worker's count of v1 subscribers of `topic` (0 removes it; idempotent),
    /// and with a `ticket` also takes the topic's pending frames in the same script (the
    /// answer comes as `V1Taken`). Watch the topic's [`NS_V1`] channel and wait for its
    /// first `Subscribed` before the first call, so a `pub` that sees the count reaches this
    /// node. `Err`: refused at once, no event follows.
    pub fn v1_sub(
        &self,
        ticket: Option<u64>,
        topic: &Arc<str>,
        count: u32,
    ) -> Result<(), Unavailable> {
        self.send(
            topic,
            command::Command::V1Sub {
                worker: self.worker,
                ticket,
                topic: Arc::clone(topic),
                count,
            },
        )
    }

    /// The worker this handle is for.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// A client id's op on its subscription of `topic` (no answer).
    pub fn client(
        &self,
        topic: &Arc<str>,
        client: &Arc<str>,
        project: &Arc<str>,
        op: super::clients::ClientCmd,
    ) -> Result<(), Unavailable> {
        self.send(
            topic,
            command::Command::Client {
                worker: self.worker,
                topic: Arc::clone(topic),
                client: Arc::clone(client),
                project: Arc::clone(project),
                op,
            },
        )
    }

    /// A client id's set of topics, on the client id's own shard and slot.
    pub fn mailbox(
        &self,
        client: &Arc<str>,
        topic: &Arc<str>,
        op: super::clients::MailboxCmd,
    ) -> Result<(), Unavailable> {
        self.send(
            client,
            command::Command::Mailbox {
                worker: self.worker,
                client: Arc::clone(client),
                topic: Arc::clone(topic),
                op,
            },
        )
    }

    /// This worker wants the topic's live messages (`Live`), and a `Subscribed` whenever the
    /// node's subscription becomes live. Idempotent per worker and topic.
    pub fn watch(&self, ns: u8, topic: &Arc<str>) -> Result<(), Unavailable> {
        self.ctl(topic, |worker, topic| pubsub::Ctl::Watch {
            worker,
            ns,
            topic,
        })
    }

    /// This worker no longer wants the topic; the node unsubscribes when no worker does.
    pub fn unwatch(&self, ns: u8, topic: &Arc<str>) -> Result<(), Unavailable> {
        self.ctl(topic, |worker, topic| pubsub::Ctl::Unwatch {
            worker,
            ns,
            topic,
        })
    }

    fn ctl(
        &self,
        topic: &Arc<str>,
        make: impl FnOnce(usize, Arc<str>) -> pubsub::Ctl,
    ) -> Result<(), Unavailable> {
        self.port(topic)
            .watch
            .try_send(make(self.worker, Arc::clone(topic)))
            .map_err(|_| Unavailable)
    }
}
