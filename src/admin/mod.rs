//! The admin address (`--admin-listen`): what operators and their tools ask of a node,
//! apart from the clients' port. `GET /metrics` (Prometheus), `/health`, `/live` (every
//! worker's loop turns), `/ready` (should it get new clients), `POST /drain` and `GET
//! /status` (one HTML page that polls the rest), as [`routes`] answers them.
//!
//! Owns the admin thread: its own small `mio::Poll` loop (not a worker: a scrape that
//! renders every figure or counts `/proc/self/fd` never stalls a core's clients), its
//! listener and at most [`MAX_CLIENTS`] connections in a slab, each with a bounded read
//! buffer (one request head and a small body), one answer at a time on its way out, and a
//! deadline. Requests are parsed by `http::parse`; a malformed or oversized one is answered
//! (400, 431, ...) and its connection closed, never the thread stopped. It reads the
//! workers only through `conn::Shared` (their metrics, the health, the drain): no lock, no
//! mailbox. Also the blocking client of `walletrelay probe` and `walletrelay drain`
//! ([`client`]).

pub mod client;
pub mod process;
pub mod routes;

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use crate::config::Limits;
use crate::conn::Shared;
use crate::http::response::Response;

/// Most admin connections open at once; more are closed as they are accepted (a scraper,
/// a probe or two and a browser need a handful).
pub const MAX_CLIENTS: usize = 64;

/// Largest request body read on the admin address (`POST /drain` has none): 413 past it.
pub const MAX_BODY: usize = 4096;

/// Milliseconds a closing connection is given to take its answer and hang up.
const LINGER_MS: u64 = 2000;

/// Reads of one connection per readiness before the others get their turn.
const BUDGET: usize = 16;

/// How often the loop looks at the deadlines, at least.
const TICK: Duration = Duration::from_millis(250);

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);

/// The running admin thread.
pub struct Admin {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").field("addr", &self.addr).finish()
    }
}

impl Admin {
    /// Serves the admin routes on `listener` (bound, any blocking mode) from a thread of
    /// its own, until [`Admin::stop`].
    pub fn start(listener: std::net::TcpListener, shared: Arc<Shared>) -> io::Result<Admin> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let stop = Arc::new(AtomicBool::new(false));
        let mut limits = shared.config.limits.clone();
        limits.max_body = MAX_BODY;
        let mut lp = Loop {
            poll,
            listener,
            clients: Slab::with_capacity(MAX_CLIENTS),
            shared,
            limits,
            stop: stop.clone(),
            date: Date::default(),
            again: Vec::new(),
            retry_accept: false,
        };
        let thread = std::thread::Builder::new()
            .name("admin".into())
            .spawn(move || {
                // Like a worker: a thread that panicked leaves the process half alive (no
                // metrics, no probes answered); end it so the supervisor starts a whole one.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lp.run())).is_err() {
                    log::error!("the admin thread panicked; aborting the process");
                    std::process::abort();
                }
            })?;
        Ok(Admin {
            addr,
            stop,
            waker,
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the real port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the thread and closes its connections.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where an admin connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading requests; answering one at a time.
    Serving,
    /// Its last answer is queued (an error, `Connection: close`): written, then the write
    /// side shut and the input discarded until the peer hangs up or the deadline.
    Closing,
}

/// One admin connection.
struct Client {
    sock: TcpStream,
    /// Bytes of requests not yet answered (at most a head and [`MAX_BODY`]).
    rbuf: Vec<u8>,
    /// The answer on its way out, and how much of it went.
    out: Vec<u8>,
    sent: usize,
    /// `clock::now_ms` by which the next request must be whole (or the connection gone).
    deadline: u64,
    phase: Phase,
    /// The write side was shut (after the last answer of a closing connection).
    shut: bool,
    /// Marked for removal at the end of the event.
    dead: bool,
}

/// This second's HTTP date, formatted once.
#[derive(Default)]
struct Date {
    sec: u64,
    text: String,
}

impl Date {
    fn now(&mut self) -> &str {
        let sec = crate::clock::unix_ms() / 1000;
        if sec != self.sec || self.text.is_empty() {
            self.sec = sec;
            self.text = crate::http::response::http_date(std::time::SystemTime::now());
        }
        &self.text
    }
}

/// The admin thread's state.
struct Loop {
    poll: Poll,
    listener: TcpListener,
    clients: Slab<Client>,
    shared: Arc<Shared>,
    /// The public port's limits, with the admin's body bound.
    limits: Limits,
    stop: Arc<AtomicBool>,
    date: Date,
    /// Connections that used their read budget with input left: driven again next turn.
    again: Vec<usize>,
    /// `accept` failed (out of descriptors): tried again next turn, whatever the events.
    retry_accept: bool,
}

impl Loop {
    fn run(&mut self) {
        let mut events = Events::with_capacity(128);
        while !self.stop.load(Ordering::Acquire) {
            let timeout = if self.again.is_empty() {
                TICK
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::error!("admin: poll failed: {e}; the admin address stops answering");
                    return;
                }
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(key) => self.drive(key),
                }
            }
            for key in std::mem::take(&mut self.again) {
                self.drive(key);
            }
            if std::mem::take(&mut self.retry_accept) {
                self.accept();
            }
            self.expire();
        }
        log::debug!("admin thread stopped");
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut sock, peer)) => {
                    if self.clients.len() >= MAX_CLIENTS {
                        log::debug!("admin: {MAX_CLIENTS} connections open; {peer} closed");
                        continue;
                    }
                    let entry = self.clients.vacant_entry();
                    let token = Token(entry.key());
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if let Err(e) = self.poll.registry().register(&mut sock, token, interest) {
                        log::warn!("admin: cannot register a connection: {e}");
                        continue;
                    }
                    let _ = sock.set_nodelay(true);
                    let now = crate::clock::now_ms();
                    entry.insert(Client {
                        sock,
                        rbuf: Vec::new(),
                        out: Vec::new(),
                        sent: 0,
                        deadline: now + self.limits.head_timeout().as_millis() as u64,
                        phase: Phase::Serving,
                        shut: false,
                        dead: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: tried again next turn (at most a tick away).
                    log::warn!("admin: accept failed: {e}");
                    self.retry_accept = true;
                    return;
                }
            }
        }
    }

    /// Reads, answers and writes what connection `key` is ready for, until its socket
    /// would block or it used [`BUDGET`] reads (then it goes on the `again` list: one
    /// client's flood of pipelined requests does not hold back the others' probes).
    fn drive(&mut self, key: usize) {
        let Some(c) = self.clients.get_mut(key) else {
            return;
        };
        let cap = self.limits.max_head + MAX_BODY;
        let mut buf = [0u8; 8192];
        let mut reads = 0;
        loop {
            let answered =
                c.phase == Phase::Serving && answer(c, &self.shared, &self.limits, self.date.now());
            write(c);
            // An answer still going out waits for the socket (one answer at a time).
            if c.dead || !c.out.is_empty() {
                break;
            }
            // The next pipelined request may be whole already.
            if answered {
                continue;
            }
            let room = match c.phase {
                Phase::Serving => cap.saturating_sub(c.rbuf.len()).min(buf.len()),
                Phase::Closing => buf.len(),
            };
            if room == 0 {
                break;
            }
            if reads == BUDGET {
                self.again.push(key);
                break;
            }
            reads += 1;
            match c.sock.read(&mut buf[..room]) {
                // Every whole request was answered above: what is left is a part of one.
                Ok(0) => c.dead = true,
                Ok(n) if c.phase == Phase::Serving => c.rbuf.extend_from_slice(&buf[..n]),
                // Closing: the input is read and dropped.
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => c.dead = true,
            }
            if c.dead {
                break;
            }
        }
        if c.dead {
            self.remove(key);
        }
    }

    /// Closes the connections past their deadline.
    fn expire(&mut self) {
        let now = crate::clock::now_ms();
        let late: Vec<usize> = self
            .clients
            .iter()
            .filter(|(_, c)| now >= c.deadline)
            .map(|(k, _)| k)
            .collect();
        for key in late {
            self.remove(key);
        }
    }

    fn remove(&mut self, key: usize) {
        if self.clients.contains(key) {
            let mut c = self.clients.remove(key);
            let _ = self.poll.registry().deregister(&mut c.sock);
        }
    }
}

/// Answers the request at the front of `c.rbuf`, if it is whole and no answer is still
/// going out (returns whether it did); an invalid one is answered and the connection
/// closes.
fn answer(c: &mut Client, shared: &Shared, limits: &Limits, date: &str) -> bool {
    if !c.out.is_empty() || c.phase != Phase::Serving || c.rbuf.is_empty() {
        return false;
    }
    let now = crate::clock::now_ms();
    let (resp, used, head_only, close) = match crate::http::parse(&c.rbuf, limits) {
        Ok(None) => return false,
        Ok(Some((n, req))) => {
            let head_only = req.method == crate::http::Method::Head;
            let resp = routes::answer(&req, &c.rbuf[..n], shared, now);
            (resp, n, head_only, req.close)
        }
        Err(e) => {
            let used = c.rbuf.len();
            (
                Response::json_error(e.status(), &e.to_string()),
                used,
                false,
                true,
            )
        }
    };
    c.rbuf.drain(..used);
    c.out = serialize(&resp, date, head_only, close);
    c.sent = 0;
    if close {
        c.phase = Phase::Closing;
        c.rbuf = Vec::new();
        c.deadline = now + LINGER_MS;
    } else {
        // The next request: in time if it has begun, else the connection may idle.
        let wait = if c.rbuf.is_empty() {
            limits.keepalive_timeout()
        } else {
            limits.head_timeout()
        };
        c.deadline = now + wait.as_millis() as u64;
    }
    true
}

/// Writes what is queued; a closing connection's write side is shut once it all went.
fn write(c: &mut Client) {
    while c.sent < c.out.len() {
        match c.sock.write(&c.out[c.sent..]) {
            Ok(0) => {
                c.dead = true;
                return;
            }
            Ok(n) => c.sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                c.dead = true;
                return;
            }
        }
    }
    c.out = Vec::new();
    c.sent = 0;
    if c.phase == Phase::Closing && !c.shut {
        c.shut = true;
        // The answer is out; what the peer still sends is read and dropped until it hangs
        // up, so an unread request never turns into a reset that destroys the answer.
        let _ = c.sock.shutdown(std::net::Shutdown::Write);
    }
}

/// `resp` as HTTP/1.1 bytes. Unlike the public port's answers, no
/// `Access-Control-Allow-Origin`: no other site's page may read the admin address.
fn serialize(resp: &Response, date: &str, head_only: bool, close: bool) -> Vec<u8> {
    use std::fmt::Write as _;
    let body = resp.body.to_vec().unwrap_or_default();
    let mut head = String::with_capacity(256);
    let _ = write!(
        head,
        "HTTP/1.1 {} {}\r\nServer: walletrelay\r\nDate: {date}\r\nCache-Control: no-store\r\n",
        resp.status,
        crate::http::response::reason(resp.status)
    );
    let bodiless = resp.status == 204 || resp.status == 304;
    if !bodiless {
        let _ = write!(head, "Content-Length: {}\r\n", body.len());
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    let mut out = head.into_bytes();
    out.extend_from_slice(&resp.headers);
    out.extend_from_slice(b"\r\n");
    if !head_only && !bodiless {
        out.extend_from_slice(&body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_carry_no_cors_header_and_head_has_no_body() {
        let r = Response::new(200, "text/plain", "hi");
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        let got = String::from_utf8(serialize(&r, date, false, false)).unwrap();
        assert_eq!(
            got,
            "HTTP/1.1 200 OK\r\nServer: walletrelay\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
             Cache-Control: no-store\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nhi"
        );
        let got = String::from_utf8(serialize(&r, date, true, true)).unwrap();
        assert!(got.ends_with("Connection: close\r\nContent-Type: text/plain\r\n\r\n"));
        let got = String::from_utf8(serialize(&Response::empty(204), date, false, false)).unwrap();
        assert!(!got.contains("Content-Length") && got.ends_with("no-store\r\n\r\n"));
    }
}
