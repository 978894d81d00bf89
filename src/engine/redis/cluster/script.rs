//! The Lua scripts, the key and channel names they work on, the RESP encoding of their calls
//! and the decoding of their replies and of the pub/sub payload.
//!
//! Owns: `scripts/*.lua` (embedded), key layout, the channel payload format. Pure: no I/O
//! (the shard thread sends what this module packs, and hands back what it read).
//!
//! Key layout (ns = namespace digit, db = the Redis database, T = topic bytes as they are):
//! `wr:{ns}:m:T` meta hash (`e` epoch, `s` last seq, `f` first seq, `x` the keys' expiry ms,
//! and the dedup state: one field per cached message, its [`digest`] -> its seq),
//! `wr:{db}:{ns}:T` stream (id `<seq>-0`, fields `d` data, `x` expiry ms, `o` origin, `h`
//! digest), `wr:w:T` webhook set (per topic name, both namespaces: a `POST /subscribe`
//! registration has none), `wr:webhooks` the shard's registration counter, `wr:ring` the
//! shard-list fingerprint; the WalletConnect 1.0 keys (`wr:1:v:T`, `wr:1:p:T`,
//! `wr:node:<node>`) are described in `cluster::v1`, the client ids' (`wr:c:T`, the meta's
//! field `c`, `wr:mb:<client>`) in `cluster::clients`.
//! Channel: `wr:{db}:{ns}:T` (pub/sub is not per database, so the database is in the name),
//! the same string as the stream's key: the publish script names both with one argument,
//! and each string handed to Redis's Lua costs a hash over all its bytes.

use bytes::Bytes;
use redis::Value;

pub use super::resp::Packer;
use super::slots::{self, tag_parts};
use super::types::{
    ClientRead, ClientSeen, History, HistoryMessage, Origin, PublishOutcome, WebhookAdd,
};
use crate::arcbuf::ArcBuf;
use crate::message::Body;

/// `publish.lua`: dedup + store + trim + expiry + PUBLISH, returns position and webhooks.
pub const PUBLISH: &str = include_str!("scripts/publish.lua");
/// `read.lua`: unexpired messages after a position.
pub const READ: &str = include_str!("scripts/read.lua");
/// `webhook_add.lua`: idempotent registration under per-topic and per-shard caps.
pub const WEBHOOK_ADD: &str = include_str!("scripts/webhook_add.lua");
/// `webhook_remove.lua`: drop a registration and its count.
pub const WEBHOOK_REMOVE: &str = include_str!("scripts/webhook_remove.lua");
/// `v1_pub.lua`: a WalletConnect 1.0 frame live or pending, and the webhooks (keys and
/// arguments in `cluster::v1`).
pub const V1_PUB: &str = include_str!("scripts/v1_pub.lua");
/// `v1_sub.lua`: a worker's v1 subscriber count, and the pending frames taken.
pub const V1_SUB: &str = include_str!("scripts/v1_sub.lua");
/// `clients.lua`: a client id's subscription of a topic (keys and arguments in
/// `cluster::clients`).
pub const CLIENTS: &str = include_str!("scripts/clients.lua");
/// `mailbox.lua`: the topics a client id keeps, for the whole cluster.
pub const MAILBOX: &str = include_str!("scripts/mailbox.lua");

/// The scripts in load order; [`Shas`] holds their digests in the same order.
pub const ALL: [&str; 8] = [
    PUBLISH,
    READ,
    WEBHOOK_ADD,
    WEBHOOK_REMOVE,
    V1_PUB,
    V1_SUB,
    CLIENTS,
    MAILBOX,
];
/// Index of `v1_pub.lua` in [`ALL`] and [`Shas`].
pub const V1_PUB_IDX: usize = 4;
/// Index of `v1_sub.lua` in [`ALL`] and [`Shas`].
pub const V1_SUB_IDX: usize = 5;
/// Index of `clients.lua` in [`ALL`] and [`Shas`].
pub const CLIENTS_IDX: usize = 6;
/// Index of `mailbox.lua` in [`ALL`] and [`Shas`].
pub const MAILBOX_IDX: usize = 7;

/// The key holding the shard-list fingerprint.
pub const RING_KEY: &[u8] = b"wr:ring";
/// The shard's webhook registration counter.
const WEBHOOK_COUNT_KEY: &[u8] = b"wr:webhooks";

/// SHA1 digests of the loaded scripts (what `EVALSHA` names), as returned by `SCRIPT LOAD`.
#[derive(Debug, Clone, Default)]
pub struct Shas(pub [String; 8]);

/// How a shard names a topic's keys: its database (pub/sub is not per database, so channel
/// names carry it) and whether the topic is a hash tag (`{T}`: a Redis Cluster shard, where
/// every key one script call touches must be in one slot; `slots::tag_parts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keys {
    /// The database number.
    pub db: i64,
    /// Topics are written as hash tags.
    pub tagged: bool,
}

impl Keys {
    /// What sends live messages: `PUBLISH`, or `SPUBLISH` on a cluster (sharded pub/sub).
    pub fn publish_command(self) -> &'static [u8] {
        match self.tagged {
            true => b"SPUBLISH",
            false => b"PUBLISH",
        }
    }
}

/// `wr:{ns}:` : the prefix of a topic's keys.
fn ns_prefix(ns: u8) -> [u8; 5] {
    [b'w', b'r', b':', b'0' + ns % 10, b':']
}

/// The pub/sub channel of a topic: `wr:{db}:{ns}:T` (`T` as a hash tag on a cluster).
pub fn channel(keys: Keys, ns: u8, topic: &[u8]) -> Vec<u8> {
    let mut head = [0u8; 32];
    let t = tag_parts(topic, keys.tagged);
    [channel_head(&mut head, keys.db, ns), t[0], t[1], t[2]].concat()
}

/// The webhook registration counter a topic's registrations count in: the shard's one key,
/// or on a cluster the counter of the topic's slot (`wr:webhooks:{tag}`).
fn webhook_counter(keys: Keys, topic: &[u8]) -> Vec<u8> {
    if !keys.tagged {
        return WEBHOOK_COUNT_KEY.to_vec();
    }
    let tag = slots::slot_tag(slots::topic_slot(topic));
    [WEBHOOK_COUNT_KEY, b":{", tag.as_bytes(), b"}"].concat()
}

/// What one message of a publish group carries to the script.
pub struct PublishArgs<'a> {
    /// Namespace.
    pub ns: u8,
    /// Topic.
    pub topic: &'a [u8],
    /// The message's body.
    pub body: &'a Body,
    /// Time to live, ms.
    pub ttl_ms: u64,
    /// Who published it.
    pub origin: Origin,
    /// Whether webhooks are wanted.
    pub prompt: bool,
    /// The publisher's client id (`b""`: none).
    pub publisher: &'a [u8],
}

/// What the publish script needs to judge the client ids' sockets and mailboxes.
#[derive(Debug, Clone, Copy)]
pub struct ClientArgs {
    /// `--mailbox-ttl`, ms.
    pub mailbox_ttl_ms: u64,
    /// A node counts while its liveness key was refreshed within this, ms.
    pub alive_ms: u64,
    /// The cluster writes an older layout than this build's (`layout::Current`): nodes of
    /// layout 4 may be running, whose publish script drops the meta's field `c` when it
    /// starts a new epoch, so the script looks for the clients hash itself.
    pub mixed: bool,
}

/// The dedup digest of a message: xxh3-128 of its bytes, 16 bytes big-endian (binary: a
/// hash field name and a stream field value are binary-safe, and half the bytes of hex to
/// hash in Lua). Computed here rather than in Lua (where SHA1 costs microseconds of the
/// server's single thread); a fixed function, so every node computes the same. Only a hint:
/// the script confirms a hit by comparing the bytes, so a collision can at worst store a
/// duplicate, never drop a message.
pub fn digest(data: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(data).to_be_bytes()
}

/// Packs one `EVALSHA publish` for a group of messages (one reply: a flat array, per
/// message its epoch, seq and webhooks; see [`decode_publish_group`]). `cap` is the cache
/// cap per topic, `db` the database number (in the stream's and channel's name). A message
/// passes its webhook set's key only when it asks for its webhooks; its clients hash always.
pub fn pack_publish_group(
    buf: &mut Vec<u8>,
    shas: &Shas,
    cap: u64,
    keys: Keys,
    term: &[u8],
    clients: ClientArgs,
    msgs: &[PublishArgs<'_>],
) {
    let nkeys = msgs
        .iter()
        .map(|a| 3 + usize::from(a.prompt))
        .sum::<usize>();
    let mut pk = Packer::new(buf);
    pk.cmd(3 + nkeys + 8 + 8 * msgs.len())
        .arg(b"EVALSHA")
        .arg(shas.0[0].as_bytes())
        .num(nkeys as u64);
    for a in msgs {
        let mut chan = [0u8; 32];
        let t = tag_parts(a.topic, keys.tagged);
        pk.arg_parts(&[&ns_prefix(a.ns), b"m:", t[0], t[1], t[2]])
            .arg_parts(&[channel_head(&mut chan, keys.db, a.ns), t[0], t[1], t[2]])
            .arg_parts(&[super::keys::CLIENTS_PREFIX, t[0], t[1], t[2]]);
        if a.prompt {
            pk.arg_parts(&[b"wr:w:", t[0], t[1], t[2]]);
        }
    }
    pk.num(cap)
        .arg(term)
        .arg(keys.publish_command())
        .num(clients.mailbox_ttl_ms.clamp(1, 1 << 40))
        .arg(super::keys::NODE_PREFIX)
        .num(super::keys::forget_ms())
        .num(clients.alive_ms.min(super::keys::forget_ms()))
        .arg(if clients.mixed { b"1" } else { b"0" });
    for a in msgs {
        pk.arg(a.body.irn())
            .num(a.ttl_ms)
            .arg(&a.origin.to_bytes())
            .arg(if a.prompt { b"1" } else { b"0" })
            .arg(&digest(a.body.beta_bytes()))
            .num(u64::from(a.body.beta_len()))
            .arg(a.publisher)
            .arg(&super::keys::node_suffix(keys.tagged, a.topic));
    }
}

/// Writes `wr:{db}:{ns}:` into `out` and returns it.
fn channel_head(out: &mut [u8; 32], db: i64, ns: u8) -> &[u8] {
    use std::io::Write as _;
    let mut c = std::io::Cursor::new(&mut out[..]);
    let _ = write!(c, "wr:{db}:{}:", ns % 10);
    let n = usize::try_from(c.position()).unwrap_or(0);
    &out[..n]
}

/// Where a read starts and how much it may return.
#[derive(Debug, Clone, Copy)]
pub struct ReadArgs {
    /// The reader's epoch (0: none).
    pub epoch: u64,
    /// The last seq the reader has.
    pub after: u64,
    /// Most data bytes in one reply.
    pub max_bytes: u64,
    /// Most entries scanned.
    pub max_count: u64,
}

/// Packs `EVALSHA read`; with `client`, a read for that client id (after what it was
/// given; its receipts in the reply).
pub fn pack_read(
    buf: &mut Vec<u8>,
    shas: &Shas,
    keys: Keys,
    ns: u8,
    topic: &[u8],
    r: ReadArgs,
    client: Option<&str>,
) {
    let mut chan = [0u8; 32];
    let t = tag_parts(topic, keys.tagged);
    let mut pk = Packer::new(buf);
    let n = 2 + usize::from(client.is_some());
    pk.cmd(3 + n + 4 + usize::from(client.is_some()))
        .arg(b"EVALSHA")
        .arg(shas.0[1].as_bytes())
        .num(n as u64);
    pk.arg_parts(&[&ns_prefix(ns), b"m:", t[0], t[1], t[2]])
        .arg_parts(&[channel_head(&mut chan, keys.db, ns), t[0], t[1], t[2]]);
    if client.is_some() {
        pk.arg_parts(&[super::keys::CLIENTS_PREFIX, t[0], t[1], t[2]]);
    }
    pk.num(r.epoch)
        .num(r.after)
        .num(r.max_bytes)
        .num(r.max_count);
    if let Some(c) = client {
        pk.arg(c.as_bytes());
    }
}

/// Packs `EVALSHA webhook_add`.
/// Packs `EVALSHA webhook_add`. `per_counter`: the registrations its counter allows (the
/// shard's share; on a cluster, a slot's: `webhooks_per_slot`).
pub fn pack_webhook_add(
    buf: &mut Vec<u8>,
    shas: &Shas,
    keys: Keys,
    topic: &[u8],
    url: &[u8],
    per_topic: u64,
    per_counter: u64,
) {
    let t = tag_parts(topic, keys.tagged);
    let mut pk = Packer::new(buf);
    pk.cmd(8).arg(b"EVALSHA").arg(shas.0[2].as_bytes()).num(2);
    pk.arg_parts(&[b"wr:w:", t[0], t[1], t[2]])
        .arg(&webhook_counter(keys, topic));
    pk.arg(url).num(per_topic).num(per_counter);
}

/// The registrations one slot's counter allows on a Redis Cluster shard: twice the shard's
/// share spread over the slots, plus 8, so uneven spreads are not refused early while the
/// whole stays bounded (at most about twice the share plus 8 per slot).
pub fn webhooks_per_slot(per_shard: u64) -> u64 {
    per_shard.div_ceil(slots::SLOTS as u64) * 2 + 8
}

/// Packs `EVALSHA webhook_remove`.
pub fn pack_webhook_remove(buf: &mut Vec<u8>, shas: &Shas, keys: Keys, topic: &[u8], url: &[u8]) {
    let t = tag_parts(topic, keys.tagged);
    let mut pk = Packer::new(buf);
    pk.cmd(6).arg(b"EVALSHA").arg(shas.0[3].as_bytes()).num(2);
    pk.arg_parts(&[b"wr:w:", t[0], t[1], t[2]])
        .arg(&webhook_counter(keys, topic));
    pk.arg(url);
}

/// A reply that does not have the shape the script returns (a bug or a foreign script).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unexpected script reply: {0}")]
pub struct BadReply(pub &'static str);

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn uint(v: &Value) -> Option<u64> {
    int(v).and_then(|i| u64::try_from(i).ok())
}

fn text(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Decodes the publish script's reply for a group of `n` messages: a flat array, per
/// message its epoch, its seq (negative: a duplicate of the message still cached at -seq),
/// a count k and k webhook urls, a count j and j client ids (id, project, has a socket).
pub fn decode_publish_group(v: Value, n: usize) -> Result<Vec<PublishOutcome>, BadReply> {
    let Value::Array(items) = v else {
        return Err(BadReply("publish: not an array"));
    };
    let mut it = items.into_iter();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let epoch = it
            .next()
            .as_ref()
            .and_then(uint)
            .ok_or(BadReply("publish: epoch"))?;
        let seq = it
            .next()
            .as_ref()
            .and_then(int)
            .ok_or(BadReply("publish: seq"))?;
        let k = it
            .next()
            .as_ref()
            .and_then(uint)
            .and_then(|k| usize::try_from(k).ok())
            .ok_or(BadReply("publish: webhook count"))?;
        let webhooks = (0..k)
            .map(|_| it.next().and_then(text))
            .collect::<Option<Vec<_>>>()
            .ok_or(BadReply("publish: webhook"))?;
        let j = it
            .next()
            .as_ref()
            .and_then(uint)
            .and_then(|k| usize::try_from(k).ok())
            .ok_or(BadReply("publish: client count"))?;
        let clients = (0..j)
            .map(|_| {
                let id = it.next().and_then(text)?;
                let project = it.next().and_then(text)?;
                let socket = it.next().as_ref().and_then(int)? == 1;
                Some(ClientSeen {
                    id,
                    project,
                    socket,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or(BadReply("publish: client"))?;
        out.push(match seq {
            1.. => PublishOutcome::Stored {
                epoch,
                seq: seq.unsigned_abs(),
                webhooks,
                clients,
            },
            ..0 => PublishOutcome::Duplicate {
                epoch,
                seq: seq.unsigned_abs(),
            },
            0 => return Err(BadReply("publish: seq")),
        });
    }
    if it.next().is_some() {
        return Err(BadReply("publish: length"));
    }
    Ok(out)
}

/// Decodes the read script's reply (`client`: a read for a client id, whose reply says
/// whether it has a subscription and its receipts).
pub fn decode_read(v: Value, client: bool) -> Result<History, BadReply> {
    let Value::Array(items) = v else {
        return Err(BadReply("read: not an array"));
    };
    let head = if client { 5 } else { 3 };
    if items.len() < head || (items.len() - head) % 4 != 0 {
        return Err(BadReply("read: length"));
    }
    let epoch = uint(&items[0]).ok_or(BadReply("read: epoch"))?;
    let last_seq = uint(&items[1]).ok_or(BadReply("read: last"))?;
    let scanned_to = uint(&items[2]).ok_or(BadReply("read: scanned"))?;
    let client = match client {
        false => None,
        true => {
            let sub = uint(&items[3]).ok_or(BadReply("read: client"))?;
            let receipts = match &items[4] {
                Value::BulkString(b) => std::str::from_utf8(b)
                    .ok()
                    .and_then(|s| {
                        s.split(',')
                            .filter(|x| !x.is_empty())
                            .map(|x| x.parse().ok())
                            .collect::<Option<Vec<u64>>>()
                    })
                    .ok_or(BadReply("read: receipts"))?,
                _ => return Err(BadReply("read: receipts")),
            };
            Some(ClientRead {
                subscribed: sub == 1,
                received: receipts,
            })
        }
    };
    let mut messages = Vec::with_capacity((items.len() - head) / 4);
    let mut it = items.into_iter().skip(head);
    while let (Some(s), Some(d), Some(o), Some(x)) = (it.next(), it.next(), it.next(), it.next()) {
        let seq = uint(&s).ok_or(BadReply("read: seq"))?;
        let Value::BulkString(data) = d else {
            return Err(BadReply("read: data"));
        };
        let Value::BulkString(o) = o else {
            return Err(BadReply("read: origin"));
        };
        let origin = Origin::from_bytes(&o).ok_or(BadReply("read: origin"))?;
        let expires_ms = uint(&x).ok_or(BadReply("read: expiry"))?;
        let body = Body::from_stored(ArcBuf::from(data)).ok_or(BadReply("read: data"))?;
        messages.push(HistoryMessage {
            seq,
            body,
            origin,
            expires_ms,
        });
    }
    Ok(History {
        epoch,
        last_seq,
        scanned_to,
        messages,
        client,
    })
}

/// Decodes the webhook_add script's reply.
pub fn decode_webhook_add(v: &Value) -> Result<WebhookAdd, BadReply> {
    match int(v) {
        Some(1) => Ok(WebhookAdd::Added),
        Some(0) => Ok(WebhookAdd::Exists),
        Some(-1) => Ok(WebhookAdd::TopicFull),
        Some(-2) => Ok(WebhookAdd::GlobalFull),
        _ => Err(BadReply("webhook_add")),
    }
}

/// A message as published on a topic's channel: `<epoch>:<seq>:<origin 16 bytes><data>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePayload {
    /// The topic's epoch.
    pub epoch: u64,
    /// The message's sequence number.
    pub seq: u64,
    /// Who published it.
    pub origin: Origin,
    /// The stored bytes.
    pub data: Bytes,
}

fn digits(b: &[u8]) -> Option<(u64, &[u8])> {
    let end = memchr::memchr(b':', b)?;
    let s = std::str::from_utf8(&b[..end]).ok()?;
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((s.parse().ok()?, &b[end + 1..]))
}

/// Decodes a channel payload (`None`: not ours or damaged).
pub fn decode_live(payload: Vec<u8>) -> Option<LivePayload> {
    let (epoch, rest) = digits(&payload)?;
    let (seq, rest) = digits(rest)?;
    let origin = Origin::from_bytes(rest.get(..16)?)?;
    let start = payload.len() - rest.len() + 16;
    let mut data = Bytes::from(payload);
    let data = data.split_off(start);
    Some(LivePayload {
        epoch,
        seq,
        origin,
        data,
    })
}

#[cfg(test)]
#[path = "script_tests.rs"]
mod tests;
