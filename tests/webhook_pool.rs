//! Drives `WebhookPool` directly against small HTTP receivers on 127.0.0.1: exact requests,
//! retries, final statuses, redirects, timeouts, the SSRF guard, a full queue and shutdown.
//! Timing checks are only generous upper bounds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use walletrelay::webhook::{Delivery, WebhookConfig, WebhookPool};

mod common;
use common::metrics;
use common::wait::wait_until;
use common::webhook::{Receiver, Reply};

fn config(threads: usize, queue: usize, allow_private: bool, timeout: Duration) -> WebhookConfig {
    WebhookConfig {
        threads,
        queue,
        allow_private,
        timeout,
        tries: 3,
        give_up_after: Duration::from_secs(3600),
    }
}

fn pool(cfg: WebhookConfig) -> WebhookPool {
    WebhookPool::start(cfg, Arc::new(|_, _| {}))
}

fn delivery(topic: &str, url: &str) -> Delivery {
    Delivery {
        topic: topic.into(),
        url: url.into(),
    }
}

/// The value of one series (name with labels) in the pool's metrics; 0 if absent.
fn metric(pool: &WebhookPool, series: &str) -> u64 {
    let mut out = String::new();
    pool.render_metrics(&mut out);
    metrics::series(&out, series).map_or(0, |v| v as u64)
}

fn failed(pool: &WebhookPool, reason: &str) -> u64 {
    metric(
        pool,
        &format!("walletrelay_webhook_failed_total{{reason=\"{reason}\"}}"),
    )
}

/// Calls given up, whatever the reason.
fn failed_total(pool: &WebhookPool) -> u64 {
    let mut out = String::new();
    pool.render_metrics(&mut out);
    metrics::sum(&out, "walletrelay_webhook_failed_total") as u64
}

fn dropped(pool: &WebhookPool, reason: &str) -> u64 {
    metric(
        pool,
        &format!("walletrelay_webhook_dropped_total{{reason=\"{reason}\"}}"),
    )
}

const LONG: Duration = Duration::from_secs(20);

#[test]
fn posts_the_exact_body_and_content_type() {
    let r = Receiver::start(|_| Reply::Status(200));
    let p = pool(config(2, 16, true, Duration::from_secs(5)));
    let topic = "a\"b\\c\u{e9}/\u{1}";
    p.submit(delivery(topic, &r.url("/hook?x=1")));
    let seen = r.next(LONG).expect("the webhook is called");
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.target, "/hook?x=1");
    assert_eq!(seen.header("content-type"), Some("application/json"));
    let body = String::from_utf8(seen.body).expect("UTF-8 body");
    assert_eq!(body, "{\"topic\":\"a\\\"b\\\\c\u{e9}/\\u0001\"}");
    let parsed: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(parsed, serde_json::json!({ "topic": topic }));
    assert!(wait_until(LONG, || metric(
        &p,
        "walletrelay_webhook_succeeded_total"
    ) == 1));
    assert_eq!(metric(&p, "walletrelay_webhook_queued_total"), 1);
    assert_eq!(metric(&p, "walletrelay_webhook_sent_total"), 1);
    assert_eq!(metric(&p, "walletrelay_webhook_latency_seconds_count"), 1);
    assert_eq!(metric(&p, "walletrelay_webhook_retried_total"), 0);
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn reuses_the_connection_to_a_host() {
    let r = Receiver::start(|_| Reply::Status(204));
    let p = pool(config(1, 16, true, Duration::from_secs(5)));
    let mut conns = Vec::new();
    for i in 0..3u64 {
        p.submit(delivery(&format!("t{i}"), &r.url("/")));
        conns.push(r.next(LONG).expect("the webhook is called").conn);
        assert!(wait_until(LONG, || metric(
            &p,
            "walletrelay_webhook_succeeded_total"
        ) == i + 1));
    }
    assert_eq!(
        conns,
        vec![conns[0]; 3],
        "all calls on one kept-alive connection"
    );
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn server_errors_are_retried_until_success() {
    let r = Receiver::start(|n| Reply::Status(if n < 2 { 500 } else { 200 }));
    let p = pool(config(2, 16, true, Duration::from_secs(5)));
    p.submit(delivery("retry", &r.url("/")));
    assert!(wait_until(LONG, || metric(
        &p,
        "walletrelay_webhook_succeeded_total"
    ) == 1));
    assert_eq!(r.hits(), 3);
    assert_eq!(metric(&p, "walletrelay_webhook_sent_total"), 3);
    assert_eq!(metric(&p, "walletrelay_webhook_retried_total"), 2);
    assert_eq!(failed(&p, "status_5xx"), 0);
    for _ in 0..3 {
        let seen = r.next(LONG).expect("three tries");
        assert_eq!(seen.body, br#"{"topic":"retry"}"#);
    }
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn persistent_server_errors_give_up_after_three_tries_and_report_gone() {
    let r = Receiver::start(|_| Reply::Status(503));
    let gone = Arc::new(Mutex::new(Vec::new()));
    let g = gone.clone();
    let mut cfg = config(2, 16, true, Duration::from_secs(5));
    // Give up on the registration at its first failed call.
    cfg.give_up_after = Duration::ZERO;
    let p = WebhookPool::start(
        cfg,
        Arc::new(move |t: Arc<str>, u: Arc<str>| {
            if let Ok(mut v) = g.lock() {
                v.push((t.to_string(), u.to_string()));
            }
        }),
    );
    let url = r.url("/dead");
    p.submit(delivery("gone-topic", &url));
    assert!(wait_until(LONG, || failed(&p, "status_5xx") == 1));
    assert_eq!(r.hits(), 3);
    assert_eq!(metric(&p, "walletrelay_webhook_gone_total"), 1);
    assert_eq!(
        *gone.lock().expect("gone list"),
        vec![("gone-topic".to_string(), url)]
    );
    // No fourth try arrives later.
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(r.hits(), 3);
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn client_errors_are_final_and_do_not_report_gone_early() {
    let r = Receiver::start(|_| Reply::Status(404));
    let gone = Arc::new(AtomicUsize::new(0));
    let g = gone.clone();
    let p = WebhookPool::start(
        config(2, 16, true, Duration::from_secs(5)),
        Arc::new(move |_, _| {
            g.fetch_add(1, Ordering::SeqCst);
        }),
    );
    p.submit(delivery("t", &r.url("/missing")));
    assert!(wait_until(LONG, || failed(&p, "status_4xx") == 1));
    // Longer than the first backoff could be: still a single try.
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(r.hits(), 1);
    assert_eq!(metric(&p, "walletrelay_webhook_retried_total"), 0);
    assert_eq!(gone.load(Ordering::SeqCst), 0, "24 h have not passed");
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn redirects_are_not_followed() {
    let r = Receiver::start(|_| Reply::Status(302));
    let p = pool(config(2, 16, true, Duration::from_secs(5)));
    p.submit(delivery("t", &r.url("/moved")));
    assert!(wait_until(LONG, || failed(&p, "redirect") == 1));
    thread::sleep(Duration::from_millis(500));
    assert_eq!(r.hits(), 1, "the Location was not requested");
    let seen = r.next(LONG).expect("one request");
    assert_eq!(seen.target, "/moved");
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn a_hanging_receiver_does_not_block_others_and_times_out() {
    let hang = Receiver::start(|_| Reply::Hang);
    let good = Receiver::start(|_| Reply::Status(200));
    let mut cfg = config(2, 64, true, Duration::from_secs(3));
    cfg.tries = 2;
    let p = pool(cfg);
    p.submit(delivery("slow", &hang.url("/")));
    assert!(
        hang.next(LONG).is_some(),
        "the hanging receiver got its call"
    );
    for i in 0..5 {
        p.submit(delivery(&format!("fast{i}"), &good.url("/")));
    }
    assert!(wait_until(LONG, || metric(
        &p,
        "walletrelay_webhook_succeeded_total"
    ) == 5));
    // The other deliveries went through while the hanging call was still in its first try.
    assert_eq!(failed(&p, "timeout"), 0);
    assert_eq!(metric(&p, "walletrelay_webhook_retried_total"), 0);
    // Then it times out, is retried once, and times out again.
    assert!(wait_until(Duration::from_secs(30), || failed(
        &p, "timeout"
    ) == 1));
    assert_eq!(hang.hits(), 2);
    assert_eq!(metric(&p, "walletrelay_webhook_retried_total"), 1);
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn the_ssrf_guard_refuses_loopback_and_counts_it() {
    let r = Receiver::start(|_| Reply::Status(200));
    let p = pool(config(2, 16, false, Duration::from_secs(5)));
    let port = r.addr.port();
    for url in [
        format!("http://127.0.0.1:{port}/"),
        format!("http://localhost:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://127.0.0.1:{port}/"),
    ] {
        p.submit(delivery("t", &url));
    }
    assert!(wait_until(LONG, || dropped(&p, "ssrf") == 4));
    thread::sleep(Duration::from_millis(300));
    assert_eq!(r.hits(), 0, "nothing reached the loopback receiver");
    assert_eq!(metric(&p, "walletrelay_webhook_sent_total"), 0);
    assert_eq!(metric(&p, "walletrelay_webhook_retried_total"), 0);
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn a_full_queue_drops_and_counts_without_blocking_submit() {
    // The first call hangs, so the single thread takes nothing else while we submit.
    let r = Receiver::start(|_| Reply::Hang);
    let p = pool(config(1, 8, true, Duration::from_secs(60)));
    let url = r.url("/slow");
    let started = Instant::now();
    for _ in 0..10_000 {
        p.submit(delivery("flood", &url));
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "10,000 submits took {took:?}"
    );
    let queued = metric(&p, "walletrelay_webhook_queued_total");
    let full = dropped(&p, "queue_full");
    assert_eq!(queued + full, 10_000);
    assert!(
        queued <= 8 + 1,
        "queued {queued}: the queue holds 8, one may be in flight"
    );
    assert!(full >= 10_000 - 9);
    assert!(metric(&p, "walletrelay_webhook_queue_depth") <= 8);
    assert!(r.next(LONG).is_some(), "the first call went out");
    let started = Instant::now();
    p.shutdown(Duration::from_secs(1));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r.hits(), 1);
}

#[test]
fn shutdown_lets_the_call_in_flight_finish_and_drops_the_queue() {
    let r = Receiver::start(|_| Reply::After(Duration::from_millis(300), 200));
    let p = pool(config(1, 16, true, Duration::from_secs(5)));
    for i in 0..3 {
        p.submit(delivery(&format!("t{i}"), &r.url("/")));
    }
    assert!(r.next(LONG).is_some(), "the first call is in flight");
    let started = Instant::now();
    p.shutdown(Duration::from_secs(3));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(metric(&p, "walletrelay_webhook_succeeded_total"), 1);
    assert_eq!(dropped(&p, "shutdown"), 2, "the two queued calls");
    assert_eq!(r.hits(), 1);
    // After shutdown nothing is taken.
    p.submit(delivery("late", &r.url("/")));
    assert_eq!(dropped(&p, "shutdown"), 3);
    assert_eq!(metric(&p, "walletrelay_webhook_queued_total"), 3);
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn shutdown_returns_within_grace_while_a_call_hangs() {
    let hang = Receiver::start(|_| Reply::Hang);
    let p = pool(config(2, 16, true, Duration::from_secs(60)));
    p.submit(delivery("t", &hang.url("/")));
    assert!(hang.next(LONG).is_some(), "the call is in flight");
    let started = Instant::now();
    p.shutdown(Duration::from_millis(500));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    // The aborted try ended the call: it is counted, and not retried.
    assert!(wait_until(LONG, || failed_total(&p) == 1));
    assert_eq!(metric(&p, "walletrelay_webhook_retried_total"), 0);
    assert_eq!(hang.hits(), 1);
}

#[test]
fn metrics_are_prometheus_text() {
    let p = pool(config(1, 1, true, Duration::from_secs(5)));
    let mut out = String::new();
    p.render_metrics(&mut out);
    for family in [
        "walletrelay_webhook_queued_total counter",
        "walletrelay_webhook_sent_total counter",
        "walletrelay_webhook_succeeded_total counter",
        "walletrelay_webhook_failed_total counter",
        "walletrelay_webhook_retried_total counter",
        "walletrelay_webhook_dropped_total counter",
        "walletrelay_webhook_latency_seconds histogram",
    ] {
        assert!(
            out.contains(&format!("# TYPE {family}\n")),
            "{family} missing:\n{out}"
        );
    }
    assert!(out.contains("walletrelay_webhook_dropped_total{reason=\"queue_full\"} 0\n"));
    assert!(out.contains("walletrelay_webhook_latency_seconds_bucket{le=\"+Inf\"} 0\n"));
    for line in out.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        assert!(series.starts_with("walletrelay_webhook_"), "{line}");
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
    p.shutdown(Duration::from_secs(1));
}

#[test]
fn https_goes_through_tls_and_a_handshake_failure_is_final() {
    // A plain-HTTP peer answering an https webhook: the TLS handshake fails.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    thread::spawn(move || {
        for s in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            let mut s = s;
            let _ = std::io::Write::write_all(&mut s, b"HTTP/1.1 200 OK\r\n\r\n");
        }
    });
    let p = pool(config(2, 16, true, Duration::from_secs(5)));
    p.submit(delivery("t", &format!("https://127.0.0.1:{port}/hook")));
    let ok = wait_until(LONG, || failed(&p, "tls") == 1);
    let mut m = String::new();
    p.render_metrics(&mut m);
    assert!(ok, "{m}");
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "not retried");
    assert_eq!(metric(&p, "walletrelay_webhook_succeeded_total"), 0);
    p.shutdown(Duration::from_secs(1));
}
