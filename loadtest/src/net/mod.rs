//! The event loop every scenario runs on: one `mio::Poll`, connections in a `slab`, one shared
//! read buffer, and a [`Handler`] that a scenario implements. This file holds the types, the
//! calls a scenario makes ([`Io::connect`], [`Io::out`], [`Io::close`], ...) and [`run`];
//! `socket` handles readiness (connect completion, reads, writes, reaping), `frames` what a
//! read carries (the upgrade answer, WebSocket frames), `http` HTTP/1.1 response framing.
//!
//! Together they own sockets, connection phases (connect, upgrade, open, closing),
//! WebSocket frame assembly, control frames (ping -> pong, close handshake), HTTP/1.1
//! response framing, and the one close path (mark dead during a batch, remove after it).
//! They do not know what the messages mean: scenarios get whole messages and decide.
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
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::{deflate, sys, tls, upgrade, ws};

mod frames;
mod http;
mod socket;

use http::HttpState;

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
/// When the next wanted wake-up is nearer than this, poll without sleeping, or with
/// `--wait sleep` sleep on the loop's timerfd, which has ns resolution (epoll timeouts are
/// whole milliseconds, so they would make sends up to a millisecond late).
const SPIN_BELOW: Duration = Duration::from_millis(2);

/// The poll token of the loop's [`sys::Timer`] (slab keys never reach it).
const TIMER: Token = Token(usize::MAX);

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
    /// This connection's own upgrade request (one with a query, e.g. its auth token); the
    /// loop's shared one when `None`. Taken when sent.
    upgrade: Option<Box<[u8]>>,
    http: HttpState,
}

/// WebSocket traffic: frame bytes as on the wire after TLS (before inflation, after
/// compression), and message counts; a loop's running totals, or a measured window's share
/// (`scenario::Wire::between`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wire {
    /// Bytes read (after TLS: upgrade answers and WebSocket frames as sent).
    pub bytes_in: u64,
    /// Bytes written (after compression, before TLS).
    pub bytes_out: u64,
    /// Text and binary messages received.
    pub messages_in: u64,
    /// Of those, compressed (RSV1).
    pub compressed_in: u64,
    /// Messages sent compressed (`--permessage-deflate` only).
    pub compressed_out: u64,
    /// Messages sent plain because compressing did not shrink them.
    pub uncompressed_out: u64,
}

/// Byte and frame counters of one loop.
#[derive(Debug, Default, Clone, Copy)]
pub struct IoStats {
    /// Bytes and messages.
    pub wire: Wire,
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
    /// `Host` and path of the upgrade, and whether it offers permessage-deflate: for the
    /// requests of connections with their own query.
    host: String,
    path: String,
    deflate: bool,
    source_ips: u32,
    /// Bind every connection to this address instead ([`Io::set_source`]).
    fixed_source: Option<std::net::IpAddr>,
    /// New connections close with a RST whatever ends them ([`Io::set_rst_always`]).
    rst_always: bool,
    /// Most bytes handed to one `write` ([`Io::set_max_write`]; unbounded by default).
    max_write: usize,
    /// Global index of this loop's next connection, for spreading source addresses.
    next_conn_index: usize,
    conn_index_step: usize,
    epoch: Instant,
    /// Counters.
    pub stats: IoStats,
    /// Busy time of each loop turn (from `poll`'s return to the next `poll`) that began in
    /// [`Io::time_turns`]'s window: the generator's own stalls.
    pub turns: crate::stats::Lat,
    turns_window: (u64, u64),
    /// Wakes the loop for a due time closer than [`SPIN_BELOW`] with `--wait sleep` (`None`:
    /// spin instead).
    timer: Option<sys::Timer>,
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
            upgrade_req: upgrade::upgrade_request(&target.host, &target.path, None, deflate),
            host: target.host.clone(),
            path: target.path.clone(),
            deflate,
            source_ips,
            fixed_source: None,
            rst_always: false,
            max_write: usize::MAX,
            next_conn_index: thread,
            conn_index_step: threads.max(1),
            epoch,
            stats: IoStats::default(),
            turns: crate::stats::Lat::new(),
            turns_window: (u64::MAX, u64::MAX),
            timer: None,
        })
    }

    /// `--wait sleep`: wait for a send due in less than [`SPIN_BELOW`] on a timerfd instead
    /// of spinning (and let this thread's timers fire within 1 ns). Called on the loop's own
    /// thread.
    pub fn sleep_on_timer(&mut self) -> io::Result<()> {
        let t = sys::Timer::new()?;
        self.poll.registry().register(
            &mut mio::unix::SourceFd(&t.raw_fd()),
            TIMER,
            Interest::READABLE,
        )?;
        self.timer = Some(t);
        sys::set_timer_slack_ns(1);
        Ok(())
    }

    /// Time the busy part of the loop turns that begin in `from_ns..to_ns` into
    /// [`Io::turns`].
    pub fn time_turns(&mut self, from_ns: u64, to_ns: u64) {
        self.turns_window = (from_ns, to_ns);
    }

    /// Nanoseconds since the shared epoch.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Bind every later connection of this loop to `ip` (one client address), whatever
    /// `--source-ips` says.
    pub fn set_source(&mut self, ip: std::net::IpAddr) {
        self.fixed_source = Some(ip);
    }

    /// Later connections end with a RST however they end (server close, EOF, refusal):
    /// no TIME_WAIT on our side when many are opened.
    pub fn set_rst_always(&mut self) {
        self.rst_always = true;
    }

    /// Write at most `n` bytes per `write` call (at least 1). On loopback a `write` also
    /// does the receiving side's TCP work, in the writer's thread and without a point where
    /// the kernel (built with `PREEMPT_NONE`) lets another thread in: one 200 KiB write of a
    /// pipelined flood holds its core for a few hundred µs, whatever the thread's priority.
    pub fn set_max_write(&mut self, n: usize) {
        self.max_write = n.max(1);
    }

    /// Start connecting; the handler hears `on_open` or `on_closed` later.
    pub fn connect(&mut self, tag: u32, proto: Proto) -> io::Result<Key> {
        self.connect_with(tag, proto, None)
    }

    /// [`Io::connect`], with `query` (e.g. `auth=<jwt>&projectId=..`) added to this
    /// connection's upgrade request.
    pub fn connect_with(&mut self, tag: u32, proto: Proto, query: Option<&str>) -> io::Result<Key> {
        let upgrade = match (proto, query) {
            (Proto::Ws, Some(q)) => Some(
                upgrade::upgrade_request(&self.host, &self.path, Some(q), self.deflate)
                    .into_boxed_slice(),
            ),
            _ => None,
        };
        let src = self
            .fixed_source
            .or_else(|| sys::source_ip(&self.target, self.source_ips, self.next_conn_index));
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
            rst: self.rst_always,
            upgrade,
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

    fn alive(&self, key: Key) -> bool {
        self.conns.get(key).is_some_and(|c| c.phase != Phase::Dead)
    }
}

/// Run the loop until `until_ns`, or until the handler says it is done.
pub fn run<H: Handler>(io: &mut Io, h: &mut H, until_ns: u64) -> io::Result<()> {
    let mut events = Events::with_capacity(4096);
    let mut turn_began = u64::MAX;
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
            let timed = d < SPIN_BELOW && io.timer.as_ref().is_some_and(|t| t.arm(d).is_ok());
            if timed {
                // Sleep until the timer fires (or a socket is ready) instead of spinning.
                SPIN_BELOW
            } else if d < SPIN_BELOW {
                Duration::ZERO
            } else {
                d - Duration::from_millis(1)
            }
        };
        if turn_began >= io.turns_window.0 && turn_began < io.turns_window.1 {
            io.turns.record(now.saturating_sub(turn_began), now);
        }
        match io.poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        turn_began = io.now_ns();
        for (i, ev) in events.iter().enumerate() {
            if ev.token() == TIMER {
                // Edge-triggered: each expiry is an event, re-arming resets the count, so
                // the expiry need not be read (a syscall per wake-up saved).
                continue;
            }
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
