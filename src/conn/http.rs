//! A connection in its HTTP phase: one request at a time off the front of its input
//! (pipelined requests are answered in order), routed (`http::route`) and answered into the
//! connection's `OutBuf`. `POST /subscribe` may need the topic's store to answer; the
//! connection then waits for it before reading the next request. A WebSocket upgrade at `/`
//! is handed to [`super::upgrade`].

use super::{upgrade, Conn, Ctx, HttpWait, Phase};
use crate::http::{self, response, response::Response, Method, Route};
use crate::relay::{Done, RelayError};
use crate::rpc;

/// Handles at most one request; returns bytes consumed (0 = need more input or stopped).
pub fn step<S>(conn: &mut Conn<S>, input: &mut [u8], ctx: &mut Ctx<'_>) -> usize {
    let limits = &ctx.shared.config.limits;
    let (n, req) = match http::parse(input, limits) {
        Ok(Some(r)) => r,
        Ok(None) => return 0,
        Err(e) => {
            let resp = Response::json_error(e.status(), &e.to_string());
            response::write(&mut conn.out, &resp, ctx.time.date, false, true);
            ctx.metrics().http_requests.inc();
            conn.begin_close(ctx.time.ms, ctx.close_ms());
            return input.len();
        }
    };
    ctx.metrics().http_requests.inc();
    // Behind a trusted proxy each request says whose it is (DECISIONS §11).
    if conn.limit.proxied() {
        if let Err(kind) =
            ctx.tools
                .limits
                .forwarded(&mut conn.limit, req.forwarded_for, ctx.time.ms)
        {
            ctx.metrics().limited[kind as usize].inc();
            let resp = Response::json_error(429, "too many connections");
            response::write(&mut conn.out, &resp, ctx.time.date, false, true);
            conn.begin_close(ctx.time.ms, ctx.close_ms());
            return input.len();
        }
    }
    let head_only = req.method == Method::Head;
    let close = req.close;
    let echo = ctx.shared.config.ws_echo;
    let route = http::route(req.method, req.path, echo);
    // DECISIONS §3: an upgrade anywhere but the relay's address is refused before
    // upgrading (it is not a registry request that happens to carry headers).
    let ws_path = matches!(
        http::route(Method::Get, req.path, echo),
        Route::Relay | Route::Echo
    );
    let resp = match route {
        _ if req.upgrade_websocket && !ws_path => Response::json_error(404, "not found"),
        Route::Registry => ctx.tools.answers.respond(&ctx.tools.registry, &req),
        Route::Subscribe => match register_webhook(conn, req.body, ctx) {
            Some(resp) => resp,
            None => {
                // The answer comes from the topic's store; later requests wait for it.
                conn.phase = Phase::Http(HttpWait::Webhook { close });
                return n;
            }
        },
        Route::Rpc => match super::rpc_http::request(conn, &req, ctx) {
            Some(resp) => resp,
            None => {
                // The answer waits for the relay; later requests wait for it.
                return n;
            }
        },
        Route::Relay | Route::Echo => {
            return if upgrade::upgrade(conn, &req, route == Route::Echo, ctx) {
                n
            } else {
                input.len()
            };
        }
        other => fixed_answer(other, ctx),
    };
    // An HTTP/1.0 client keeps the connection only when told so (RFC 9112 §9.3).
    let resp = if req.http10 && !close {
        resp.with_header("Connection", "keep-alive")
    } else {
        resp
    };
    response::write(&mut conn.out, &resp, ctx.time.date, head_only, close);
    if close {
        conn.begin_close(ctx.time.ms, ctx.close_ms());
        return input.len();
    }
    // Next request: its head must arrive in time (or the connection idles).
    conn.deadline = ctx.time.ms
        + if n < input.len() {
            limits.head_timeout().as_millis() as u64
        } else {
            limits.keepalive_timeout().as_millis() as u64
        };
    if conn.out.len() > limits.max_outbound {
        conn.phase = Phase::Http(HttpWait::Output);
    }
    n
}

/// The answer of a route that needs neither the request's body nor the relay.
fn fixed_answer(route: Route, ctx: &Ctx<'_>) -> Response {
    match route {
        Route::Hello => ctx.shared.hello.clone(),
        Route::PublicKey => Response::new(
            200,
            "text/plain",
            ctx.shared.relay_key.public_hex().as_bytes().to_vec(),
        ),
        Route::Health => match ctx.shared.health.problem() {
            None => Response::empty(204),
            Some(why) => Response::json_error(503, &why),
        },
        Route::Metrics => {
            let (pool, more) = (&ctx.shared.webhooks, &ctx.shared.exporters);
            let body = ctx.shared.metrics.render(&|s| {
                pool.render_metrics(s);
                more.iter().for_each(|e| e(s));
            });
            Response::new(200, "text/plain; version=0.0.4; charset=utf-8", body)
        }
        Route::Preflight(allow) => Response::empty(204)
            .with_header("Allow", allow)
            .with_header("Access-Control-Allow-Methods", allow)
            .with_header(
                "Access-Control-Allow-Headers",
                "Content-Type, If-None-Match, Authorization",
            )
            .with_header("Access-Control-Max-Age", "86400"),
        Route::MethodNotAllowed(allow) => {
            Response::json_error(405, "method not allowed").with_header("Allow", allow)
        }
        Route::NotFound
        | Route::Registry
        | Route::Subscribe
        | Route::Rpc
        | Route::Relay
        | Route::Echo => Response::json_error(404, "not found"),
    }
}

/// `POST /subscribe`: the answer, or `None` when it comes later from the topic's store.
fn register_webhook<S>(conn: &Conn<S>, body: &[u8], ctx: &mut Ctx<'_>) -> Option<Response> {
    let (topic, url) = match crate::webhook::validate_registration(body) {
        Err(e) => return Some(subscribe_answer(Err((400, &e.to_string())))),
        Ok(v) => v,
    };
    if topic.len() > ctx.shared.config.limits.max_topic {
        return Some(subscribe_answer(Err((
            400,
            "Missing or invalid \"topic\" param",
        ))));
    }
    let me = ctx.conn_ref(conn);
    match ctx.relay.add_webhook(me, &topic, &url) {
        Done::Now(r) => Some(webhook_answer(r)),
        Done::Later => None,
    }
}

/// The HTTP status a relay refusal is answered with.
pub fn status_of(e: &RelayError) -> u16 {
    match e {
        RelayError::TooManyWebhooks => 429,
        RelayError::StorageUnavailable | RelayError::Overloaded => 503,
        RelayError::TooManyWebhooksForTopic
        | RelayError::TooManySubscriptions(_)
        | RelayError::SubscriberLimitExceeded(_)
        | RelayError::Closing => 400,
    }
}

/// The `POST /subscribe` answer for the store's outcome.
pub fn webhook_answer(r: Result<(), RelayError>) -> Response {
    match r {
        Ok(()) => subscribe_answer(Ok(())),
        Err(e) => subscribe_answer(Err((status_of(&e), &e.to_string()))),
    }
}

/// The `POST /subscribe` answer.
fn subscribe_answer(r: Result<(), (u16, &str)>) -> Response {
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
