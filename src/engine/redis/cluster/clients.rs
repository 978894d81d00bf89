//! Client-id subscriptions on Redis (DECISIONS 13): the keys of `clients.lua` and
//! `mailbox.lua` (embedded with the others in `script`), the RESP encoding of their calls
//! and the decoding of their replies.
//!
//! Owns: the client key layout. Pure: no I/O (the shard thread sends what this module
//! packs). Must not touch worker state.
//!
//! Key layout (T = topic, C = client id, as hash tags on a Redis Cluster): `wr:c:T` the
//! topic's client ids, one field per client id: `<expiry ms>|<delivered epoch>|<delivered
//! seq>|<receipts>|<node hex>:<worker>=<sockets>,...|<project>` (expiry 0 while a socket
//! follows the topic for it; each worker's count is absolute, so a close Redis missed is
//! made good by sending it again; a node's sockets count while its liveness key,
//! `cluster::v1`, is fresh, and are dropped once it is gone); the meta hash `wr:2:m:T` has
//! the field `c` while the topic has client ids (the publish script reads the clients hash
//! only then); `wr:mb:C` the client's topics for `--max-mailbox-topics`, a sorted set
//! scored by when each mailbox would expire without a socket.

use redis::Value;

use super::script::{BadReply, Keys, Packer};
use super::slots::tag_parts;

/// Prefix of a topic's clients hash.
pub(crate) use super::keys::CLIENTS_PREFIX;
/// Prefix of a client's set of topics.
const MAILBOX_PREFIX: &[u8] = b"wr:mb:";
/// Most receipts kept per client and topic (as `engine::clients::MAX_RECEIPTS`).
pub const MAX_RECEIPTS: u64 = 64;
/// Most client ids one topic keeps (as `engine::clients::MAX_CLIENTS_PER_TOPIC`).
pub const MAX_CLIENTS_PER_TOPIC: u64 = 1024;

/// What a client op does to its subscription of a topic. The socket counts are this
/// worker's, absolute (sent again after an outage: a close Redis missed leaves nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCmd {
    /// A socket of this worker subscribed: this worker's sockets following the topic for
    /// the client now.
    Sub(u32),
    /// This worker's sockets again (after Redis may have missed an op), if the client has
    /// a subscription.
    Sockets(u32),
    /// A subscription without a socket (HTTP).
    Http,
    /// A socket of this worker closed, having been given everything up to (epoch, seq);
    /// this worker's sockets now.
    Gone(u64, u64, u32),
    /// The client's subscription ends.
    Unsub,
    /// A fetch gave it everything up to (epoch, seq).
    Delivered(u64, u64),
    /// It received these message ids.
    Receive(Vec<u64>),
}

impl ClientCmd {
    fn name(&self) -> &'static [u8] {
        match self {
            ClientCmd::Sub(_) => b"sub",
            ClientCmd::Sockets(_) => b"sock",
            ClientCmd::Http => b"http",
            ClientCmd::Gone(..) => b"gone",
            ClientCmd::Unsub => b"unsub",
            ClientCmd::Delivered(..) => b"deliv",
            ClientCmd::Receive(_) => b"recv",
        }
    }

    /// This worker's socket count the op carries.
    pub fn sockets(&self) -> Option<u32> {
        match self {
            ClientCmd::Sub(n) | ClientCmd::Sockets(n) | ClientCmd::Gone(_, _, n) => Some(*n),
            _ => None,
        }
    }
}

/// What a client's set of topics is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MailboxCmd {
    /// Count the topic (refused past the limit).
    Add,
    /// Its mailbox runs from now (only if counted).
    Touch,
    /// The subscription ended.
    Del,
}

/// What the client scripts need besides the op.
pub struct ClientLimits {
    /// This node.
    pub node: u64,
    /// `--mailbox-ttl`, ms.
    pub mailbox_ttl_ms: u64,
    /// A node counts while its liveness key was refreshed within this, ms.
    pub alive_ms: u64,
    /// How the shard names keys.
    pub keys: Keys,
}

/// One client-id subscription change to pack ([`pack_client`]).
#[derive(Debug, Clone, Copy)]
pub struct ClientCall<'a> {
    /// The worker it comes from.
    pub worker: usize,
    /// The topic.
    pub topic: &'a [u8],
    /// The client id.
    pub client: &'a str,
    /// Its project.
    pub project: &'a str,
    /// The change.
    pub op: &'a ClientCmd,
}

/// Packs `EVALSHA clients` for `call`.
pub fn pack_client(buf: &mut Vec<u8>, sha: &str, lim: &ClientLimits, call: ClientCall<'_>) {
    let ClientCall {
        worker,
        topic,
        client,
        project,
        op,
    } = call;
    let t = tag_parts(topic, lim.keys.tagged);
    let (e, s) = match op {
        ClientCmd::Gone(e, s, _) | ClientCmd::Delivered(e, s) => (*e, *s),
        _ => (0, 0),
    };
    let receipts = match op {
        ClientCmd::Receive(ids) => ids.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
        _ => String::new(),
    };
    let forget = super::keys::forget_ms();
    let mut pk = Packer::new(buf);
    pk.cmd(20).arg(b"EVALSHA").arg(sha.as_bytes()).num(2);
    pk.arg_parts(&[CLIENTS_PREFIX, t[0], t[1], t[2]])
        .arg_parts(&[b"wr:2:m:", t[0], t[1], t[2]]);
    pk.arg(op.name())
        .arg(client.as_bytes())
        .arg(project.as_bytes())
        .arg(super::v1::field(lim.node, worker).as_bytes())
        .num(lim.mailbox_ttl_ms.clamp(1, 1 << 40))
        .num(e)
        .num(s)
        .arg(receipts.as_bytes())
        .arg(super::keys::NODE_PREFIX)
        .arg(&super::keys::node_suffix(lim.keys.tagged, topic))
        .num(forget)
        .num(lim.alive_ms.min(forget))
        .num(MAX_RECEIPTS)
        .num(MAX_CLIENTS_PER_TOPIC)
        .num(u64::from(op.sockets().unwrap_or(0)));
}

/// Packs `EVALSHA mailbox` for `op` of `client` on `topic`.
pub fn pack_mailbox(
    buf: &mut Vec<u8>,
    sha: &str,
    lim: &ClientLimits,
    client: &str,
    topic: &str,
    op: MailboxCmd,
    max: usize,
) {
    let c = tag_parts(client.as_bytes(), lim.keys.tagged);
    let name: &[u8] = match op {
        MailboxCmd::Add => b"add",
        MailboxCmd::Touch => b"touch",
        MailboxCmd::Del => b"del",
    };
    let mut pk = Packer::new(buf);
    pk.cmd(8).arg(b"EVALSHA").arg(sha.as_bytes()).num(1);
    pk.arg_parts(&[MAILBOX_PREFIX, c[0], c[1], c[2]]);
    pk.arg(name)
        .arg(topic.as_bytes())
        .num(max as u64)
        .num(lim.mailbox_ttl_ms.clamp(1, 1 << 40));
}

fn uint(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// Decodes a `mailbox` reply: `None` when admitted, else the topics the client keeps.
pub fn decode_mailbox(v: &Value) -> Result<Option<Vec<String>>, BadReply> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|t| match t {
                Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
                _ => None,
            })
            .collect::<Option<Vec<String>>>()
            .map(Some)
            .ok_or(BadReply("mailbox: topic")),
        _ if uint(v) == Some(1) => Ok(None),
        _ => Err(BadReply("mailbox")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::redis::cluster::resp::tests::strings;

    #[test]
    fn on_a_cluster_a_client_op_stays_in_its_topic_slot_and_the_set_in_the_clients() {
        let lim = ClientLimits {
            node: 0xab,
            mailbox_ttl_ms: 1000,
            alive_ms: 3000,
            keys: Keys {
                db: 0,
                tagged: true,
            },
        };
        let mut buf = Vec::new();
        let gone = ClientCmd::Gone(3, 4, 2);
        let call = ClientCall {
            worker: 1,
            topic: b"t",
            client: "did:key:z1",
            project: "p",
            op: &gone,
        };
        pack_client(&mut buf, "sha", &lim, call);
        let s = strings(&buf);
        assert_eq!(s.len(), 20);
        assert_eq!(s[8], b"00000000000000ab:1");
        assert_eq!(s[19], b"2");
        assert_eq!(s[3], b"wr:c:{t}");
        assert_eq!(s[4], b"wr:2:m:{t}");
        assert_eq!(s[5], b"gone");
        assert_eq!((&s[10][..], &s[11][..]), (&b"3"[..], &b"4"[..]));
        let slot = super::super::slots::topic_slot(b"t");
        assert_eq!(super::super::slots::key_slot(&s[3]), slot);
        assert_eq!(super::super::slots::key_slot(&s[4]), slot);
        assert_eq!(super::super::slots::key_slot(&s[14]), slot);
        let mut buf = Vec::new();
        pack_mailbox(&mut buf, "sha", &lim, "did:key:z1", "t", MailboxCmd::Add, 5);
        let s = strings(&buf);
        assert_eq!(s[3], b"wr:mb:{did:key:z1}");
    }

    #[test]
    fn a_mailbox_reply_decodes() {
        assert_eq!(decode_mailbox(&Value::Int(1)), Ok(None));
        let kept = Value::Array(vec![Value::BulkString(b"t1".to_vec())]);
        assert_eq!(decode_mailbox(&kept), Ok(Some(vec!["t1".to_string()])));
        assert!(decode_mailbox(&Value::Int(0)).is_err());
        assert!(decode_mailbox(&Value::Nil).is_err());
    }
}
