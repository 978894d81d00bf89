//! The names the Redis scripts share: the prefix of a topic's client hash and of a node's
//! liveness key, how long that key lives, and the suffix that puts it in a topic's slot on a
//! Redis Cluster. A leaf of `cluster/` (below `script`, `v1` and `clients`, which all
//! name these keys).

use std::time::Duration;

/// Prefix of a topic's hash of client ids (`clients`).
pub(crate) const CLIENTS_PREFIX: &[u8] = b"wr:c:";

/// Prefix of a node's liveness key.
pub(crate) const NODE_PREFIX: &[u8] = b"wr:node:";

/// How long a node's liveness key lives after its last refresh: a node silent that long
/// (crashed, or cut off from the shard) has its subscriber counts removed by the next
/// `pub` of their topics (a node cut off re-sends them when it reconnects).
pub const NODE_FORGET: Duration = Duration::from_secs(60);

/// `d` in ms.
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// [`NODE_FORGET`] in ms.
pub(crate) fn forget_ms() -> u64 {
    ms(NODE_FORGET)
}

/// What a node's liveness key adds where a script on `topic` reads it: nothing, or on a
/// Redis Cluster (`tagged` keys) `:{tag}` of the topic's slot.
pub(crate) fn node_suffix(tagged: bool, topic: &[u8]) -> Vec<u8> {
    match tagged {
        true => slot_suffix(super::slots::topic_slot(topic)),
        false => Vec::new(),
    }
}

/// `:{tag}`: what a node's liveness key in `slot` adds to its name.
pub(crate) fn slot_suffix(slot: u16) -> Vec<u8> {
    [b":{", super::slots::slot_tag(slot).as_bytes(), b"}"].concat()
}
