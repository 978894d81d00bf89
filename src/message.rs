//! A stored relay message as every engine, the cluster and the connections carry it: its
//! [`Position`] on its topic, who published it ([`Origin`]) and its content ([`Body`]).
//!
//! A leaf: it imports nothing of the relay, so `relay/` (the engines, the feed) and
//! `engine/redis/cluster/` (Redis) share it without importing each other.
//!
//! The content is encoded once, when the relay accepts the publish, as the JSON object the
//! `irn_subscription` push carries and a fetch answers (DECISIONS §10):
//!
//! ```text
//! {"topic":T,"message":M,"publishedAt":P,"tag":G}                     (no attestation)
//! {"topic":T,"message":M,"publishedAt":P,"tag":G,"attestation":A}     (with one)
//! ```
//!
//! The beta push (`waku_subscription`, DECISIONS §3) carries `{"topic":T,"message":M}`: the
//! same bytes up to the end of `M`, closed by `}`. A [`Body`] keeps where that part ends, so
//! both shapes are sent from one buffer, shared by reference, without encoding anything per
//! subscriber; dedup compares that part only (the same message published twice is a
//! duplicate whatever its time or tag).

use std::cell::Cell;

use crate::arcbuf::{ArcBuf, Writer};

/// A place in a topic's history. `seq` counts the topic's stored messages from 1; `epoch`
/// names the history the count belongs to and changes (grows) whenever that history is lost
/// (the topic was forgotten, a store lost it), so positions of different epochs are never
/// compared as if they were one sequence. Ordered by epoch, then seq.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The history (see [`new_epoch`]).
    pub epoch: u64,
    /// The message's number in that history (1 for the first).
    pub seq: u64,
}

impl Position {
    /// Before anything: every message comes after it.
    pub const ZERO: Position = Position { epoch: 0, seq: 0 };

    /// Whether `next` directly follows `self` in the same history.
    pub fn is_followed_by(self, next: Position) -> bool {
        self.epoch == next.epoch && self.seq + 1 == next.seq
    }
}

/// A fresh epoch: microseconds of wall-clock time, made strictly increasing within the
/// process, so a history started later has a larger epoch than one started earlier (also
/// across restarts, as long as the clock does not go back by more than the downtime).
pub fn new_epoch() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = crate::clock::unix_ms().saturating_mul(1000);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// Who published a message: the process (`node`, random per process start, so ids of a
/// previous run or another node never match) and the connection (`conn`, see
/// [`Origin::conn_id`]). A subscription is never sent a message its own connection
/// published. [`Origin::NONE`] matches no connection (messages recovered from disk).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The publishing process.
    pub node: u64,
    /// The publishing connection within it.
    pub conn: u64,
}

impl Origin {
    /// Nobody: a message whose publisher is unknown.
    pub const NONE: Origin = Origin { node: 0, conn: 0 };

    /// 16 bytes, big-endian node then connection (as the Redis engine stores and publishes
    /// it).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.node.to_be_bytes());
        b[8..].copy_from_slice(&self.conn.to_be_bytes());
        b
    }

    /// The inverse of [`Origin::to_bytes`]; `None` unless exactly 16 bytes.
    pub fn from_bytes(b: &[u8]) -> Option<Origin> {
        let b: &[u8; 16] = b.try_into().ok()?;
        let (n, c) = b.split_at(8);
        Some(Origin {
            node: u64::from_be_bytes(n.try_into().ok()?),
            conn: u64::from_be_bytes(c.try_into().ok()?),
        })
    }

    /// The id of connection `uid` of worker `worker`, unique within the process.
    pub fn conn_id(worker: u16, uid: u64) -> u64 {
        (u64::from(worker) << 48) | (uid & ((1 << 48) - 1))
    }
}

/// The members a publish adds to its topic and message (DECISIONS §10).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Meta<'a> {
    /// The relay's wall clock when it accepted the publish, ms since the Unix epoch.
    pub published_at: u64,
    /// The publish's `tag` (0 when it had none).
    pub tag: u32,
    /// The publish's `attestation`, when it had one.
    pub attestation: Option<&'a str>,
    /// The topic and the message hold no byte JSON escapes (the decoder knew: `rpc::Plain`);
    /// `false` when not known, and they are looked at.
    pub plain: bool,
}

/// What separates the beta part of a body from the members the `irn` shape adds.
const TAIL_START: &[u8] = b",\"publishedAt\":";

/// The most bytes a body adds to its topic and message when neither needs escaping:
/// `{"topic":""` (11), `,"message":""` (13), [`TAIL_START`] (15) and a `u64` (20),
/// `,"tag":` (7) and a `u32` (10), `}` (1). Sized so that the buffer never grows while the
/// body is written (growing copied the whole body once more).
const FRAMING: usize = 11 + 13 + TAIL_START.len() + 20 + 7 + 10 + 1;

/// What an attestation adds besides its own bytes: `,"attestation":""`.
const ATTESTATION_FRAMING: usize = 17;

/// The buffer the next body is written into, allocated and brought into the cache while
/// the worker does other work (its decode, its store, its delivery), not while the body is
/// written. At saturation an allocation's memory is cold (the cache's evicted bodies are
/// what it reuses), and writing a body into cold memory waits for each of its lines in
/// turn; asked for ahead, those misses overlap other work.
///
/// One per thread, for bodies up to [`next_buf::MAX`]; sized for the last body, taken when
/// the next one fits it closely (within an eighth), so a body never holds much more than
/// the allocator would have given it.
mod next_buf {
    use std::cell::RefCell;
    use std::mem::MaybeUninit;
    use std::sync::Arc;

    /// Bodies larger than this get a buffer of their own at once (no per-thread buffer
    /// that large is kept, nor brought into the cache ahead).
    pub(super) const MAX: usize = 4096;

    type Buf = Arc<[MaybeUninit<u8>]>;

    thread_local! {
        static NEXT: RefCell<Option<Buf>> = const { RefCell::new(None) };
        /// The last evicted body's allocation, for the next [`prepare`] (see [`recycle`]).
        static SPARE: RefCell<Option<Buf>> = const { RefCell::new(None) };
    }

    /// Whether a buffer of `cap` bytes may hold a body of `need` bytes: it is large enough
    /// and not larger by more than an eighth.
    fn fits(cap: usize, need: usize) -> bool {
        cap >= need && cap - need <= need / 8
    }

    /// A buffer for a body of at most `need` bytes and its capacity: the prepared one if
    /// it fits closely, else `None` and `need` (a fresh one).
    pub(super) fn take(need: usize) -> (Option<Buf>, usize) {
        if need <= MAX {
            let ready = NEXT.with(|n| {
                let mut n = n.borrow_mut();
                n.as_ref()
                    .is_some_and(|b| fits(b.len(), need))
                    .then(|| n.take())
                    .flatten()
            });
            if let Some(b) = ready {
                let cap = b.len();
                return (Some(b), cap);
            }
        }
        (None, need)
    }

    /// Prepares the next body's buffer, sized like this one's (`need`), unless one that
    /// size is ready: the last evicted body's allocation when it fits, else a fresh one.
    pub(super) fn prepare(need: usize) {
        if need > MAX {
            return;
        }
        NEXT.with(|n| {
            let mut n = n.borrow_mut();
            if n.as_ref().is_none_or(|b| b.len() != need) {
                let spare = SPARE
                    .with(|s| s.borrow_mut().take())
                    .filter(|b| fits(b.len(), need));
                let b: Buf = spare.unwrap_or_else(|| Arc::new_uninit_slice(need));
                // Its bytes (the counts before them share their first line).
                crate::prefetch::range(Arc::as_ptr(&b).cast(), need);
                *n = Some(b);
            }
        });
    }

    /// Keeps the allocation of an evicted message, when nothing else holds it and it is not
    /// larger than [`MAX`], for the next body of about its size: at saturation every
    /// publish evicts one, and taking its buffer back spares the allocator a free and an
    /// allocation, each of which touches the evicted body's page's bookkeeping, cold by
    /// then. One is kept per thread; an earlier one is freed.
    pub fn recycle(data: crate::arcbuf::ArcBuf) {
        if data.capacity() > MAX {
            return;
        }
        if let Some(b) = data.into_spare() {
            SPARE.with(|s| *s.borrow_mut() = Some(b));
        }
    }
}

/// An evicted message's bytes given back for the next body this thread encodes: the same
/// as dropping them, only cheaper.
pub use next_buf::recycle;

/// A message's content, encoded once (see the module documentation).
#[derive(Debug, Clone)]
pub struct Body {
    /// The `irn` object, closed.
    json: ArcBuf,
    /// Bytes of `json` before [`TAIL_START`]: the beta object without its closing `}`.
    beta_len: u32,
    /// When its publish arrived on this server (`clock::stamp`; 0: read back from a store),
    /// for the latency histograms (`metrics::latency`). Not part of the content: equality
    /// ignores it. It fills what was padding: a body is no larger for it.
    arrived: u32,
}

impl PartialEq for Body {
    fn eq(&self, other: &Body) -> bool {
        self.json == other.json && self.beta_len == other.beta_len
    }
}

impl Eq for Body {}

impl Body {
    /// Encodes a publish's content, in place, into the buffer that holds it from then on.
    /// Inlined into its one hot caller: a body returned through memory is written in pieces
    /// and read back whole, a store-forwarding stall on every publish.
    #[inline(always)]
    pub fn encode(topic: &str, message: &str, meta: Meta<'_>) -> Body {
        let extra = meta
            .attestation
            .map_or(0, |a| a.len() + ATTESTATION_FRAMING);
        let need = topic.len() + message.len() + extra + FRAMING;
        let (ready, cap) = next_buf::take(need);
        let mut beta_len = 0;
        let built = ArcBuf::build(ready, cap, |w| {
            beta_len = Self::write(w, topic, message, meta)
        });
        next_buf::prepare(need);
        match built {
            Some(json) => Body {
                json,
                beta_len,
                arrived: 0,
            },
            // Escapes made it longer than `need`: written again where it may grow.
            None => {
                let mut v = Vec::with_capacity(need * 2);
                let beta_len = Self::write(&mut v, topic, message, meta);
                Body {
                    json: ArcBuf::from(v),
                    beta_len,
                    arrived: 0,
                }
            }
        }
    }

    /// Writes the whole object; returns the length of its beta part (see [`Body::beta`]).
    fn write(v: &mut impl Out, topic: &str, message: &str, meta: Meta<'_>) -> u32 {
        v.put(b"{\"topic\":");
        v.put_str(topic, meta.plain);
        v.put(b",\"message\":");
        v.put_str(message, meta.plain);
        let beta_len = v.len() as u32;
        Self::close(v, meta);
        beta_len
    }

    /// Appends the `irn` members and the closing brace.
    fn close(v: &mut impl Out, meta: Meta<'_>) {
        v.put(TAIL_START);
        put_ms(v, meta.published_at);
        v.put(b",\"tag\":");
        v.put(itoa::Buffer::new().format(meta.tag).as_bytes());
        if let Some(a) = meta.attestation {
            v.put(b",\"attestation\":");
            v.put_str(a, meta.plain);
        }
        v.put(b"}");
    }

    /// A body as stored (by this build): `None` when `json` is not of the `irn` shape
    /// (no `,"publishedAt":` member, which no JSON string can contain unescaped; looked
    /// for from the end, where it is).
    pub fn from_stored(json: ArcBuf) -> Option<Body> {
        let at = memchr::memmem::rfind(&json, TAIL_START).filter(|&at| at > 0)?;
        let beta_len = u32::try_from(at).ok()?;
        if json.last() != Some(&b'}') {
            return None;
        }
        Some(Body {
            json,
            beta_len,
            arrived: 0,
        })
    }

    /// A body stored by a build before `irn` (`{"topic":T,"message":M}`), given the
    /// members it lacks; `None` when `beta` is not a closed object.
    pub fn from_beta(beta: &[u8], meta: Meta<'_>) -> Option<Body> {
        let open = beta.strip_suffix(b"}")?;
        let mut v = Vec::with_capacity(beta.len() + 48);
        v.extend_from_slice(open);
        let beta_len = u32::try_from(v.len()).ok()?;
        Self::close(&mut v, meta);
        Some(Body {
            json: ArcBuf::from(v),
            beta_len,
            arrived: 0,
        })
    }

    /// A body from its two parts as [`Body::beta_len`] and [`Body::irn`] gave them (a cache
    /// keeps them apart); `None` when `beta_len` does not fit in `json`.
    pub fn from_parts(json: ArcBuf, beta_len: u32) -> Option<Body> {
        (beta_len > 0 && (beta_len as usize) < json.len()).then_some(Body {
            json,
            beta_len,
            arrived: 0,
        })
    }

    /// The body stamped with its publish's arrival (`clock::stamp`).
    #[inline]
    pub fn arrived_at(mut self, at: u32) -> Body {
        self.arrived = at;
        self
    }

    /// When its publish arrived (`clock::stamp`), 0 when not known.
    #[inline]
    pub fn arrived(&self) -> u32 {
        self.arrived
    }

    /// Whether `other` is this very body (the same bytes in the same buffer), not only an
    /// equal one.
    #[inline]
    pub fn same_bytes(&self, other: &Body) -> bool {
        self.json.same(&other.json)
    }

    /// See [`Body::beta`].
    pub fn beta_len(&self) -> u32 {
        self.beta_len
    }

    /// The whole `irn` object (`irn_subscription` data, a fetch answer's element).
    pub fn irn(&self) -> &ArcBuf {
        &self.json
    }

    /// The shared buffer and how many of its bytes the beta object takes before its closing
    /// `}` (the beta push sends `json[..n]` then `}`).
    pub fn beta(&self) -> (&ArcBuf, usize) {
        (&self.json, self.beta_len as usize)
    }

    /// Whether this body, encoded from `topic` and `message`, holds both strings as they are
    /// (no escape in either): its beta part is then `{"topic":"` (10), `topic`,
    /// `","message":"` (13), `message` and `"` (1), an escape only lengthening a string.
    pub fn is_verbatim(&self, topic: &str, message: &str) -> bool {
        self.beta_len as usize == topic.len() + message.len() + 24
    }

    /// `{"topic":T,"message":M` (what dedup compares; its hash is of `M` alone, see
    /// `engine::placement::Placement::content_hash`).
    pub fn beta_bytes(&self) -> &[u8] {
        self.json.get(..self.beta_len as usize).unwrap_or(&[])
    }

    /// Bytes held (what the cache budget counts).
    pub fn len(&self) -> usize {
        self.json.len()
    }

    /// Never true for an encoded body.
    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }

    /// The relay's accept time written in the body (`publishedAt`, ms), 0 if unreadable.
    pub fn published_at(&self) -> u64 {
        let from = self.beta_len as usize + TAIL_START.len();
        let digits = self.json.get(from..).unwrap_or(&[]);
        let mut ms: u64 = 0;
        for &d in digits.iter().take(20).take_while(|d| d.is_ascii_digit()) {
            ms = ms.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
        }
        ms
    }

    /// The `irn_subscription` id of this body stored at `seq` (`notice::message_id`): the
    /// same for every subscriber of the message.
    pub fn message_id(&self, seq: u64) -> u64 {
        crate::notice::message_id(self.published_at(), seq)
    }

    /// The message as written in the body (between its quotes; JSON escapes kept), its
    /// tag, and its attestation as written (escapes kept), for notices.
    pub fn parts(&self) -> (&str, u32, Option<&str>) {
        let beta = self.beta_bytes();
        let message = memchr::memmem::rfind(beta, b",\"message\":\"")
            .and_then(|at| beta.get(at + 12..beta.len().saturating_sub(1)))
            .and_then(|m| std::str::from_utf8(m).ok())
            .unwrap_or("");
        let tail = self.json.get(self.beta_len as usize..).unwrap_or(&[]);
        let tag = memchr::memmem::find(tail, b",\"tag\":")
            .and_then(|at| tail.get(at + 7..))
            .map_or(0, |d| {
                d.iter()
                    .take(10)
                    .take_while(|d| d.is_ascii_digit())
                    .fold(0u32, |n, &d| {
                        n.wrapping_mul(10).wrapping_add(u32::from(d - b'0'))
                    })
            });
        let attestation = memchr::memmem::find(tail, b",\"attestation\":\"")
            .and_then(|at| tail.get(at + 16..tail.len().saturating_sub(2)))
            .and_then(|a| std::str::from_utf8(a).ok());
        (message, tag, attestation)
    }

    /// This body in a buffer of its own (a big fan-out's worker copy, see `relay`).
    pub fn detached(&self) -> Body {
        Body {
            json: ArcBuf::copy_from_slice(&self.json),
            beta_len: self.beta_len,
            arrived: self.arrived,
        }
    }
}

/// The last time stamp this thread wrote, in decimal.
#[derive(Clone, Copy)]
struct Stamp {
    ms: u64,
    len: u8,
    digits: [u8; 20],
}

thread_local! {
    static STAMP: Cell<Stamp> = const { Cell::new(Stamp { ms: 0, len: 0, digits: [0; 20] }) };
}

/// Writes `ms` in decimal: formatted once per millisecond and thread, since a saturated
/// worker stamps hundreds of publishes with the same one (`clock::coarse`).
fn put_ms(v: &mut impl Out, ms: u64) {
    STAMP.with(|c| {
        let last = c.get();
        if last.len > 0 && last.ms == ms {
            if let Some(d) = last.digits.get(..usize::from(last.len)) {
                v.put(d);
                return;
            }
        }
        let mut b = itoa::Buffer::new();
        let d = b.format(ms).as_bytes();
        v.put(d);
        let mut digits = [0; 20];
        if let Some(to) = digits.get_mut(..d.len()) {
            to.copy_from_slice(d);
            let len = d.len() as u8;
            c.set(Stamp { ms, len, digits });
        }
    })
}

/// Where a body is written: in place ([`Writer`]), or a `Vec` that may grow.
trait Out {
    fn put(&mut self, b: &[u8]);

    /// `s` as a JSON string; `plain` when `s` is known to need no escape.
    fn put_str(&mut self, s: &str, plain: bool);

    /// Bytes written so far.
    fn len(&self) -> usize;
}

impl Out for Writer<'_> {
    fn put(&mut self, b: &[u8]) {
        self.extend(b);
    }

    /// As it is unless JSON needs it escaped (then through `json::write_str`).
    #[inline]
    fn put_str(&mut self, s: &str, plain: bool) {
        if !plain && crate::json::needs_escape(s.as_bytes()) {
            let mut v = Vec::with_capacity(s.len() + 8);
            crate::json::write_str(&mut v, s);
            self.extend(&v);
        } else {
            self.extend(b"\"");
            self.extend(s.as_bytes());
            self.extend(b"\"");
        }
    }

    fn len(&self) -> usize {
        Writer::len(self)
    }
}

impl Out for Vec<u8> {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }

    fn put_str(&mut self, s: &str, _plain: bool) {
        crate::json::write_str(self, s);
    }

    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// A stored message as the engines hand it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its place in the topic's history.
    pub pos: Position,
    /// Its content.
    pub body: Body,
    /// Its publisher.
    pub origin: Origin,
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
