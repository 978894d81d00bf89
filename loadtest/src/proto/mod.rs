//! The relay's JSON-RPC, the way the load generator speaks it: pre-encoded request frames,
//! the payload stamp, and a byte-search classifier for what the server sends.
//!
//! No JSON parser runs on the hot path. A publish frame is encoded and masked once per topic;
//! each send copies it and patches two fixed-width fields in place (the request id and the
//! stamp). Incoming messages are classified by searching for a few keys; the relay's own
//! output is compact JSON, and a little whitespace after a colon is tolerated.

use memchr::memmem::Finder;

use crate::ws::{self, MASK};

/// Request ids are this plus a counter, so every id has [`ID_DIGITS`] digits and can be
/// patched in place (JSON forbids leading zeros).
pub const ID_BASE: u64 = 1_000_000_000_000;
/// Digits of every request id we send.
pub const ID_DIGITS: usize = 13;
/// Hex characters of the stamp at the start of every message payload.
pub const STAMP_LEN: usize = 32;
/// The `tag` of every `irn_publish` (1108: a session request, the commonest in a session).
pub const IRN_TAG: u32 = 1108;
/// The ttl an `irn_publish` may carry, seconds (DECISIONS §10: 10 s to 30 days).
pub const IRN_TTL_S: std::ops::RangeInclusive<u64> = 10..=2_592_000;
/// Request ids in the SDK's shape are JSON strings of 19 digits (sign-client's
/// `getBigIntRpcId().toString()`); a publish's is this plus a counter.
pub const SDK_ID_BASE: u64 = 1_100_000_000_000_000_000;
/// Digits of every SDK-shaped request id.
pub const SDK_ID_DIGITS: usize = 19;
/// The id of the SDK-shaped `irn_batchSubscribe` every connection sends at connect.
pub const SDK_SUB_ID: u64 = 1_000_000_000_000_000_001;
/// The id of a scenario's own `*_subscribe` (one per connection).
pub const SUB_ID: u64 = 1;
/// The ttl of a session request and its response, seconds (sign-client 2.25.0: 900).
pub const SDK_TTL_S: u64 = 900;
/// What the SDK adds to the upgrade query after `auth` and `projectId` (utils
/// `formatRelayRpcUrl`; tests/e2e-sdk/WIRE.md).
pub const SDK_QUERY_TAIL: &str = "&ua=wc-2%2Fjs-2.25.0%2Flinux-20.20.2%2Fnode&useOnCloseEvent=true";

/// The JSON-RPC method family: `waku_*` (v2.0-beta) or `irn_*` (today's 2.x SDKs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rpc {
    /// `waku_subscribe`, `waku_publish`, pushes `waku_subscription`.
    #[default]
    Waku,
    /// `irn_subscribe`, `irn_publish` (with `"tag"`), pushes `irn_subscription`.
    Irn,
}

impl Rpc {
    /// The method prefix, without the underscore.
    pub fn prefix(self) -> &'static str {
        match self {
            Rpc::Waku => "waku",
            Rpc::Irn => "irn",
        }
    }

    /// The push method as it appears in JSON, quotes included.
    fn push_method(self) -> &'static [u8] {
        match self {
            Rpc::Waku => b"\"waku_subscription\"",
            Rpc::Irn => b"\"irn_subscription\"",
        }
    }
}

/// What a message carries so its receiver can compute latency and loss: the time it was
/// scheduled (ns since the run's epoch), who sent it, and that sender's sequence number.
/// Encoded as 32 lowercase hex characters: 16 + 8 + 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Scheduled send time, ns since the shared epoch.
    pub sched_ns: u64,
    /// Global index of the sending connection.
    pub sender: u32,
    /// The sender's message sequence number.
    pub seq: u32,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl Stamp {
    /// Write the 32 hex characters.
    pub fn encode(&self, out: &mut [u8; STAMP_LEN]) {
        put_hex(&mut out[0..16], self.sched_ns);
        put_hex(&mut out[16..24], self.sender as u64);
        put_hex(&mut out[24..32], self.seq as u64);
    }

    /// Read a stamp from the first 32 bytes of `b`; `None` if they are not lowercase hex.
    pub fn decode(b: &[u8]) -> Option<Stamp> {
        if b.len() < STAMP_LEN {
            return None;
        }
        Some(Stamp {
            sched_ns: get_hex(&b[0..16])?,
            sender: get_hex(&b[16..24])? as u32,
            seq: get_hex(&b[24..32])? as u32,
        })
    }
}

/// `size` lowercase hex characters that look random (the same for every run): real clients
/// publish encrypted payloads, 4 bits of entropy per character, so permessage-deflate shrinks
/// them to about half and no further. (A repeated pattern would compress to almost nothing.)
pub fn filler(size: usize) -> Vec<u8> {
    (0..size as u64)
        .map(|i| {
            // splitmix64 of the index.
            let mut z = i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            HEX[((z ^ (z >> 31)) >> 60) as usize]
        })
        .collect()
}

fn put_hex(out: &mut [u8], mut v: u64) {
    for b in out.iter_mut().rev() {
        *b = HEX[(v & 0xf) as usize];
        v >>= 4;
    }
}

fn get_hex(b: &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for &c in b {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | d as u64;
    }
    Some(v)
}

/// A topic name: 64 lowercase hex characters, like the 32-byte topics real clients use,
/// derived from a per-run nonce so runs never see each other's cached messages.
pub fn topic(nonce: u64, a: u64, b: u64) -> String {
    let mut t = [0u8; 64];
    put_hex(&mut t[0..16], nonce);
    put_hex(&mut t[16..32], a);
    put_hex(&mut t[32..48], b);
    put_hex(
        &mut t[48..64],
        nonce ^ a.rotate_left(17) ^ b.rotate_left(41),
    );
    String::from_utf8_lossy(&t).into_owned()
}

/// A masked publish frame for one topic (a `waku_publish`, or a WalletConnect 1.0 `pub`),
/// encoded once and patched per send.
#[derive(Debug, Clone)]
pub struct PublishTemplate {
    frame: Vec<u8>,
    /// Offset of the payload inside `frame`: the mask phase of any payload byte.
    payload_at: usize,
    /// Offset in `frame` of the fixed-width id (a v1 `pub` has none).
    id_at: Option<usize>,
    /// The id written is `id_base + n` in `id_digits` digits (13, or the SDK's 19).
    id_base: u64,
    id_digits: usize,
    /// Offset in `frame` of the stamp (start of the message string).
    stamp_at: usize,
}

impl PublishTemplate {
    /// A `waku_publish`, or an `irn_publish` with `"tag":`[`IRN_TAG`]; `size` is the
    /// message length in hex characters (at least [`STAMP_LEN`]).
    pub fn new(rpc: Rpc, topic: &str, size: usize, ttl: u64) -> Self {
        let size = size.max(STAMP_LEN);
        let p = rpc.prefix();
        let head = format!(
            "{{\"id\":{ID_BASE},\"jsonrpc\":\"2.0\",\"method\":\"{p}_publish\",\"params\":{{\"topic\":\"{topic}\",\"message\":\""
        );
        let tail = match rpc {
            Rpc::Waku => format!("\",\"ttl\":{ttl}}}}}"),
            Rpc::Irn => format!("\",\"ttl\":{ttl},\"tag\":{IRN_TAG}}}}}"),
        };
        Self::build(&head, size, &tail, Some("{\"id\":".len()))
    }

    /// An `irn_publish` as sign-client 2.25.0 writes a session request (`answer` false: tag
    /// 1108, `prompt` true) or the wallet's response to it (tag 1109, `prompt` false, the
    /// result in `txHashes`): a 19-digit string id, then `topic`, `message`, `ttl`,
    /// `prompt`, `tag` and the request's `correlationId`, `rpcMethods`, `chainId`,
    /// `txHashes`, `contractAddresses` (tests/e2e-sdk/WIRE.md).
    pub fn new_sdk(topic: &str, size: usize, ttl: u64, answer: bool) -> Self {
        let head = format!(
            "{{\"id\":\"{SDK_ID_BASE}\",\"jsonrpc\":\"2.0\",\"method\":\"irn_publish\",\"params\":{{\"topic\":\"{topic}\",\"message\":\""
        );
        let (prompt, tag, hashes) = match answer {
            false => ("true", 1108, String::new()),
            true => ("false", 1109, format!("\"0x{}\"", "ab".repeat(65))),
        };
        let tail = format!(
            "\",\"ttl\":{ttl},\"prompt\":{prompt},\"tag\":{tag},\"correlationId\":1795638982221335,\"rpcMethods\":[\"personal_sign\"],\"chainId\":\"eip155:1\",\"txHashes\":[{hashes}],\"contractAddresses\":[]}}}}"
        );
        let mut t = Self::build(&head, size.max(STAMP_LEN), &tail, Some("{\"id\":\"".len()));
        t.id_base = SDK_ID_BASE;
        t.id_digits = SDK_ID_DIGITS;
        t
    }

    /// A WalletConnect 1.0 `pub` of `size` hex characters, as the 1.0 client writes it:
    /// `{"topic":..,"type":"pub","payload":..,"silent":true}` (silent: no webhook lookups).
    pub fn new_v1(topic: &str, size: usize) -> Self {
        let head = format!("{{\"topic\":\"{topic}\",\"type\":\"pub\",\"payload\":\"");
        Self::build(&head, size.max(STAMP_LEN), "\",\"silent\":true}", None)
    }

    fn build(head: &str, size: usize, tail: &str, id_in_json: Option<usize>) -> Self {
        let mut json = head.as_bytes().to_vec();
        let stamp_in_json = json.len();
        json.extend_from_slice(&filler(size));
        json.extend_from_slice(tail.as_bytes());
        let mut frame = Vec::with_capacity(json.len() + 14);
        ws::encode_client(&mut frame, ws::op::TEXT, &json);
        let payload_at = ws::client_head_len(json.len());
        PublishTemplate {
            frame,
            payload_at,
            id_at: id_in_json.map(|i| payload_at + i),
            id_base: ID_BASE,
            id_digits: ID_DIGITS,
            stamp_at: payload_at + stamp_in_json,
        }
    }

    /// Bytes one publish puts on the wire.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.frame.len()
    }

    /// Append one publish with request id `ID_BASE + n` (`SDK_ID_BASE + n` in the SDK's
    /// shape) and `stamp`.
    pub fn write(&self, out: &mut Vec<u8>, n: u64, stamp: &Stamp) {
        let at = out.len();
        out.extend_from_slice(&self.frame);
        if let Some(id_at) = self.id_at {
            let mut id = [0u8; SDK_ID_DIGITS];
            let id = &mut id[..self.id_digits];
            let mut v = self.id_base + n;
            for b in id.iter_mut().rev() {
                *b = b'0' + (v % 10) as u8;
                v /= 10;
            }
            let id_slot = &mut out[at + id_at..at + id_at + self.id_digits];
            id_slot.copy_from_slice(id);
            ws::apply_mask(id_slot, MASK, id_at - self.payload_at);
        }
        let mut s = [0u8; STAMP_LEN];
        stamp.encode(&mut s);
        let stamp_slot = &mut out[at + self.stamp_at..at + self.stamp_at + STAMP_LEN];
        stamp_slot.copy_from_slice(&s);
        ws::apply_mask(stamp_slot, MASK, self.stamp_at - self.payload_at);
    }
}

/// Append a masked `waku_subscribe` or `irn_subscribe` frame.
pub fn write_subscribe(out: &mut Vec<u8>, rpc: Rpc, id: u64, topic: &str) {
    let p = rpc.prefix();
    let json = format!(
        "{{\"id\":{id},\"jsonrpc\":\"2.0\",\"method\":\"{p}_subscribe\",\"params\":{{\"topic\":\"{topic}\"}}}}"
    );
    ws::encode_client(out, ws::op::TEXT, json.as_bytes());
}

/// Append a masked `waku_batchSubscribe` or `irn_batchSubscribe` of `topics` (1 to 500).
pub fn write_batch_subscribe(out: &mut Vec<u8>, rpc: Rpc, id: u64, topics: &[String]) {
    write_batch(out, rpc, "batchSubscribe", &id.to_string(), topics);
}

/// Append a masked `irn_batchSubscribe` of `topics` as the SDK writes it: the id a JSON
/// string of 19 digits ([`SDK_SUB_ID`]).
pub fn write_sdk_batch_subscribe(out: &mut Vec<u8>, topics: &[String]) {
    let id = format!("\"{SDK_SUB_ID}\"");
    write_batch(out, Rpc::Irn, "batchSubscribe", &id, topics);
}

/// The id a connection's subscribe goes with, the result it is answered with and the base
/// of its publishes' ids: `*_subscribe` answers a subscription id (a string); the SDK's
/// `irn_batchSubscribe` answers an array of them, and its ids are 19 digits.
pub fn subscribe_reply(sdk: bool) -> (u64, ResultValue, u64) {
    match sdk {
        true => (SDK_SUB_ID, ResultValue::Array, SDK_ID_BASE),
        false => (SUB_ID, ResultValue::Str, ID_BASE),
    }
}

/// Append a masked `waku_batchFetchMessages` or `irn_batchFetchMessages` of `topics` (1 to
/// 500).
pub fn write_batch_fetch(out: &mut Vec<u8>, rpc: Rpc, id: u64, topics: &[String]) {
    write_batch(out, rpc, "batchFetchMessages", &id.to_string(), topics);
}

/// `id` is the id's JSON text (a number, or a quoted string).
fn write_batch(out: &mut Vec<u8>, rpc: Rpc, method: &str, id: &str, topics: &[String]) {
    let p = rpc.prefix();
    let mut json = format!(
        "{{\"id\":{id},\"jsonrpc\":\"2.0\",\"method\":\"{p}_{method}\",\"params\":{{\"topics\":["
    );
    for (i, t) in topics.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push('"');
        json.push_str(t);
        json.push('"');
    }
    json.push_str("]}}");
    ws::encode_client(out, ws::op::TEXT, json.as_bytes());
}

/// The JSON-RPC error code of a refusal by the server's limits (DECISIONS §11).
pub const RATE_LIMITED: i64 = -32000;

/// If `msg` is an error response `-32000` carrying `data.retryAfterMs` (a refusal by the
/// server's limits per client, DECISIONS §11), the wait it asks for, in ms. Any other
/// message (a result, a push, another error, a -32000 without `retryAfterMs`) is `None`.
pub fn rate_limited(msg: &[u8]) -> Option<u64> {
    let err = memchr::memmem::find(msg, b"\"error\"")?;
    let tail = &msg[err..];
    let c = memchr::memmem::find(tail, b"\"code\"")?;
    if parse_int(after_colon(tail, c + b"\"code\"".len())?)? != RATE_LIMITED {
        return None;
    }
    let r = memchr::memmem::find(tail, b"\"retryAfterMs\"")?;
    let v = after_colon(tail, r + b"\"retryAfterMs\"".len())?;
    let n = parse_int(v)?;
    u64::try_from(n).ok()
}

/// Append a masked WalletConnect 1.0 `sub` (as the 1.0 client writes it) and a ping: the
/// server answers nothing to a `sub`, and its pong says the `sub` was processed.
pub fn write_v1_sub(out: &mut Vec<u8>, topic: &str) {
    let json =
        format!("{{\"topic\":\"{topic}\",\"type\":\"sub\",\"payload\":\"\",\"silent\":true}}");
    ws::encode_client(out, ws::op::TEXT, json.as_bytes());
    ws::encode_client(out, ws::op::PING, b"sub");
}

/// Append a masked acknowledgement of a server request whose id is the JSON number `id`.
pub fn write_ack(out: &mut Vec<u8>, id: &[u8]) {
    let mut json = [0u8; 96];
    let pre = b"{\"id\":";
    let post = b",\"jsonrpc\":\"2.0\",\"result\":true}";
    if id.len() > json.len() - pre.len() - post.len() {
        return;
    }
    let mut n = 0;
    for part in [&pre[..], id, &post[..]] {
        json[n..n + part.len()].copy_from_slice(part);
        n += part.len();
    }
    ws::encode_client(out, ws::op::TEXT, &json[..n]);
}

/// What a `result` carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultValue {
    /// `true` (publish, unsubscribe).
    True,
    /// A string (subscribe: the subscription id).
    Str,
    /// An array (batch subscribe: the subscription ids).
    Array,
    /// Anything else.
    Other,
}

/// A server message, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incoming<'a> {
    /// A `waku_subscription` (or `irn_subscription`) push, or a WalletConnect 1.0 `pub` frame
    /// (no `rpc_id`).
    Delivery {
        /// The JSON-RPC id digits, to acknowledge it.
        rpc_id: Option<&'a [u8]>,
        /// Our stamp, if the message starts with one.
        stamp: Option<Stamp>,
    },
    /// A response to one of our requests.
    Result {
        /// Our request id (numeric ids only).
        id: Option<u64>,
        /// What the result was.
        value: ResultValue,
    },
    /// An error response.
    Error {
        /// Our request id, if any.
        id: Option<u64>,
        /// The JSON-RPC error code.
        code: Option<i64>,
    },
    /// Anything else (a batch, an unknown method, garbage).
    Other,
}

/// Precompiled searchers for [`Incoming`]; build one per event loop.
pub struct Classifier {
    method: Finder<'static>,
    message: Finder<'static>,
    result: Finder<'static>,
    error: Finder<'static>,
    code: Finder<'static>,
    id: Finder<'static>,
    payload: Finder<'static>,
}

impl Default for Classifier {
    fn default() -> Self {
        Self::new(Rpc::Waku)
    }
}

impl Classifier {
    /// Build the searchers; pushes are recognised by `rpc`'s method only (a push of the
    /// other family is [`Incoming::Other`]). The `"message"` of a push is the first key of
    /// that name, which is `data.message`; members after it (irn's `publishedAt`, `tag`)
    /// are not looked at.
    pub fn new(rpc: Rpc) -> Self {
        Classifier {
            method: Finder::new(rpc.push_method()),
            message: Finder::new(b"\"message\""),
            result: Finder::new(b"\"result\""),
            error: Finder::new(b"\"error\""),
            code: Finder::new(b"\"code\""),
            id: Finder::new(b"\"id\""),
            payload: Finder::new(b"\"payload\""),
        }
    }

    /// Classify one text message from the server.
    pub fn classify<'a>(&self, msg: &'a [u8]) -> Incoming<'a> {
        if self.method.find(msg).is_some() {
            let stamp = self
                .message
                .find(msg)
                .and_then(|at| after_colon(msg, at + b"\"message\"".len()))
                .and_then(|v| v.strip_prefix(b"\""))
                .and_then(Stamp::decode);
            return Incoming::Delivery {
                rpc_id: self.numeric_id_digits(msg),
                stamp,
            };
        }
        if let Some(at) = self.error.find(msg) {
            let code = self
                .code
                .find(&msg[at..])
                .and_then(|c| after_colon(msg, at + c + b"\"code\"".len()))
                .and_then(parse_int);
            return Incoming::Error {
                id: self.numeric_id(msg),
                code,
            };
        }
        // A WalletConnect 1.0 frame: `{"topic":..,"type":"pub","payload":..,"silent":..}`.
        if let Some(at) = self.payload.find(msg) {
            let stamp = after_colon(msg, at + b"\"payload\"".len())
                .and_then(|v| v.strip_prefix(b"\""))
                .and_then(Stamp::decode);
            return Incoming::Delivery {
                rpc_id: None,
                stamp,
            };
        }
        if let Some(at) = self.result.find(msg) {
            let value = match after_colon(msg, at + b"\"result\"".len()) {
                Some(v) if v.starts_with(b"true") => ResultValue::True,
                Some(v) if v.starts_with(b"\"") => ResultValue::Str,
                Some(v) if v.starts_with(b"[") => ResultValue::Array,
                _ => ResultValue::Other,
            };
            return Incoming::Result {
                id: self.numeric_id(msg),
                value,
            };
        }
        Incoming::Other
    }

    fn numeric_id_digits<'a>(&self, msg: &'a [u8]) -> Option<&'a [u8]> {
        for at in self.id.find_iter(msg) {
            if let Some(v) = after_colon(msg, at + b"\"id\"".len()) {
                let n = v.iter().take_while(|c| c.is_ascii_digit()).count();
                if n > 0 {
                    return Some(&v[..n]);
                }
            }
        }
        None
    }

    /// The request id as a number: a JSON number, or a string of digits only (the SDK's
    /// 19-digit ids; a hex subscription id such as `"6116b8.."` is not one).
    fn numeric_id(&self, msg: &[u8]) -> Option<u64> {
        let digits = self.numeric_id_digits(msg).or_else(|| {
            self.id.find_iter(msg).find_map(|at| {
                let v = after_colon(msg, at + b"\"id\"".len())?.strip_prefix(b"\"")?;
                let n = v.iter().take_while(|c| c.is_ascii_digit()).count();
                (n > 0 && v.get(n) == Some(&b'"')).then_some(&v[..n])
            })
        });
        digits.and_then(|d| {
            d.iter().try_fold(0u64, |acc, &c| {
                acc.checked_mul(10)?.checked_add((c - b'0') as u64)
            })
        })
    }
}

/// The bytes after `"key"` + optional spaces + `:` + optional spaces.
fn after_colon(msg: &[u8], mut at: usize) -> Option<&[u8]> {
    while msg.get(at).is_some_and(|c| c.is_ascii_whitespace()) {
        at += 1;
    }
    if msg.get(at) != Some(&b':') {
        return None;
    }
    at += 1;
    while msg.get(at).is_some_and(|c| c.is_ascii_whitespace()) {
        at += 1;
    }
    msg.get(at..)
}

fn parse_int(v: &[u8]) -> Option<i64> {
    let (neg, digits) = match v.first() {
        Some(b'-') => (true, &v[1..]),
        _ => (false, v),
    };
    let n = digits.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 || n > 18 {
        return None;
    }
    let mut x: i64 = 0;
    for &c in &digits[..n] {
        x = x * 10 + (c - b'0') as i64;
    }
    Some(if neg { -x } else { x })
}

#[cfg(test)]
mod tests;
