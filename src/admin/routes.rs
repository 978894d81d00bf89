//! The admin address's routes and their answers: a pure table from a request to a
//! `Response` (no I/O but the `/proc` reads of `/metrics`). `HEAD` works wherever `GET`
//! does; an unknown path is 404, a known one with another method 405 with `Allow`.
//!
//! | route | answer |
//! |---|---|
//! | `GET /metrics` | the public port's families (`conn::http::metrics_text`) and `process_*` |
//! | `GET /health` | 204, or 503 with the reasons |
//! | `GET /live` | 204 while every worker's loop turned within [`LIVE_WITHIN_MS`]; 503 naming the others |
//! | `GET /ready` | 204, or 503 `draining`, or 503 with the `/health` reasons |
//! | `POST /drain` | begins the drain: 202 `{"draining":true,"drain_seconds":N,"remaining_ms":M}` |
//! | `POST /layout/switch` | moves the Redis cluster to this build's newest data layout: 200 `{"redis":{"before":[4,4],"writes":5}}`; 409 without Redis, 503 when a shard could not be moved |
//! | `GET /status` | [`STATUS_PAGE`] |

use crate::conn::http::{health_answer, metrics_text, ready_answer, METRICS_TYPE};
use crate::conn::Shared;
use crate::http::response::{Response, JSON};
use crate::http::{Method, Request};

/// The status page (`src/admin/status.html`): one self-contained HTML page that polls
/// `/metrics`, `/ready` and `/health` on the same origin.
pub const STATUS_PAGE: &str = include_str!("status.html");

/// A worker whose loop has not turned for this long is stuck (`/live` 503). An idle
/// worker turns every timer tick (`timer::TICK_MS`, 50 ms); a busy one at the end of each
/// iteration, which its budgets keep to milliseconds.
pub const LIVE_WITHIN_MS: u64 = 10_000;

/// What answers an admin request, by path and method alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRoute {
    /// `GET /metrics`
    Metrics,
    /// `GET /health`
    Health,
    /// `GET /live`
    Live,
    /// `GET /ready`
    Ready,
    /// `POST /drain`
    Drain,
    /// `POST /layout/switch`
    LayoutSwitch,
    /// `GET /status`
    Status,
    /// Known path, wrong method; the value is the `Allow` header.
    MethodNotAllowed(&'static str),
    /// Unknown path.
    NotFound,
}

/// Picks the answer for `method` and `path`.
pub fn route(method: Method, path: &str) -> AdminRoute {
    let (allow, r) = match path {
        "/metrics" => ("GET, HEAD", AdminRoute::Metrics),
        "/health" => ("GET, HEAD", AdminRoute::Health),
        "/live" => ("GET, HEAD", AdminRoute::Live),
        "/ready" => ("GET, HEAD", AdminRoute::Ready),
        "/drain" => ("POST", AdminRoute::Drain),
        "/layout/switch" => ("POST", AdminRoute::LayoutSwitch),
        "/status" => ("GET, HEAD", AdminRoute::Status),
        _ => return AdminRoute::NotFound,
    };
    match (method, r) {
        (Method::Post, AdminRoute::Drain | AdminRoute::LayoutSwitch) => r,
        (_, AdminRoute::Drain | AdminRoute::LayoutSwitch) => AdminRoute::MethodNotAllowed(allow),
        (Method::Get | Method::Head, _) => r,
        _ => AdminRoute::MethodNotAllowed(allow),
    }
}

/// The answer to `req` (whose raw bytes are `raw`) at `now_ms` (`clock::now_ms`).
pub fn answer(req: &Request<'_>, raw: &[u8], shared: &Shared, now_ms: u64) -> Response {
    match route(req.method, req.path) {
        AdminRoute::Metrics => {
            let mut text = metrics_text(shared);
            super::process::render(&mut text);
            Response::new(200, METRICS_TYPE, text)
        }
        AdminRoute::Health => health_answer(shared),
        AdminRoute::Live => live(shared, now_ms),
        AdminRoute::Ready => ready_answer(shared),
        AdminRoute::Drain if cross_site(raw) => {
            Response::json_error(403, "POST /drain from another site's page refused")
        }
        AdminRoute::Drain => drain(shared, now_ms),
        AdminRoute::LayoutSwitch if cross_site(raw) => {
            Response::json_error(403, "POST /layout/switch from another site's page refused")
        }
        AdminRoute::LayoutSwitch => layout_switch(shared),
        AdminRoute::Status => Response::new(200, "text/html; charset=utf-8", STATUS_PAGE)
            .with_header("X-Content-Type-Options", "nosniff"),
        AdminRoute::MethodNotAllowed(allow) => {
            Response::json_error(405, "method not allowed").with_header("Allow", allow)
        }
        AdminRoute::NotFound => Response::json_error(404, "not found"),
    }
}

/// `/live`: 204 while every worker's loop turned within [`LIVE_WITHIN_MS`], else 503 naming
/// the workers that did not and for how long.
pub fn live(shared: &Shared, now_ms: u64) -> Response {
    let stuck: Vec<String> = shared
        .metrics
        .cores
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let idle = now_ms.saturating_sub(c.last_turn_ms.get());
            (idle > LIVE_WITHIN_MS).then(|| {
                format!(
                    "worker {i}: its loop has not turned for {}.{} s",
                    idle / 1000,
                    idle % 1000 / 100
                )
            })
        })
        .collect();
    if stuck.is_empty() {
        Response::empty(204)
    } else {
        Response::json_error(503, &stuck.join("; "))
    }
}

/// `POST /drain`: begins the drain (once; later calls say what is left) and logs its start.
fn drain(shared: &Shared, now_ms: u64) -> Response {
    let d = shared.drain.begin(now_ms);
    if d.began_now {
        log::info!(
            "POST /drain: draining: /ready answers 503, clients are still served and accepted; \
             a SIGTERM within {} s waits for what is left of the drain",
            seconds(d.seconds)
        );
    }
    let body = format!(
        "{{\"draining\":true,\"drain_seconds\":{},\"remaining_ms\":{}}}",
        seconds(d.seconds),
        d.remaining_ms
    );
    Response::new(202, JSON, body)
}

/// `POST /layout/switch`: the Redis cluster writes this build's newest layout from now on
/// (docs/UPGRADING.md). Idempotent; blocks this admin thread for the shards' round trips.
fn layout_switch(shared: &Shared) -> Response {
    let Some(switch) = &shared.layout_switch else {
        return Response::json_error(
            409,
            "no layout to switch: this node keeps its data in no Redis (--redis)",
        );
    };
    match switch() {
        Ok(before) => {
            let list: Vec<String> = before.iter().map(u32::to_string).collect();
            log::info!(before:? = before, writes = crate::layout::REDIS;
                "POST /layout/switch: the cluster writes data layout {} (shards were on {})",
                crate::layout::REDIS,
                list.join(",")
            );
            let body = format!(
                "{{\"redis\":{{\"before\":[{}],\"writes\":{}}}}}",
                list.join(","),
                crate::layout::REDIS
            );
            Response::new(200, JSON, body)
        }
        Err(why) => {
            log::error!("POST /layout/switch: {why}");
            Response::json_error(503, &why)
        }
    }
}

/// Seconds as a JSON number: whole ones without a fraction (`30`, `2.5`).
fn seconds(s: f64) -> String {
    if s.fract() == 0.0 && s.abs() < 1e15 {
        format!("{}", s as i64)
    } else {
        format!("{s}")
    }
}

/// A browser's request from a page of another origin (its `Origin` is not this address):
/// a page on the operator's machine must not be able to drain a node by a form's POST.
/// Tools (`walletrelay drain`, curl) send no `Origin`.
fn cross_site(raw: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    if req.parse(raw).is_err() {
        return true;
    }
    let value = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
    };
    match (value("origin"), value("host")) {
        (None, _) => false,
        (Some(origin), Some(host)) => origin != format!("http://{host}"),
        (Some(_), None) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_answer_head_where_get_and_name_what_is_allowed() {
        assert_eq!(route(Method::Get, "/metrics"), AdminRoute::Metrics);
        assert_eq!(route(Method::Head, "/live"), AdminRoute::Live);
        assert_eq!(route(Method::Head, "/status"), AdminRoute::Status);
        assert_eq!(route(Method::Post, "/drain"), AdminRoute::Drain);
        assert_eq!(
            route(Method::Get, "/drain"),
            AdminRoute::MethodNotAllowed("POST")
        );
        assert_eq!(
            route(Method::Post, "/ready"),
            AdminRoute::MethodNotAllowed("GET, HEAD")
        );
        assert_eq!(
            route(Method::Options, "/metrics"),
            AdminRoute::MethodNotAllowed("GET, HEAD")
        );
        assert_eq!(route(Method::Get, "/"), AdminRoute::NotFound);
        assert_eq!(route(Method::Post, "/nope"), AdminRoute::NotFound);
    }

    #[test]
    fn only_a_foreign_origin_is_cross_site() {
        let req = |h: &str| format!("POST /drain HTTP/1.1\r\nHost: 127.0.0.1:9091\r\n{h}\r\n");
        assert!(!cross_site(req("").as_bytes()));
        assert!(!cross_site(
            req("Origin: http://127.0.0.1:9091\r\n").as_bytes()
        ));
        assert!(cross_site(
            req("Origin: https://evil.example\r\n").as_bytes()
        ));
        assert!(cross_site(req("Origin: null\r\n").as_bytes()));
    }

    #[test]
    fn drain_seconds_print_as_numbers() {
        assert_eq!(seconds(30.0), "30");
        assert_eq!(seconds(2.5), "2.5");
        assert_eq!(seconds(0.0), "0");
    }
}
