//! A connection in its WebSocket phase: whole messages off the front of its input, as the
//! codec decodes them (`ws`); control frames answered here (pong, the close handshake), data
//! messages handed to [`super::waku`] (or echoed on the test-only `/echo` route). A protocol
//! violation closes the connection with the codec's close code.

use super::{waku, Conn, Ctx};
use crate::ws::{self, close, Opcode, Reassembly, WsError};

/// WebSocket phase state.
#[derive(Debug)]
pub struct WsState {
    /// Test-only echo connection (`/echo`, `--ws-echo`) instead of the relay.
    pub echo: bool,
    /// A fragmented message in progress.
    frag: Reassembly,
    /// Largest message (`--max-message`).
    max_message: usize,
    /// JSON-RPC id of the next `waku_subscription` push (unique on the connection).
    pub next_push_id: u64,
    /// The connection's number for its next pending answer (see `outbound::Part`).
    pub next_answer: u64,
    /// When the peer last sent anything (ms).
    pub last_rx: u64,
    /// When the server sends its next ping (ms).
    pub next_ping: u64,
}

impl WsState {
    /// A fresh WebSocket phase at `now`, first ping at `first_ping`.
    pub fn new(echo: bool, max_message: usize, push_base: u64, now: u64, first_ping: u64) -> Self {
        WsState {
            echo,
            frag: Reassembly::default(),
            max_message,
            next_push_id: push_base,
            next_answer: 1,
            last_rx: now,
            next_ping: first_ping,
        }
    }
}

/// Handles complete frames at the front of `input`; returns bytes consumed.
pub fn step<S>(conn: &mut Conn<S>, input: &mut [u8], ctx: &mut Ctx<'_>) -> usize {
    let max = ctx.shared.config.limits.max_message;
    let max_pending = ctx.shared.config.limits.max_pending_answers;
    let mut pos = 0;
    // Past the fan-out budget, or with too many answers pending, the rest waits in the
    // connection's buffer: the worker delivers and flushes first, then resumes it.
    while !ctx.relay.over_fanout_budget() && !conn.input_blocked(max_pending) {
        if conn.ws().is_none() {
            break;
        }
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

/// Closes the connection for a protocol violation, with the error's close code.
fn fail<S>(conn: &mut Conn<S>, e: &WsError, ctx: &mut Ctx<'_>) {
    ctx.metrics().protocol_closes.inc();
    let reason = match e {
        WsError::Protocol(r) => r,
        WsError::TooBig => "message too big",
        WsError::InvalidUtf8 => "invalid UTF-8",
    };
    conn.ws_close(e.close_code(), reason, ctx.now, ctx.close_ms());
}

fn on_frame<S>(
    conn: &mut Conn<S>,
    fin: bool,
    op: Opcode,
    payload: &mut [u8],
    ctx: &mut Ctx<'_>,
) -> Result<(), WsError> {
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
            let max = w.max_message;
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
            conn.ws_close(reply, "", ctx.now, ctx.close_ms());
        }
    }
    Ok(())
}

fn on_message<S>(
    conn: &mut Conn<S>,
    op: Opcode,
    payload: &mut [u8],
    ctx: &mut Ctx<'_>,
) -> Result<(), WsError> {
    if op == Opcode::Text && simdutf8::basic::from_utf8(payload).is_err() {
        return Err(WsError::InvalidUtf8);
    }
    if conn.ws().is_some_and(|w| w.echo) {
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, op, payload.len());
        conn.out.extend(&h[..n]);
        conn.out.extend(payload);
        return Ok(());
    }
    waku::message(conn, payload, ctx);
    Ok(())
}
