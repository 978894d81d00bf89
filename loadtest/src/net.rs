//! The event loop every scenario runs on: one `mio::Poll`, connections in a `slab`, one shared
//! read buffer, and a [`Handler`] that a scenario implements.
//!
//! Owns sockets, connection phases (connect, upgrade, open, closing), WebSocket frame
//! assembly, control frames (ping -> pong, close handshake), HTTP/1.1 response framing, and the
//! one close path (mark dead during a batch, remove after it). It does not know what the
//! messages mean: scenarios get whole messages and decide.
//!
//! A `wss://`/`https://` connection also holds its `rustls` client state; its bytes go
//! through `tls::read`/`tls::write`, which are the socket's own calls without TLS.
//!
//! With `--permessage-deflate` every WebSocket upgrade offers it and must get it; scenarios
//! still queue plain frames, which [`Io`] compresses (one [`deflate::Codec`] per loop) just
//! before writing them, and RSV1 messages are inflated before the handler sees them. The
//! byte counters count WebSocket bytes (after TLS, before inflation).
//!
//! Memory: an idle connection owns no buffers. Reads go into one per-loop scratch buffer and
//! only the unparsed tail of a read is kept per connection; output buffers are released once
//! they drain past a size.

use std::io;
use std::mem;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::{deflate, sys, tls, ws};

/// A connection's slab key.
pub type Key = usize;

/// Bytes asked of each `read`.
const READ_CHUNK: usize = 64 * 1024;
/// Largest message we accept from the server (and largest frame).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Unsent bytes one connection may hold before [`Io::out`] refuses more.
pub const MAX_BACKLOG: usize = 64 * 1024 * 1024;
/// Output buffers larger than this are freed when they drain.
const KEEP_OUT_CAPACITY: usize = 64 * 1024;
/// Events handled between two calls of [`Handler::tick`] inside one poll batch.
const TICK_EVERY: usize = 128;
/// When the next wanted wake-up is nearer than this, poll without sleeping (epoll timeouts
/// are whole milliseconds, so sleeping would make sends up to a millisecond late).
const SPIN_BELOW: Duration = Duration::from_millis(2);

/// What the connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// WebSocket after an HTTP upgrade.
    Ws,
    /// Plain HTTP/1.1 keep-alive.
    Http,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    Upgrading,
    Open,
    /// We sent a close frame and wait for the server's.
    Closing,
    Dead,
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseWhy {
    /// The TCP connect failed.
    ConnectFailed(io::ErrorKind),
    /// The upgrade was refused or malformed.
    Upgrade(String),
    /// The server closed TCP without a close frame.
    Eof,
    /// A socket error.
    Io(io::ErrorKind),
    /// The server broke RFC 6455 or HTTP/1.1 framing.
    Protocol(String),
    /// The server sent a close frame first (its code, 1005 if none).
    ServerClose(u16),
    /// Our close handshake completed.
    Normal,
    /// We dropped it ([`Io::abort`]).
    Aborted,
}

impl CloseWhy {
    /// A short label for counting.
    pub fn label(&self) -> String {
        match self {
            CloseWhy::ConnectFailed(k) => format!("connect_failed:{k:?}"),
            CloseWhy::Upgrade(s) => format!("upgrade:{s}"),
            CloseWhy::Eof => "eof".into(),
            CloseWhy::Io(k) => format!("io:{k:?}"),
            CloseWhy::Protocol(s) => format!("protocol:{s}"),
            CloseWhy::ServerClose(c) => format!("server_close:{c}"),
            CloseWhy::Normal => "normal".into(),
            CloseWhy::Aborted => "aborted".into(),
        }
    }
}

/// One HTTP response, framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpResp {
    /// Status code.
    pub status: u16,
    /// Body bytes (as sent, possibly gzip).
    pub body_len: usize,
}

#[derive(Debug, Default)]
struct HttpState {
    /// Body bytes of the current response still to skip, with its status.
    body_left: Option<(u16, usize, usize)>,
}

struct Conn {
    stream: TcpStream,
    /// The TLS state of a `wss://`/`https://` connection.
    tls: Option<Box<tls::Session>>,
    /// The scenario's name for this connection.
    tag: u32,
    proto: Proto,
    phase: Phase,
    /// Unparsed bytes from the last read (a partial frame or head).
    pending: Vec<u8>,
    /// A fragmented message being assembled.
    frag: Vec<u8>,
    frag_active: bool,
    /// The message being assembled came with RSV1.
    frag_compressed: bool,
    /// permessage-deflate was agreed in the upgrade.
    deflate: bool,
    /// `out[plain_from..]`: frames queued by the scenario and not yet compressed.
    plain_from: usize,
    out: Vec<u8>,
    out_pos: usize,
    /// False after a write hit WouldBlock, until the next writable event.
    writable: bool,
    /// Already on the dirty list.
    dirty: bool,
    /// Close with a RST (SO_LINGER 0).
    rst: bool,
    http: HttpState,
}

/// Byte and frame counters of one loop.
#[derive(Debug, Default, Clone, Copy)]
pub struct IoStats {
    /// Bytes read (after TLS: upgrade answers and WebSocket frames as sent).
    pub bytes_in: u64,
    /// Bytes written (after compression, before TLS).
    pub bytes_out: u64,
    /// WebSocket text and binary messages received, and how many of them came compressed.
    pub messages_in: u64,
    /// See [`IoStats::messages_in`].
    pub compressed_in: u64,
    /// Messages sent compressed (RSV1), and sent plain because compressing did not shrink
    /// them (`--permessage-deflate` only).
    pub compressed_out: u64,
    /// See [`IoStats::compressed_out`].
    pub uncompressed_out: u64,
    /// Connections opened (connect started).
    pub connects: u64,
    /// Pings answered.
    pub pings: u64,
}

/// A scenario's side of the loop.
pub trait Handler {
    /// The connection is usable: upgraded (WebSocket) or connected (HTTP).
    fn on_open(&mut self, io: &mut Io, key: Key, tag: u32, now_ns: u64);
    /// One whole text or binary message (WebSocket).
    fn on_message(&mut self, io: &mut Io, key: Key, tag: u32, msg: &[u8], now_ns: u64);
    /// One whole HTTP response.
    fn on_http(&mut self, _io: &mut Io, _key: Key, _tag: u32, _resp: HttpResp, _now_ns: u64) {}
    /// A pong (WebSocket) came: the answer to a ping the scenario sent.
    fn on_pong(&mut self, _io: &mut Io, _key: Key, _tag: u32, _now_ns: u64) {}
    /// The connection is gone (its key may be reused after this returns).
    fn on_closed(&mut self, io: &mut Io, key: Key, tag: u32, why: &CloseWhy, now_ns: u64);
    /// Called every loop turn; returns when it next wants to run (ns since epoch).
    fn tick(&mut self, io: &mut Io, now_ns: u64) -> Option<u64>;
    /// True when this phase of the scenario has finished.
    fn done(&self) -> bool;
}

/// The sockets of one event loop and what they need.
pub struct Io {
    poll: Poll,
    conns: Slab<Conn>,
    dirty: Vec<Key>,
    dead: Vec<(Key, CloseWhy)>,
    scratch: Vec<u8>,
    target: SocketAddr,
    tls: Option<tls::Client>,
    /// Ciphertext read from TLS sockets before it is decrypted (allocated on first use).
    cipher: Vec<u8>,
    /// `--permessage-deflate`: the loop's compressor and inflater.
    codec: Option<Box<deflate::Codec>>,
    /// An inflated message, and plain frames being compressed (reused).
    inflated: Vec<u8>,
    recode: Vec<u8>,
    upgrade_req: Vec<u8>,
    source_ips: u32,
    /// Global index of this loop's next connection, for spreading source addresses.
    next_conn_index: usize,
    conn_index_step: usize,
    epoch: Instant,
    /// Counters.
    pub stats: IoStats,
}

impl Io {
    /// A loop for connections to `target`; `thread`/`threads` interleave source addresses.
    /// `deflate`: WebSocket connections offer (and require) permessage-deflate.
    pub fn new(
        target: &crate::cli::Target,
        tls: Option<tls::Client>,
        deflate: bool,
        source_ips: u32,
        epoch: Instant,
        thread: usize,
        threads: usize,
    ) -> io::Result<Io> {
        Ok(Io {
            poll: Poll::new()?,
            conns: Slab::new(),
            dirty: Vec::new(),
            dead: Vec::new(),
            scratch: vec![0; 4 * READ_CHUNK],
            target: target.addr,
            tls,
            cipher: Vec::new(),
            codec: deflate.then(Box::default),
            inflated: Vec::new(),
            recode: Vec::new(),
            upgrade_req: ws::upgrade_request(&target.host, &target.path, deflate),
            source_ips,
            next_conn_index: thread,
            conn_index_step: threads.max(1),
            epoch,
            stats: IoStats::default(),
        })
    }

    /// Nanoseconds since the shared epoch.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Start connecting; the handler hears `on_open` or `on_closed` later.
    pub fn connect(&mut self, tag: u32, proto: Proto) -> io::Result<Key> {
        let src = sys::source_ip(&self.target, self.source_ips, self.next_conn_index);
        self.next_conn_index += self.conn_index_step;
        let tls = match &self.tls {
            Some(client) => Some(Box::new(client.session()?)),
            None => None,
        };
        let std_stream = sys::connect(&self.target, src)?;
        let mut stream = TcpStream::from_std(std_stream);
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        self.poll.registry().register(
            &mut stream,
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        entry.insert(Conn {
            stream,
            tls,
            tag,
            proto,
            phase: Phase::Connecting,
            pending: Vec::new(),
            frag: Vec::new(),
            frag_active: false,
            frag_compressed: false,
            deflate: false,
            plain_from: 0,
            out: Vec::new(),
            out_pos: 0,
            writable: false,
            dirty: false,
            rst: false,
            http: HttpState::default(),
        });
        self.stats.connects += 1;
        Ok(key)
    }

    /// The output buffer of an open connection, to append frames to; `None` if the
    /// connection is gone or holds more than [`MAX_BACKLOG`] unsent bytes.
    pub fn out(&mut self, key: Key) -> Option<&mut Vec<u8>> {
        let c = self.conns.get_mut(key)?;
        if !matches!(c.phase, Phase::Open | Phase::Upgrading)
            || c.out.len() - c.out_pos > MAX_BACKLOG
        {
            return None;
        }
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(key);
        }
        Some(&mut c.out)
    }

    /// Start the close handshake (WebSocket) or close at once (HTTP).
    pub fn close(&mut self, key: Key, rst: bool) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        c.rst = rst;
        match (c.proto, c.phase) {
            (Proto::Ws, Phase::Open) => {
                ws::encode_close(&mut c.out, 1000);
                c.phase = Phase::Closing;
                if !c.dirty {
                    c.dirty = true;
                    self.dirty.push(key);
                }
            }
            (_, Phase::Closing) | (_, Phase::Dead) => {}
            _ => self.mark_dead(key, CloseWhy::Normal),
        }
    }

    /// Drop a connection now, without a close handshake.
    pub fn abort(&mut self, key: Key, rst: bool) {
        if let Some(c) = self.conns.get_mut(key) {
            c.rst = rst;
        }
        self.mark_dead(key, CloseWhy::Aborted);
    }

    fn mark_dead(&mut self, key: Key, why: CloseWhy) {
        if let Some(c) = self.conns.get_mut(key) {
            if c.phase != Phase::Dead {
                c.phase = Phase::Dead;
                self.dead.push((key, why));
            }
        }
    }

    /// Remove dead connections and tell the handler; repeats while handlers cause more.
    fn reap<H: Handler>(&mut self, h: &mut H) {
        while let Some((key, why)) = self.dead.pop() {
            if let Some(mut c) = self.conns.try_remove(key) {
                let _ = self.poll.registry().deregister(&mut c.stream);
                if c.rst {
                    sys::set_linger_zero(&c.stream);
                }
                drop(c.stream);
                let now = self.now_ns();
                h.on_closed(self, key, c.tag, &why, now);
            }
        }
    }

    /// Write what can be written on every connection with output.
    fn flush(&mut self) {
        let mut dirty = mem::take(&mut self.dirty);
        for key in dirty.drain(..) {
            let Some(c) = self.conns.get_mut(key) else {
                continue;
            };
            c.dirty = false;
            if c.phase == Phase::Dead || c.phase == Phase::Connecting || !c.writable {
                continue;
            }
            if let (true, Some(codec)) = (c.deflate, self.codec.as_deref_mut()) {
                compress_queued(c, codec, &mut self.recode, &mut self.stats);
            }
            let mut failed = None;
            while c.out_pos < c.out.len() {
                match tls::write(&mut c.stream, c.tls.as_deref_mut(), &c.out[c.out_pos..]) {
                    Ok(0) => {
                        failed = Some(CloseWhy::Io(io::ErrorKind::WriteZero));
                        break;
                    }
                    Ok(n) => {
                        c.out_pos += n;
                        self.stats.bytes_out += n as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        c.writable = false;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        failed = Some(CloseWhy::Io(e.kind()));
                        break;
                    }
                }
            }
            if let (Some(t), None, true) = (c.tls.as_deref_mut(), &failed, c.writable) {
                // Ciphertext of what was written, still in `rustls`.
                match tls::send_pending(&mut c.stream, t) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.writable = false,
                    Err(e) => failed = Some(CloseWhy::Io(e.kind())),
                }
            }
            if c.out_pos == c.out.len() {
                c.out_pos = 0;
                if c.out.capacity() > KEEP_OUT_CAPACITY {
                    c.out = Vec::new();
                } else {
                    c.out.clear();
                }
            } else if c.out_pos > KEEP_OUT_CAPACITY && c.out_pos * 2 > c.out.len() {
                c.out.drain(..c.out_pos);
                c.out_pos = 0;
            }
            c.plain_from = c.out.len();
            if let Some(why) = failed {
                self.mark_dead(key, why);
            }
        }
        self.dirty = dirty;
    }

    fn on_event<H: Handler>(&mut self, h: &mut H, key: Key, readable: bool, writable: bool) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.phase == Phase::Dead {
            return;
        }
        if c.phase == Phase::Connecting {
            match c.stream.take_error() {
                Ok(Some(e)) | Err(e) => {
                    self.mark_dead(key, CloseWhy::ConnectFailed(e.kind()));
                    return;
                }
                Ok(None) => {}
            }
            match c.stream.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => {
                    self.mark_dead(key, CloseWhy::ConnectFailed(e.kind()));
                    return;
                }
            }
            c.writable = true;
            match c.proto {
                Proto::Ws => {
                    c.phase = Phase::Upgrading;
                    c.out.extend_from_slice(&self.upgrade_req);
                    if !c.dirty {
                        c.dirty = true;
                        self.dirty.push(key);
                    }
                }
                Proto::Http => {
                    c.phase = Phase::Open;
                    let tag = c.tag;
                    let now = self.now_ns();
                    h.on_open(self, key, tag, now);
                }
            }
        } else if writable {
            c.writable = true;
            let tls_waits = c.tls.as_ref().is_some_and(|t| t.wants_write());
            if (c.out_pos < c.out.len() || tls_waits) && !c.dirty {
                c.dirty = true;
                self.dirty.push(key);
            }
        }
        if readable {
            self.read(h, key);
        }
    }

    fn read<H: Handler>(&mut self, h: &mut H, key: Key) {
        let mut scratch = mem::take(&mut self.scratch);
        while let Some(c) = self.conns.get_mut(key) {
            if c.phase == Phase::Dead || c.phase == Phase::Connecting {
                break;
            }
            let kept = c.pending.len();
            if scratch.len() < kept + READ_CHUNK {
                scratch.resize(kept + READ_CHUNK, 0);
            }
            let n = match tls::read(
                &mut c.stream,
                c.tls.as_deref_mut(),
                &mut scratch[kept..],
                &mut self.cipher,
            ) {
                Ok(0) => {
                    let why = if c.phase == Phase::Closing {
                        CloseWhy::Normal
                    } else {
                        CloseWhy::Eof
                    };
                    self.mark_dead(key, why);
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // From `tls::read`: the TLS layer refused what the server sent.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    self.mark_dead(key, CloseWhy::Protocol(format!("tls: {e}")));
                    break;
                }
                Err(e) => {
                    self.mark_dead(key, CloseWhy::Io(e.kind()));
                    break;
                }
            };
            let short_ends = c.tls.is_none();
            scratch[..kept].copy_from_slice(&c.pending);
            c.pending.clear();
            let room = scratch.len() - kept;
            self.stats.bytes_in += n as u64;
            let end = kept + n;
            let now = self.now_ns();
            let used = self.process(h, key, &scratch[..end], now);
            if let Some(c) = self.conns.get_mut(key) {
                if c.phase != Phase::Dead && used < end {
                    c.pending.extend_from_slice(&scratch[used..end]);
                } else if c.pending.capacity() > READ_CHUNK {
                    c.pending = Vec::new();
                }
            }
            // A short read emptied the socket; edge-triggered epoll reports new data again.
            // (Not so over TLS: a read gives at most the records decrypted so far.)
            if n < room && short_ends {
                break;
            }
        }
        if scratch.len() > 16 * READ_CHUNK {
            scratch.truncate(4 * READ_CHUNK);
            scratch.shrink_to_fit();
        }
        self.scratch = scratch;
    }

    /// Consume what can be consumed of `buf`; returns bytes used.
    fn process<H: Handler>(&mut self, h: &mut H, key: Key, buf: &[u8], now: u64) -> usize {
        let Some(c) = self.conns.get_mut(key) else {
            return buf.len();
        };
        let tag = c.tag;
        match (c.proto, c.phase) {
            (Proto::Ws, Phase::Upgrading) => {
                match ws::parse_upgrade_response(buf, self.codec.is_some()) {
                    Ok(None) => 0,
                    Err(e) => {
                        self.mark_dead(key, CloseWhy::Upgrade(e.to_string()));
                        buf.len()
                    }
                    Ok(Some(n)) => {
                        c.phase = Phase::Open;
                        c.deflate = self.codec.is_some();
                        c.plain_from = c.out.len();
                        h.on_open(self, key, tag, now);
                        n + self.frames(h, key, tag, &buf[n..], now)
                    }
                }
            }
            (Proto::Ws, Phase::Open | Phase::Closing) => self.frames(h, key, tag, buf, now),
            (Proto::Http, Phase::Open) => self.http_responses(h, key, tag, buf, now),
            _ => buf.len(),
        }
    }

    fn alive(&self, key: Key) -> bool {
        self.conns.get(key).is_some_and(|c| c.phase != Phase::Dead)
    }

    fn frames<H: Handler>(&mut self, h: &mut H, key: Key, tag: u32, buf: &[u8], now: u64) -> usize {
        let mut off = 0;
        let deflate = self.conns.get(key).is_some_and(|c| c.deflate);
        while self.alive(key) {
            let head = match ws::parse_head(&buf[off..], MAX_MESSAGE, deflate) {
                Ok(Some(hd)) => hd,
                Ok(None) => return off,
                Err(e) => {
                    self.mark_dead(key, CloseWhy::Protocol(e.to_string()));
                    return buf.len();
                }
            };
            let total = head.head_len + head.payload_len;
            if buf.len() - off < total {
                return off;
            }
            let payload = &buf[off + head.head_len..off + total];
            off += total;
            if head.mask.is_some() {
                self.mark_dead(key, CloseWhy::Protocol("masked server frame".into()));
                return buf.len();
            }
            match head.opcode {
                ws::op::TEXT | ws::op::BINARY => {
                    let Some(c) = self.conns.get_mut(key) else {
                        return buf.len();
                    };
                    if c.frag_active {
                        self.mark_dead(
                            key,
                            CloseWhy::Protocol("new message inside a fragmented one".into()),
                        );
                        return buf.len();
                    }
                    if head.fin {
                        self.deliver(h, key, tag, payload, head.compressed, now);
                    } else {
                        c.frag_active = true;
                        c.frag_compressed = head.compressed;
                        c.frag.extend_from_slice(payload);
                    }
                }
                ws::op::CONT => {
                    let Some(c) = self.conns.get_mut(key) else {
                        return buf.len();
                    };
                    if !c.frag_active {
                        self.mark_dead(
                            key,
                            CloseWhy::Protocol("continuation without a start".into()),
                        );
                        return buf.len();
                    }
                    if c.frag.len() + payload.len() > MAX_MESSAGE {
                        self.mark_dead(key, CloseWhy::Protocol("message too large".into()));
                        return buf.len();
                    }
                    c.frag.extend_from_slice(payload);
                    if head.fin {
                        c.frag_active = false;
                        let compressed = mem::take(&mut c.frag_compressed);
                        let msg = mem::take(&mut c.frag);
                        self.deliver(h, key, tag, &msg, compressed, now);
                    }
                }
                ws::op::PING => {
                    if let Some(c) = self.conns.get_mut(key) {
                        ws::encode_client(&mut c.out, ws::op::PONG, payload);
                        if !c.dirty {
                            c.dirty = true;
                            self.dirty.push(key);
                        }
                        self.stats.pings += 1;
                    }
                }
                ws::op::PONG => h.on_pong(self, key, tag, now),
                _ => {
                    // Close.
                    let code = if payload.len() >= 2 {
                        u16::from_be_bytes([payload[0], payload[1]])
                    } else {
                        1005
                    };
                    let Some(c) = self.conns.get_mut(key) else {
                        return buf.len();
                    };
                    if c.phase == Phase::Closing {
                        self.mark_dead(key, CloseWhy::Normal);
                    } else {
                        // Echo the close, best effort, then drop.
                        let mut echo = Vec::new();
                        ws::encode_close(&mut echo, if code == 1005 { 1000 } else { code });
                        let _ = tls::write(&mut c.stream, c.tls.as_deref_mut(), &echo);
                        self.mark_dead(key, CloseWhy::ServerClose(code));
                    }
                    return buf.len();
                }
            }
        }
        buf.len()
    }

    /// Hands one whole message to the handler, inflating it first if it came compressed.
    fn deliver<H: Handler>(
        &mut self,
        h: &mut H,
        key: Key,
        tag: u32,
        payload: &[u8],
        compressed: bool,
        now: u64,
    ) {
        self.stats.messages_in += 1;
        if !compressed {
            h.on_message(self, key, tag, payload, now);
            return;
        }
        self.stats.compressed_in += 1;
        let mut msg = mem::take(&mut self.inflated);
        let inflated = match self.codec.as_deref_mut() {
            Some(codec) => codec.inflate(payload, MAX_MESSAGE, &mut msg),
            None => Err(deflate::InflateError::Invalid),
        };
        match inflated {
            Ok(()) => h.on_message(self, key, tag, &msg, now),
            Err(e) => self.mark_dead(key, CloseWhy::Protocol(e.to_string())),
        }
        if msg.capacity() <= READ_CHUNK {
            self.inflated = msg;
        }
    }

    fn http_responses<H: Handler>(
        &mut self,
        h: &mut H,
        key: Key,
        tag: u32,
        buf: &[u8],
        now: u64,
    ) -> usize {
        let mut off = 0;
        while self.alive(key) && off < buf.len() {
            let Some(c) = self.conns.get_mut(key) else {
                return buf.len();
            };
            if let Some((status, total, left)) = c.http.body_left {
                let take = left.min(buf.len() - off);
                off += take;
                if take < left {
                    c.http.body_left = Some((status, total, left - take));
                    return off;
                }
                c.http.body_left = None;
                h.on_http(
                    self,
                    key,
                    tag,
                    HttpResp {
                        status,
                        body_len: total,
                    },
                    now,
                );
                continue;
            }
            match parse_http_head(&buf[off..]) {
                Ok(None) => return off,
                Err(e) => {
                    self.mark_dead(key, CloseWhy::Protocol(e));
                    return buf.len();
                }
                Ok(Some(head)) => match head.body {
                    Body::Length(0) => {
                        off += head.head_len;
                        h.on_http(
                            self,
                            key,
                            tag,
                            HttpResp {
                                status: head.status,
                                body_len: 0,
                            },
                            now,
                        );
                    }
                    Body::Length(n) => {
                        off += head.head_len;
                        c.http.body_left = Some((head.status, n, n));
                    }
                    Body::Chunked => match chunked_len(&buf[off + head.head_len..]) {
                        Ok(None) => return off,
                        Ok(Some((wire, body))) => {
                            off += head.head_len + wire;
                            h.on_http(
                                self,
                                key,
                                tag,
                                HttpResp {
                                    status: head.status,
                                    body_len: body,
                                },
                                now,
                            );
                        }
                        Err(e) => {
                            self.mark_dead(key, CloseWhy::Protocol(e));
                            return buf.len();
                        }
                    },
                },
            }
        }
        off.min(buf.len())
    }
}

/// Compresses the frames queued on `c` since the last write (`out[plain_from..]`).
fn compress_queued(
    c: &mut Conn,
    codec: &mut deflate::Codec,
    tmp: &mut Vec<u8>,
    stats: &mut IoStats,
) {
    if c.plain_from >= c.out.len() {
        return;
    }
    tmp.clear();
    tmp.extend_from_slice(&c.out[c.plain_from..]);
    c.out.truncate(c.plain_from);
    let before = (codec.sent_compressed, codec.sent_plain);
    codec.recode(tmp, &mut c.out);
    stats.compressed_out += codec.sent_compressed - before.0;
    stats.uncompressed_out += codec.sent_plain - before.1;
    c.plain_from = c.out.len();
    if tmp.capacity() > KEEP_OUT_CAPACITY {
        *tmp = Vec::new();
    }
}

enum Body {
    Length(usize),
    Chunked,
}

struct RespHead {
    status: u16,
    head_len: usize,
    body: Body,
}

fn parse_http_head(buf: &[u8]) -> Result<Option<RespHead>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 48];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Partial) => {
            if buf.len() > 64 * 1024 {
                Err("response head too large".into())
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(format!("bad response head: {e}")),
        Ok(httparse::Status::Complete(n)) => {
            let status = resp.code.unwrap_or(0);
            let mut body = None;
            for hd in resp.headers.iter() {
                if hd.name.eq_ignore_ascii_case("content-length") {
                    let v = std::str::from_utf8(hd.value)
                        .ok()
                        .and_then(|s| s.trim().parse::<usize>().ok())
                        .ok_or("bad content-length")?;
                    body = Some(Body::Length(v));
                } else if hd.name.eq_ignore_ascii_case("transfer-encoding")
                    && hd.value.eq_ignore_ascii_case(b"chunked")
                {
                    body = Some(Body::Chunked);
                }
            }
            let body = match body {
                Some(b) => b,
                None if status == 204 || status == 304 || (100..200).contains(&status) => {
                    Body::Length(0)
                }
                None => return Err(format!("status {status} without a body length")),
            };
            Ok(Some(RespHead {
                status,
                head_len: n,
                body,
            }))
        }
    }
}

/// Wire length and decoded length of a complete chunked body at the start of `buf`.
fn chunked_len(buf: &[u8]) -> Result<Option<(usize, usize)>, String> {
    let mut off = 0;
    let mut body = 0;
    loop {
        let Some(eol) = memchr::memmem::find(&buf[off..], b"\r\n") else {
            return Ok(None);
        };
        let line = &buf[off..off + eol];
        let hex = line.split(|&c| c == b';').next().unwrap_or(b"");
        let size = std::str::from_utf8(hex)
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .ok_or("bad chunk size")?;
        off += eol + 2;
        if size == 0 {
            // Trailers end with an empty line.
            let Some(end) = memchr::memmem::find(&buf[off..], b"\r\n") else {
                return Ok(None);
            };
            if end != 0 {
                return Err("trailers are not supported".into());
            }
            return Ok(Some((off + 2, body)));
        }
        if buf.len() < off + size + 2 {
            return Ok(None);
        }
        off += size + 2;
        body += size;
    }
}

/// Run the loop until `until_ns`, or until the handler says it is done.
pub fn run<H: Handler>(io: &mut Io, h: &mut H, until_ns: u64) -> io::Result<()> {
    let mut events = Events::with_capacity(4096);
    loop {
        let now = io.now_ns();
        if now >= until_ns || h.done() {
            break;
        }
        let wake = h.tick(io, now).unwrap_or(until_ns).min(until_ns);
        io.flush();
        io.reap(h);
        let now = io.now_ns();
        let timeout = if !io.dirty.is_empty() || wake <= now {
            Duration::ZERO
        } else {
            let d = Duration::from_nanos(wake - now);
            if d < SPIN_BELOW {
                Duration::ZERO
            } else {
                d - Duration::from_millis(1)
            }
        };
        match io.poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for (i, ev) in events.iter().enumerate() {
            let readable = ev.is_readable() || ev.is_read_closed() || ev.is_error();
            io.on_event(h, ev.token().0, readable, ev.is_writable() || ev.is_error());
            // A large batch (a fanout's thousands of readable sockets) must not delay
            // scheduled sends until it is all read.
            if i % TICK_EVERY == TICK_EVERY - 1 {
                let now = io.now_ns();
                h.tick(io, now);
                io.flush();
            }
        }
        io.flush();
        io.reap(h);
    }
    io.flush();
    io.reap(h);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_heads() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        let h = parse_http_head(r).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.head_len, r.len() - 5);
        assert!(matches!(h.body, Body::Length(5)));
        assert!(parse_http_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
        let h = parse_http_head(b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(matches!(h.body, Body::Length(0)));
        assert!(parse_http_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        let h = parse_http_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(matches!(h.body, Body::Chunked));
    }

    #[test]
    fn chunked_bodies() {
        let b = b"5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\n\r\nNEXT";
        assert_eq!(chunked_len(b), Ok(Some((b.len() - 4, 8))));
        for cut in 0..b.len() - 4 {
            assert_eq!(chunked_len(&b[..cut]), Ok(None), "cut {cut}");
        }
        assert!(chunked_len(b"zz\r\n").is_err());
    }
}
