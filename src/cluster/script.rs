//! The Lua scripts, the key and channel names they work on, the RESP encoding of their calls
//! and the decoding of their replies and of the pub/sub payload.
//!
//! Owns: `scripts/*.lua` (embedded), key layout, the channel payload format. Pure: no I/O
//! (the shard thread sends what this module packs, and hands back what it read).
//!
//! Key layout (ns = namespace digit, T = topic bytes as they are):
//! `wr:{ns}:m:T` meta hash (`e` epoch, `s` last seq, `f` first seq, `x` the keys' expiry ms,
//! and the dedup state: one field per cached message, sha1 of its data -> its seq),
//! `wr:{ns}:s:T` stream (id `<seq>-0`, fields `d` data, `x` expiry ms, `o` origin, `h` sha1
//! of data), `wr:w:T` webhook set (per topic name, both
//! namespaces: a `POST /subscribe` registration has none), `wr:webhooks` the shard's
//! registration counter, `wr:ring` the shard-list fingerprint; the WalletConnect 1.0 keys
//! (`wr:1:v:T`, `wr:1:p:T`, `wr:node:<node>`) are described in `cluster::v1`.
//! Channel: `wr:{db}:{ns}:T` (pub/sub is not per database, so the database is in the name).

use bytes::Bytes;
use redis::Value;

use super::{History, HistoryMessage, Origin, PublishOutcome, WebhookAdd};

/// `publish.lua`: dedup + store + trim + expiry + PUBLISH, returns position and webhooks.
pub const PUBLISH: &str = include_str!("scripts/publish.lua");
/// `read.lua`: unexpired messages after a position.
pub const READ: &str = include_str!("scripts/read.lua");
/// `webhook_add.lua`: idempotent registration under per-topic and per-shard caps.
pub const WEBHOOK_ADD: &str = include_str!("scripts/webhook_add.lua");
/// `webhook_remove.lua`: drop a registration and its count.
pub const WEBHOOK_REMOVE: &str = include_str!("scripts/webhook_remove.lua");

/// The scripts in load order; [`Shas`] holds their digests in the same order (the v1
/// scripts are in `cluster::v1`).
pub const ALL: [&str; 6] = [
    PUBLISH,
    READ,
    WEBHOOK_ADD,
    WEBHOOK_REMOVE,
    super::v1::V1_PUB,
    super::v1::V1_SUB,
];
/// Index of `v1_pub.lua` in [`ALL`] and [`Shas`].
pub const V1_PUB_IDX: usize = 4;
/// Index of `v1_sub.lua` in [`ALL`] and [`Shas`].
pub const V1_SUB_IDX: usize = 5;

/// The key holding the shard-list fingerprint.
pub const RING_KEY: &[u8] = b"wr:ring";
/// The shard's webhook registration counter.
const WEBHOOK_COUNT_KEY: &[u8] = b"wr:webhooks";

/// SHA1 digests of the loaded scripts (what `EVALSHA` names), as returned by `SCRIPT LOAD`.
#[derive(Debug, Clone, Default)]
pub struct Shas(pub [String; 6]);

/// Appends RESP arrays of bulk strings to a buffer (a pipeline of commands).
pub struct Packer<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> Packer<'a> {
    /// Packs into `buf` (appending).
    pub fn new(buf: &'a mut Vec<u8>) -> Self {
        Packer { buf }
    }

    fn head(&mut self, c: u8, n: usize) {
        self.buf.push(c);
        let mut b = itoa::Buffer::new();
        self.buf.extend_from_slice(b.format(n).as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    /// Starts a command of `n` arguments (the command name counts).
    pub fn cmd(&mut self, n: usize) -> &mut Self {
        self.head(b'*', n);
        self
    }

    /// One argument made of `parts` concatenated (a key = prefix + topic, without a copy).
    pub fn arg_parts(&mut self, parts: &[&[u8]]) -> &mut Self {
        self.head(b'$', parts.iter().map(|p| p.len()).sum());
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.buf.extend_from_slice(b"\r\n");
        self
    }

    /// One argument.
    pub fn arg(&mut self, a: &[u8]) -> &mut Self {
        self.arg_parts(&[a])
    }

    /// One unsigned integer argument, in decimal.
    pub fn num(&mut self, n: u64) -> &mut Self {
        let mut b = itoa::Buffer::new();
        let s = b.format(n);
        self.arg_parts(&[s.as_bytes()])
    }
}

/// `wr:{ns}:` : the prefix of a topic's keys.
fn ns_prefix(ns: u8) -> [u8; 5] {
    [b'w', b'r', b':', b'0' + ns % 10, b':']
}

/// The pub/sub channel of a topic: `wr:{db}:{ns}:T`.
pub fn channel(db: i64, ns: u8, topic: &[u8]) -> Vec<u8> {
    let mut c = format!("wr:{db}:{}:", ns % 10).into_bytes();
    c.extend_from_slice(topic);
    c
}

/// What one message of a publish group carries to the script.
pub struct PublishArgs<'a> {
    /// Namespace.
    pub ns: u8,
    /// Topic.
    pub topic: &'a [u8],
    /// The encoded message bytes.
    pub data: &'a [u8],
    /// Time to live, ms.
    pub ttl_ms: u64,
    /// Who published it.
    pub origin: Origin,
    /// Whether webhooks are wanted.
    pub prompt: bool,
}

/// The dedup digest of a message: xxh3-128 of its bytes, 32 lowercase hex digits. Computed
/// here rather than in Lua (where SHA1 costs microseconds of the server's single thread); a
/// fixed function, so every node computes the same. Only a hint: the script confirms a hit
/// by comparing the bytes, so a collision can at worst store a duplicate, never drop a
/// message.
pub fn digest(data: &[u8]) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let h = xxhash_rust::xxh3::xxh3_128(data).to_be_bytes();
    let mut out = [0u8; 32];
    for (i, b) in h.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 15)];
    }
    out
}

/// Packs one `EVALSHA publish` for a group of messages (one reply: an array with one reply
/// per message, in order). `cap` is the cache cap per topic, `db` the database number (for
/// the channel names).
pub fn pack_publish_group(
    buf: &mut Vec<u8>,
    shas: &Shas,
    cap: u64,
    db: i64,
    msgs: &[PublishArgs<'_>],
) {
    let k = msgs.len();
    let mut pk = Packer::new(buf);
    pk.cmd(3 + 3 * k + 1 + 6 * k)
        .arg(b"EVALSHA")
        .arg(shas.0[0].as_bytes())
        .num(3 * k as u64);
    for a in msgs {
        let p = ns_prefix(a.ns);
        pk.arg_parts(&[&p, b"m:", a.topic])
            .arg_parts(&[&p, b"s:", a.topic])
            .arg_parts(&[b"wr:w:", a.topic]);
    }
    pk.num(cap);
    for a in msgs {
        let mut chan = [0u8; 32];
        let chan_head = channel_head(&mut chan, db, a.ns);
        pk.arg(a.data)
            .num(a.ttl_ms)
            .arg(&a.origin.to_bytes())
            .arg(if a.prompt { b"1" } else { b"0" })
            .arg_parts(&[chan_head, a.topic])
            .arg(&digest(a.data));
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

/// Packs `EVALSHA read`.
#[allow(clippy::too_many_arguments)]
pub fn pack_read(
    buf: &mut Vec<u8>,
    shas: &Shas,
    ns: u8,
    topic: &[u8],
    epoch: u64,
    after: u64,
    max_bytes: u64,
    max_count: u64,
) {
    let p = ns_prefix(ns);
    let mut pk = Packer::new(buf);
    pk.cmd(9).arg(b"EVALSHA").arg(shas.0[1].as_bytes()).num(2);
    pk.arg_parts(&[&p, b"m:", topic])
        .arg_parts(&[&p, b"s:", topic]);
    pk.num(epoch).num(after).num(max_bytes).num(max_count);
}

/// Packs `EVALSHA webhook_add`.
pub fn pack_webhook_add(
    buf: &mut Vec<u8>,
    shas: &Shas,
    topic: &[u8],
    url: &[u8],
    per_topic: u64,
    per_shard: u64,
) {
    let mut pk = Packer::new(buf);
    pk.cmd(8).arg(b"EVALSHA").arg(shas.0[2].as_bytes()).num(2);
    pk.arg_parts(&[b"wr:w:", topic]).arg(WEBHOOK_COUNT_KEY);
    pk.arg(url).num(per_topic).num(per_shard);
}

/// Packs `EVALSHA webhook_remove`.
pub fn pack_webhook_remove(buf: &mut Vec<u8>, shas: &Shas, topic: &[u8], url: &[u8]) {
    let mut pk = Packer::new(buf);
    pk.cmd(6).arg(b"EVALSHA").arg(shas.0[3].as_bytes()).num(2);
    pk.arg_parts(&[b"wr:w:", topic]).arg(WEBHOOK_COUNT_KEY);
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

/// Decodes the publish script's reply.
pub fn decode_publish(v: Value) -> Result<PublishOutcome, BadReply> {
    let Value::Array(items) = v else {
        return Err(BadReply("publish: not an array"));
    };
    let mut it = items.into_iter();
    let kind = it
        .next()
        .as_ref()
        .and_then(int)
        .ok_or(BadReply("publish: kind"))?;
    let epoch = it
        .next()
        .as_ref()
        .and_then(uint)
        .ok_or(BadReply("publish: epoch"))?;
    let seq = it
        .next()
        .as_ref()
        .and_then(uint)
        .ok_or(BadReply("publish: seq"))?;
    match kind {
        0 => Ok(PublishOutcome::Duplicate { epoch, seq }),
        1 => {
            let webhooks = it.filter_map(text).collect();
            Ok(PublishOutcome::Stored {
                epoch,
                seq,
                webhooks,
            })
        }
        _ => Err(BadReply("publish: kind")),
    }
}

/// Decodes the read script's reply.
pub fn decode_read(v: Value) -> Result<History, BadReply> {
    let Value::Array(items) = v else {
        return Err(BadReply("read: not an array"));
    };
    if items.len() < 3 || (items.len() - 3) % 4 != 0 {
        return Err(BadReply("read: length"));
    }
    let epoch = uint(&items[0]).ok_or(BadReply("read: epoch"))?;
    let last_seq = uint(&items[1]).ok_or(BadReply("read: last"))?;
    let scanned_to = uint(&items[2]).ok_or(BadReply("read: scanned"))?;
    let mut messages = Vec::with_capacity((items.len() - 3) / 4);
    let mut it = items.into_iter().skip(3);
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
        messages.push(HistoryMessage {
            seq,
            data: Bytes::from(data),
            origin,
            expires_ms,
        });
    }
    Ok(History {
        epoch,
        last_seq,
        scanned_to,
        messages,
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
mod tests {
    use super::*;

    fn args<'a>(topic: &'a [u8], data: &'a [u8]) -> PublishArgs<'a> {
        PublishArgs {
            ns: 2,
            topic,
            data,
            ttl_ms: 5000,
            origin: Origin { node: 1, conn: 2 },
            prompt: true,
        }
    }

    #[test]
    fn a_publish_group_packs_as_resp_and_parses_back() {
        let mut buf = Vec::new();
        let shas = Shas(["a", "b", "c", "d", "e", "f"].map(String::from));
        pack_publish_group(
            &mut buf,
            &shas,
            1000,
            3,
            &[args(b"t\r\n", b"{}"), args(b"u", b"x")],
        );
        let v = redis::parse_redis_value(&buf).unwrap();
        let Value::Array(a) = v else { panic!() };
        let s: Vec<Vec<u8>> = a
            .into_iter()
            .map(|x| match x {
                Value::BulkString(b) => b,
                _ => panic!(),
            })
            .collect();
        assert_eq!(s.len(), 3 + 6 + 1 + 12);
        assert_eq!(s[0], b"EVALSHA");
        assert_eq!(s[2], b"6");
        assert_eq!(s[3], b"wr:2:m:t\r\n");
        assert_eq!(s[5], b"wr:w:t\r\n");
        assert_eq!(s[7], b"wr:2:s:u");
        assert_eq!(s[9], b"1000");
        assert_eq!(s[10], b"{}");
        assert_eq!(s[11], b"5000");
        assert_eq!(s[12], [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
        assert_eq!(s[14], b"wr:3:2:t\r\n");
        assert_eq!(channel(3, 2, b"t\r\n"), s[14]);
        assert_eq!(s[15], digest(b"{}"));
        assert_eq!(s[16], b"x");
    }

    #[test]
    fn the_digest_is_fixed_hex() {
        // xxh3-128 of "" (the reference value), so every node and build agrees.
        assert_eq!(&digest(b""), b"99aa06d3014798d86001c324468d497f");
        assert_ne!(digest(b"a"), digest(b"b"));
    }

    #[test]
    fn live_payload_round_trip_and_garbage() {
        let mut p = b"1700000000000001:42:".to_vec();
        p.extend_from_slice(&Origin { node: 7, conn: 9 }.to_bytes());
        p.extend_from_slice(b"{\"topic\":\"t\"}");
        let l = decode_live(p).unwrap();
        assert_eq!((l.epoch, l.seq), (1_700_000_000_000_001, 42));
        assert_eq!(l.origin, Origin { node: 7, conn: 9 });
        assert_eq!(&l.data[..], b"{\"topic\":\"t\"}");
        for bad in [
            &b""[..],
            b"1:2:",
            b"x:2:0123456789abcdef",
            b":1:0123456789abcdef",
            b"1:2",
        ] {
            assert!(decode_live(bad.to_vec()).is_none());
        }
    }

    #[test]
    fn replies_of_the_wrong_shape_are_errors() {
        assert!(decode_publish(Value::Nil).is_err());
        assert!(decode_publish(Value::Array(vec![Value::Int(5)])).is_err());
        assert!(decode_read(Value::Array(vec![Value::Int(1)])).is_err());
        assert!(decode_webhook_add(&Value::Int(9)).is_err());
        let ok = decode_read(Value::Array(vec![
            Value::BulkString(b"0".to_vec()),
            Value::Int(0),
            Value::Int(0),
        ]))
        .unwrap();
        assert_eq!((ok.epoch, ok.last_seq, ok.messages.len()), (0, 0, 0));
    }
}
