//! WalletConnect 1.0 frames across the nodes (DECISIONS §8 "all cores, all nodes"): the keys
//! of the scripts `v1_pub.lua` and `v1_sub.lua` (embedded with the others in `script`), the
//! RESP encoding of their calls and the decoding of their replies.
//!
//! Owns: the v1 key layout and the node liveness key. Pure: no I/O (the shard thread sends
//! what this module packs). Must not touch v2 keys (`script`) or worker state.
//!
//! Key layout (T = topic bytes as they are): `wr:1:v:T` hash of v1 subscriber counts, one
//! field `<node 16 hex>:<worker>` per worker with v1 subscribers of the topic (its absolute
//! count: idempotent, re-sent after a reconnect), `wr:1:p:T` list of pending frames
//! (`<expiry ms>:<frame>`, oldest first, at most `max_cached_per_topic`, expiring with its
//! newest frame), `wr:node:<node 16 hex>` the node's liveness key (set at every heartbeat
//! for [`NODE_FORGET`]). Live frames go on the topic's v1 channel `wr:{db}:1:T` in the v2
//! payload format with epoch and seq 0 (`0:0:<origin 16 bytes><frame>`).

use std::time::Duration;

use bytes::Bytes;
use redis::Value;

use super::script::{channel, BadReply, Packer};
use super::slots::tag_parts;
use super::types::{Origin, V1Published};

pub use super::keys::NODE_FORGET;
use super::keys::{ms, slot_suffix, NODE_PREFIX};

/// A v1 `pub` for the shard.
#[derive(Debug, Clone)]
pub struct V1PublishReq {
    /// The topic.
    pub topic: std::sync::Arc<str>,
    /// The frame subscribers get.
    pub frame: Bytes,
    /// The publishing connection is itself a v1 subscriber of the topic.
    pub self_subscribed: bool,
    /// Its publisher (carried on the channel, so its own connection is skipped).
    pub origin: Origin,
    /// Whether the topic's webhooks should be returned (the `pub` is not silent).
    pub prompt: bool,
}

/// The hash field of worker `worker` of node `node`.
pub fn field(node: u64, worker: usize) -> String {
    format!("{node:016x}:{worker}")
}

/// The liveness key of node `node`.
pub fn node_key(node: u64) -> Vec<u8> {
    let mut k = NODE_PREFIX.to_vec();
    k.extend_from_slice(format!("{node:016x}").as_bytes());
    k
}

/// The liveness key of node `node` in hash slot `slot` of a Redis Cluster
/// (`wr:node:<node>:{tag}`): a topic's `pub` there can only read keys of its own slot, so a
/// node keeps one such key alive in each slot where it has v1 subscribers.
pub fn node_key_in(node: u64, slot: u16) -> Vec<u8> {
    let mut k = node_key(node);
    k.extend_from_slice(&slot_suffix(slot));
    k
}

/// Packs the liveness refresh of node `node` in `slot` (a Redis Cluster shard).
pub fn pack_alive_in(buf: &mut Vec<u8>, node: u64, slot: u16) {
    Packer::new(buf)
        .cmd(5)
        .arg(b"SET")
        .arg(&node_key_in(node, slot))
        .arg(b"1")
        .arg(b"PX")
        .num(ms(NODE_FORGET));
}

/// Packs `SET wr:node:<node> 1 PX <NODE_FORGET>` (the heartbeat's liveness refresh).
pub fn pack_alive(buf: &mut Vec<u8>, node: u64) {
    Packer::new(buf)
        .cmd(5)
        .arg(b"SET")
        .arg(&node_key(node))
        .arg(b"1")
        .arg(b"PX")
        .num(ms(NODE_FORGET));
}

/// What the pub script needs besides the request.
pub struct PubLimits {
    /// How long a pending frame is kept.
    pub pending_ttl: Duration,
    /// Most pending frames per topic.
    pub cap: u64,
    /// A node counts while its key was refreshed within this time.
    pub alive: Duration,
    /// How the shard names keys (channel names carry the database).
    pub keys: super::script::Keys,
}

/// Packs `EVALSHA v1_pub`.
pub fn pack_pub(buf: &mut Vec<u8>, sha: &str, req: &V1PublishReq, lim: &PubLimits) {
    let t = req.topic.as_bytes();
    let p = tag_parts(t, lim.keys.tagged);
    let mut pk = Packer::new(buf);
    pk.cmd(18).arg(b"EVALSHA").arg(sha.as_bytes()).num(3);
    pk.arg_parts(&[b"wr:1:v:", p[0], p[1], p[2]])
        .arg_parts(&[b"wr:1:p:", p[0], p[1], p[2]])
        .arg_parts(&[b"wr:w:", p[0], p[1], p[2]]);
    pk.arg(&req.frame)
        .arg(if req.self_subscribed { b"1" } else { b"0" })
        .arg(&req.origin.to_bytes())
        .arg(if req.prompt { b"1" } else { b"0" })
        .arg(&channel(lim.keys, super::types::NS_V1, t))
        .num(ms(lim.pending_ttl).clamp(1, 1 << 40))
        .num(lim.cap.max(1))
        .arg(NODE_PREFIX)
        .num(ms(NODE_FORGET))
        .num(ms(lim.alive).min(ms(NODE_FORGET)))
        .arg(lim.keys.publish_command())
        // On a cluster a node's liveness key in the topic's own slot ([`node_key_in`]).
        .arg(&match lim.keys.tagged {
            true => slot_suffix(super::slots::topic_slot(t)),
            false => Vec::new(),
        });
}

/// Packs `EVALSHA v1_sub`: worker `field`'s count of the topic, and the take.
pub fn pack_sub(
    buf: &mut Vec<u8>,
    sha: &str,
    tagged: bool,
    topic: &[u8],
    field: &str,
    count: u32,
    take: bool,
) {
    let p = tag_parts(topic, tagged);
    let mut pk = Packer::new(buf);
    pk.cmd(8).arg(b"EVALSHA").arg(sha.as_bytes()).num(2);
    pk.arg_parts(&[b"wr:1:v:", p[0], p[1], p[2]])
        .arg_parts(&[b"wr:1:p:", p[0], p[1], p[2]]);
    pk.arg(field.as_bytes())
        .num(u64::from(count))
        .arg(if take { b"1" } else { b"0" });
}

/// Decodes the pub script's reply.
pub fn decode_pub(v: Value) -> Result<V1Published, BadReply> {
    let Value::Array(items) = v else {
        return Err(BadReply("v1_pub: not an array"));
    };
    let mut it = items.into_iter();
    let live = match it.next() {
        Some(Value::Int(1)) => true,
        Some(Value::Int(0)) => false,
        _ => return Err(BadReply("v1_pub: kind")),
    };
    let mut webhooks = Vec::new();
    for u in it {
        match u {
            Value::BulkString(b) => {
                webhooks.push(String::from_utf8(b).map_err(|_| BadReply("v1_pub: url"))?)
            }
            _ => return Err(BadReply("v1_pub: url")),
        }
    }
    Ok(V1Published { live, webhooks })
}

/// Decodes the sub script's reply: the frames taken.
pub fn decode_sub(v: Value) -> Result<Vec<Bytes>, BadReply> {
    let Value::Array(items) = v else {
        return Err(BadReply("v1_sub: not an array"));
    };
    items
        .into_iter()
        .map(|f| match f {
            Value::BulkString(b) => Ok(Bytes::from(b)),
            _ => Err(BadReply("v1_sub: frame")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::redis::cluster::resp::tests::strings;

    #[test]
    fn a_pub_packs_its_keys_frame_and_channel() {
        let mut buf = Vec::new();
        let req = V1PublishReq {
            topic: "t\r\n".into(),
            frame: Bytes::from_static(b"{\"x\":1}"),
            self_subscribed: true,
            origin: Origin { node: 1, conn: 2 },
            prompt: false,
        };
        let lim = PubLimits {
            pending_ttl: Duration::from_secs(6 * 3600),
            cap: 1000,
            alive: Duration::from_secs(3),
            keys: super::super::script::Keys {
                db: 4,
                tagged: false,
            },
        };
        pack_pub(&mut buf, "sha", &req, &lim);
        let s = strings(&buf);
        assert_eq!(s.len(), 18);
        assert_eq!(s[3], b"wr:1:v:t\r\n");
        assert_eq!(s[4], b"wr:1:p:t\r\n");
        assert_eq!(s[5], b"wr:w:t\r\n");
        assert_eq!(s[6], b"{\"x\":1}");
        assert_eq!((&s[7][..], &s[9][..]), (&b"1"[..], &b"0"[..]));
        assert_eq!(s[10], channel(lim.keys, 1, b"t\r\n"));
        assert_eq!(s[11], b"21600000");
        assert_eq!(s[13], b"wr:node:");
        assert_eq!((&s[14][..], &s[15][..]), (&b"60000"[..], &b"3000"[..]));
        assert_eq!(s[16], b"PUBLISH");
        assert_eq!(s[17], b"");
    }

    #[test]
    fn a_sub_packs_the_field_count_and_take() {
        let mut buf = Vec::new();
        pack_sub(&mut buf, "sha", false, b"t", &field(0xab, 3), 2, true);
        let s = strings(&buf);
        assert_eq!(s[3], b"wr:1:v:t");
        assert_eq!(s[5], b"00000000000000ab:3");
        assert_eq!((&s[6][..], &s[7][..]), (&b"2"[..], &b"1"[..]));
        let mut buf = Vec::new();
        pack_alive(&mut buf, 0xab);
        assert_eq!(strings(&buf)[1], b"wr:node:00000000000000ab");
    }

    #[test]
    fn replies_decode_and_wrong_shapes_are_errors() {
        let v = Value::Array(vec![Value::Int(1), Value::BulkString(b"http://x".to_vec())]);
        assert_eq!(
            decode_pub(v).unwrap(),
            V1Published {
                live: true,
                webhooks: vec!["http://x".into()]
            }
        );
        assert!(decode_pub(Value::Nil).is_err());
        assert!(decode_pub(Value::Array(vec![Value::Int(7)])).is_err());
        let v = Value::Array(vec![Value::BulkString(b"a".to_vec())]);
        assert_eq!(decode_sub(v).unwrap(), vec![Bytes::from_static(b"a")]);
        assert!(decode_sub(Value::Array(vec![Value::Int(1)])).is_err());
        assert!(decode_sub(Value::Okay).is_err());
    }
}
