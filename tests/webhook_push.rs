//! Push notifications end to end (DECISIONS §4, issue 4): the real binary, a real WebSocket
//! publisher and subscriber, `POST /subscribe`, and a webhook receiver on 127.0.0.1.
//!
//! Needs the pool wired into `server.rs` (`WebhookPool::start` with `--webhook-allow-private`,
//! `--webhook-threads`, `--webhook-queue`, `on_gone` -> `CoreMsg::RemoveWebhook`, and
//! `shutdown(2 s)`): with `WebhookPool::default()` every loopback receiver here is refused.
//!
//! "No call" checks use a barrier: after the action that must not call the webhook, an
//! action that must call it; once that call arrives (plus a generous pause for stragglers)
//! the count must be exactly what is expected.

mod common;

use std::time::{Duration, Instant};

use common::wait::wait_until;
use common::webhook::{Receiver, Reply, Seen};
use common::{topic, Server, THREADS};
use serde_json::json;

const LONG: Duration = Duration::from_secs(20);
/// Time allowed for a call that should not happen to show up anyway.
const STRAGGLERS: Duration = Duration::from_millis(700);

fn register_ok(s: &Server, topic: &str, webhook: &str) {
    let (status, body) = s.register_webhook(topic, webhook);
    assert_eq!(status, 200, "register: {body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).ok(),
        Some(json!({"success": true})),
        "{body}"
    );
}

fn publish_with(ws: &mut common::Ws, topic: &str, message: &str, prompt: Option<bool>) {
    let mut params = json!({ "topic": topic, "message": message, "ttl": 21600 });
    if let Some(p) = prompt {
        params["prompt"] = json!(p);
    }
    let r = ws.call("waku_publish", params);
    assert_eq!(r["result"], true, "publish failed: {r}");
}

fn expect_call(r: &Receiver, topic: &str) -> Seen {
    let seen = r.next(LONG).expect("the webhook is called");
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(
        String::from_utf8_lossy(&seen.body),
        format!("{{\"topic\":\"{topic}\"}}")
    );
    seen
}

#[test]
fn one_post_per_publish_with_the_exact_body() {
    for t in THREADS {
        let s = Server::start(&["--webhook-allow-private", "--threads", t]);
        let r = Receiver::start(|_| Reply::Status(200));
        let tp = topic();
        register_ok(&s, &tp, &r.url("/push?app=1"));
        let mut publ = s.ws();
        publ.publish(&tp, "first");
        let seen = expect_call(&r, &tp);
        assert_eq!(seen.target, "/push?app=1");
        publ.publish(&tp, "second");
        expect_call(&r, &tp);
        std::thread::sleep(STRAGGLERS);
        assert_eq!(r.hits(), 2, "threads {t}");
        assert!(wait_until(LONG, || {
            s.series("walletrelay_webhook_succeeded_total") == 2.0
        }));
    }
}

#[test]
fn a_duplicate_registration_still_gets_one_post() {
    let s = Server::start(&["--webhook-allow-private", "--threads", "4"]);
    let r = Receiver::start(|_| Reply::Status(200));
    let tp = topic();
    register_ok(&s, &tp, &r.url("/"));
    register_ok(&s, &tp, &r.url("/"));
    s.ws().publish(&tp, "once");
    expect_call(&r, &tp);
    std::thread::sleep(STRAGGLERS);
    assert_eq!(r.hits(), 1);
}

#[test]
fn prompt_false_gets_no_post() {
    let s = Server::start(&["--webhook-allow-private", "--threads", "4"]);
    let r = Receiver::start(|_| Reply::Status(200));
    let tp = topic();
    register_ok(&s, &tp, &r.url("/"));
    let mut publ = s.ws();
    publish_with(&mut publ, &tp, "quiet", Some(false));
    publish_with(&mut publ, &tp, "loud", Some(true));
    expect_call(&r, &tp);
    std::thread::sleep(STRAGGLERS);
    assert_eq!(r.hits(), 1, "only the prompted publish calls the webhook");
}

#[test]
fn a_duplicate_message_gets_no_post() {
    let s = Server::start(&["--webhook-allow-private", "--threads", "4"]);
    let r = Receiver::start(|_| Reply::Status(200));
    let tp = topic();
    register_ok(&s, &tp, &r.url("/"));
    let mut publ = s.ws();
    publ.publish(&tp, "same");
    publ.publish(&tp, "same");
    publ.publish(&tp, "different");
    expect_call(&r, &tp);
    expect_call(&r, &tp);
    std::thread::sleep(STRAGGLERS);
    assert_eq!(r.hits(), 2, "the duplicate was neither stored nor pushed");
}

#[test]
fn a_publish_on_another_topic_gets_no_post() {
    let s = Server::start(&["--webhook-allow-private", "--threads", "4"]);
    let r = Receiver::start(|_| Reply::Status(200));
    let (mine, other) = (topic(), topic());
    register_ok(&s, &mine, &r.url("/"));
    let mut publ = s.ws();
    publ.publish(&other, "not for you");
    publ.publish(&mine, "for you");
    expect_call(&r, &mine);
    std::thread::sleep(STRAGGLERS);
    assert_eq!(r.hits(), 1);
}

#[test]
fn a_loopback_webhook_is_refused_and_counted_by_default() {
    let s = Server::start(&["--threads", "2"]);
    let r = Receiver::start(|_| Reply::Status(200));
    let tp = topic();
    // Registration accepts any absolute http(s) URL; the guard acts at delivery.
    register_ok(&s, &tp, &r.url("/"));
    s.ws().publish(&tp, "hello");
    assert!(wait_until(LONG, || {
        s.series("walletrelay_webhook_dropped_total{reason=\"ssrf\"}") == 1.0
    }));
    std::thread::sleep(STRAGGLERS);
    assert_eq!(r.hits(), 0, "nothing reached the loopback receiver");
    assert_eq!(s.series("walletrelay_webhook_sent_total"), 0.0);
}

#[test]
fn a_hanging_webhook_does_not_slow_publish_and_delivery() {
    let s = Server::start(&["--webhook-allow-private", "--threads", "2"]);
    let r = Receiver::start(|_| Reply::Hang);
    let tp = topic();
    register_ok(&s, &tp, &r.url("/"));
    let mut sub = s.ws();
    let mut publ = s.ws();
    let id = sub.subscribe(&tp);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let t = Instant::now();
        publ.publish(&tp, &format!("m{i}"));
        assert_eq!(sub.next_push(), (id.clone(), tp.clone(), format!("m{i}")));
        slowest = slowest.max(t.elapsed());
    }
    // A webhook try may hang for 5 s; the relay's round trips must not wait for it.
    assert!(
        slowest < Duration::from_secs(4),
        "slowest round trip {slowest:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        wait_until(LONG, || r.hits() >= 1),
        "webhook calls were made and are hanging"
    );
}

#[test]
fn a_flood_with_a_slow_webhook_drops_calls_and_keeps_relaying() {
    let s = Server::start(&[
        "--webhook-allow-private",
        "--threads",
        "2",
        "--webhook-threads",
        "1",
        "--webhook-queue",
        "8",
    ]);
    let r = Receiver::start(|_| Reply::After(Duration::from_millis(50), 200));
    let tp = topic();
    register_ok(&s, &tp, &r.url("/"));
    let mut sub = s.ws();
    let mut publ = s.ws();
    let id = sub.subscribe(&tp);
    const N: usize = 10_000;
    let reader = std::thread::spawn(move || {
        let mut got = 0;
        for i in 0..N {
            let (sid, t, m) = sub.next_push();
            assert_eq!((sid.as_str(), m), (id.as_str(), format!("m{i}")));
            assert_eq!(t.len(), 64);
            got += 1;
        }
        got
    });
    for i in 0..N {
        publ.publish(&tp, &format!("m{i}"));
    }
    assert_eq!(reader.join().expect("subscriber"), N);
    let queued = s.series("walletrelay_webhook_queued_total");
    let full = s.series("walletrelay_webhook_dropped_total{reason=\"queue_full\"}");
    assert!(full > 0.0, "a queue of 8 and a slow receiver must drop");
    assert_eq!(
        queued + full,
        N as f64,
        "every stored publish was submitted once"
    );
    assert_eq!(s.get("/health").0, Some(204), "the server still answers");
}
