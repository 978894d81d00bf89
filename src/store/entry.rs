//! The typed entries a worker writes to its log, and their compact binary encoding.
//!
//! ```text
//! Message        1 ns flags epoch:u64 seq:u64 expires_unix_ms:u64 topic:str16 data:bytes32
//! MessageBody    5 (as Message)
//! Forget         2 ns epoch:u64 seq:u64 topic:str16
//! WebhookAdd     3 topic:str16 url:str16
//! WebhookRemove  4 topic:str16 url:str16
//! ```
//! Integers are little-endian; `str16` is a u16 length then UTF-8 bytes, `bytes32` a u32
//! length then bytes; `flags` bit 0 is `prompt`, other bits must be zero.
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
}

const MESSAGE: u8 = 1;
const FORGET: u8 = 2;
const WEBHOOK_ADD: u8 = 3;
const WEBHOOK_REMOVE: u8 = 4;
const MESSAGE_BODY: u8 = 5;

fn put_str16(out: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), EntryError> {
    let n = u16::try_from(s.len()).map_err(|_| EntryError::TooLong(what))?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

impl<'a> Entry<'a> {
    /// The topic the entry is about.
    pub fn topic(&self) -> &'a str {
        match *self {
            Entry::Message { topic, .. }
            | Entry::Forget { topic, .. }
            | Entry::WebhookAdd { topic, .. }
            | Entry::WebhookRemove { topic, .. } => topic,
        }
    }

    /// Bytes of the encoding.
    pub fn encoded_len(&self) -> usize {
        match *self {
            Entry::Message { topic, data, .. } => 3 + 24 + 2 + topic.len() + 4 + data.len(),
            Entry::Forget { topic, .. } => 2 + 16 + 2 + topic.len(),
            Entry::WebhookAdd { topic, url } | Entry::WebhookRemove { topic, url } => {
                1 + 2 + topic.len() + 2 + url.len()
            }
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
                    data: r.take(n)?,
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
            k => return Err(EntryError::UnknownKind(k)),
        };
        if !r.buf.is_empty() {
            return Err(EntryError::Trailing(r.buf.len()));
        }
        Ok(e)
    }
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Entry<'static>> {
        vec![
            Entry::Message {
                ns: Ns::V2,
                topic: "7f3a",
                epoch: 3,
                seq: u64::MAX,
                expires_unix_ms: 1_800_000_000_000,
                prompt: true,
                body: true,
                data: b"{\"x\":1}",
            },
            Entry::Message {
                ns: Ns::V1,
                topic: "",
                epoch: 0,
                seq: 0,
                expires_unix_ms: 0,
                prompt: false,
                body: false,
                data: b"",
            },
            Entry::Forget {
                ns: Ns::V1,
                topic: "t\u{e9}",
                epoch: 1,
                seq: 2,
            },
            Entry::WebhookAdd {
                topic: "t",
                url: "https://example.com/hook",
            },
            Entry::WebhookRemove {
                topic: "t",
                url: "https://example.com/hook",
            },
        ]
    }

    #[test]
    fn every_kind_round_trips_and_every_prefix_is_truncated() {
        for e in samples() {
            let mut buf = Vec::new();
            e.encode(&mut buf).unwrap();
            assert_eq!(buf.len(), e.encoded_len());
            assert_eq!(Entry::decode(&buf), Ok(e));
            for cut in 0..buf.len() {
                assert!(Entry::decode(&buf[..cut]).is_err(), "{e:?} cut at {cut}");
            }
            buf.push(0);
            assert_eq!(Entry::decode(&buf), Err(EntryError::Trailing(1)));
        }
    }

    #[test]
    fn malformed_fields_have_typed_errors() {
        assert_eq!(Entry::decode(&[9]), Err(EntryError::UnknownKind(9)));
        assert_eq!(Entry::decode(&[2, 3]), Err(EntryError::UnknownNs(3)));
        assert_eq!(Entry::decode(&[1, 2, 2]), Err(EntryError::BadFlags(2)));
        assert_eq!(
            Entry::decode(&[3, 1, 0, 0xFF, 0, 0]),
            Err(EntryError::NotUtf8("topic"))
        );
        let long = "x".repeat(70_000);
        let mut out = vec![7];
        let e = Entry::WebhookAdd {
            topic: "t",
            url: &long,
        };
        assert_eq!(e.encode(&mut out), Err(EntryError::TooLong("url")));
        assert_eq!(out, vec![7], "a failed encode leaves the buffer as it was");
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            if let Ok(e) = Entry::decode(&bytes) {
                let mut again = Vec::new();
                e.encode(&mut again).unwrap();
                prop_assert_eq!(again, bytes);
            }
        }

        #[test]
        fn messages_round_trip(v1 in any::<bool>(), topic in ".{0,40}", epoch in any::<u64>(),
                               seq in any::<u64>(), exp in any::<u64>(), prompt in any::<bool>(), body in any::<bool>(),
                               data in proptest::collection::vec(any::<u8>(), 0..100)) {
            let e = Entry::Message { ns: if v1 { Ns::V1 } else { Ns::V2 }, topic: &topic, epoch,
                                     seq, expires_unix_ms: exp, prompt, body, data: &data };
            let mut buf = Vec::new();
            e.encode(&mut buf).unwrap();
            prop_assert_eq!(Entry::decode(&buf), Ok(e));
        }
    }
}
