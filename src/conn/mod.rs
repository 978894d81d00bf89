//! One client connection: its slab entry ([`Conn`]), its phase as an explicit state machine
//! ([`Phase`]: HTTP, WebSocket, closing), and what it does with the bytes it receives.
//!
//! The worker reads into a buffer and calls [`process`], which hands the bytes to the phase:
//! [`http`] parses and answers requests (the registry, `/hello`, `/subscribe`...), [`upgrade`]
//! switches a request at `/` to WebSocket, [`websocket`] decodes messages (`ws::Decoder`)
//! and answers control frames, [`waku`] decodes JSON-RPC and [`methods`] (one file per method
//! family, shared with `POST /rpc`, [`rpc_http`]) executes it against the worker's relay share.
//! Answers go to the connection's own output ([`outbound`]: the `OutBuf` and, behind it, the
//! backlog of pushes and answers still waiting, in order).
//!
//! Nothing here touches the socket or another connection: deliveries to other connections
//! are decided by `relay` and carried out by the worker. A TLS connection's session rides
//! along in [`Conn::tls`] for the worker's read and write paths; the phases only ever see
//! plaintext.

pub mod acks;
mod admit;
pub mod answer;
pub mod fetch;
pub mod http;
pub mod methods;
pub mod outbound;
pub mod rpc_http;
pub mod upgrade;
pub mod waku;
pub mod websocket;

#[cfg(test)]
mod tests;
mod turn;

use std::sync::Arc;

use mio::net::TcpStream;

use crate::http::response::Response;
use crate::metrics::{CoreMetrics, Metrics};
use crate::outbuf::OutBuf;
use crate::registry::Registry;
use crate::relay::{ConnRef, Relay, SubId};
use crate::tls::TlsSession;
use crate::webhook::WebhookPool;

pub use outbound::Backlog;
pub use turn::{Step, Turn};
pub use websocket::{DeflateKit, WsState};

/// Everything workers share, read-only.
pub struct Shared {
    /// The configuration.
    pub config: crate::config::Config,
    /// All workers' metrics.
    pub metrics: Arc<Metrics>,
    /// The webhook delivery pool.
    pub webhooks: WebhookPool,
    /// The relay's Ed25519 key (`GET /public-key`, the watches' `relayId`).
    pub relay_key: Arc<crate::identity::RelayKey>,
    /// Watch registrations and the signed POSTs (`irn_watchRegister`...).
    pub notifier: Arc<crate::notify::Notifier>,
    /// Where a watch change's answer goes once the change is durable (see [`WatchReply`]).
    pub watch_reply: WatchReply,
    /// The `/hello` answer.
    pub hello: Response,
    /// What `/health` reports.
    pub health: Arc<crate::health::Health>,
    /// The data layouts the process writes now (`/health`'s `Walletrelay-Layouts`).
    pub layouts: Arc<crate::layout::Current>,
    /// `POST /layout/switch` on the admin address (the Redis engine's; `None` otherwise).
    pub layout_switch: Option<crate::engine::LayoutSwitch>,
    /// The drain (`--drain`): begun, `/ready` answers 503.
    pub drain: Arc<crate::drain::Drain>,
    /// More `/metrics` text (the engines' figures), each appending its own lines.
    pub exporters: Vec<Exporter>,
    /// `--project-ids` as loaded at start (each worker's door starts from it).
    pub projects: Option<Arc<crate::auth::ProjectIds>>,
    /// The limits per client as every worker applies them, with the per-address counts
    /// they share (each worker's `Limiter` starts from a clone).
    pub limit_policy: crate::limits::Policy,
}

/// Appends metrics in the Prometheus text format.
pub use crate::engine::Exporter;

/// Called on a helper thread once a watch change is durable (or could not be made so):
/// (worker, connection, its answer number, result). The server sends it to the worker's own
/// mailbox, where the connection's pending answer is resolved
/// (`worker::Control::Watched`).
pub type WatchReply = Arc<
    dyn Fn(usize, crate::relay::ConnRef, u64, Result<(), crate::notify::WatchError>) + Send + Sync,
>;

/// A subscription as its connection knows it.
#[derive(Debug, Clone, Copy)]
pub struct ConnSub {
    /// Topic slot in the worker's relay share.
    pub slot: u32,
    /// Subscription id.
    pub id: SubId,
}

/// What an HTTP connection waits for before it reads its next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpWait {
    /// Nothing: requests are read as they come.
    Nothing,
    /// The answer to its `POST /subscribe` (from the topic's store); later pipelined
    /// requests wait behind it. `close`: the request asked to close after the answer.
    Webhook {
        /// Close once answered.
        close: bool,
    },
    /// Its output to drain below `--max-outbound` (pipelining backpressure).
    Output,
    /// The answer to its `POST /rpc`, waiting in its backlog for the relay (`rpc_http`).
    /// `close`: the request asked to close after the answer.
    Rpc {
        /// Close once answered.
        close: bool,
    },
}

/// How far a closing connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseStage {
    /// Flushing what is queued; the write side is shut once it is out.
    Flushing,
    /// Write side shut; waiting for the peer to hang up (or the linger deadline).
    Lingering,
}

/// A connection's phase. Moved by value on every transition.
#[derive(Debug)]
pub enum Phase {
    /// Reading HTTP requests.
    Http(HttpWait),
    /// Upgraded.
    Ws(Box<WsState>),
    /// Finishing: flush what is queued, half-close, discard input until the peer hangs up
    /// or the deadline passes.
    Closing {
        /// How far.
        stage: CloseStage,
        /// It was a WebSocket (for the open-WebSockets gauge).
        was_ws: bool,
    },
}

/// The worker's bookkeeping marks on a connection (which of its lists it is on).
#[derive(Debug, Default, Clone, Copy)]
pub struct Marks {
    /// In the flush list.
    pub dirty: bool,
    /// In the ready list (input to resume without an event).
    pub ready: bool,
    /// In the close list (no more work of any kind).
    pub closed: bool,
    /// One of its HTTP requests was read: from then on an idle connection is one that
    /// waits between requests, which a shutdown closes; a connection not yet answered
    /// is still sending its first request, which a shutdown answers first.
    pub answered: bool,
    /// Its upgrade request waits for the round's token checks, already counted: read again,
    /// it is not counted twice.
    pub auth_pending: bool,
}

/// One connection in a worker's slab. `S` is its socket (the protocol state never touches
/// it: the worker reads and writes; unit tests use `()`). 256 bytes with a plain socket in
/// a release build (a unit test holds it there): what few connections need is boxed.
pub struct Conn<S = TcpStream> {
    /// The socket.
    pub sock: S,
    /// The TLS session, for a connection accepted on the TLS listener (boxed: a plain
    /// connection pays one pointer for it).
    pub tls: Option<Box<TlsSession>>,
    /// Unique (per worker) id; guards every cross-reference against slab key reuse.
    pub uid: u64,
    /// Phase.
    pub phase: Phase,
    /// Input received but not yet consumed (a partial head or frame). Empty when idle.
    pub rbuf: Vec<u8>,
    /// Output ready for the socket.
    pub out: OutBuf,
    /// Output waiting behind it, in order (see [`outbound`]).
    pub backlog: Backlog,
    /// The worker's marks.
    pub marks: Marks,
    /// This connection's subscriptions (kept outside the phase so that closing, whatever
    /// the phase by then, always finds them).
    pub subs: Vec<ConnSub>,
    /// Its WalletConnect 1.0 subscriptions (topics), boxed: few connections have any (see
    /// [`Conn::v1_topics`]).
    pub v1: Option<Box<Vec<Arc<str>>>>,
    /// Tick of the live timer-wheel entry (0 = none).
    pub timer_tick: u64,
    /// The phase's deadline (ms): slowloris / keep-alive idle for HTTP, next heartbeat
    /// check for WebSocket, the linger limit for `Closing`.
    pub deadline: u64,
    /// Its place in the worker's per-address and per-client limits (DECISIONS §11),
    /// released when it is removed.
    pub limit: crate::limits::ConnLimit,
}

impl<S> Conn<S> {
    /// A fresh HTTP connection.
    pub fn new(sock: S, uid: u64, deadline: u64) -> Conn<S> {
        Conn {
            sock,
            tls: None,
            uid,
            phase: Phase::Http(HttpWait::Nothing),
            rbuf: Vec::new(),
            out: OutBuf::default(),
            backlog: Backlog::default(),
            marks: Marks::default(),
            subs: Vec::new(),
            v1: None,
            timer_tick: 0,
            deadline,
            limit: crate::limits::ConnLimit::default(),
        }
    }

    /// Its WalletConnect 1.0 subscriptions (topics).
    pub fn v1_topics(&self) -> &[Arc<str>] {
        self.v1.as_deref().map_or(&[], |v| v.as_slice())
    }

    /// Whether this is the connection `r` names (and not a later one in its slab slot).
    pub fn is(&self, r: ConnRef) -> bool {
        self.uid == r.uid && !self.marks.closed
    }

    /// This connection's name for the relay and the worker's lists.
    pub fn at(&self, key: usize) -> ConnRef {
        ConnRef { key, uid: self.uid }
    }

    /// The WebSocket state, if upgraded.
    pub fn ws(&mut self) -> Option<&mut WsState> {
        match &mut self.phase {
            Phase::Ws(w) => Some(w),
            _ => None,
        }
    }

    /// Input waits: an HTTP answer or output is awaited, or too many answers are pending.
    pub fn input_blocked(&self, max_pending: usize) -> bool {
        match &self.phase {
            Phase::Http(w) => *w != HttpWait::Nothing,
            Phase::Ws(_) => self.backlog.pending_answers() >= max_pending,
            Phase::Closing { .. } => false,
        }
    }

    /// Whether it was upgraded to WebSocket at some point.
    pub fn was_ws(&self) -> bool {
        match self.phase {
            Phase::Ws(_) => true,
            Phase::Closing { was_ws, .. } => was_ws,
            Phase::Http(_) => false,
        }
    }

    /// Starts the closing phase: what is queued is flushed, then the write side is shut.
    pub fn begin_close(&mut self, now: u64, flush_ms: u64) {
        self.start_flushing(now, flush_ms);
        self.backlog.clear();
    }

    /// The peer half-closed: answers still owed are sent (those pending included, once
    /// their store answers), pushes are dropped, then the write side is shut.
    pub fn finish(&mut self, now: u64, flush_ms: u64) {
        self.start_flushing(now, flush_ms);
        self.backlog.keep_answers();
    }

    /// Enters the closing phase's first stage, with `flush_ms` to write what is owed.
    fn start_flushing(&mut self, now: u64, flush_ms: u64) {
        let was_ws = self.was_ws();
        self.phase = Phase::Closing {
            stage: CloseStage::Flushing,
            was_ws,
        };
        self.deadline = now + flush_ms;
    }

    /// Queues a WebSocket close frame and starts closing.
    pub fn ws_close(&mut self, code: u16, reason: &str, now: u64, flush_ms: u64) {
        if matches!(self.phase, Phase::Ws(_)) {
            self.out.extend(&crate::ws::close_frame(code, reason));
        }
        self.begin_close(now, flush_ms);
    }
}

/// The connection `r` names in a worker's slab, if it is still that one and not closed:
/// every reference to a connection kept across events (timers, ready list, deliveries,
/// answers) goes through here.
pub fn live(conns: &mut slab::Slab<Conn>, r: ConnRef) -> Option<&mut Conn> {
    conns.get_mut(r.key).filter(|c| c.is(r))
}

/// What [`process`] needs from its worker besides the connection.
pub struct Ctx<'a> {
    /// Worker index.
    pub me: usize,
    /// The connection's slab key.
    pub key: usize,
    /// The time as the worker's round read it.
    pub time: Time<'a>,
    /// Shared read-only state.
    pub shared: &'a Shared,
    /// The worker's relay share.
    pub relay: &'a mut Relay,
    /// The worker's tools, lent to one connection at a time.
    pub tools: &'a mut Tools,
    /// The connection's turn of the worker's round: at its end, or once the round's
    /// fan-out budget is reached, the rest of its input waits in its buffer and the worker
    /// gives the other connections their turn first ([`Turn::stop`]).
    pub turn: Turn,
}

/// The time as a worker's round read it (once per round).
#[derive(Debug, Clone, Copy)]
pub struct Time<'a> {
    /// Now (ms, `clock::now_ms`).
    pub ms: u64,
    /// This second's HTTP date.
    pub date: &'a [u8],
}

/// What a worker owns once and lends to the connection it is processing: buffers reused
/// for every message, caches, and the per-worker tables of auth and limits.
pub struct Tools {
    /// The worker's CSPRNG buffer.
    pub ids: IdSource,
    /// Scratch space for encoding.
    pub scratch: Vec<u8>,
    /// The JSON parser's reusable buffers.
    pub json: simd_json::Buffers,
    /// The registry the worker answers from (replaced on SIGHUP, between two requests).
    pub registry: Arc<Registry>,
    /// The worker's cache of assembled registry answers (emptied with a new registry).
    pub answers: crate::registry::answers::AnswerCache,
    /// The worker's permessage-deflate tools.
    pub deflate: websocket::DeflateKit,
    /// The worker's relay-auth door.
    pub gate: crate::auth::Gate,
    /// The worker's limits per address and client (DECISIONS §11).
    pub limits: crate::limits::Limiter,
    /// The worker is shutting down: every HTTP answer closes its connection.
    pub stopping: bool,
}

impl Ctx<'_> {
    fn metrics(&self) -> &CoreMetrics {
        &self.shared.metrics.cores[self.me]
    }

    /// The connection being processed, as the relay names it.
    fn conn_ref<S>(&self, conn: &Conn<S>) -> ConnRef {
        ConnRef {
            key: self.key,
            uid: conn.uid,
        }
    }

    fn close_ms(&self) -> u64 {
        self.shared.config.limits.close_ms()
    }
}

/// Subscription ids from the OS CSPRNG, fetched 4 KiB at a time.
pub struct IdSource {
    buf: [u8; 4096],
    pos: usize,
}

impl Default for IdSource {
    fn default() -> Self {
        IdSource {
            buf: [0; 4096],
            pos: 4096,
        }
    }
}

impl IdSource {
    /// A fresh id.
    pub fn next_id(&mut self) -> SubId {
        SubId::from_bytes(&self.next_raw())
    }

    /// 32 fresh random bytes.
    fn next_raw(&mut self) -> [u8; 32] {
        if self.pos + 32 > self.buf.len() {
            // The OS CSPRNG does not fail on Linux once seeded; if it ever did, refusing to
            // hand out predictable ids is the only safe answer.
            #[allow(
                clippy::expect_used,
                reason = "no input reaches it; predictable ids are worse"
            )]
            getrandom::fill(&mut self.buf).expect("OS random number generator failed");
            self.pos = 0;
        }
        let mut id = [0u8; 32];
        id.copy_from_slice(&self.buf[self.pos..self.pos + 32]);
        self.pos += 32;
        id
    }

    /// A random u64 (for push-id starting points).
    pub fn next_u64(&mut self) -> u64 {
        let id = self.next_raw();
        let mut b = [0u8; 8];
        b.copy_from_slice(&id[..8]);
        u64::from_le_bytes(b)
    }
}

/// Consumes as much of `input` as forms complete requests or messages; returns the number
/// of bytes consumed and why it stopped. `input` may be modified in place (unmasking, JSON
/// parsing).
pub fn process<S>(conn: &mut Conn<S>, input: &mut [u8], ctx: &mut Ctx<'_>) -> (usize, Step) {
    let max_pending = ctx.shared.config.limits.max_pending_answers;
    let mut pos = 0;
    loop {
        let before = pos;
        if conn.input_blocked(max_pending) {
            break;
        }
        match conn.phase {
            Phase::Http(_) => pos += http::step(conn, &mut input[pos..], ctx),
            Phase::Ws(_) => pos += websocket::step(conn, &mut input[pos..], ctx),
            Phase::Closing { .. } => return (input.len(), Step::Closed),
        }
        if pos == before || pos >= input.len() || ctx.turn.over() {
            break;
        }
    }
    let step = match conn.phase {
        Phase::Closing { .. } => Some(Step::Closed),
        _ => ctx.turn.stop(conn, ctx.relay, max_pending),
    };
    (pos, step.unwrap_or(Step::Drained))
}
