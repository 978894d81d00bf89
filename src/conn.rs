//! One client connection: its slab entry ([`Conn`]), its phase as an explicit state machine
//! ([`Phase`]: HTTP, WebSocket, closing), and what it does with the bytes it receives:
//! HTTP requests are routed and answered, a WebSocket upgrade switches the phase, frames are
//! decoded, JSON-RPC requests are executed against the worker's relay share.
//!
//! Nothing here touches the socket or other connections: the worker reads into a buffer and
//! calls [`process`]; answers go to the connection's own [`OutBuf`], deliveries to other
//! connections are decided by `relay` and carried out by the worker.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use mio::net::TcpStream;

use crate::http::{self, response, response::Response, Method, Route};
use crate::metrics::Metrics;
use crate::outbuf::OutBuf;
use crate::registry::Registry;
use crate::relay::{Relay, SubId, WebhookRegistration};
use crate::rpc::{self, Id, Incoming, Item, Op, RpcError};
use crate::webhook::WebhookPool;
use crate::ws::{self, close, Opcode, Reassembly, WsError};

/// Milliseconds a half-closed connection is given to hang up after its last bytes.
pub const LINGER_MS: u64 = 2000;

/// Everything workers share, read-only.
pub struct Shared {
    /// The configuration.
    pub config: crate::config::Config,
    /// The registry.
    pub registry: Arc<Registry>,
    /// All workers' metrics.
    pub metrics: Arc<Metrics>,
    /// The webhook delivery pool.
    pub webhooks: WebhookPool,
    /// The `/hello` answer.
    pub hello: Response,
}

/// A subscription as its connection knows it.
#[derive(Debug, Clone, Copy)]
pub struct ConnSub {
    /// Topic slot in the worker's relay share.
    pub slot: u32,
    /// Subscription id.
    pub id: SubId,
}

/// WebSocket phase state.
#[derive(Debug)]
pub struct WsState {
    /// Test-only echo connection (`/echo`, `--ws-echo`) instead of the relay.
    pub echo: bool,
    /// A fragmented message in progress.
    pub frag: Reassembly,
    /// JSON-RPC id of the next `waku_subscription` push (unique on the connection).
    pub next_push_id: u64,
    /// When the peer last sent anything (ms).
    pub last_rx: u64,
    /// When the server sends its next ping (ms).
    pub next_ping: u64,
}

/// A connection's phase. Moved by value on every transition.
#[derive(Debug)]
pub enum Phase {
    /// Reading HTTP requests.
    Http {
        /// A `POST /subscribe` answer is awaited from the topic's home worker; later
        /// pipelined requests wait behind it.
        awaiting: bool,
    },
    /// Upgraded.
    Ws(Box<WsState>),
    /// Finishing: flush what is queued, half-close, discard input until the peer hangs up
    /// or the deadline passes.
    Closing,
}

/// A push waiting in a connection's backlog.
#[derive(Debug)]
pub struct Queued {
    /// Subscription id.
    pub id: SubId,
    /// Encoded data object (shared with the cache and other subscribers).
    pub data: Bytes,
    /// A live message (counted against the outbound limit) rather than a replayed one.
    pub live: bool,
}

/// One connection in a worker's slab.
pub struct Conn {
    /// The socket.
    pub sock: TcpStream,
    /// Unique (per worker) id; guards every cross-reference against slab key reuse.
    pub uid: u64,
    /// Phase.
    pub phase: Phase,
    /// Input received but not yet consumed (a partial head or frame). Empty when idle.
    pub rbuf: Vec<u8>,
    /// Output waiting for the socket.
    pub out: OutBuf,
    /// Pushes not yet encoded into `out` because it holds enough already: a cache replay
    /// (references into the cache) and whatever follows it, so that order is kept.
    pub backlog: VecDeque<Queued>,
    /// Bytes of live (not replayed) messages in `backlog`; they count against
    /// `--max-outbound` like `out` does.
    pub backlog_live: usize,
    /// In the worker's flush list.
    pub dirty: bool,
    /// In the worker's ready list (input to resume without an event).
    pub ready: bool,
    /// In the worker's close list (no more work of any kind).
    pub closed: bool,
    /// Input processing paused until output drains (HTTP pipelining backpressure).
    pub paused: bool,
    /// Half-close after the output is flushed (phase `Closing`).
    pub shutdown_pending: bool,
    /// Upgraded to WebSocket at some point (for the open-WebSockets gauge).
    pub is_ws: bool,
    /// This connection's subscriptions (kept outside the phase so that closing, whatever
    /// the phase by then, always finds them).
    pub subs: Vec<ConnSub>,
    /// Tick of the live timer-wheel entry (0 = none).
    pub timer_tick: u64,
    /// The phase's deadline (ms): slowloris / keep-alive idle for HTTP, next heartbeat
    /// check for WebSocket, the linger limit for `Closing`.
    pub deadline: u64,
}

impl Conn {
    /// A fresh HTTP connection.
    pub fn new(sock: TcpStream, uid: u64, deadline: u64) -> Conn {
        Conn {
            sock,
            uid,
            phase: Phase::Http { awaiting: false },
            rbuf: Vec::new(),
            out: OutBuf::default(),
            backlog: VecDeque::new(),
            backlog_live: 0,
            dirty: false,
            ready: false,
            closed: false,
            paused: false,
            shutdown_pending: false,
            is_ws: false,
            subs: Vec::new(),
            timer_tick: 0,
            deadline,
        }
    }

    /// The WebSocket state, if upgraded.
    pub fn ws(&mut self) -> Option<&mut WsState> {
        match &mut self.phase {
            Phase::Ws(w) => Some(w),
            _ => None,
        }
    }

    /// Starts the closing phase: what is queued is flushed, then the write side is shut.
    pub fn begin_close(&mut self, now: u64, flush_ms: u64) {
        self.phase = Phase::Closing;
        self.shutdown_pending = true;
        self.paused = false;
        self.backlog = VecDeque::new();
        self.backlog_live = 0;
        self.deadline = now + flush_ms;
    }

    /// Bytes queued for this connection that count against `--max-outbound`.
    pub fn outbound_len(&self) -> usize {
        self.out.len() + self.backlog_live
    }

    /// Delivers a push: encoded into `out` while it holds less than `fill_mark` bytes and
    /// nothing waits before it, else queued (by reference) in the backlog.
    pub fn deliver(
        &mut self,
        id: &SubId,
        data: &Bytes,
        live: bool,
        fill_mark: usize,
        share_min: usize,
        scratch: &mut Vec<u8>,
    ) {
        if self.backlog.is_empty() && self.out.len() < fill_mark {
            self.push_message(id, data, share_min, scratch);
        } else {
            if live {
                self.backlog_live += data.len();
            }
            self.backlog.push_back(Queued {
                id: *id,
                data: data.clone(),
                live,
            });
        }
    }

    /// Moves backlog entries into `out` until it holds `fill_mark` bytes; returns whether
    /// anything moved.
    pub fn refill(&mut self, fill_mark: usize, scratch: &mut Vec<u8>) -> bool {
        let mut moved = false;
        while self.out.len() < fill_mark {
            let Some(q) = self.backlog.pop_front() else {
                break;
            };
            if q.live {
                self.backlog_live -= q.data.len();
            }
            self.push_message(&q.id, &q.data, crate::outbuf::PUSH_SHARE_MIN, scratch);
            moved = true;
        }
        if self.backlog.is_empty() && self.backlog.capacity() > 64 {
            self.backlog = VecDeque::new();
        }
        moved
    }

    /// Queues a WebSocket close frame and starts closing.
    pub fn ws_close(&mut self, code: u16, reason: &str, now: u64, flush_ms: u64) {
        if matches!(self.phase, Phase::Ws(_)) {
            self.out.extend(&ws::close_frame(code, reason));
        }
        self.begin_close(now, flush_ms);
    }

    /// Queues a text frame.
    pub fn send_text(&mut self, payload: &[u8]) {
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, Opcode::Text, payload.len());
        self.out.extend(&h[..n]);
        self.out.extend(payload);
    }

    /// Queues a `waku_subscription` push of `data` for subscription `id`.
    pub fn push_message(
        &mut self,
        id: &SubId,
        data: &Bytes,
        share_min: usize,
        scratch: &mut Vec<u8>,
    ) {
        let Phase::Ws(w) = &mut self.phase else {
            return;
        };
        scratch.clear();
        rpc::write_push_prefix(scratch, w.next_push_id, id.hex());
        w.next_push_id += 1;
        let len = scratch.len() + data.len() + rpc::PUSH_SUFFIX.len();
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, Opcode::Text, len);
        self.out.extend(&h[..n]);
        self.out.extend(scratch);
        self.out.push_shared(data, share_min);
        self.out.extend(rpc::PUSH_SUFFIX);
    }
}

/// What `process` needs from its worker besides the connection.
pub struct Ctx<'a> {
    /// Worker index.
    pub me: usize,
    /// The connection's slab key.
    pub key: usize,
    /// Now (ms).
    pub now: u64,
    /// This second's HTTP date.
    pub date: &'a [u8],
    /// Shared read-only state.
    pub shared: &'a Shared,
    /// The worker's relay share.
    pub relay: &'a mut Relay,
    /// The worker's CSPRNG buffer.
    pub ids: &'a mut IdSource,
    /// Scratch space for encoding.
    pub scratch: &'a mut Vec<u8>,
    /// The JSON parser's reusable buffers.
    pub json: &'a mut simd_json::Buffers,
    /// The worker's cache of assembled registry answers.
    pub answers: &'a mut crate::registry::answers::AnswerCache,
}

impl Ctx<'_> {
    fn metrics(&self) -> &crate::metrics::CoreMetrics {
        &self.shared.metrics.cores[self.me]
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

/// Consumes as much of `input` as forms complete requests or frames; returns the number of
/// bytes consumed. `input` may be modified in place (unmasking, JSON parsing).
pub fn process(conn: &mut Conn, input: &mut [u8], ctx: &mut Ctx<'_>) -> usize {
    let mut pos = 0;
    loop {
        let before = pos;
        match conn.phase {
            Phase::Http { awaiting } => {
                if awaiting || conn.paused {
                    return pos;
                }
                pos += http_step(conn, &mut input[pos..], ctx);
            }
            Phase::Ws(_) => {
                pos += ws_step(conn, &mut input[pos..], ctx);
            }
            Phase::Closing => return input.len(),
        }
        if pos == before || pos >= input.len() {
            return pos;
        }
    }
}

// ---------------------------------------------------------------------------------------
// HTTP

/// Handles at most one request; returns bytes consumed (0 = need more input or stopped).
fn http_step(conn: &mut Conn, input: &mut [u8], ctx: &mut Ctx<'_>) -> usize {
    let limits = &ctx.shared.config.limits;
    let (n, req) = match http::parse(input, limits) {
        Ok(Some(r)) => r,
        Ok(None) => return 0,
        Err(e) => {
            let resp = Response::json_error(e.status(), &e.to_string());
            response::write(&mut conn.out, &resp, ctx.date, false, true);
            ctx.metrics().http_requests.inc();
            conn.begin_close(ctx.now, ctx.shared.config.limits.close_ms());
            return input.len();
        }
    };
    ctx.metrics().http_requests.inc();
    let head_only = req.method == Method::Head;
    let close = req.close;
    let route = http::route(req.method, req.path, ctx.shared.config.ws_echo);
    let resp = match route {
        Route::Hello => ctx.shared.hello.clone(),
        Route::Health => Response::empty(204),
        Route::Metrics => {
            let pool = &ctx.shared.webhooks;
            let body = ctx.shared.metrics.render(&|s| pool.render_metrics(s));
            Response::new(200, "text/plain; version=0.0.4; charset=utf-8", body)
        }
        Route::Registry => ctx.answers.respond(&ctx.shared.registry, &req),
        Route::Preflight(allow) => Response::empty(204)
            .with_header("Allow", allow)
            .with_header("Access-Control-Allow-Methods", allow)
            .with_header(
                "Access-Control-Allow-Headers",
                "Content-Type, If-None-Match",
            )
            .with_header("Access-Control-Max-Age", "86400"),
        Route::MethodNotAllowed(allow) => {
            Response::json_error(405, "method not allowed").with_header("Allow", allow)
        }
        Route::NotFound => Response::json_error(404, "not found"),
        Route::Subscribe => match crate::webhook::validate_registration(req.body) {
            Err(e) => subscribe_answer(Err((400, &e.to_string()))),
            Ok((topic, url)) => {
                if topic.len() > limits.max_topic {
                    subscribe_answer(Err((400, "Missing or invalid \"topic\" param")))
                } else {
                    match ctx.relay.add_webhook(&topic, &url, (ctx.key, conn.uid)) {
                        WebhookRegistration::Done(r) => subscribe_answer(r),
                        WebhookRegistration::Deferred => {
                            // The answer comes from the home worker; hold later requests.
                            conn.phase = Phase::Http { awaiting: true };
                            if close {
                                conn.shutdown_pending = true;
                            }
                            return n;
                        }
                    }
                }
            }
        },
        Route::Relay | Route::Echo => {
            return if upgrade(conn, &req, route == Route::Echo, ctx) {
                n
            } else {
                input.len()
            };
        }
    };
    response::write(&mut conn.out, &resp, ctx.date, head_only, close);
    if close {
        conn.begin_close(ctx.now, ctx.shared.config.limits.close_ms());
        return input.len();
    }
    // Next request: its head must arrive in time (or the connection idles).
    conn.deadline = ctx.now
        + if n < input.len() {
            limits.head_timeout().as_millis() as u64
        } else {
            limits.keepalive_timeout().as_millis() as u64
        };
    if conn.out.len() > limits.max_outbound {
        conn.paused = true;
    }
    n
}

/// The `POST /subscribe` answer.
pub fn subscribe_answer(r: Result<(), (u16, &str)>) -> Response {
    match r {
        Ok(()) => Response::new(200, response::JSON, &b"{\"success\":true}"[..]),
        Err((status, msg)) => {
            // Key order as the reference relay sent it: success first.
            let mut body = b"{\"success\":false,\"error\":".to_vec();
            rpc::write_str(&mut body, msg);
            body.push(b'}');
            Response::new(status, response::JSON, body)
        }
    }
}

/// Answers a WebSocket upgrade request; `false` when it was refused (and the connection is
/// closing).
fn upgrade(conn: &mut Conn, req: &http::Request<'_>, echo: bool, ctx: &mut Ctx<'_>) -> bool {
    let fail = |conn: &mut Conn, resp: Response, ctx: &mut Ctx<'_>| {
        response::write(&mut conn.out, &resp, ctx.date, false, true);
        conn.begin_close(ctx.now, ctx.shared.config.limits.close_ms());
        false
    };
    if !req.upgrade_websocket {
        fail(
            conn,
            Response::json_error(426, "WebSocket upgrade required")
                .with_header("Upgrade", "websocket"),
            ctx,
        )
    } else if req.ws_version != Some(b"13") {
        fail(
            conn,
            Response::json_error(426, "unsupported WebSocket version")
                .with_header("Sec-WebSocket-Version", "13"),
            ctx,
        )
    } else if req.ws_key.is_none_or(|k| k.len() != 24) {
        fail(
            conn,
            Response::json_error(400, "missing or invalid Sec-WebSocket-Key"),
            ctx,
        )
    } else {
        let accept = ws::accept_key(req.ws_key.unwrap_or_default());
        let head = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\nX-Walletrelay-Worker: {}\r\n\r\n",
            ctx.me
        );
        conn.out.extend(head.as_bytes());
        let push_base = crate::clock::unix_ms() * 1000 + ctx.ids.next_u64() % 1000;
        // The first ping comes a random half to whole interval after the upgrade, so that
        // connections opened together (a reconnect storm after a restart) are not all
        // pinged in one loop iteration every interval: 1,276 pings at once were a 5 ms
        // iteration every 30 s at 2,000 connections (docs/PERFORMANCE.md).
        let interval = ctx.shared.config.limits.ping_interval().as_millis() as u64;
        let first_ping = ctx.now + interval - ctx.ids.next_u64() % (interval / 2 + 1);
        conn.phase = Phase::Ws(Box::new(WsState {
            echo,
            frag: Reassembly::default(),
            next_push_id: push_base,
            last_rx: ctx.now,
            next_ping: first_ping,
        }));
        conn.deadline = first_ping;
        conn.is_ws = true;
        ctx.metrics().websockets_open.inc();
        true
    }
}

// ---------------------------------------------------------------------------------------
// WebSocket

/// Handles complete frames at the front of `input`; returns bytes consumed.
fn ws_step(conn: &mut Conn, input: &mut [u8], ctx: &mut Ctx<'_>) -> usize {
    let max = ctx.shared.config.limits.max_message;
    let mut pos = 0;
    // Past the fan-out budget the rest waits in the connection's buffer: the worker
    // delivers and flushes first, then resumes it (see `relay::FANOUT_MIN`).
    while matches!(conn.phase, Phase::Ws(_)) && !ctx.relay.over_fanout_budget() {
        let head = match ws::parse_head(&input[pos..], max) {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                fail(conn, &e, ctx);
                return input.len();
            }
        };
        if input.len() - pos < head.frame_len() {
            break;
        }
        let start = pos + head.header_len;
        let end = pos + head.frame_len();
        pos = end;
        let payload = &mut input[start..end];
        ws::unmask(payload, head.mask, 0);
        if let Some(w) = conn.ws() {
            w.last_rx = ctx.now;
        }
        if let Err(e) = on_frame(conn, head.fin, head.opcode, payload, ctx) {
            fail(conn, &e, ctx);
            return input.len();
        }
    }
    pos
}

fn fail(conn: &mut Conn, e: &WsError, ctx: &mut Ctx<'_>) {
    ctx.metrics().protocol_closes.inc();
    let reason = match e {
        WsError::Protocol(r) => r,
        WsError::TooBig => "message too big",
        WsError::InvalidUtf8 => "invalid UTF-8",
    };
    conn.ws_close(
        e.close_code(),
        reason,
        ctx.now,
        ctx.shared.config.limits.close_ms(),
    );
}

fn on_frame(
    conn: &mut Conn,
    fin: bool,
    op: Opcode,
    payload: &mut [u8],
    ctx: &mut Ctx<'_>,
) -> Result<(), WsError> {
    let max = ctx.shared.config.limits.max_message;
    let Some(w) = conn.ws() else { return Ok(()) };
    match op {
        Opcode::Text | Opcode::Binary => {
            if w.frag.opcode.is_some() {
                return Err(WsError::Protocol("new message inside a fragmented one"));
            }
            if fin {
                on_message(conn, op, payload, ctx)?;
            } else {
                w.frag.start(op, payload)?;
            }
        }
        Opcode::Continuation => {
            if w.frag.opcode.is_none() {
                return Err(WsError::Protocol("continuation without a message"));
            }
            w.frag.push(payload, max)?;
            if fin {
                let (op, mut buf) = w.frag.finish();
                on_message(conn, op, &mut buf, ctx)?;
            }
        }
        Opcode::Ping => {
            let mut h = [0u8; 10];
            let n = ws::write_head(&mut h, true, Opcode::Pong, payload.len());
            conn.out.extend(&h[..n]);
            conn.out.extend(payload);
        }
        Opcode::Pong => {}
        Opcode::Close => {
            let code = ws::check_close_payload(payload)?;
            let reply = if code == 1005 { close::NORMAL } else { code };
            conn.ws_close(reply, "", ctx.now, ctx.shared.config.limits.close_ms());
        }
    }
    Ok(())
}

fn on_message(
    conn: &mut Conn,
    op: Opcode,
    payload: &mut [u8],
    ctx: &mut Ctx<'_>,
) -> Result<(), WsError> {
    if op == Opcode::Text && simdutf8::basic::from_utf8(payload).is_err() {
        return Err(WsError::InvalidUtf8);
    }
    let echo = conn.ws().is_some_and(|w| w.echo);
    if echo {
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, op, payload.len());
        conn.out.extend(&h[..n]);
        conn.out.extend(payload);
        return Ok(());
    }
    rpc_message(conn, payload, ctx);
    Ok(())
}

/// Executes a JSON-RPC message and queues its answer (if any).
fn rpc_message(conn: &mut Conn, payload: &mut [u8], ctx: &mut Ctx<'_>) {
    let mut out = std::mem::take(ctx.scratch);
    out.clear();
    match rpc::decode(payload, ctx.json) {
        Err(_) => {
            rpc::write_error(
                &mut out,
                &Id::Null,
                &RpcError {
                    code: rpc::code::PARSE_ERROR,
                    message: "Parse error".into(),
                },
            );
            ctx.metrics().rpc_errors.inc();
        }
        Ok(Incoming::Single(item)) => {
            run_item(conn, item, &mut out, ctx);
        }
        Ok(Incoming::Batch(items)) => {
            out.push(b'[');
            for item in items {
                let before = out.len();
                if before > 1 {
                    out.push(b',');
                }
                if !run_item(conn, item, &mut out, ctx) {
                    out.truncate(before);
                }
            }
            if out.len() == 1 {
                out.clear();
            } else {
                out.push(b']');
            }
        }
    }
    if !out.is_empty() {
        conn.send_text(&out);
    }
    if out.capacity() > 64 << 10 {
        out = Vec::with_capacity(4096);
    }
    *ctx.scratch = out;
}

/// Runs one element; appends its answer to `out` and returns whether it wrote one.
fn run_item(conn: &mut Conn, item: Item<'_>, out: &mut Vec<u8>, ctx: &mut Ctx<'_>) -> bool {
    match item {
        Item::Ack => false,
        Item::Invalid(id, e) => {
            ctx.metrics().rpc_errors.inc();
            rpc::write_error(out, &id, &e);
            true
        }
        Item::Call(call) => {
            let id = call.id.clone();
            let result = call
                .op(ctx.shared.config.limits.max_topic)
                .and_then(|op| execute(conn, op, ctx));
            let Some(id) = id else { return false };
            match result {
                Ok(None) => rpc::write_result(out, &id, b"true"),
                Ok(Some(sub)) => {
                    let mut r = [b'"'; 66];
                    r[1..65].copy_from_slice(sub.hex());
                    rpc::write_result(out, &id, &r);
                }
                Err(e) => {
                    ctx.metrics().rpc_errors.inc();
                    rpc::write_error(out, &id, &e);
                }
            }
            true
        }
    }
}

/// Runs a validated operation. Its result is `true`, or a subscription id.
fn execute(conn: &mut Conn, op: Op<'_>, ctx: &mut Ctx<'_>) -> Result<Option<SubId>, RpcError> {
    let uid = conn.uid;
    let key = ctx.key;
    let max_subs = ctx.shared.config.limits.max_subscriptions;
    if !matches!(conn.phase, Phase::Ws(_)) {
        return Err(RpcError::server("connection is closing"));
    }
    let subs = &mut conn.subs;
    match op {
        Op::Subscribe { topic } => {
            let existing = subs
                .iter()
                .find(|s| ctx.relay.topic(s.slot).is_some_and(|t| *t.name == *topic));
            let id = match existing {
                Some(s) => s.id,
                None => {
                    if subs.len() >= max_subs {
                        return Err(RpcError::server(format!(
                            "Subscription limit reached ({max_subs} per connection)"
                        )));
                    }
                    let id = ctx.ids.next_id();
                    let slot = ctx.relay.subscribe(key, uid, &topic, id);
                    subs.push(ConnSub { slot, id });
                    id
                }
            };
            Ok(Some(id))
        }
        Op::Publish {
            topic,
            message,
            ttl,
            prompt,
        } => {
            let data = Bytes::from(rpc::encode_data(&topic, &message));
            ctx.relay.publish(&topic, data, ttl, prompt, uid);
            Ok(None)
        }
        Op::Unsubscribe { topic, id } => {
            if let Some(id) = SubId::from_hex(&id) {
                let pos = subs.iter().position(|s| {
                    s.id == id
                        && topic
                            .as_ref()
                            .is_none_or(|t| ctx.relay.topic(s.slot).is_some_and(|x| *x.name == **t))
                });
                if let Some(p) = pos {
                    let s = subs.swap_remove(p);
                    ctx.relay.unsubscribe(s.slot, key, uid);
                }
            }
            Ok(None)
        }
    }
}
