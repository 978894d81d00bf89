//! The WebSocket upgrade (RFC 6455 §4.2): checks the request, answers 101 with the accept
//! key, and moves the connection to its WebSocket phase with a fresh heartbeat schedule.
//! A request that cannot be upgraded is answered with the error and the connection closes.

use super::websocket::WsState;
use super::{Conn, Ctx, Phase};
use crate::auth::{UpgradeAuth, Verdict};
use crate::http::{self, response, response::Response};
use crate::ws;

/// The close code of an upgrade refused by relay auth, for clients that asked for close
/// events (DECISIONS §10; the SDK stops on it instead of reconnecting).
pub const CLOSE_AUTH: u16 = 3000;

/// What became of an upgrade request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgraded {
    /// Upgraded: the connection speaks WebSocket.
    Open,
    /// Refused: the connection is closing.
    Refused,
    /// Nothing done yet: its token waits for the round's batch of checks; the request is
    /// read again after it.
    Pending,
}

/// Answers a WebSocket upgrade request.
pub fn upgrade<S>(
    conn: &mut Conn<S>,
    req: &http::Request<'_>,
    echo: bool,
    ctx: &mut Ctx<'_>,
) -> Upgraded {
    if let Some(resp) = refusal(req) {
        let head_only = req.method == http::Method::Head;
        response::write(&mut conn.out, &resp, ctx.time.date, head_only, true);
        conn.begin_close(ctx.time.ms, ctx.close_ms());
        return Upgraded::Refused;
    }
    // Relay auth (DECISIONS §10): refused before the upgrade, or, for a client that asked
    // for close events (the SDK then stops instead of retrying), upgraded and closed with
    // 3000 and the reason. A token not seen before is verified with the round's others
    // (one batch: a reconnect storm brings thousands at once).
    let up = UpgradeAuth::from_request(req.query, req.authorization);
    let (client, refused) = if echo {
        (None, None)
    } else {
        match ctx
            .tools
            .gate
            .check_or_queue(&up, crate::clock::unix_ms() / 1000)
        {
            Verdict::Open(client) => (client, None),
            Verdict::Refused(status, reason) => (None, Some((status, reason))),
            Verdict::Pending => {
                ctx.turn.auth_pending();
                return Upgraded::Pending;
            }
        }
    };
    if let Some((status, reason)) = refused {
        ctx.metrics().auth_refused.inc();
        // The reason only: the token itself is a credential (DECISIONS, "Logs").
        log::debug!(
            worker = ctx.me, status, reason, via = "upgrade";
            "relay auth refused: {reason}"
        );
        if !up.use_on_close_event {
            let resp = Response::json_error(status, reason);
            response::write(&mut conn.out, &resp, ctx.time.date, false, true);
            conn.begin_close(ctx.time.ms, ctx.close_ms());
            return Upgraded::Refused;
        }
    }
    let deflate = switching_protocols(conn, req, ctx);
    // The first ping comes a random half to whole interval after the upgrade, so that
    // connections opened together (a reconnect storm after a restart) are not all pinged
    // in one loop iteration every interval.
    let interval = ctx.shared.config.limits.ping_interval().as_millis() as u64;
    let first_ping = ctx.time.ms + interval - ctx.tools.ids.next_u64() % (interval / 2 + 1);
    let max = ctx.shared.config.limits.max_message;
    let mut ws = WsState::new(echo, max, deflate, ctx.time.ms, first_ping);
    ws.limits = ctx.tools.limits.conn_buckets(ctx.time.ms);
    if let Some(c) = &client {
        ctx.tools
            .limits
            .bind_client(&mut conn.limit, c, ctx.time.ms);
    }
    if let Some(c) = &client {
        // Named once per connection: its subscriptions and publishes share it.
        ws.set_client_ref(std::sync::Arc::new(crate::engine::ClientRef {
            id: c.did().into(),
            project: up.project_id.as_deref().unwrap_or("").into(),
        }));
    }
    ws.set_client(client);
    conn.phase = Phase::Ws(Box::new(ws));
    conn.deadline = first_ping;
    ctx.metrics().websockets_open.inc();
    if let Some((_, reason)) = refused {
        conn.ws_close(CLOSE_AUTH, reason, ctx.time.ms, ctx.close_ms());
        return Upgraded::Refused;
    }
    Upgraded::Open
}

/// Why a request cannot be upgraded (RFC 6455 §4.1: a GET of HTTP/1.1 or later, version
/// 13, a valid key): the answer to give it, or `None` when it can.
fn refusal(req: &http::Request<'_>) -> Option<Response> {
    // RFC 6455 §4.1: the handshake is a GET of HTTP/1.1 or later; a HEAD at `/` gets what
    // a GET that is no upgrade gets, without the body.
    if !req.upgrade_websocket || req.method != http::Method::Get {
        Some(
            Response::json_error(426, "WebSocket upgrade required")
                .with_header("Upgrade", "websocket"),
        )
    } else if req.http10 {
        Some(Response::json_error(
            400,
            "a WebSocket upgrade needs HTTP/1.1",
        ))
    } else if req.ws_version != Some(b"13") {
        Some(
            Response::json_error(426, "unsupported WebSocket version")
                .with_header("Sec-WebSocket-Version", "13"),
        )
    } else if !req.ws_key.is_some_and(ws::valid_key) {
        Some(Response::json_error(
            400,
            "missing or invalid Sec-WebSocket-Key",
        ))
    } else {
        None
    }
}

/// Writes the 101 answer (the accept key, this worker's number, permessage-deflate when
/// asked for and allowed); returns the deflate agreement made.
fn switching_protocols<S>(
    conn: &mut Conn<S>,
    req: &http::Request<'_>,
    ctx: &mut Ctx<'_>,
) -> Option<ws::deflate::Agreement> {
    let accept = ws::accept_key(req.ws_key.unwrap_or_default());
    let mut head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
     Sec-WebSocket-Accept: {accept}\r\nX-Walletrelay-Worker: {}\r\n",
        ctx.me
    )
    .into_bytes();
    // permessage-deflate only when the flag allows it (DECISIONS §9: declined otherwise).
    let deflate = req
        .ws_deflate
        .filter(|_| ctx.shared.config.permessage_deflate);
    if let Some(a) = deflate {
        a.write_header(&mut head);
        ctx.metrics().deflate_upgrades.inc();
    }
    head.extend_from_slice(b"\r\n");
    conn.out.extend(&head);
    deflate
}
