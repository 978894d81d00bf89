//! HTTP/1.1 behaviour of the one listener (DECISIONS §1, §3 limits, §4): exact answers of
//! `/hello`, `/health`, `/metrics`, `POST /subscribe`; errors; CORS; HEAD; keep-alive and
//! pipelining; request limits and the slowloris guard. Every answer is parsed here from the
//! raw bytes, so a stray or missing byte breaks the next answer's parse.

mod common;
#[path = "http_behaviour/subscribe.rs"]
mod subscribe;

use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::checks::HELLO;
use common::http::{get, post_subscribe, JSON};
use common::{topic, HttpConn, Resp, Server};
use serde_json::Value;

const TEXT: &str = "text/plain; charset=utf-8";
const WEBHOOK_ERR: &str = r#"{"success":false,"error":"Missing or invalid \"webhook\" param"}"#;
const TOPIC_ERR: &str = r#"{"success":false,"error":"Missing or invalid \"topic\" param"}"#;

fn assert_hello(r: &Resp, body: &str) {
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("Content-Type"), Some(TEXT), "{r:?}");
    assert_eq!(
        r.header("Content-Length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(r.body_str(), body);
}

// ------------------------------------------------------------------------------------------
// Exact answers

#[test]
fn hello_answers_exactly_the_greeting() {
    let s = Server::start(&[]);
    let r = s.request(&get("/hello"));
    assert_hello(&r, HELLO);
    assert_eq!(r.header("Access-Control-Allow-Origin"), Some("*"));
}

#[test]
fn hello_uses_the_service_name_flag() {
    let s = Server::start(&["--service-name", "Foo"]);
    assert_hello(&s.request(&get("/hello")), "Hello World, this is Foo v2.0");
}

#[test]
fn health_is_204_without_a_body() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    c.send(get("/health").as_bytes());
    let r = c.response(false);
    assert_eq!(r.status, 204, "{r:?}");
    // Nothing follows the head: the next answer on the connection parses exactly.
    c.send(get("/hello").as_bytes());
    assert_hello(&c.response(false), HELLO);
}

#[test]
fn metrics_is_prometheus_text() {
    let s = Server::start(&[]);
    let r = s.request(&get("/metrics"));
    assert_eq!(r.status, 200, "{r:?}");
    let ct = r.header("Content-Type").expect("Content-Type");
    assert!(ct.starts_with("text/plain"), "{ct}");
    let text = r.body_str();
    assert!(text.lines().any(|l| l.starts_with("# TYPE ")), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("# TYPE walletrelay_connections_open ")),
        "{text}"
    );
    // The metrics connection itself is open while it is being answered.
    let open: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("walletrelay_connections_open{")
                || l.starts_with("walletrelay_connections_open ")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().expect("value"))
        .sum();
    assert!(open >= 1.0, "connections_open = {open}\n{text}");
    // Every sample line is `name{labels} value` or `name value` with a numeric value.
    for l in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let v = l.rsplit(' ').next().unwrap();
        assert!(v.parse::<f64>().is_ok(), "bad sample line {l:?}");
        assert!(l.starts_with("walletrelay_"), "unprefixed metric {l:?}");
    }
}

#[test]
fn metrics_has_the_loop_iteration_histogram_per_worker() {
    let s = Server::start(&["--threads", "2"]);
    // A few requests, so that the workers run loop iterations.
    for _ in 0..4 {
        assert_eq!(s.request(&get("/hello")).status, 200);
    }
    let text = s.request(&get("/metrics")).body_str().to_string();
    let fam = "walletrelay_loop_iteration_seconds";
    assert!(text.contains(&format!("\n# HELP {fam} ")), "{text}");
    assert!(
        text.contains(&format!("\n# TYPE {fam} histogram\n")),
        "{text}"
    );
    let long = "walletrelay_long_loop_iterations_total";
    assert!(
        text.contains(&format!("\n# TYPE {long} counter\n")),
        "{text}"
    );
    let mut answered = 0.0;
    for core in ["0", "1"] {
        let bucket = format!("{fam}_bucket{{core=\"{core}\",le=\"");
        let buckets: Vec<(String, f64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix(&bucket))
            .map(|rest| {
                let (le, v) = rest.split_once("\"} ").expect("bucket line");
                (le.to_string(), v.parse().expect("bucket value"))
            })
            .collect();
        assert_eq!(buckets.len(), 14, "{core}: {buckets:?}");
        assert_eq!(buckets[0].0, "0.00001");
        assert_eq!(buckets[12].0, "1");
        assert_eq!(buckets[13].0, "+Inf");
        let bounds: Vec<f64> = buckets[..13].iter().map(|b| b.0.parse().unwrap()).collect();
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
        let count = common::metrics::series(&text, &format!("{fam}_count{{core=\"{core}\"}}"));
        assert_eq!(count, Some(buckets[13].1), "{core}");
        let sum = common::metrics::series(&text, &format!("{fam}_sum{{core=\"{core}\"}}"));
        assert!(sum.is_some_and(|v| v >= 0.0), "{core}: {sum:?}");
        answered += buckets[13].1;
        let long = common::metrics::series(&text, &format!("{long}{{core=\"{core}\"}}"));
        assert!(long.is_some_and(|v| v <= buckets[13].1), "{core}: {long:?}");
    }
    assert!(answered >= 1.0, "no iteration timed\n{text}");
}

#[test]
fn unknown_path_is_404_json() {
    let s = Server::start(&[]);
    for p in ["/nope", "/hello/", "/api", "/HELLO"] {
        let r = s.request(&get(p));
        assert_eq!(r.status, 404, "{p}: {r:?}");
        r.assert_json_error();
    }
}

#[test]
fn wrong_method_is_405_json_with_allow() {
    let s = Server::start(&[]);
    let r = s.request("POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(r.status, 405, "{r:?}");
    r.assert_json_error();
    let allow = r.header("Allow").expect("Allow header");
    assert!(allow.contains("GET"), "{allow}");
    assert!(!allow.contains("POST"), "{allow}");

    let r = s.request(&get("/subscribe"));
    assert_eq!(r.status, 405, "{r:?}");
    r.assert_json_error();
    let allow = r.header("Allow").expect("Allow header");
    assert!(allow.contains("POST"), "{allow}");

    let r = s.request("DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 405, "{r:?}");
    r.assert_json_error();
    assert!(r.header("Allow").is_some_and(|a| a.contains("GET")));
}

#[test]
fn every_answer_carries_access_control_allow_origin_star() {
    let s = Server::start(&[]);
    let mut big = String::from("GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ");
    big.push_str(&"a".repeat(17 * 1024));
    big.push_str("\r\n\r\n");
    let requests = [
        get("/hello"),
        get("/health"),
        get("/metrics"),
        get("/nope"),
        get("/subscribe"),
        "HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        "OPTIONS /subscribe HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        post_subscribe(r#"{"topic":"t","webhook":"https://example.com/hook"}"#),
        post_subscribe(r#"{"topic":"t"}"#),
        get("/"),
        big,
        "GET\x01 / HTTP/1.1\r\n\r\n".to_string(),
    ];
    for req in &requests {
        let r = s.request(req);
        assert_eq!(
            r.header("Access-Control-Allow-Origin"),
            Some("*"),
            "{:?} -> {r:?}",
            &req[..req.len().min(40)]
        );
    }
}

#[test]
fn options_preflight_is_204_with_allowed_methods_and_headers() {
    let s = Server::start(&[]);
    let pre = |path: &str| {
        s.request(&format!(
            "OPTIONS {path} HTTP/1.1\r\nHost: x\r\nOrigin: https://dapp.example\r\n\
                 Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: content-type\r\n\r\n"
        ))
    };
    let r = pre("/subscribe");
    assert_eq!(r.status, 204, "{r:?}");
    let m = r
        .header("Access-Control-Allow-Methods")
        .expect("Access-Control-Allow-Methods");
    assert!(m.contains("POST"), "{m}");
    let h = r
        .header("Access-Control-Allow-Headers")
        .expect("Access-Control-Allow-Headers");
    assert!(h.to_ascii_lowercase().contains("content-type"), "{h}");
    assert_eq!(r.header("Access-Control-Allow-Origin"), Some("*"));

    let r = pre("/hello");
    assert_eq!(r.status, 204, "{r:?}");
    let m = r.header("Access-Control-Allow-Methods").expect("methods");
    assert!(m.contains("GET"), "{m}");
}

#[test]
fn head_hello_has_content_length_37_and_no_body() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    c.send(b"HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response(true);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("Content-Length"), Some("37"));
    assert_eq!(r.header("Content-Type"), Some(TEXT));
    // If the HEAD answer had carried a body, it would sit in front of this answer.
    c.send(get("/hello").as_bytes());
    assert_hello(&c.response(false), HELLO);
    assert!(c.buf.is_empty());
}

#[test]
fn head_works_on_health_and_metrics() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    c.send(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response(true);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.header("Content-Length").is_some_and(|l| l != "0"));
    c.send(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(c.response(true).status, 204);
    c.send(get("/hello").as_bytes());
    assert_hello(&c.response(false), HELLO);
}

// ------------------------------------------------------------------------------------------
// Connection management

#[test]
fn keep_alive_serves_sequential_requests_on_one_connection() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    for _ in 0..3 {
        c.send(get("/hello").as_bytes());
        let r = c.response(false);
        assert_hello(&r, HELLO);
        assert!(
            r.header("Connection")
                .is_none_or(|v| !v.eq_ignore_ascii_case("close")),
            "{r:?}"
        );
    }
    c.expect_open_and_silent(300);
}

#[test]
fn pipelined_requests_in_one_write_are_answered_in_order() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    let mut raw = get("/hello");
    raw.push_str(&get("/nope"));
    raw.push_str(&get("/health"));
    c.send(raw.as_bytes());
    assert_hello(&c.response(false), HELLO);
    let r = c.response(false);
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(c.response(false).status, 204);
    c.expect_open_and_silent(300);
}

#[test]
fn http_1_0_without_keep_alive_is_closed_after_the_answer() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    c.send(b"GET /hello HTTP/1.0\r\nHost: x\r\n\r\n");
    assert_hello(&c.response(false), HELLO);
    c.expect_closed();
}

#[test]
fn http_1_0_with_keep_alive_stays_open() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    for _ in 0..2 {
        c.send(b"GET /hello HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n");
        let r = c.response(false);
        assert_hello(&r, HELLO);
        // A 1.0 client keeps the connection only when told so.
        assert_eq!(r.header("Connection"), Some("keep-alive"), "{r:?}");
    }
}

#[test]
fn connection_close_is_closed_after_the_answer() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    c.send(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let r = c.response(false);
    assert_hello(&r, HELLO);
    assert_eq!(
        r.header("Connection")
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("close")
    );
    c.expect_closed();
}

#[test]
fn requests_after_connection_close_are_not_answered() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    let raw =
        "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /health HTTP/1.1\r\n\r\n";
    c.send(raw.as_bytes());
    assert_hello(&c.response(false), HELLO);
    c.expect_closed();
}

#[test]
fn post_body_arriving_in_pieces_is_answered_once_complete() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    let raw = post_subscribe(r#"{"topic":"split","webhook":"https://example.com/hook"}"#);
    let (a, b) = raw.split_at(raw.len() - 10);
    c.send(a.as_bytes());
    std::thread::sleep(Duration::from_millis(200));
    c.send(b.as_bytes());
    let r = c.response(false);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body_str(), r#"{"success":true}"#);
}

// ------------------------------------------------------------------------------------------
// Limits

#[test]
fn head_over_16_kib_is_431() {
    let s = Server::start(&[]);
    let mut raw = String::from("GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ");
    raw.push_str(&"a".repeat(17 * 1024));
    raw.push_str("\r\n\r\n");
    let mut c = HttpConn::open(&s);
    c.send(raw.as_bytes());
    let r = c.response(false);
    assert_eq!(r.status, 431, "{r:?}");
    r.assert_json_error();
    c.expect_closed();
}

#[test]
fn head_over_16_kib_is_431_even_before_it_ends() {
    let s = Server::start(&[]);
    let mut raw = String::from("GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ");
    raw.push_str(&"a".repeat(17 * 1024));
    let mut c = HttpConn::open(&s);
    c.send(raw.as_bytes());
    let r = c.response(false);
    assert_eq!(r.status, 431, "{r:?}");
}

#[test]
fn head_just_under_16_kib_is_accepted() {
    let s = Server::start(&[]);
    let mut raw = String::from("GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ");
    raw.push_str(&"a".repeat(15 * 1024));
    raw.push_str("\r\n\r\n");
    assert!(raw.len() < 16 * 1024);
    assert_hello(&s.request(&raw), HELLO);
}

#[test]
fn content_length_over_64_kib_is_413() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    c.send(
        b"POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 70000\r\n\r\n{\"topic\":",
    );
    let r = c.response(false);
    assert_eq!(r.status, 413, "{r:?}");
    r.assert_json_error();
}

#[test]
fn chunked_transfer_encoding_is_refused_with_411_or_400() {
    let s = Server::start(&[]);
    let mut c = HttpConn::open(&s);
    c.send(
        b"POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
    let r = c.response(false);
    assert!(r.status == 411 || r.status == 400, "{r:?}");
    r.assert_json_error();
    c.expect_closed();
}

#[test]
fn malformed_request_line_is_400() {
    let s = Server::start(&[]);
    for raw in [
        "GET\x01 /hello HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET hello HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /hello HTTP/1.1\r\nBad Header Name: x\r\n\r\n",
    ] {
        let mut c = HttpConn::open(&s);
        c.send(raw.as_bytes());
        let r = c.response(false);
        assert_eq!(r.status, 400, "{raw:?}: {r:?}");
        r.assert_json_error();
        c.expect_closed();
    }
}

#[test]
fn slowloris_gets_408_and_is_closed_while_others_are_served() {
    let s = Server::start(&["--head-timeout", "1", "--threads", "1"]);
    let mut slow = s.tcp();
    slow.write_all(b"GET /hel").unwrap();
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writer = slow.try_clone().unwrap();
    let stop2 = stop.clone();
    let dribble = std::thread::spawn(move || {
        // Never finishes the head: one byte every 300 ms.
        let rest = b"lo HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        for b in rest.iter().cycle() {
            if stop2.load(Ordering::Relaxed) || writer.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });

    // Meanwhile another client is served (same worker: there is only one).
    std::thread::sleep(Duration::from_millis(400));
    let other = s.request(&get("/hello"));
    assert_hello(&other, HELLO);
    // ... while the slow client's connection was still open and unanswered.
    slow.set_nonblocking(true).unwrap();
    match slow.peek(&mut [0u8; 1]) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        r => panic!(
            "the slow client was already answered or closed ({r:?}) after {:?}: this machine \
             is too slow for the test to mean anything",
            start.elapsed()
        ),
    }
    slow.set_nonblocking(false).unwrap();

    let mut got = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        match slow.read(&mut tmp) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("slow client not closed ({e}) after {:?}", start.elapsed()),
        }
    }
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = dribble.join();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408 "), "{text:?}");
    assert!(elapsed < Duration::from_secs(5), "closed after {elapsed:?}");
    // The 408 is a complete answer with the common headers.
    assert!(
        text.contains("\r\nAccess-Control-Allow-Origin: *\r\n"),
        "{text:?}"
    );
}

#[test]
fn idle_connection_that_sends_nothing_is_closed_after_the_head_timeout() {
    let s = Server::start(&["--head-timeout", "1"]);
    let mut c = s.tcp();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut tmp = [0u8; 1024];
    loop {
        match c.read(&mut tmp) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!(
                "idle connection not closed ({e}) after {:?}",
                start.elapsed()
            ),
        }
    }
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(5), "closed after {elapsed:?}");
    assert!(
        elapsed >= Duration::from_millis(500),
        "closed at once ({elapsed:?})"
    );
    // Either silence or a 408; nothing else.
    assert!(
        got.is_empty() || got.starts_with(b"HTTP/1.1 408 "),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}
