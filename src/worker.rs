//! One worker: a thread pinned to a core running its own `mio::Poll` loop. It owns its
//! listener (`SO_REUSEPORT`), its connections (in a `slab`), its share of the relay and a
//! timer wheel. Nothing it owns is touched by another thread; other workers reach it only
//! through its mailbox (see `relay`).
//!
//! One loop iteration: poll; accept; read every readable connection (each within a read
//! budget, the rest continued next iteration) and process what it sent; take the batches
//! other workers sent; carry out the deliveries all this decided; fire due timers; flush
//! every connection with output (one `writev` each); send this iteration's cross-worker
//! batches; then remove closed connections, all in one place.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::conn::{self, Conn, Ctx, IdSource, Phase, Shared};
use crate::http::response;
use crate::metrics::{CoreMetrics, DropReason};
use crate::outbuf::Flush;
use crate::registry::answers::AnswerCache;
use crate::relay::{CoreMsg, Delivery, Mailboxes, Relay};
use crate::timer::Wheel;
use crate::ws::close;

/// Token of the listener.
pub const LISTENER: Token = Token(usize::MAX - 1);
/// Token of the waker.
pub const WAKER: Token = Token(usize::MAX - 2);

/// Bytes read from one connection per readiness event before others get their turn.
const READ_BUDGET: usize = 256 << 10;
/// Size of the worker's shared read buffer.
const SCRATCH: usize = 64 << 10;
/// Batches taken from the mailbox per iteration.
const INBOX_BUDGET: usize = 256;

/// A worker and everything it owns.
pub struct Worker {
    id: usize,
    poll: Poll,
    listener: Option<TcpListener>,
    conns: Slab<Conn>,
    next_uid: u64,
    relay: Relay,
    inbox: Receiver<Vec<CoreMsg>>,
    mailboxes: Arc<Mailboxes>,
    shared: Arc<Shared>,
    wheel: Wheel,
    /// Read buffer shared by all connections: a connection keeps its own buffer only while
    /// it holds a partial head or frame.
    scratch: Vec<u8>,
    /// Encoding scratch space.
    enc: Vec<u8>,
    /// The JSON parser's buffers, reused for every message.
    json: simd_json::Buffers,
    /// Assembled registry answers, for repeated queries.
    answers: AnswerCache,
    ids: IdSource,
    /// Connections with queued output, flushed at the end of the iteration.
    dirty: Vec<usize>,
    /// Connections to remove at the end of the iteration.
    closing: Vec<usize>,
    /// Connections whose read budget ran out (or that were resumed) with input left.
    ready: VecDeque<(usize, u64)>,
    date: String,
    date_sec: u64,
    now: u64,
    /// Retry `accept` at the next tick (after running out of file descriptors).
    accept_retry: bool,
    /// Set once shutdown began: the time by which to exit.
    stop_at: Option<u64>,
    /// Batches for another worker wait for room in its queue.
    outbox_waiting: bool,
    /// WebSockets whose outbound buffer passed the limit during a delivery round.
    overflow: Vec<usize>,
    /// How full a connection's `OutBuf` is kept from its backlog.
    fill_mark: usize,
    /// `--close-timeout` in milliseconds.
    close_ms: u64,
}

impl Worker {
    /// A worker with its listener, poll instance (whose waker is in `mailboxes`) and inbox.
    pub fn new(
        id: usize,
        mut listener: TcpListener,
        poll: Poll,
        inbox: Receiver<Vec<CoreMsg>>,
        mailboxes: Arc<Mailboxes>,
        relay: Relay,
        shared: Arc<Shared>,
    ) -> io::Result<Worker> {
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let now = crate::clock::now_ms();
        // Encoded bytes a connection's queue holds before further pushes wait by reference
        // (shared with the cache and every other subscriber): enough for a few writes, while
        // 10,000 subscribers of a burst do not each get their own copy of it.
        let fill_mark = (shared.config.limits.max_outbound / 2).clamp(1, 64 << 10);
        let close_ms = shared.config.limits.close_ms();
        let answer_cache = shared.config.limits.answer_cache;
        Ok(Worker {
            id,
            poll,
            listener: Some(listener),
            conns: Slab::with_capacity(1024),
            next_uid: 1,
            relay,
            inbox,
            mailboxes,
            shared,
            wheel: Wheel::new(now),
            scratch: vec![0u8; SCRATCH],
            enc: Vec::with_capacity(4096),
            json: simd_json::Buffers::new(4096),
            answers: AnswerCache::new(answer_cache),
            ids: IdSource::default(),
            dirty: Vec::new(),
            closing: Vec::new(),
            ready: VecDeque::new(),
            date: String::new(),
            date_sec: u64::MAX,
            now,
            accept_retry: false,
            stop_at: None,
            outbox_waiting: false,
            overflow: Vec::new(),
            fill_mark,
            close_ms,
        })
    }

    fn m(&self) -> &CoreMetrics {
        &self.shared.metrics.cores[self.id]
    }

    /// Runs the loop until shutdown completes.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut due = Vec::new();
        loop {
            let mut timeout = if !self.ready.is_empty() {
                Duration::ZERO
            } else if self.outbox_waiting {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(self.wheel.until_next_tick(self.now))
            };
            // Tell senders to wake us, then look once more so no batch slips in between.
            self.mailboxes.set_sleeping(self.id, true);
            if !self.inbox.is_empty() {
                timeout = Duration::ZERO;
            }
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::error!("worker {}: poll failed: {e}", self.id);
                    break;
                }
            }
            self.mailboxes.set_sleeping(self.id, false);
            self.tick_clock();
            self.relay.set_fanout_budget(self.conns.len());
            self.m().loop_iterations.inc();

            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(key) => {
                        let uid = match self.conns.get(key) {
                            Some(c) if !c.closed => c.uid,
                            _ => continue,
                        };
                        if ev.is_writable() {
                            self.flush(key);
                        }
                        let hangup = ev.is_read_closed() || ev.is_error();
                        if ev.is_readable() || hangup {
                            self.drive(key, uid, hangup);
                        }
                    }
                }
            }
            for _ in 0..self.ready.len() {
                let Some((key, uid)) = self.ready.pop_front() else {
                    break;
                };
                if let Some(c) = self.conns.get_mut(key) {
                    if c.uid == uid {
                        c.ready = false;
                    }
                }
                self.drive(key, uid, true);
            }
            let mut shutdown = false;
            for _ in 0..INBOX_BUDGET {
                match self.inbox.try_recv() {
                    Ok(batch) => shutdown |= self.relay.on_batch(batch),
                    Err(_) => break,
                }
            }
            self.deliver();
            if shutdown {
                self.begin_shutdown();
            }

            due.clear();
            self.wheel.advance(self.now, &mut due);
            for &(key, uid, tick) in &due {
                self.on_timer(key, uid, tick);
            }
            self.relay.sweep(self.now);
            if self.accept_retry && !due.is_empty() {
                self.accept_retry = false;
                self.accept();
            }
            self.deliver();
            // Hand publishes to their home workers before any acknowledgement reaches a
            // socket: a client that sees `true` and then subscribes elsewhere must find the
            // message stored (the home's inbox is first in, first out).
            self.outbox_waiting = self.relay.flush_outboxes();
            self.flush_dirty();
            // Slow or not is judged after the socket took what it could.
            while let Some(k) = self.overflow.pop() {
                self.check_outbound(k);
            }
            self.flush_dirty();
            // A full queue to another worker: retry within a millisecond.
            self.outbox_waiting |= self.relay.flush_outboxes();
            self.reap();
            if let Some(stop) = self.stop_at {
                if self.conns.is_empty() || self.now >= stop {
                    break;
                }
            }
        }
        log::debug!("worker {} stopped", self.id);
    }

    fn tick_clock(&mut self) {
        self.now = crate::clock::now_ms();
        let sec = crate::clock::unix_ms() / 1000;
        if sec != self.date_sec {
            self.date_sec = sec;
            self.date = response::http_date(std::time::SystemTime::now());
        }
    }

    // -----------------------------------------------------------------------------------
    // Accepting

    fn accept(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            match listener.accept() {
                Ok((sock, _)) => self.add_conn(sock),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE/ENFILE and the like: the connection waits in the backlog.
                    if !self.accept_retry {
                        log::warn!("worker {}: accept failed: {e}", self.id);
                    }
                    self.accept_retry = true;
                    return;
                }
            }
        }
    }

    fn add_conn(&mut self, mut sock: TcpStream) {
        let limits = &self.shared.config.limits;
        if self.conns.len() >= limits.max_connections_per_worker {
            self.m().connections_refused.inc();
            drop(sock);
            return;
        }
        // TCP_NODELAY, SO_SNDBUF, TCP_NOTSENT_LOWAT and SO_BUSY_POLL come from the listener
        // (server::bind): no setsockopt per connection.
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if let Err(e) = self.poll.registry().register(
            &mut sock,
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            log::warn!("worker {}: register failed: {e}", self.id);
            return;
        }
        let uid = self.next_uid;
        self.next_uid += 1;
        let deadline = self.now + limits.head_timeout().as_millis() as u64;
        entry.insert(Conn::new(sock, uid, deadline));
        self.arm(key);
        let m = self.m();
        m.connections_accepted.inc();
        m.connections_open.inc();
    }

    // -----------------------------------------------------------------------------------
    // Reading

    /// Processes buffered input, then reads until the socket is drained, EOF or the
    /// budget. A read shorter than asked means the socket queue was empty, and new data
    /// raises a new edge, so reading stops there (saving the `EAGAIN` read) unless
    /// `greedy`: after a hang-up event, or when resuming without an event.
    fn drive(&mut self, key: usize, uid: u64, greedy: bool) {
        let Some(c) = self.conns.get(key) else { return };
        if c.uid != uid || c.closed {
            return;
        }
        if !self.conns[key].rbuf.is_empty() {
            self.process_buffered(key);
        }
        let mut total = 0usize;
        loop {
            let c = &mut self.conns[key];
            if c.closed || c.paused || matches!(c.phase, Phase::Http { awaiting: true }) {
                return;
            }
            if self.relay.over_fanout_budget() {
                // Deliver and flush what is queued first; this connection resumes after.
                self.resume_later(key);
                return;
            }
            let mut asked = SCRATCH;
            let res = if c.rbuf.is_empty() {
                c.sock.read(&mut self.scratch)
            } else {
                let cap = self.rbuf_cap(key);
                let c = &mut self.conns[key];
                let len = c.rbuf.len();
                if len >= cap {
                    // A head or frame larger than any limit allows cannot be pending here
                    // (parsers refuse those first); treat as a protocol failure.
                    self.fail_oversize(key);
                    return;
                }
                // Grow by doubling from what is held: a connection stuck on a partial head
                // keeps a few KiB, not a whole scratch buffer.
                let want = (cap - len).min(SCRATCH).min(len.max(2048));
                asked = want;
                c.rbuf.resize(len + want, 0);
                let r = c.sock.read(&mut c.rbuf[len..]);
                let got = *r.as_ref().unwrap_or(&0);
                c.rbuf.truncate(len + got);
                r
            };
            match res {
                Ok(0) => {
                    self.on_eof(key);
                    return;
                }
                Ok(n) => {
                    total += n;
                    if self.conns[key].rbuf.is_empty() {
                        self.process_scratch(key, n);
                    } else {
                        self.process_buffered(key);
                    }
                    if total >= READ_BUDGET {
                        self.resume_later(key);
                        return;
                    }
                    if n < asked && !greedy {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.close_now(key);
                    return;
                }
            }
        }
    }

    /// Puts a connection on the ready list (once): its input is driven again after this
    /// round's deliveries, without waiting for an event.
    fn resume_later(&mut self, key: usize) {
        if let Some(c) = self.conns.get_mut(key) {
            if !c.ready && !c.closed {
                c.ready = true;
                self.ready.push_back((key, c.uid));
            }
        }
    }

    fn rbuf_cap(&self, key: usize) -> usize {
        let l = &self.shared.config.limits;
        match self.conns[key].phase {
            Phase::Ws(_) => l.max_message + 14,
            _ => l.max_head + l.max_body,
        }
    }

    fn fail_oversize(&mut self, key: usize) {
        let now = self.now;
        let c = &mut self.conns[key];
        c.rbuf = Vec::new();
        match c.phase {
            Phase::Ws(_) => c.ws_close(close::TOO_BIG, "message too big", now, self.close_ms),
            _ => c.begin_close(now, self.close_ms),
        }
        self.mark_dirty(key);
    }

    fn ctx(&mut self, key: usize) -> (&mut Conn, Ctx<'_>) {
        let c = &mut self.conns[key];
        let ctx = Ctx {
            me: self.id,
            key,
            now: self.now,
            date: self.date.as_bytes(),
            shared: &self.shared,
            relay: &mut self.relay,
            ids: &mut self.ids,
            scratch: &mut self.enc,
            json: &mut self.json,
            answers: &mut self.answers,
        };
        (c, ctx)
    }

    fn process_scratch(&mut self, key: usize, n: usize) {
        let mut buf = std::mem::take(&mut self.scratch);
        let used = {
            let (c, mut ctx) = self.ctx(key);
            conn::process(c, &mut buf[..n], &mut ctx)
        };
        if used < n {
            let c = &mut self.conns[key];
            if !matches!(c.phase, Phase::Closing) {
                c.rbuf.extend_from_slice(&buf[used..n]);
            }
        }
        self.scratch = buf;
        self.after_input(key);
    }

    fn process_buffered(&mut self, key: usize) {
        let mut buf = std::mem::take(&mut self.conns[key].rbuf);
        let used = {
            let (c, mut ctx) = self.ctx(key);
            conn::process(c, &mut buf, &mut ctx)
        };
        let c = &mut self.conns[key];
        if used >= buf.len() || matches!(c.phase, Phase::Closing) {
            buf = Vec::new();
        } else if used > 0 {
            buf.drain(..used);
        }
        c.rbuf = buf;
        self.after_input(key);
    }

    /// Bookkeeping after a connection consumed input: re-arm its timer (a partial HTTP
    /// head shortens the deadline), schedule its output.
    fn after_input(&mut self, key: usize) {
        let now = self.now;
        let head_ms = self.shared.config.limits.head_timeout().as_millis() as u64;
        let c = &mut self.conns[key];
        if !c.rbuf.is_empty() && !c.closed && self.relay.over_fanout_budget() {
            // Input left unprocessed for the fan-out budget: no event will come for it,
            // so resume it once the queued pushes are delivered.
            self.resume_later(key);
        }
        let c = &mut self.conns[key];
        if matches!(c.phase, Phase::Http { .. }) && !c.rbuf.is_empty() && c.deadline > now + head_ms
        {
            c.deadline = now + head_ms;
        }
        if !c.out.is_empty() {
            self.mark_dirty(key);
        }
        self.arm(key);
        self.check_outbound(key);
    }

    fn on_eof(&mut self, key: usize) {
        let now = self.now;
        let c = &mut self.conns[key];
        match c.phase {
            Phase::Closing => self.close_now(key),
            _ if c.out.is_empty() => self.close_now(key),
            _ => {
                // Half-closed by the peer: deliver what is queued, then close.
                c.begin_close(now, self.close_ms);
                self.mark_dirty(key);
                self.arm(key);
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // Deliveries decided by the relay

    fn deliver(&mut self) {
        if self.relay.deliveries.is_empty() {
            return;
        }
        let list = std::mem::take(&mut self.relay.deliveries);
        self.relay.pending_pushes = 0;
        let max_out = self.shared.config.limits.max_outbound;
        let fill = self.fill_mark;
        for d in &list {
            match d {
                Delivery::Live {
                    slot,
                    data,
                    exclude_uid,
                } => {
                    let Some(t) = self.relay.topic(*slot) else {
                        continue;
                    };
                    let share_min = crate::outbuf::fanout_share_min(t.subs.len(), data.len());
                    for s in &t.subs {
                        if s.pending != 0 || s.conn_uid == *exclude_uid {
                            continue;
                        }
                        let Some(c) = self.conns.get_mut(s.conn_key) else {
                            continue;
                        };
                        if c.uid != s.conn_uid || c.closed || !matches!(c.phase, Phase::Ws(_)) {
                            continue;
                        }
                        c.deliver(&s.id, data, true, fill, share_min, &mut self.enc);
                        self.shared.metrics.cores[self.id].delivered.inc();
                        if !c.dirty {
                            c.dirty = true;
                            self.dirty.push(s.conn_key);
                        }
                        if c.outbound_len() > max_out {
                            self.overflow.push(s.conn_key);
                        }
                    }
                }
                Delivery::Replay {
                    slot,
                    conn_key,
                    conn_uid,
                    serial,
                    messages,
                } => {
                    if !self.relay.activate(*slot, *conn_key, *conn_uid, *serial) {
                        continue;
                    }
                    let Some(t) = self.relay.topic(*slot) else {
                        continue;
                    };
                    let Some(s) = t
                        .subs
                        .iter()
                        .find(|s| s.conn_key == *conn_key && s.conn_uid == *conn_uid)
                    else {
                        continue;
                    };
                    let Some(c) = self.conns.get_mut(*conn_key) else {
                        continue;
                    };
                    if c.uid != *conn_uid || c.closed {
                        continue;
                    }
                    // A replay is cached data: it waits by reference in the backlog and does
                    // not count as falling behind.
                    for m in messages {
                        c.deliver(
                            &s.id,
                            m,
                            false,
                            fill,
                            crate::outbuf::SHARE_THRESHOLD,
                            &mut self.enc,
                        );
                    }
                    self.shared.metrics.cores[self.id]
                        .delivered
                        .add(messages.len() as u64);
                    if !c.dirty {
                        c.dirty = true;
                        self.dirty.push(*conn_key);
                    }
                }
                Delivery::WebhookAnswer {
                    conn_key,
                    conn_uid,
                    result,
                } => {
                    let Some(c) = self.conns.get_mut(*conn_key) else {
                        continue;
                    };
                    if c.uid != *conn_uid || !matches!(c.phase, Phase::Http { awaiting: true }) {
                        continue;
                    }
                    let resp = conn::subscribe_answer(*result);
                    let close = c.shutdown_pending;
                    response::write(&mut c.out, &resp, self.date.as_bytes(), false, close);
                    if close {
                        c.begin_close(self.now, self.close_ms);
                    } else {
                        c.phase = Phase::Http { awaiting: false };
                        if !c.ready {
                            c.ready = true;
                            self.ready.push_back((*conn_key, *conn_uid));
                        }
                    }
                    self.mark_dirty(*conn_key);
                }
            }
        }
        // Keep the allocation for the next round.
        let mut list = list;
        list.clear();
        if self.relay.deliveries.is_empty() {
            self.relay.deliveries = list;
        }
    }

    /// Closes a WebSocket whose outbound buffer passed the limit (DECISIONS §3: 1008).
    fn check_outbound(&mut self, key: usize) {
        let max = self.shared.config.limits.max_outbound;
        let now = self.now;
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.outbound_len() <= max || c.closed || !matches!(c.phase, Phase::Ws(_)) {
            return;
        }
        self.shared.metrics.cores[self.id].drop(DropReason::SlowConsumer, 1);
        c.ws_close(close::POLICY, "outbound buffer full", now, self.close_ms);
        self.mark_dirty(key);
        self.arm(key);
    }

    // -----------------------------------------------------------------------------------
    // Writing

    fn mark_dirty(&mut self, key: usize) {
        if let Some(c) = self.conns.get_mut(key) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(key);
            }
        }
    }

    fn flush_dirty(&mut self) {
        while let Some(key) = self.dirty.pop() {
            if let Some(c) = self.conns.get_mut(key) {
                c.dirty = false;
            }
            self.flush(key);
        }
    }

    fn flush(&mut self, key: usize) {
        let fill = self.fill_mark;
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.closed {
            return;
        }
        loop {
            let res = c.out.write_to(&mut c.sock);
            let refilled = !c.backlog.is_empty() && c.refill(fill, &mut self.enc);
            match res {
                Ok(Flush::Done) if refilled => continue,
                Ok(Flush::Blocked) => return,
                Ok(Flush::Done) => break,
                Err(_) => return self.close_now(key),
            }
        }
        if c.shutdown_pending {
            c.shutdown_pending = false;
            let _ = c.sock.shutdown(std::net::Shutdown::Write);
            c.deadline = self.now + conn::LINGER_MS;
            self.arm(key);
        } else if c.paused {
            c.paused = false;
            self.resume_later(key);
        }
    }

    // -----------------------------------------------------------------------------------
    // Timers

    /// Makes sure the wheel holds an entry no later than the connection's deadline.
    fn arm(&mut self, key: usize) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.closed {
            return;
        }
        let tick = self.wheel.tick_of(c.deadline);
        if c.timer_tick == 0 || tick < c.timer_tick {
            c.timer_tick = self.wheel.schedule(key, c.uid, c.deadline);
        }
    }

    fn on_timer(&mut self, key: usize, uid: u64, tick: u64) {
        /// What a due deadline calls for.
        enum Action {
            Rearm,
            Close,
            RequestTimeout,
            Ping,
        }
        let now = self.now;
        let interval = self.shared.config.limits.ping_interval().as_millis() as u64;
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.uid != uid || c.timer_tick != tick || c.closed {
            return;
        }
        c.timer_tick = 0;
        let action = if now < c.deadline {
            Action::Rearm
        } else {
            match &c.phase {
                Phase::Http { awaiting: true } => {
                    c.deadline = now + 1000;
                    Action::Rearm
                }
                Phase::Http { .. } if c.rbuf.is_empty() && c.out.is_empty() => Action::Close,
                Phase::Http { .. } => Action::RequestTimeout,
                Phase::Ws(w) if now >= w.last_rx + 2 * interval => {
                    self.shared.metrics.cores[self.id].heartbeat_closes.inc();
                    Action::Close
                }
                Phase::Ws(w) if now >= w.next_ping => Action::Ping,
                Phase::Ws(w) => {
                    c.deadline = w.next_ping.min(w.last_rx + 2 * interval);
                    Action::Rearm
                }
                Phase::Closing => Action::Close,
            }
        };
        match action {
            Action::Rearm => {}
            Action::Close => return self.close_now(key),
            Action::RequestTimeout => {
                if c.rbuf.is_empty() {
                    // Idle, with a response still on its way out: finish it, then close.
                    c.begin_close(now, self.close_ms);
                } else {
                    let resp =
                        response::Response::json_error(408, "request head not received in time");
                    c.rbuf = Vec::new();
                    response::write(&mut c.out, &resp, self.date.as_bytes(), false, true);
                    c.begin_close(now, self.close_ms);
                }
                self.mark_dirty(key);
            }
            Action::Ping => {
                if let Phase::Ws(w) = &mut c.phase {
                    w.next_ping = now + interval;
                    c.deadline = w.next_ping.min(w.last_rx + 2 * interval);
                }
                c.out
                    .extend(&crate::ws::frame(crate::ws::Opcode::Ping, b""));
                self.mark_dirty(key);
            }
        }
        self.arm(key);
    }

    // -----------------------------------------------------------------------------------
    // Closing: the one path

    fn unsubscribe_all(&mut self, key: usize) {
        let uid = self.conns[key].uid;
        let subs = std::mem::take(&mut self.conns[key].subs);
        for s in subs {
            self.relay.unsubscribe(s.slot, key, uid);
        }
    }

    /// Marks a connection for removal at the end of the iteration.
    fn close_now(&mut self, key: usize) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.closed {
            return;
        }
        c.closed = true;
        self.closing.push(key);
    }

    fn reap(&mut self) {
        while let Some(key) = self.closing.pop() {
            self.unsubscribe_all(key);
            // Dropping the socket closes its only descriptor (sockets are never duplicated),
            // which removes it from the epoll set: no `epoll_ctl(DEL)` per connection.
            let c = self.conns.remove(key);
            let m = &self.shared.metrics.cores[self.id];
            m.connections_open.sub(1);
            if c.is_ws {
                m.websockets_open.sub(1);
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // Shutdown

    fn begin_shutdown(&mut self) {
        if self.stop_at.is_some() {
            return;
        }
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        let now = self.now;
        self.stop_at = Some(now + self.shared.config.limits.shutdown_grace().as_millis() as u64);
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            let c = &mut self.conns[key];
            match c.phase {
                Phase::Ws(_) => {
                    c.ws_close(
                        close::GOING_AWAY,
                        "server shutting down",
                        now,
                        self.close_ms,
                    );
                    self.mark_dirty(key);
                }
                Phase::Http { .. } if c.out.is_empty() => self.close_now(key),
                _ => {
                    c.begin_close(now, self.close_ms);
                    self.mark_dirty(key);
                }
            }
        }
    }
}
