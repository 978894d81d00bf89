//! One worker: a thread pinned to a core running its own `mio::Poll` loop. It owns its
//! listener (`SO_REUSEPORT`), its connections (in a `slab`), its share of the relay and a
//! timer wheel. Nothing it owns is touched by another thread; the rest of the process reaches
//! it only through mailboxes (`crate::mailbox`) that ring its doorbell: its own, for
//! [`Control`] (shutdown, SIGHUP reloads), and its engine's (other workers' engines, the
//! engine's helper threads), which the engine reads when the worker asks it to.
//!
//! A worker may have two listeners: plain TCP (`--listen`) and TLS (`--tls-listen`). A
//! connection accepted on the TLS one carries a `tls::TlsSession`: the read path decrypts
//! into a plaintext buffer before `conn::process`, the write path encrypts through a
//! `tls::TlsSink` ([`tls`]); nothing above the socket knows the difference.
//!
//! One loop iteration ([`Worker::run`]): poll; accept ([`io`]); read every readable
//! connection (each within a read budget, the rest continued next iteration) and process
//! what it sent (`conn::process`); take the worker's own mail, then let the engine read its
//! mailbox (`Relay::on_mail`);
//! apply the deliveries all this decided ([`apply`]); fire due timers ([`timers`]);
//! let the relay's engine hand its work on (`Relay::flush`: records to the kernel, batches
//! to other workers) *before* any socket is written; flush every connection with output
//! (one `writev` each); then remove closed connections, all in one place ([`close`]).
//! The round's lists and budgets, and the decisions of when a connection yields and when the
//! round's output is written early, are its [`round`]'s.

mod apply;
mod close;
mod io;
mod round;
mod stall;
mod timers;
mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use rustls::ServerConfig;
use slab::Slab;

use crate::conn::{Conn, DeflateKit, IdSource, Shared, Tools};
use crate::http::response;
use crate::mailbox::{Doorbell, Receiver};
use crate::metrics::CoreMetrics;
use crate::registry::answers::AnswerCache;
use crate::registry::Registry;
use crate::relay::{ConnRef, Relay};
use crate::reload::Reload;
use crate::timer::Wheel;
use crate::tls::TlsScratch;
use round::{Handoff, Round};

/// Token of the listener.
pub const LISTENER: Token = Token(usize::MAX - 1);
/// Token of the waker.
pub const WAKER: Token = Token(usize::MAX - 2);
/// Token of the TLS listener.
pub const TLS_LISTENER: Token = Token(usize::MAX - 3);

/// What one read of a connection's socket came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SocketRead {
    /// `n` bytes (for TLS: of ciphertext, its plaintext in the worker's buffer), and whether
    /// they filled what was asked (the socket may hold more).
    Bytes { n: usize, all_asked: bool },
    /// The peer closed its side.
    Eof,
    /// Nothing to read now (or the connection was just failed for oversized input).
    Nothing,
    /// A signal interrupted the call: read again.
    Interrupted,
    /// A socket or TLS error: the connection is closed.
    Failed,
}

impl SocketRead {
    /// The outcome of a `read` of up to `asked` bytes.
    pub(super) fn of(r: std::io::Result<usize>, asked: usize) -> SocketRead {
        match r {
            Ok(0) => SocketRead::Eof,
            Ok(n) => SocketRead::Bytes {
                n,
                all_asked: n >= asked,
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => SocketRead::Nothing,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => SocketRead::Interrupted,
            Err(_) => SocketRead::Failed,
        }
    }
}

/// What the rest of the process tells a worker (its own mailbox; the engine has its own).
#[derive(Debug)]
pub enum Control {
    /// Stop: close every connection and exit.
    Shutdown,
    /// A SIGHUP reload, applied between two connections' input.
    Reload(Reload),
    /// A watch change of a connection of this worker is durable (or could not be made so):
    /// its pending answer `answer` is resolved (`conn::WatchReply`).
    Watched {
        /// The connection.
        conn: ConnRef,
        /// Its answer number.
        answer: u64,
        /// Durable, or why not.
        result: Result<(), crate::notify::WatchError>,
    },
}

/// What a worker's own mail asked of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Orders {
    /// Go on serving.
    Serve,
    /// Begin the shutdown.
    ShutDown,
}

/// What a worker serves: its listeners, and the state a SIGHUP replaces.
pub struct Serving {
    /// Its socket of the plain `SO_REUSEPORT` group (`--listen`), unless `none`.
    pub plain: Option<TcpListener>,
    /// Its socket of the TLS group (`--tls-listen`) and the configuration new TLS
    /// connections start from.
    pub tls: Option<(TcpListener, Arc<ServerConfig>)>,
    /// The registry it answers from.
    pub registry: Arc<Registry>,
}

/// Size of the worker's shared read buffer (one read's worth).
const SCRATCH: usize = 64 << 10;

/// A worker and everything it owns.
pub struct Worker {
    id: usize,
    /// What its loop sleeps on and is woken by.
    waits: Waits,
    /// Its listeners (none once shutdown began).
    listeners: io::Listeners,
    /// Its buffers for reading and writing sockets, shared by all connections.
    bufs: io::Buffers,
    conns: Slab<Conn>,
    relay: Relay,
    shared: Arc<Shared>,
    /// Its timers: the connections' deadlines, the shutdown's.
    timers: Timers,
    /// What it lends the connection it processes (encoding scratch, JSON buffers, the
    /// answer cache, deflate, the auth gate, the limits per address and client).
    tools: Tools,
    /// The round in progress: its lists and budgets.
    round: Round,
    /// The time as this round read it.
    clock: Clock,
    /// The iteration in progress: when it began and what it did, and the long ones.
    iteration: stall::Iterations,
}

/// A worker's timers.
struct Timers {
    /// The connections' deadlines (heartbeats, timeouts), by tick.
    wheel: Wheel,
    /// Set once shutdown began: the time by which to exit.
    stop_at: Option<u64>,
}

/// What a worker's loop sleeps on and is woken by.
#[derive(Debug)]
struct Waits {
    /// Its sockets' readiness (and the doorbell's waker).
    poll: Poll,
    /// The worker's own mailbox.
    control: Receiver<Control>,
    /// Rung by whoever sends to this worker or its engine.
    bell: Arc<Doorbell>,
}

impl Worker {
    /// A worker with its listeners, poll instance (whose waker is in `bell`) and mailbox.
    pub fn new(
        id: usize,
        serving: Serving,
        poll: Poll,
        control: Receiver<Control>,
        bell: Arc<Doorbell>,
        relay: Relay,
        shared: Arc<Shared>,
    ) -> std::io::Result<Worker> {
        let Serving {
            plain: mut listener,
            tls,
            registry,
        } = serving;
        if let Some(l) = listener.as_mut() {
            poll.registry().register(l, LISTENER, Interest::READABLE)?;
        }
        let (mut tls_listener, tls_config) = tls.unzip();
        if let Some(l) = tls_listener.as_mut() {
            poll.registry()
                .register(l, TLS_LISTENER, Interest::READABLE)?;
        }
        let now = crate::clock::now_ms();
        let answer_cache = shared.config.limits.answer_cache;
        let gate = crate::auth::Gate::new(
            shared.config.auth_audience.clone(),
            shared.config.require_auth,
            shared.projects.clone(),
        );
        let policy = shared.limit_policy.clone();
        let round = Round::new(&shared.config.limits, Instant::now());
        shared.metrics.cores[id].last_turn_ms.set(now);
        Ok(Worker {
            id,
            waits: Waits {
                poll,
                control,
                bell,
            },
            listeners: io::Listeners {
                plain: listener,
                tls: tls_listener,
                tls_config,
                retry: false,
                next_uid: 1,
            },
            bufs: io::Buffers {
                scratch: vec![0u8; SCRATCH],
                plain: Vec::new(),
                tls: TlsScratch::default(),
            },
            conns: Slab::with_capacity(1024),
            relay,
            shared,
            timers: Timers {
                wheel: Wheel::new(now),
                stop_at: None,
            },
            tools: Tools {
                ids: IdSource::default(),
                scratch: Vec::with_capacity(4096),
                json: simd_json::Buffers::new(4096),
                registry,
                answers: AnswerCache::new(answer_cache),
                deflate: DeflateKit::default(),
                gate,
                limits: crate::limits::Limiter::new(policy),
                stopping: false,
            },
            round,
            clock: Clock {
                now,
                date: String::new(),
                date_sec: u64::MAX,
                stamp: 0,
            },
            iteration: stall::Iterations::new(Instant::now()),
        })
    }

    fn m(&self) -> &CoreMetrics {
        &self.shared.metrics.cores[self.id]
    }

    /// Runs the loop until shutdown completes.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        loop {
            if !self.wait(&mut events) {
                break;
            }
            for tls in [false, true] {
                if self.round.accept_more[usize::from(tls)] {
                    self.accept(tls);
                }
            }
            for ev in events.iter() {
                self.iteration.work.events += 1;
                match ev.token() {
                    LISTENER => self.accept(false),
                    TLS_LISTENER => self.accept(true),
                    WAKER => {}
                    Token(key) => {
                        self.on_event(key, ev);
                        self.flush_within_round();
                    }
                }
            }
            // The upgrades of this round's events whose tokens are new wait on the ready list:
            // their tokens are verified together, then the upgrades are read again.
            self.tools.gate.settle(crate::clock::unix_ms() / 1000);
            self.resume_ready();
            let orders = self.take_mail();
            self.deliver();
            if orders == Orders::ShutDown {
                self.begin_shutdown();
            }
            if self.timers.stop_at.is_some() {
                self.close_late_upgrades();
            }
            self.iteration.work.timers += self.fire_timers();
            self.iteration.work.writes += self.round.dirty.len() as u32;
            self.round.handoff = self.write_out();
            self.reap();
            self.end_iteration();
            if let Some(stop) = self.timers.stop_at {
                if self.conns.is_empty() || self.clock.now >= stop {
                    break;
                }
            }
        }
        log::debug!(worker = self.id; "worker {} stopped", self.id);
    }

    /// Polls for events (not at all when work is ready); returns `false` if polling failed.
    fn wait(&mut self, events: &mut Events) -> bool {
        let mut timeout = if self.round.has_work() {
            Duration::ZERO
        } else if self.round.handoff == Handoff::Waiting {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(self.timers.wheel.until_next_tick(self.clock.now))
        };
        // Tell senders to wake us, then look once more so no message slips in between.
        self.waits.bell.set_sleeping(true);
        if !self.waits.control.is_empty() || self.relay.has_mail() {
            timeout = Duration::ZERO;
        }
        if let Err(e) = self.waits.poll.poll(events, Some(timeout)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                log::error!(worker = self.id, error:% = e; "worker {}: poll failed: {e}", self.id);
                return false;
            }
        }
        self.waits.bell.set_sleeping(false);
        let began = Instant::now();
        self.clock.tick(began);
        let m = &self.shared.metrics.cores[self.id];
        // `/live`: the loop turned (the poll above waits at most a timer tick).
        m.last_turn_ms.set(self.clock.now);
        self.iteration.begin(began, m);
        self.round.begin(began, self.conns.len());
        self.relay.begin_round(self.clock.stamp);
        self.m().loop_iterations.inc();
        true
    }

    /// Takes the worker's own mail, then lets the engine read its mailbox, within the
    /// round's budget (`--inbox-budget` batches).
    fn take_mail(&mut self) -> Orders {
        let mut orders = Orders::Serve;
        while let Ok(c) = self.waits.control.try_recv() {
            match c {
                Control::Shutdown => orders = Orders::ShutDown,
                Control::Reload(r) => self.apply(r),
                Control::Watched {
                    conn,
                    answer,
                    result,
                } => self.watched(conn, answer, result),
            }
        }
        self.relay.on_mail(self.round.inbox_budget());
        orders
    }

    /// Applies a SIGHUP reload. Connections already open keep their TLS session; a new
    /// registry gets an empty answer cache (the old one's answers carry the old ETags).
    fn apply(&mut self, r: Reload) {
        match r {
            Reload::Tls(config) => {
                if self.listeners.tls_config.is_some() {
                    self.listeners.tls_config = Some(config);
                }
            }
            Reload::Registry(registry) => {
                self.tools.registry = registry;
                self.tools.answers = AnswerCache::new(self.shared.config.limits.answer_cache);
            }
            Reload::Projects(ids) => self.tools.gate.set_projects(ids),
        }
    }

    /// Ends the loop iteration: its output written, the round's acks and pushes become
    /// latency samples (`metrics::latency`); timed into `walletrelay_loop_iteration_seconds`,
    /// a long one counted, and described in the log at most every `stall::LOG_EVERY_MS`.
    fn end_iteration(&mut self) {
        let took = self.iteration.since_start(Instant::now());
        // The round's output is on the sockets: its stamp and the time it took.
        let written = self.clock.stamp.wrapping_add(took.as_micros() as u32);
        self.relay.written(written);
        let m = &self.shared.metrics.cores[self.id];
        if let Some(line) = self.iteration.end_after(took, self.clock.now, m) {
            match self.iteration.run_delay_since_last() {
                Some(ns) => log::warn!(worker = self.id, waited_us = ns / 1_000;
                    "worker {}: {line}; {} µs waiting for the CPU since the last such line",
                    self.id,
                    ns / 1_000
                ),
                None => log::warn!(worker = self.id; "worker {}: {line}", self.id),
            }
        }
    }
}

/// The time as a worker's round read it: once per round, when it wakes.
struct Clock {
    /// Now (ms, `clock::now_ms`).
    now: u64,
    /// This second's HTTP date.
    date: String,
    /// The second `date` is of.
    date_sec: u64,
    /// The round's start as a latency stamp (`clock::stamp`).
    stamp: u32,
}

impl Clock {
    /// Read at `at`.
    fn tick(&mut self, at: Instant) {
        let (now, unix, stamp) = crate::clock::refresh_stamped(at);
        self.now = now;
        self.stamp = stamp;
        let sec = unix / 1000;
        if sec != self.date_sec {
            self.date_sec = sec;
            self.date = response::http_date(std::time::SystemTime::now());
        }
    }
}
