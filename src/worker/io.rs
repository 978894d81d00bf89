//! A worker's socket I/O: accepting connections, reading a connection's input and handing it
//! to `conn::process`, and writing its output out (at the round's end, or early within it:
//! [`Worker::write_out`], [`Worker::flush_within_round`]). A TLS connection's reads and writes take
//! the detours of `worker::tls` (decrypt before processing, encrypt while flushing).

use std::io::{self, Read};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Token};
use rustls::ServerConfig;

use super::round::{Early, Handoff, ACCEPT_BUDGET};
use super::{SocketRead, Worker};
use crate::conn::{self, CloseStage, Conn, Ctx, HttpWait, Phase, Step};
use crate::outbuf::Flush;
use crate::relay::ConnRef;
use crate::tls::TlsScratch;
use crate::ws::close;

/// A worker's listeners, and what accepting from them needs.
pub(super) struct Listeners {
    /// Its socket of the plain group (`--listen`).
    pub plain: Option<TcpListener>,
    /// Its socket of the TLS group (`--tls-listen`).
    pub tls: Option<TcpListener>,
    /// The configuration new TLS connections start from (replaced on SIGHUP).
    pub tls_config: Option<Arc<ServerConfig>>,
    /// Retry `accept` at the next tick (after running out of file descriptors).
    pub retry: bool,
    /// The uid the next accepted connection gets (never 0).
    pub next_uid: u64,
}

impl Listeners {
    /// The TLS listener when `tls`, else the plain one.
    fn get(&self, tls: bool) -> Option<&TcpListener> {
        match tls {
            true => self.tls.as_ref(),
            false => self.plain.as_ref(),
        }
    }
}

/// A worker's buffers for its sockets, shared by all its connections.
pub(super) struct Buffers {
    /// Where a read lands: a connection keeps its own buffer only while it holds a partial
    /// head or frame.
    pub scratch: Vec<u8>,
    /// Plaintext decrypted from one TLS read, processed like a plain connection's scratch.
    pub plain: Vec<u8>,
    /// The TLS write path's buffers (allocated on first use).
    pub tls: TlsScratch,
}

impl Worker {
    /// Accepts until the listener (the TLS one when `tls`) has no more waiting connections,
    /// at most [`ACCEPT_BUDGET`] a round: the rest waits for the next round, so a
    /// connection storm (refused at accept or not) cannot hold the loop away from the
    /// connections it serves for a whole backlog's worth of accepts.
    pub(super) fn accept(&mut self, tls: bool) {
        self.round.accept_more[usize::from(tls)] = false;
        for _ in 0..ACCEPT_BUDGET {
            let Some(listener) = self.listeners.get(tls) else {
                return;
            };
            match listener.accept() {
                Ok((sock, peer)) => self.add_conn(sock, peer.ip(), tls),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE/ENFILE and the like: the connection waits in the backlog.
                    if !self.listeners.retry {
                        log::warn!(
                            worker = self.id, error:% = e;
                            "worker {}: accept failed: {e}", self.id
                        );
                    }
                    self.listeners.retry = true;
                    return;
                }
            }
        }
        self.round.accept_more[usize::from(tls)] = true;
    }

    /// Puts the limiter's blocked addresses on the listeners when they changed (a storm
    /// began or a block ended): a classic BPF filter that drops their packets, or none.
    pub(super) fn apply_blocks(&mut self) {
        let Some(program) = self.tools.limits.take_block_change() else {
            return;
        };
        let (total, now) = self.tools.limits.blocks();
        let m = self.m();
        m.accept_blocks.set(total);
        m.blocked_addresses.set(now as u64);
        for l in [self.listeners.plain.as_ref(), self.listeners.tls.as_ref()]
            .into_iter()
            .flatten()
        {
            let sock = socket2::SockRef::from(l);
            let done = match program.is_empty() {
                true => sock.detach_filter(),
                false => sock.attach_filter(&program),
            };
            if let Err(e) = done {
                // ENOENT when there was no filter to take off; anything else leaves the
                // storm refused at accept, as without blocks.
                if !program.is_empty() || e.raw_os_error() != Some(libc::ENOENT) {
                    log::warn!(
                        worker = self.id, error:% = e;
                        "worker {}: listener filter not set: {e}", self.id
                    );
                }
            }
        }
    }

    fn add_conn(&mut self, mut sock: TcpStream, peer: IpAddr, tls: bool) {
        let limits = &self.shared.config.limits;
        if self.conns.len() >= limits.max_connections_per_worker {
            self.m().connections_refused.inc();
            drop(sock);
            return;
        }
        // DECISIONS §11: too many open or new connections from the address.
        let mut limit = match self.tools.limits.on_accept(peer, self.clock.now) {
            Ok(l) => l,
            Err(kind) => {
                self.m().limited[kind as usize].inc();
                // Closed at accept with a reset (DECISIONS §11): no answer to write, no
                // FIN exchange, no TIME_WAIT left here; a storm of refused connections
                // costs an accept and a close each.
                let _ = socket2::SockRef::from(&sock).set_linger(Some(std::time::Duration::ZERO));
                drop(sock);
                return;
            }
        };
        let session = match tls {
            false => None,
            true => match self.new_session() {
                Some(s) => Some(s),
                None => return self.tools.limits.release(&mut limit),
            },
        };
        // TCP_NODELAY, SO_SNDBUF, TCP_NOTSENT_LOWAT and SO_BUSY_POLL come from the listener
        // (server::bind): no setsockopt per connection.
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if let Err(e) = self.waits.poll.registry().register(
            &mut sock,
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            log::warn!(worker = self.id, error:% = e; "worker {}: register failed: {e}", self.id);
            return self.tools.limits.release(&mut limit);
        }
        let uid = self.listeners.next_uid;
        self.listeners.next_uid += 1;
        let deadline = self.clock.now + limits.head_timeout().as_millis() as u64;
        // A TLS connection keeps this deadline until its handshake is done and a request
        // comes: a stalled handshake is closed like a stalled head.
        let mut conn = Conn::new(sock, uid, deadline);
        conn.tls = session;
        conn.limit = limit;
        entry.insert(conn);
        self.arm(key);
        let m = self.m();
        m.connections_accepted.inc();
        m.connections_open.inc();
    }

    /// A readiness event of connection `key`.
    pub(super) fn on_event(&mut self, key: usize, ev: &Event) {
        let Some(r) = self
            .conns
            .get(key)
            .filter(|c| !c.marks.closed)
            .map(|c| c.at(key))
        else {
            return;
        };
        if ev.is_writable() {
            self.flush(key);
        }
        let hangup = ev.is_read_closed() || ev.is_error();
        if ev.is_readable() || hangup {
            self.drive(r, hangup);
        }
    }

    /// Drives the connections whose input was left for later (budget, backpressure).
    pub(super) fn resume_ready(&mut self) {
        for _ in 0..self.round.ready.len() {
            let Some(r) = self.round.ready.pop_front() else {
                break;
            };
            if let Some(c) = conn::live(&mut self.conns, r) {
                c.marks.ready = false;
                self.drive(r, true);
                self.flush_within_round();
            }
        }
    }

    /// Processes buffered input, then reads until the socket is drained, EOF or the
    /// budget. A read shorter than asked means the socket queue was empty, and new data
    /// raises a new edge, so reading stops there (saving the `EAGAIN` read) unless
    /// `greedy`: after a hang-up event, or when resuming without an event.
    fn drive(&mut self, r: ConnRef, greedy: bool) {
        let key = r.key;
        let Some(c) = conn::live(&mut self.conns, r) else {
            return;
        };
        if !c.rbuf.is_empty() {
            self.process_buffered(key);
        }
        let max_pending = self.round.out.max_pending;
        let mut total = 0usize;
        loop {
            let c = &mut self.conns[key];
            // `ready`: its turn ended with input left (resumed after the others).
            if c.marks.closed || c.marks.ready || c.input_blocked(max_pending) {
                return;
            }
            if self.round.fanout_full(&self.relay) {
                // Deliver and flush what is queued first; this connection resumes after.
                self.resume_later(key);
                return;
            }
            let tls = self.conns[key].tls.is_some();
            let read = if tls {
                self.read_tls(key)
            } else {
                self.read_some(key)
            };
            match read {
                SocketRead::Eof => return self.on_eof(key),
                SocketRead::Bytes { n, all_asked } => {
                    total += n;
                    self.iteration.work.bytes_in += n as u64;
                    if tls {
                        if !self.process_plain(key) {
                            return self.on_eof(key);
                        }
                    } else if self.conns[key].rbuf.is_empty() {
                        self.process_scratch(key, n);
                    } else {
                        self.process_buffered(key);
                    }
                    if !self.round.read_more(total) {
                        self.resume_later(key);
                        return;
                    }
                    if !all_asked && !greedy {
                        return;
                    }
                }
                SocketRead::Nothing => return,
                SocketRead::Interrupted => continue,
                SocketRead::Failed => return self.close_now(key),
            }
        }
    }

    /// One read: into the shared scratch buffer when the connection holds no partial input,
    /// else onto the end of its own buffer.
    fn read_some(&mut self, key: usize) -> SocketRead {
        let cap = self.rbuf_cap(key);
        let c = &mut self.conns[key];
        if c.rbuf.is_empty() {
            return SocketRead::of(c.sock.read(&mut self.bufs.scratch), self.bufs.scratch.len());
        }
        let len = c.rbuf.len();
        if len >= cap {
            // A head or frame larger than any limit allows cannot be pending here (parsers
            // refuse those first); treat as a protocol failure.
            self.fail_oversize(key);
            return SocketRead::Nothing;
        }
        // Grow by doubling from what is held: a connection stuck on a partial head keeps a
        // few KiB, not a whole scratch buffer.
        let want = (cap - len).min(self.bufs.scratch.len()).min(len.max(2048));
        c.rbuf.resize(len + want, 0);
        let r = c.sock.read(&mut c.rbuf[len..]);
        let got = *r.as_ref().unwrap_or(&0);
        c.rbuf.truncate(len + got);
        SocketRead::of(r, want)
    }

    /// Puts a connection on the ready list (once): its input is driven again after this
    /// round's deliveries, without waiting for an event.
    pub(super) fn resume_later(&mut self, key: usize) {
        self.round.resume_later(&mut self.conns, key);
    }

    pub(super) fn rbuf_cap(&self, key: usize) -> usize {
        let l = &self.shared.config.limits;
        match self.conns[key].phase {
            Phase::Ws(_) => l.max_message + 14,
            // `POST /rpc` takes a body of up to `--max-message`.
            _ => l.max_head + l.max_body.max(l.max_message),
        }
    }

    pub(super) fn fail_oversize(&mut self, key: usize) {
        let now = self.clock.now;
        let c = &mut self.conns[key];
        c.rbuf = Vec::new();
        match c.phase {
            Phase::Ws(_) => c.ws_close(
                close::TOO_BIG,
                "message too big",
                now,
                self.round.out.close_ms,
            ),
            _ => c.begin_close(now, self.round.out.close_ms),
        }
        self.mark_dirty(key);
    }

    fn process_scratch(&mut self, key: usize, n: usize) {
        let mut buf = std::mem::take(&mut self.bufs.scratch);
        self.process_front(key, &mut buf[..n]);
        self.bufs.scratch = buf;
    }

    /// Processes input read into a worker buffer (the connection holds none); what it
    /// does not consume is kept in the connection's buffer.
    pub(super) fn process_front(&mut self, key: usize, input: &mut [u8]) {
        let (used, step) = self.process(key, input);
        if used < input.len() {
            let c = &mut self.conns[key];
            if !matches!(c.phase, Phase::Closing { .. }) {
                c.rbuf.extend_from_slice(&input[used..]);
            }
        }
        self.after_input(key, step);
        self.deliver_early();
    }

    pub(super) fn process_buffered(&mut self, key: usize) {
        let mut buf = std::mem::take(&mut self.conns[key].rbuf);
        let (used, step) = self.process(key, &mut buf);
        let c = &mut self.conns[key];
        if used >= buf.len() || matches!(c.phase, Phase::Closing { .. }) {
            buf = Vec::new();
        } else if used > 0 {
            buf.drain(..used);
        }
        c.rbuf = buf;
        self.after_input(key, step);
        self.deliver_early();
    }

    /// Runs `conn::process` on connection `key` with this worker's context, in a fresh turn
    /// of the round; returns the bytes consumed and why it stopped.
    fn process(&mut self, key: usize, input: &mut [u8]) -> (usize, Step) {
        let c = &mut self.conns[key];
        let mut ctx = Ctx {
            me: self.id,
            key,
            time: conn::Time {
                ms: self.clock.now,
                date: self.clock.date.as_bytes(),
            },
            shared: &self.shared,
            relay: &mut self.relay,
            tools: &mut self.tools,
            turn: self.round.turn(),
        };
        conn::process(c, input, &mut ctx)
    }

    /// Bookkeeping after a connection consumed input: re-arm its timer (a partial HTTP
    /// head shortens the deadline), schedule its output, and resume it later if it
    /// yielded with input left.
    fn after_input(&mut self, key: usize, step: Step) {
        let now = self.clock.now;
        let head_ms = self.shared.config.limits.head_timeout().as_millis() as u64;
        let c = &mut self.conns[key];
        if !c.rbuf.is_empty() && !c.marks.closed && step.yields() {
            // Input left unprocessed for the fan-out budget or at the end of the
            // connection's turn: no event will come for it, so resume it once the other
            // connections had their turn and the queued pushes are delivered.
            self.resume_later(key);
        }
        let c = &mut self.conns[key];
        if matches!(c.phase, Phase::Http(_)) && !c.rbuf.is_empty() && c.deadline > now + head_ms {
            c.deadline = now + head_ms;
        }
        if !c.out.is_empty() {
            self.mark_dirty(key);
        }
        self.arm(key);
        self.check_outbound(key);
    }

    pub(super) fn on_eof(&mut self, key: usize) {
        let now = self.clock.now;
        let c = &mut self.conns[key];
        let owed = !c.out.is_empty() || !c.backlog.is_empty();
        match c.phase {
            // Still owing the peer answers it asked for before it half-closed (an event
            // after its FIN says EOF again): the close deadline bounds the wait.
            Phase::Closing {
                stage: CloseStage::Flushing,
                ..
            } if owed => {}
            Phase::Closing { .. } => self.close_now(key),
            // Half-closed while its `POST /rpc` answer waits for the relay: the answer is
            // still written as an HTTP response, then the connection closes
            // (`conn::rpc_http::finish`).
            Phase::Http(HttpWait::Rpc { .. }) if owed => {
                c.phase = Phase::Http(HttpWait::Rpc { close: true });
            }
            _ if !owed => self.close_now(key),
            _ => {
                // Half-closed by the peer: deliver the answers it is owed, then close.
                c.finish(now, self.round.out.close_ms);
                self.mark_dirty(key);
                self.arm(key);
            }
        }
    }

    /// Between two connections' events: the round's end comes early (the engine hands its
    /// work on, then every socket is written) when the round says so
    /// ([`Round::write_early`]: past a volume of copied bodies, or output held past
    /// `--round-hold-us`).
    pub(super) fn flush_within_round(&mut self) {
        let queued = self.relay.pending_pushes() > 0;
        let Some(why) = self.round.write_early(queued, Instant::now) else {
            return;
        };
        match why {
            Early::Bytes => self.m().round_flushes.inc(),
            Early::Held => self.m().round_flushes_held.inc(),
        }
        let handoff = self.write_out();
        self.relay.written(crate::clock::stamp(Instant::now()));
        self.round.handoff = self.round.handoff.and(handoff);
    }

    /// A round's end: the engine hands the round's work on before any answer reaches a
    /// socket (a client that sees `true` finds its message where the engine promised it),
    /// then what is queued is delivered and every connection with output is written.
    pub(super) fn write_out(&mut self) -> Handoff {
        let first = self.relay.flush();
        self.deliver();
        self.flush_dirty();
        // Slow or not is judged after the socket took what it could.
        while let Some(k) = self.round.overflow.pop() {
            self.check_outbound(k);
        }
        self.flush_dirty();
        let again = self.relay.flush();
        self.round.written();
        first.and(again)
    }

    pub(super) fn mark_dirty(&mut self, key: usize) {
        self.round.mark_dirty(&mut self.conns, key);
    }

    pub(super) fn flush_dirty(&mut self) {
        while let Some(key) = self.round.dirty.pop() {
            if let Some(c) = self.conns.get_mut(key) {
                c.marks.dirty = false;
            }
            self.flush(key);
        }
    }

    /// Writes what the connection has queued, refilling from its backlog; then moves its
    /// phase on if it waited for its output (half-close, pipelining backpressure).
    fn flush(&mut self, key: usize) {
        let fill = self.round.out.fill_mark;
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.marks.closed {
            return;
        }
        loop {
            let res = match c.tls.as_deref_mut() {
                None => c.out.write_to(&mut c.sock),
                Some(tls) => super::tls::write(&mut c.out, tls, &mut c.sock, &mut self.bufs.tls),
            };
            let refilled = !c.backlog.is_empty() && c.refill(fill, &mut self.tools.scratch);
            match res {
                Ok(Flush::Done) if refilled => continue,
                Ok(Flush::Blocked) => return,
                Ok(Flush::Done) => break,
                Err(_) => return self.close_now(key),
            }
        }
        match &mut c.phase {
            // Shut the write side once everything owed is out (a pending answer may still
            // come from the store: its arrival flushes the connection again).
            Phase::Closing {
                stage: stage @ CloseStage::Flushing,
                ..
            } if c.backlog.is_empty() => {
                if let Some(tls) = c.tls.as_deref_mut() {
                    match super::tls::close_notify(tls, &mut c.sock) {
                        Ok(Flush::Done) => {}
                        Ok(Flush::Blocked) => return,
                        Err(_) => return self.close_now(key),
                    }
                }
                *stage = CloseStage::Lingering;
                let _ = c.sock.shutdown(std::net::Shutdown::Write);
                c.deadline = self.clock.now + self.shared.config.limits.linger_ms;
                self.arm(key);
            }
            Phase::Http(w @ HttpWait::Output) => {
                *w = HttpWait::Nothing;
                self.resume_later(key);
            }
            _ => {}
        }
    }
}
