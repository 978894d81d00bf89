//! A connection in its HTTP phase: one request at a time off the front of its input
//! (pipelined requests are answered in order), routed (`http::route`) and answered into the
//! connection's `OutBuf`. `POST /subscribe` may need the topic's store to answer; the
//! connection then waits for it before reading the next request. A WebSocket upgrade at `/`
//! is handed to [`super::upgrade`].

use super::{upgrade, Conn, Ctx, HttpWait, Phase, Shared};
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
            ctx.metrics().http_requests.inc();
            refuse(conn, &Response::json_error(e.status(), &e.to_string()), ctx);
            return input.len();
        }
    };
    if !std::mem::take(&mut conn.marks.auth_pending) {
        ctx.metrics().http_requests.inc();
    }
    conn.marks.answered = true;
    if !forwarded_allowed(conn, req.forwarded_for, ctx) {
        return input.len();
    }
    let head_only = req.method == Method::Head;
    let close = req.close || ctx.tools.stopping;
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
            return match upgrade::upgrade(conn, &req, route == Route::Echo, ctx) {
                upgrade::Upgraded::Open => n,
                upgrade::Upgraded::Refused => input.len(),
                // Read again, whole, once its token is verified.
                upgrade::Upgraded::Pending => {
                    conn.marks.auth_pending = true;
                    0
                }
            };
        }
        other => fixed_answer(other, ctx),
    };
    let how = Answering {
        head_only,
        close,
        http10: req.http10,
        more: n < input.len(),
    };
    if answer(conn, resp, how, ctx) {
        n
    } else {
        input.len()
    }
}

/// How a request is answered.
#[derive(Clone, Copy)]
struct Answering {
    /// A HEAD: the head only.
    head_only: bool,
    /// The connection closes after it.
    close: bool,
    /// The request was HTTP/1.0.
    http10: bool,
    /// More input follows it (a pipelined request).
    more: bool,
}

/// Writes the answer `resp`; `false` when the connection now closes (the rest of its input
/// is dropped), else its deadline is the next request's.
fn answer<S>(conn: &mut Conn<S>, resp: Response, how: Answering, ctx: &mut Ctx<'_>) -> bool {
    let limits = &ctx.shared.config.limits;
    // An HTTP/1.0 client keeps the connection only when told so (RFC 9112 §9.3).
    let resp = if how.http10 && !how.close {
        resp.with_header("Connection", "keep-alive")
    } else {
        resp
    };
    response::write(
        &mut conn.out,
        &resp,
        ctx.time.date,
        how.head_only,
        how.close,
    );
    if how.close {
        conn.begin_close(ctx.time.ms, ctx.close_ms());
        return false;
    }
    // Next request: its head must arrive in time (or the connection idles).
    conn.deadline = ctx.time.ms
        + if how.more {
            limits.head_timeout().as_millis() as u64
        } else {
            limits.keepalive_timeout().as_millis() as u64
        };
    if conn.out.len() > limits.max_outbound {
        conn.phase = Phase::Http(HttpWait::Output);
    }
    true
}

/// Behind a trusted proxy each request says whose it is (DECISIONS §11): `false` when that
/// address is over its limit (the connection is then answered 429 and closes).
fn forwarded_allowed<S>(conn: &mut Conn<S>, forwarded: Option<&[u8]>, ctx: &mut Ctx<'_>) -> bool {
    if !conn.limit.proxied() {
        return true;
    }
    let now = ctx.time.ms;
    match ctx.tools.limits.forwarded(&mut conn.limit, forwarded, now) {
        Ok(()) => true,
        Err(kind) => {
            ctx.metrics().limited[kind as usize].inc();
            refuse(
                conn,
                &Response::json_error(429, "too many connections"),
                ctx,
            );
            false
        }
    }
}

/// Answers with `resp` and closes the connection.
fn refuse<S>(conn: &mut Conn<S>, resp: &Response, ctx: &Ctx<'_>) {
    response::write(&mut conn.out, resp, ctx.time.date, false, true);
    conn.begin_close(ctx.time.ms, ctx.close_ms());
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
        Route::Health => health_answer(ctx.shared),
        Route::Ready => ready_answer(ctx.shared),
        // With an admin address the figures are served there only.
        Route::Metrics if ctx.shared.config.admin.admin_listen.is_some() => {
            Response::json_error(404, "not found")
        }
        Route::Metrics => Response::new(200, METRICS_TYPE, metrics_text(ctx.shared)),
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

/// The content type of `/metrics` (Prometheus text format 0.0.4).
pub const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `/health` (public port and admin address): 204, or 503 with the reasons (DECISIONS §6,
/// §7).
pub fn health_answer(shared: &Shared) -> Response {
    let r = match shared.health.problem() {
        None => Response::empty(204),
        Some(why) => Response::json_error(503, &why),
    };
    r.with_header(LAYOUTS_HEADER, &shared.layouts.describe())
}

/// The header of `/health` naming the data layouts the node reads and writes now
/// (`layout::Current::describe`).
pub const LAYOUTS_HEADER: &str = "Walletrelay-Layouts";

/// Why the node should get no new clients now (`/ready`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// The drain began (SIGTERM, `POST /drain`).
    Draining,
    /// The engine cannot store (the `/health` problems: Redis unreachable, disk refused).
    Unhealthy(String),
}

/// Whether the node should get new clients: not while draining, nor while `/health` fails.
pub fn readiness(shared: &Shared) -> Result<(), NotReady> {
    if shared.drain.is_draining() {
        return Err(NotReady::Draining);
    }
    match shared.health.problem() {
        None => Ok(()),
        Some(why) => Err(NotReady::Unhealthy(why)),
    }
}

/// `/ready` (public port and admin address): 204, or 503 `{"error":"draining"}`, or 503
/// with the `/health` reasons.
pub fn ready_answer(shared: &Shared) -> Response {
    match readiness(shared) {
        Ok(()) => Response::empty(204),
        Err(NotReady::Draining) => Response::json_error(503, "draining"),
        Err(NotReady::Unhealthy(why)) => Response::json_error(503, &why),
    }
}

/// The `/metrics` text every port serves: the workers' figures, the webhook pool's, the
/// engines' and the notifier's, then what this build is and whether the node is ready
/// (`walletrelay_build_info`, `walletrelay_ready`, `walletrelay_draining`). The admin
/// address adds the `process_*` families (`admin::process`).
pub fn metrics_text(shared: &Shared) -> String {
    use crate::metrics::{family, single, Kind};
    use std::fmt::Write as _;
    let (pool, more) = (&shared.webhooks, &shared.exporters);
    shared.metrics.render(&|s| {
        pool.render_metrics(s);
        more.iter().for_each(|e| e(s));
        family(
            s,
            "walletrelay_build_info",
            Kind::Gauge,
            "What this build is: its version, commit and the newest data layouts it writes (always 1).",
        );
        let _ = writeln!(
            s,
            "walletrelay_build_info{{version=\"{}\",commit=\"{}\",redis_layout=\"{}\",journal_layout=\"{}\"}} 1",
            crate::version::VERSION,
            crate::version::COMMIT,
            crate::layout::REDIS,
            crate::layout::JOURNAL
        );
        family(
            s,
            "walletrelay_layout_writes",
            Kind::Gauge,
            "The data layout the node writes now, per layout (redis: its cluster's, from the shards' fingerprints; absent without Redis).",
        );
        if let Some(v) = shared.layouts.redis_writes() {
            let _ = writeln!(s, "walletrelay_layout_writes{{layout=\"redis\"}} {v}");
        }
        let _ = writeln!(
            s,
            "walletrelay_layout_writes{{layout=\"journal\"}} {}",
            crate::layout::JOURNAL
        );
        family(
            s,
            "walletrelay_layout_newest",
            Kind::Gauge,
            "The newest data layout this build writes, per layout (walletrelay_layout_writes below it: the cluster waits for walletrelay switch-layout).",
        );
        let _ = writeln!(
            s,
            "walletrelay_layout_newest{{layout=\"redis\"}} {}\nwalletrelay_layout_newest{{layout=\"journal\"}} {}",
            crate::layout::REDIS,
            crate::layout::JOURNAL
        );
        single(
            s,
            "walletrelay_ready",
            Kind::Gauge,
            "1 while /ready answers 204: not draining, and the engine can store.",
            u8::from(readiness(shared).is_ok()),
        );
        single(
            s,
            "walletrelay_draining",
            Kind::Gauge,
            "1 from the first SIGTERM or POST /drain on (--drain).",
            u8::from(shared.drain.is_draining()),
        );
    })
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
