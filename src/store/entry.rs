//! The typed entries a worker writes to its log, and their compact binary encoding.
//!
//! ```text
//! Message        1 ns flags epoch:u64 seq:u64 expires_unix_ms:u64 topic:str16 data:bytes32
//! MessageBody    5 (as Message)
//! Body           6 flags epoch:var seq:var expires_unix_ms:var topic_len:var data:rest
//! Forget         2 ns epoch:u64 seq:u64 topic:str16
//! WebhookAdd     3 topic:str16 url:str16
//! WebhookRemove  4 topic:str16 url:str16
//! ClientSub      7 topic:str16 client:str16 project:str16 epoch:u64 seq:u64
//!                  expires_unix_ms:u64 n:u8 received:u64*n
//! ClientEnd      8 topic:str16 client:str16
//! ```
//! `ClientSub` (DECISIONS 13) is the whole state of a client id's subscription of a topic
//! as of its last change (with a socket then, the expiry its mailbox would have had if the
//! socket had closed at that moment); the later
//! record of a pair supersedes the earlier. `ClientEnd` is its tombstone (an explicit
//! unsubscribe).
//! Integers are little-endian; `str16` is a u16 length then UTF-8 bytes, `bytes32` a u32
//! length then bytes; `flags` bit 0 is `prompt`, other bits must be zero. `var` is an
//! unsigned LEB128 varint (7 bits a byte, low first, shortest form only); `rest` is every
//! byte to the end of the payload (the record's length gives it).
//!
//! `Body` (kind 6, written since the compact format) is a v2 message whose `message::Body`
//! starts `{"topic":"T"` with `T` exactly the topic: the topic is not written again, only
//! its length; it is the `topic_len` bytes after the 10-byte prefix `{"topic":"`, which a
//! `"` must follow. Its namespace is v2 and its data a `message::Body`. A message whose
//! topic needs escaping in JSON is written as `MessageBody` (kind 5): see
//! [`Entry::topic_in_body`].
//!
//! `MessageBody` (this build's v2 messages) holds the message's `message::Body`, the `irn`
//! object with `publishedAt`, `tag` and `attestation`. `Message` holds a v1 frame, or a v2
//! message written by a build before `irn` (`{"topic":..,"message":..}`, which recovery
//! upgrades: docs/DECISIONS.md, "Stored messages before irn").
//!
//! Owns only the encoding: [`Entry::decode`] is pure and returns a typed [`EntryError`] on
//! anything malformed (never panics). What an entry means for the cache (replay order,
//! dedup, expiry, tombstones) is the engine's.

/// Which relay protocol a message belongs to (DECISIONS §8: v1 and v2 topics are separate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ns {
    /// WalletConnect 1.0 bridge frames (v1 pending messages).
    V1 = 1,
    /// WalletConnect 2.0 waku relay messages.
    V2 = 2,
}

/// One logged change of a worker's state. Borrows its strings from the encoded bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A message stored on a topic.
    Message {
        /// Protocol namespace of the topic.
        ns: Ns,
        /// The topic.
        topic: &'a str,
        /// Position on the topic: the topic's epoch (new when its sequence restarts)...
        epoch: u64,
        /// ...and the message's sequence number within the epoch.
        seq: u64,
        /// Absolute expiry, wall-clock milliseconds since the Unix epoch.
        expires_unix_ms: u64,
        /// The publish's `prompt` (false: no webhook push).
        prompt: bool,
        /// `data` is a `message::Body` (kind 5); else a v1 frame or a pre-`irn` v2 object.
        body: bool,
        /// The stored payload.
        data: &'a [u8],
    },
    /// A v2 message whose `message::Body` (`data`) holds its topic (kind 6; see the module
    /// docs and [`Entry::topic_in_body`]). Read back as the `MessageBody` it stands for.
    Body {
        /// The topic: must be what `data` holds (encoding fails otherwise).
        topic: &'a str,
        /// Epoch of the message's position.
        epoch: u64,
        /// Sequence number within the epoch.
        seq: u64,
        /// Absolute expiry, wall-clock milliseconds since the Unix epoch.
        expires_unix_ms: u64,
        /// The publish's `prompt`.
        prompt: bool,
        /// The `message::Body`.
        data: &'a [u8],
    },
    /// A message removed before its expiry (a v1 pending message delivered). A tombstone:
    /// see the module docs of [`super`] for how long it stays live.
    Forget {
        /// Protocol namespace of the topic.
        ns: Ns,
        /// The topic.
        topic: &'a str,
        /// Epoch of the forgotten message.
        epoch: u64,
        /// Sequence number of the forgotten message.
        seq: u64,
    },
    /// A webhook registered for a topic.
    WebhookAdd {
        /// The topic.
        topic: &'a str,
        /// The webhook address.
        url: &'a str,
    },
    /// A webhook registration removed (a tombstone, like `Forget`).
    WebhookRemove {
        /// The topic.
        topic: &'a str,
        /// The webhook address.
        url: &'a str,
    },
    /// A client id's subscription of a topic, as it stands (kind 7).
    ClientSub {
        /// The topic.
        topic: &'a str,
        /// The client id.
        client: &'a str,
        /// Its project id (`""`: none).
        project: &'a str,
        /// Everything up to this position was given to it: epoch...
        epoch: u64,
        /// ...and seq.
        seq: u64,
        /// When its mailbox expires, wall-clock ms.
        expires_unix_ms: u64,
        /// Receipts above the position, as little-endian u64s (at most 255).
        received: &'a [u8],
    },
    /// A client id's subscription ended (a tombstone, kind 8).
    ClientEnd {
        /// The topic.
        topic: &'a str,
        /// The client id.
        client: &'a str,
    },
}

/// Why bytes are not an entry, or an entry cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The bytes end before the entry does.
    #[error("entry truncated")]
    Truncated,
    /// The first byte is not a known entry kind.
    #[error("unknown entry kind {0}")]
    UnknownKind(u8),
    /// The namespace byte is neither 1 nor 2.
    #[error("unknown namespace {0}")]
    UnknownNs(u8),
    /// Flag bits other than `prompt` are set.
    #[error("unknown flags {0:#x}")]
    BadFlags(u8),
    /// A string field is not UTF-8.
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    /// Bytes remain after the entry.
    #[error("{0} bytes after the entry")]
    Trailing(usize),
    /// A field is too long for its length prefix (encoding only).
    #[error("{0} too long to encode")]
    TooLong(&'static str),
    /// A varint is longer than its shortest form or than 64 bits.
    #[error("malformed varint")]
    BadVarint,
    /// A `Body` entry's data does not hold its topic as this format needs.
    #[error("topic not held by the body")]
    TopicNotInBody,
}

const MESSAGE: u8 = 1;
const FORGET: u8 = 2;
const WEBHOOK_ADD: u8 = 3;
const WEBHOOK_REMOVE: u8 = 4;
const MESSAGE_BODY: u8 = 5;
const BODY: u8 = 6;
const CLIENT_SUB: u8 = 7;
const CLIENT_END: u8 = 8;

/// How every `message::Body` starts: the topic's JSON string follows.
const BODY_PREFIX: &[u8] = b"{\"topic\":\"";

/// Bytes of `v` as a varint.
fn var_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Writes `v` as a varint at the start of `at` (at least 10 bytes); returns its length.
fn put_var_at(at: &mut [u8], mut v: u64) -> usize {
    let mut n = 0;
    for b in at.iter_mut() {
        n += 1;
        if v < 0x80 {
            *b = v as u8;
            break;
        }
        *b = v as u8 | 0x80;
        v >>= 7;
    }
    n
}

/// The topic a `Body` entry's data holds: its `n` bytes after [`BODY_PREFIX`], then `"`.
fn topic_of_body(data: &[u8], n: usize) -> Result<&str, EntryError> {
    let t = data
        .strip_prefix(BODY_PREFIX)
        .filter(|rest| rest.get(n) == Some(&b'"'))
        .and_then(|rest| rest.get(..n))
        .ok_or(EntryError::TopicNotInBody)?;
    simdutf8::basic::from_utf8(t).map_err(|_| EntryError::NotUtf8("topic"))
}

fn put_str16(out: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), EntryError> {
    let n = u16::try_from(s.len()).map_err(|_| EntryError::TooLong(what))?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

impl<'a> Entry<'a> {
    /// Whether a v2 message on `topic` whose `message::Body` is `data` can be written as a
    /// [`Entry::Body`]: `data` starts with `{"topic":"`, the topic's bytes, then `"`.
    ///
    /// For a body `message::Body::encode` made of this topic (as the journal writes), that
    /// holds exactly when the topic's JSON string is the topic itself, unescaped: the
    /// first character it escapes would put a `\` where the topic has that character (so
    /// only a `\` itself could still match, and its escape doubles it), and a `"` inside
    /// the string is always escaped, so the `"` found is the closing one. So a byte compare
    /// decides it, with no scan of the topic for characters to escape.
    pub fn topic_in_body(topic: &str, data: &[u8]) -> bool {
        data.strip_prefix(BODY_PREFIX)
            .and_then(|rest| rest.strip_prefix(topic.as_bytes()))
            .is_some_and(|rest| rest.first() == Some(&b'"'))
    }

    /// A [`Entry::Body`] as the `MessageBody` it stands for (other entries as they are):
    /// what a reader of the log acts on.
    pub fn expanded(self) -> Entry<'a> {
        match self {
            Entry::Body {
                topic,
                epoch,
                seq,
                expires_unix_ms,
                prompt,
                data,
            } => Entry::Message {
                ns: Ns::V2,
                topic,
                epoch,
                seq,
                expires_unix_ms,
                prompt,
                body: true,
                data,
            },
            e => e,
        }
    }

    /// The topic the entry is about.
    pub fn topic(&self) -> &'a str {
        match *self {
            Entry::Message { topic, .. }
            | Entry::Body { topic, .. }
            | Entry::Forget { topic, .. }
            | Entry::WebhookAdd { topic, .. }
            | Entry::WebhookRemove { topic, .. }
            | Entry::ClientSub { topic, .. }
            | Entry::ClientEnd { topic, .. } => topic,
        }
    }

    /// Bytes of the encoding.
    pub fn encoded_len(&self) -> usize {
        match *self {
            Entry::Message { topic, data, .. } => 3 + 24 + 2 + topic.len() + 4 + data.len(),
            Entry::Body {
                epoch,
                seq,
                expires_unix_ms,
                data,
                topic,
                ..
            } => {
                2 + var_len(epoch)
                    + var_len(seq)
                    + var_len(expires_unix_ms)
                    + var_len(topic.len() as u64)
                    + data.len()
            }
            Entry::Forget { topic, .. } => 2 + 16 + 2 + topic.len(),
            Entry::WebhookAdd { topic, url } | Entry::WebhookRemove { topic, url } => {
                1 + 2 + topic.len() + 2 + url.len()
            }
            Entry::ClientSub {
                topic,
                client,
                project,
                received,
                ..
            } => 1 + 6 + topic.len() + client.len() + project.len() + 24 + 1 + received.len(),
            Entry::ClientEnd { topic, client } => 1 + 4 + topic.len() + client.len(),
        }
    }

    /// Appends the encoding to `out`. On error `out` is left as it was.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EntryError> {
        let start = out.len();
        let r = self.encode_inner(out);
        if r.is_err() {
            out.truncate(start);
        }
        r
    }

    fn encode_inner(&self, out: &mut Vec<u8>) -> Result<(), EntryError> {
        match *self {
            Entry::Message {
                ns,
                topic,
                epoch,
                seq,
                expires_unix_ms,
                prompt,
                body,
                data,
            } => {
                let kind = if body { MESSAGE_BODY } else { MESSAGE };
                out.extend_from_slice(&[kind, ns as u8, u8::from(prompt)]);
                for v in [epoch, seq, expires_unix_ms] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                put_str16(out, topic, "topic")?;
                let n = u32::try_from(data.len()).map_err(|_| EntryError::TooLong("data"))?;
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(data);
            }
            Entry::Body {
                topic,
                epoch,
                seq,
                expires_unix_ms,
                prompt,
                data,
            } => {
                if !Entry::topic_in_body(topic, data) {
                    return Err(EntryError::TopicNotInBody);
                }
                // The head in a stack buffer, then two copies (not a `push` a varint byte,
                // each with its capacity check).
                let mut head = [0u8; 2 + 4 * 10];
                head[0] = BODY;
                head[1] = u8::from(prompt);
                let mut n = 2;
                for v in [epoch, seq, expires_unix_ms, topic.len() as u64] {
                    n += put_var_at(&mut head[n..], v);
                }
                out.extend_from_slice(&head[..n]);
                out.extend_from_slice(data);
            }
            Entry::Forget {
                ns,
                topic,
                epoch,
                seq,
            } => {
                out.extend_from_slice(&[FORGET, ns as u8]);
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(&seq.to_le_bytes());
                put_str16(out, topic, "topic")?;
            }
            Entry::WebhookAdd { topic, url } | Entry::WebhookRemove { topic, url } => {
                let kind = if matches!(self, Entry::WebhookAdd { .. }) {
                    WEBHOOK_ADD
                } else {
                    WEBHOOK_REMOVE
                };
                out.push(kind);
                put_str16(out, topic, "topic")?;
                put_str16(out, url, "url")?;
            }
            Entry::ClientSub {
                topic,
                client,
                project,
                epoch,
                seq,
                expires_unix_ms,
                received,
            } => {
                out.push(CLIENT_SUB);
                put_str16(out, topic, "topic")?;
                put_str16(out, client, "client")?;
                put_str16(out, project, "project")?;
                for v in [epoch, seq, expires_unix_ms] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                let n = received.len() / 8;
                if received.len() % 8 != 0 || n > 255 {
                    return Err(EntryError::TooLong("received"));
                }
                out.push(n as u8);
                out.extend_from_slice(received);
            }
            Entry::ClientEnd { topic, client } => {
                out.push(CLIENT_END);
                put_str16(out, topic, "topic")?;
                put_str16(out, client, "client")?;
            }
        }
        Ok(())
    }

    /// Decodes one entry that must fill `buf` exactly.
    pub fn decode(buf: &'a [u8]) -> Result<Entry<'a>, EntryError> {
        let mut r = Reader { buf };
        let e = match r.u8()? {
            kind @ (MESSAGE | MESSAGE_BODY) => {
                let ns = r.ns()?;
                let flags = r.u8()?;
                if flags & !1 != 0 {
                    return Err(EntryError::BadFlags(flags));
                }
                let (epoch, seq, expires_unix_ms) = (r.u64()?, r.u64()?, r.u64()?);
                let topic = r.str16("topic")?;
                let n = r.u32()? as usize;
                Entry::Message {
                    ns,
                    topic,
                    epoch,
                    seq,
                    expires_unix_ms,
                    prompt: flags & 1 != 0,
                    body: kind == MESSAGE_BODY,
                    data: utf8_data(r.take(n)?)?,
                }
            }
            BODY => {
                let flags = r.u8()?;
                if flags & !1 != 0 {
                    return Err(EntryError::BadFlags(flags));
                }
                let (epoch, seq, expires_unix_ms) = (r.var()?, r.var()?, r.var()?);
                let n = usize::try_from(r.var()?).map_err(|_| EntryError::TopicNotInBody)?;
                let data = utf8_data(r.take(r.buf.len())?)?;
                Entry::Body {
                    topic: topic_of_body(data, n)?,
                    epoch,
                    seq,
                    expires_unix_ms,
                    prompt: flags & 1 != 0,
                    data,
                }
            }
            FORGET => {
                let ns = r.ns()?;
                let (epoch, seq) = (r.u64()?, r.u64()?);
                Entry::Forget {
                    ns,
                    topic: r.str16("topic")?,
                    epoch,
                    seq,
                }
            }
            k @ (WEBHOOK_ADD | WEBHOOK_REMOVE) => {
                let topic = r.str16("topic")?;
                let url = r.str16("url")?;
                if k == WEBHOOK_ADD {
                    Entry::WebhookAdd { topic, url }
                } else {
                    Entry::WebhookRemove { topic, url }
                }
            }
            CLIENT_SUB => {
                let topic = r.str16("topic")?;
                let client = r.str16("client")?;
                let project = r.str16("project")?;
                let (epoch, seq, expires_unix_ms) = (r.u64()?, r.u64()?, r.u64()?);
                let n = usize::from(r.u8()?);
                Entry::ClientSub {
                    topic,
                    client,
                    project,
                    epoch,
                    seq,
                    expires_unix_ms,
                    received: r.take(n * 8)?,
                }
            }
            CLIENT_END => {
                let topic = r.str16("topic")?;
                let client = r.str16("client")?;
                Entry::ClientEnd { topic, client }
            }
            k => return Err(EntryError::UnknownKind(k)),
        };
        if !r.buf.is_empty() {
            return Err(EntryError::Trailing(r.buf.len()));
        }
        Ok(e)
    }
}

/// A message's stored bytes, which are UTF-8 text (JSON, or a v1 frame's JSON) whatever
/// the kind: anything else never came from this server, and replayed it would reach a
/// client as a text frame that is no text (closed 1007).
fn utf8_data(b: &[u8]) -> Result<&[u8], EntryError> {
    simdutf8::basic::from_utf8(b).map_err(|_| EntryError::NotUtf8("data"))?;
    Ok(b)
}

/// A cursor over the bytes still to decode.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EntryError> {
        if self.buf.len() < n {
            return Err(EntryError::Truncated);
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], EntryError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, EntryError> {
        Ok(self.array::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, EntryError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, EntryError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A varint in its shortest form.
    fn var(&mut self) -> Result<u64, EntryError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                return Err(EntryError::BadVarint);
            }
            v |= u64::from(b & 0x7F) << (7 * i);
            if b & 0x80 == 0 {
                if b == 0 && i > 0 {
                    return Err(EntryError::BadVarint);
                }
                return Ok(v);
            }
        }
        Err(EntryError::BadVarint)
    }
    fn ns(&mut self) -> Result<Ns, EntryError> {
        match self.u8()? {
            1 => Ok(Ns::V1),
            2 => Ok(Ns::V2),
            n => Err(EntryError::UnknownNs(n)),
        }
    }
    fn str16(&mut self, what: &'static str) -> Result<&'a str, EntryError> {
        let n = u16::from_le_bytes(self.array()?) as usize;
        let b = self.take(n)?;
        simdutf8::basic::from_utf8(b).map_err(|_| EntryError::NotUtf8(what))
    }
}

#[cfg(test)]
#[path = "entry_tests.rs"]
mod tests;
