//! A connection in its WebSocket phase: whole messages off the front of its input, as the
//! codec decodes them (`ws`); control frames answered here (pong, the close handshake), data
//! messages handed to [`super::waku`] (or echoed on the test-only `/echo` route). A protocol
//! violation closes the connection with the codec's close code.

use std::sync::Arc;

use super::fetch::Cursors;
use super::{waku, Conn, Ctx};
use crate::auth::ClientKey;
use crate::engine::ClientRef;
use crate::ws::deflate::{self, Agreement, Deflater, Inflater, Shared};
use crate::ws::{self, Decoder, Event, Opcode, WsError};

/// A worker's permessage-deflate tools, shared by its connections: nothing is kept per
/// connection but its two-byte [`Agreement`] (no context takeover).
#[derive(Default)]
pub struct DeflateKit {
    inflater: Inflater,
    /// The compressor (answers, echoes, pushes).
    pub deflater: Deflater,
    /// The last inflated message.
    inflated: Vec<u8>,
    /// The last compressed answer.
    z: Vec<u8>,
    /// The push being fanned out, compressed once for all its subscribers on this worker:
    /// in the beta shape (0) and the `irn` shape (1).
    pub push: [Option<Shared>; 2],
}

impl DeflateKit {
    /// Lets go of a large buffer after a large message.
    fn trim(&mut self) {
        if self.inflated.capacity() > 64 << 10 {
            self.inflated = Vec::new();
        }
        if self.z.capacity() > 64 << 10 {
            self.z = Vec::new();
        }
    }
}

/// WebSocket phase state: one allocation per upgraded connection, kept within mimalloc's
/// 128-byte size class (a unit test holds it there): what not every connection has is
/// boxed apart (`Rare`, 16 bytes).
#[derive(Debug)]
pub struct WsState {
    /// Test-only echo connection (`/echo`, `--ws-echo`) instead of the relay.
    pub echo: bool,
    /// The message decoder (holds a fragmented message in progress, nothing when idle).
    dec: Decoder,
    /// permessage-deflate, when negotiated.
    pub deflate: Option<Agreement>,
    /// The connection's number for its next pending answer (see `outbound::Part`).
    pub next_answer: u64,
    /// When the peer last sent anything (ms).
    pub last_rx: u64,
    /// When the server sends its next ping (ms).
    pub next_ping: u64,
    /// Its relay-auth client and fetch cursors, made when it has either.
    rare: Option<Box<Rare>>,
    /// Its own rate-limit buckets and refusals in a row (DECISIONS §11).
    pub limits: crate::limits::ConnBuckets,
}

/// The parts of a WebSocket's state that only some connections have, boxed together so that
/// the others pay one pointer for them.
#[derive(Debug, Default)]
struct Rare {
    /// The client id a valid relay-auth JWT gave (DECISIONS §10): subscription ids are
    /// then the ones the client computes itself. Shared by the connections of one token.
    client: Option<Arc<ClientKey>>,
    /// What fetches gave the connection, per topic (made on its first fetch).
    cursors: Option<Box<Cursors>>,
    /// The client id with its project, as its subscriptions name it (DECISIONS 13).
    client_ref: Option<Arc<ClientRef>>,
    /// Pushes to a watched client waiting for their acknowledgement.
    acks: Option<Box<super::acks::Unacked>>,
}

impl WsState {
    /// A fresh WebSocket phase at `now`, first ping at `first_ping`.
    pub fn new(
        echo: bool,
        max_message: usize,
        deflate: Option<Agreement>,
        now: u64,
        first_ping: u64,
    ) -> Self {
        let mut dec = Decoder::new(max_message);
        dec.set_deflate(deflate.is_some());
        WsState {
            echo,
            dec,
            deflate,
            next_answer: 1,
            last_rx: now,
            next_ping: first_ping,
            rare: None,
            limits: crate::limits::ConnBuckets::default(),
        }
    }

    /// The client id its relay-auth JWT gave, if any.
    pub fn client(&self) -> Option<&Arc<ClientKey>> {
        self.rare.as_ref()?.client.as_ref()
    }

    /// Keeps the client id its relay-auth JWT gave.
    pub fn set_client(&mut self, client: Option<Arc<ClientKey>>) {
        if client.is_some() || self.rare.is_some() {
            self.rare.get_or_insert_with(Default::default).client = client;
        }
    }

    /// The client id and project its subscriptions belong to, if it has a client id.
    pub fn client_ref(&self) -> Option<&Arc<ClientRef>> {
        self.rare.as_ref()?.client_ref.as_ref()
    }

    /// Keeps the client id and project (set with the client id at the upgrade).
    pub fn set_client_ref(&mut self, c: Arc<ClientRef>) {
        self.rare.get_or_insert_with(Default::default).client_ref = Some(c);
    }

    /// Its pushes waiting for an acknowledgement, made if needed.
    pub fn acks_mut(&mut self) -> &mut super::acks::Unacked {
        self.rare
            .get_or_insert_with(Default::default)
            .acks
            .get_or_insert_with(Default::default)
    }

    /// Its pushes waiting for an acknowledgement, if it has any.
    pub fn acks(&mut self) -> Option<&mut super::acks::Unacked> {
        self.rare.as_mut()?.acks.as_deref_mut()
    }

    /// Its fetch cursors, if a fetch gave it any.
    pub fn cursors(&self) -> Option<&Cursors> {
        self.rare.as_ref()?.cursors.as_deref()
    }

    /// Its fetch cursors, made if needed.
    pub fn cursors_mut(&mut self) -> &mut Cursors {
        self.rare
            .get_or_insert_with(Default::default)
            .cursors
            .get_or_insert_with(Default::default)
    }
}

/// Handles the whole messages at the front of `input`; returns bytes consumed.
pub fn step<S>(conn: &mut Conn<S>, input: &mut [u8], ctx: &mut Ctx<'_>) -> usize {
    // The decoder lends reassembled messages out of itself while the connection handles
    // them: it is taken out of the connection for the call (it owns no heap when idle).
    let Some(w) = conn.ws() else { return 0 };
    let mut dec = std::mem::replace(&mut w.dec, Decoder::new(0));
    let used = decode(conn, &mut dec, input, ctx);
    if let Some(w) = conn.ws() {
        w.dec = dec;
    }
    used
}

fn decode<S>(conn: &mut Conn<S>, dec: &mut Decoder, input: &mut [u8], ctx: &mut Ctx<'_>) -> usize {
    let max_pending = ctx.shared.config.limits.max_pending_answers;
    let mut pos = 0;
    // Past the fan-out budget, with too many answers pending, or at the end of its turn, the
    // rest waits in the connection's buffer: the worker delivers and flushes first (and
    // serves the other connections), then resumes it (`Turn::stop`).
    while ctx.turn.stop(conn, ctx.relay, max_pending).is_none() {
        let Some(w) = conn.ws() else { break };
        w.last_rx = ctx.time.ms;
        let (n, ev) = match dec.decode(&mut input[pos..]) {
            Ok(Some(x)) => x,
            Ok(None) => break,
            Err(e) => {
                fail(conn, &e, ctx);
                return input.len();
            }
        };
        pos += n;
        match ev {
            Event::Message { binary, payload } => {
                ctx.turn.took_one();
                on_message(conn, binary, payload, ctx);
            }
            Event::Compressed { binary, payload } => {
                ctx.turn.took_one();
                if let Err(e) = on_compressed(conn, binary, payload, ctx) {
                    fail(conn, &e, ctx);
                    return input.len();
                }
            }
            Event::Fragment | Event::Pong => {}
            Event::Ping(p) => {
                let mut h = [0u8; 10];
                let n = ws::write_head(&mut h, true, Opcode::Pong, p.len());
                conn.out.extend(&h[..n]);
                conn.out.extend(p);
            }
            Event::Close { code } => conn.ws_close(code, "", ctx.time.ms, ctx.close_ms()),
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
        WsError::BadCompression => "invalid compressed data",
    };
    conn.ws_close(e.close_code(), reason, ctx.time.ms, ctx.close_ms());
}

/// A compressed message: inflated within `--max-message` (1009 past it, 1007 for data that
/// is not DEFLATE), checked for UTF-8 if text, then handled as any message.
fn on_compressed<S>(
    conn: &mut Conn<S>,
    binary: bool,
    payload: &[u8],
    ctx: &mut Ctx<'_>,
) -> Result<(), WsError> {
    let max = ctx.shared.config.limits.max_message;
    let mut msg = std::mem::take(&mut ctx.tools.deflate.inflated);
    let res = ctx.tools.deflate.inflater.inflate(payload, max, &mut msg);
    let res = match res {
        Err(deflate::DeflateError::TooBig) => Err(WsError::TooBig),
        Err(deflate::DeflateError::Invalid) => Err(WsError::BadCompression),
        Ok(()) if !binary && simdutf8::basic::from_utf8(&msg).is_err() => Err(WsError::InvalidUtf8),
        Ok(()) => {
            on_message(conn, binary, &mut msg, ctx);
            Ok(())
        }
    };
    ctx.tools.deflate.inflated = msg;
    ctx.tools.deflate.trim();
    res
}

/// A whole data message (text already checked for UTF-8 by the decoder).
fn on_message<S>(conn: &mut Conn<S>, binary: bool, payload: &mut [u8], ctx: &mut Ctx<'_>) {
    let Some(w) = conn.ws() else { return };
    if w.echo {
        let op = if binary { Opcode::Binary } else { Opcode::Text };
        let deflate = w.deflate;
        return echo(conn, op, payload, deflate, ctx);
    }
    waku::message(conn, payload, ctx);
}

/// The test-only echo (`/echo`): the message back, compressed when negotiated and worth it.
fn echo<S>(
    conn: &mut Conn<S>,
    op: Opcode,
    payload: &[u8],
    deflate: Option<Agreement>,
    ctx: &mut Ctx<'_>,
) {
    let mut h = [0u8; 10];
    let kit = &mut ctx.tools.deflate;
    if let Some(a) = deflate {
        if kit.deflater.compress(payload, a.window_bits(), &mut kit.z) {
            let n = deflate::write_head(&mut h, op, kit.z.len());
            conn.out.extend(&h[..n]);
            conn.out.extend(&kit.z);
            kit.trim();
            return;
        }
    }
    let n = ws::write_head(&mut h, true, op, payload.len());
    conn.out.extend(&h[..n]);
    conn.out.extend(payload);
}
