//! WalletConnect 1.0 bridge frames under the same rules as v2 (DECISIONS §8: "same limits,
//! metrics, persistence"), through the real binary at one worker and at four: a v1
//! subscriber that never reads is closed with 1008 and the others lose nothing; the heartbeat
//! closes a silent v1 connection and its subscription goes with it; v1 subscriptions count
//! against `--max-subscriptions`; pending frames are capped per topic, expire
//! (`--v1-pending-ttl`), and survive `kill -9`; webhooks: one POST per registered webhook
//! for each pub that is not silent, live or pending, none for a silent one.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::v1::{null_id_error, sent_pub};
use common::wait::poll_every;
use common::webhook::{Receiver, Reply};
use common::{each_server, topic, RawWs, Server, SockOpts, TempDir, THREADS};

/// Frame payload size in the slow-consumer test.
const SIZE: usize = 8192;

fn payload(i: usize) -> String {
    format!("{i:06}{}", common::hex(SIZE - 6, i as u64 + 1))
}

#[test]
fn a_v1_subscriber_that_never_reads_is_closed_with_1008_and_the_others_lose_nothing() {
    for t in THREADS {
        let s = Server::start(&["--threads", t, "--max-outbound", "65536"]);
        let tp = topic();
        let mut stalled = RawWs::upgrade(s.tcp_with(SockOpts {
            rcvbuf: Some(4096),
            ..SockOpts::default()
        }));
        stalled.v1_sub(&tp);
        stalled.settled("stalled subscriber");
        let mut reader = RawWs::open(&s);
        reader.v1_sub(&tp);
        reader.settled("reader");

        // The reader keeps up; the publisher stays at most LEAD frames ahead of it.
        const N: usize = 300;
        const LEAD: usize = 16;
        let read = Arc::new(AtomicUsize::new(0));
        let reading = std::thread::spawn({
            let (read, tp) = (read.clone(), tp.clone());
            move || {
                for i in 0..N {
                    reader.expect_text(&sent_pub(&tp, &payload(i), true), "reader");
                    read.fetch_add(1, Ordering::SeqCst);
                }
                reader.settled("reader");
            }
        });
        let mut publ = RawWs::open(&s);
        for i in 0..N {
            while i > read.load(Ordering::SeqCst) + LEAD && !reading.is_finished() {
                std::thread::sleep(Duration::from_millis(1));
            }
            publ.v1_pub(&tp, &payload(i), Some(true));
        }
        reading.join().expect("the reader lost or reordered frames");
        assert!(s.dropped("slow_consumer") >= 1.0, "[--threads {t}]");
        // The stalled client gets what was queued, in order, then the 1008 close.
        let mut got = 0;
        let code = loop {
            match stalled.next() {
                common::Next::Frame(f) if f.op == common::raw_ws::OP_TEXT => {
                    assert_eq!(
                        String::from_utf8_lossy(&f.payload),
                        sent_pub(&tp, &payload(got), true),
                        "[--threads {t}] stalled client's frame {got}"
                    );
                    got += 1;
                }
                common::Next::Frame(f) if f.op == common::raw_ws::OP_CLOSE => {
                    break f.close_code();
                }
                other => panic!("[--threads {t}] stalled client after {got} frames: {other:?}"),
            }
        };
        assert_eq!(code, Some(1008), "[--threads {t}]");
        assert!(
            got < N,
            "[--threads {t}] the stalled client was never cut off"
        );
    }
}

#[test]
fn the_heartbeat_closes_a_silent_v1_subscriber_and_its_subscription_goes_with_it() {
    each_server(&["--ping-interval", "0.5"], |s| {
        let start = Instant::now();
        let tp = topic();
        let mut silent = RawWs::open(s);
        silent.v1_sub(&tp);
        // It never answers the pings: closed after two intervals.
        let code = silent.until_closed(start + Duration::from_secs(5));
        if let Some(c) = code {
            assert_ne!(c, 1000, "heartbeat close announced as normal closure");
        }
        s.wait_unsubscribed(0.0);
        // With no subscriber left, a pub is pending again for the next sub.
        let mut publ = RawWs::open(s);
        publ.v1_pub(&tp, "after", None);
        publ.settled("publisher");
        let mut back = RawWs::open(s);
        back.v1_sub(&tp);
        back.expect_text(&sent_pub(&tp, "after", false), "returning subscriber");
    });
}

#[test]
fn v1_subscriptions_count_against_the_subscription_limit() {
    each_server(&["--max-subscriptions", "3"], |s| {
        let (t1, t2, t3, t4) = (topic(), topic(), topic(), topic());
        let mut c = RawWs::open(s);
        c.subscribe(&t1);
        c.v1_sub(&t2);
        c.v1_sub(&t3);
        c.settled("client at its limit");
        let refusal = null_id_error(-32000, "Subscription limit reached (3 per connection)");
        c.v1_sub(&t4);
        c.expect_text(&refusal, "v1 sub past the limit");
        let id = c.call("waku_subscribe", serde_json::json!({ "topic": t4 }));
        assert_eq!(
            c.recv_json(),
            serde_json::json!({"id": id, "jsonrpc": "2.0",
                "error": {"code": -32000, "message": "Subscription limit reached (3 per connection)"}})
        );
        // A topic it already has costs nothing more.
        c.v1_sub(&t2);
        c.settled("client subscribing again");
        // The refused sub did not subscribe: a pub on t4 waits for another subscriber.
        let mut publ = RawWs::open(s);
        publ.v1_pub(&t4, "kept", None);
        publ.v1_pub(&t2, "live", None);
        c.expect_text(&sent_pub(&t2, "live", false), "client");
        let mut other = RawWs::open(s);
        other.v1_sub(&t4);
        other.expect_text(&sent_pub(&t4, "kept", false), "other subscriber");
        c.settled("client");
    });
}

#[test]
fn pending_frames_are_capped_per_topic_oldest_evicted() {
    each_server(&["--max-cached-per-topic", "3"], |s| {
        let tp = topic();
        let mut publ = RawWs::open(s);
        for i in 1..=5 {
            publ.v1_pub(&tp, &format!("p{i}"), None);
        }
        publ.settled("publisher");
        let mut sub = RawWs::open(s);
        sub.v1_sub(&tp);
        for i in 3..=5 {
            sub.expect_text(&sent_pub(&tp, &format!("p{i}"), false), "subscriber");
        }
        publ.v1_pub(&tp, "next", None);
        sub.expect_text(&sent_pub(&tp, "next", false), "subscriber");
        assert_eq!(s.dropped("topic_cache_full"), 2.0);
    });
}

#[test]
fn pending_frames_expire_after_the_pending_ttl() {
    each_server(&["--v1-pending-ttl", "1"], |s| {
        let tp = topic();
        let mut publ = RawWs::open(s);
        publ.v1_pub(&tp, "stale", None);
        publ.settled("publisher");
        assert_eq!(
            s.wait_gauge("walletrelay_cached_messages", |n| n == 1.0),
            1.0
        );
        // Expired (and counted) a second later.
        let (every, within) = (Duration::from_millis(100), Duration::from_secs(10));
        let expired = poll_every(every, within, || {
            (s.dropped("expired") >= 1.0).then_some(())
        });
        assert!(expired.is_some(), "the pending frame never expired");
        assert_eq!(s.metric("walletrelay_cached_messages"), 0.0);
        let mut sub = RawWs::open(s);
        sub.v1_sub(&tp);
        sub.settled("subscriber");
        // The subscriber's first frame is the next pub, not the expired one.
        publ.v1_pub(&tp, "fresh", None);
        sub.expect_text(&sent_pub(&tp, "fresh", false), "subscriber");
    });
}

#[test]
fn pending_frames_survive_kill_9_and_a_taken_one_does_not_come_back() {
    let dir = TempDir::new("v1-pending");
    let d = dir.arg();
    let tp = topic();
    {
        let s = Server::start(&["--threads", "4", "--data-dir", d]);
        let mut publ = RawWs::open(&s);
        publ.v1_pub(&tp, "p1", None);
        publ.v1_pub(&tp, "p2", Some(true));
        // A pub has no answer: the frames are kept (and recorded) once the topic's home
        // worker counts them.
        assert_eq!(
            s.wait_gauge("walletrelay_cached_messages", |n| n == 2.0),
            2.0
        );
    } // dropped: SIGKILL
    {
        // Another worker count: the frames go to their topic's new home.
        let s = Server::start(&["--threads", "1", "--data-dir", d]);
        let mut sub = RawWs::open(&s);
        sub.v1_sub(&tp);
        sub.expect_text(&sent_pub(&tp, "p1", false), "after the first restart");
        sub.expect_text(&sent_pub(&tp, "p2", true), "after the first restart");
        sub.settled("after the first restart");
    }
    {
        let s = Server::start(&["--threads", "4", "--data-dir", d]);
        let mut sub = RawWs::open(&s);
        sub.v1_sub(&tp);
        sub.settled("after the second restart");
        let mut publ = RawWs::open(&s);
        publ.v1_pub(&tp, "p3", None);
        sub.expect_text(&sent_pub(&tp, "p3", false), "after the second restart");
    }
}

/// Registers `url` for `tp` and requires `{"success":true}`.
fn register(s: &Server, tp: &str, url: &str) {
    let (status, body) = s.register_webhook(tp, url);
    assert_eq!((status, body.as_str()), (200, r#"{"success":true}"#));
}

#[test]
fn webhooks_one_post_per_webhook_for_each_pub_not_silent_live_or_pending() {
    each_server(&["--webhook-allow-private"], |s| {
        let (r1, r2) = (
            Receiver::start(|_| Reply::Status(200)),
            Receiver::start(|_| Reply::Status(200)),
        );
        let (live, pending) = (topic(), topic());
        for tp in [&live, &pending] {
            register(s, tp, &r1.url("/push"));
            register(s, tp, &r2.url("/push"));
        }
        let mut sub = RawWs::open(s);
        sub.v1_sub(&live);
        sub.settled("subscriber");
        let mut publ = RawWs::open(s);
        // Live: silent, not silent, no `silent` key.
        publ.v1_pub(&live, "quiet", Some(true));
        publ.v1_pub(&live, "loud", Some(false));
        publ.v1_pub(&live, "default", None);
        for p in ["quiet", "loud", "default"] {
            sub.expect_text(&sent_pub(&live, p, p == "quiet"), "subscriber");
        }
        // Pending: silent, then not silent.
        publ.v1_pub(&pending, "quiet", Some(true));
        publ.v1_pub(&pending, "loud", Some(false));
        publ.settled("publisher");
        // Each receiver: two POSTs for `live`, one for `pending`, with the exact body.
        for r in [&r1, &r2] {
            let mut bodies: Vec<String> = (0..3)
                .map(|_| {
                    let seen = r.next(Duration::from_secs(20)).expect("a webhook call");
                    assert_eq!(
                        (seen.method.as_str(), seen.target.as_str()),
                        ("POST", "/push")
                    );
                    String::from_utf8_lossy(&seen.body).into_owned()
                })
                .collect();
            bodies.sort();
            let mut want = vec![
                format!(r#"{{"topic":"{live}"}}"#),
                format!(r#"{{"topic":"{live}"}}"#),
                format!(r#"{{"topic":"{pending}"}}"#),
            ];
            want.sort();
            assert_eq!(bodies, want);
        }
        // No call for the silent pubs: the next call of each receiver is for a later pub.
        let barrier = topic();
        register(s, &barrier, &r1.url("/push"));
        register(s, &barrier, &r2.url("/push"));
        publ.v1_pub(&barrier, "barrier", None);
        for r in [&r1, &r2] {
            let seen = r.next(Duration::from_secs(20)).expect("the barrier's call");
            assert_eq!(
                String::from_utf8_lossy(&seen.body),
                format!(r#"{{"topic":"{barrier}"}}"#),
                "a silent pub made a webhook call"
            );
        }
        // Calls run on several pool threads: give a stray one time to show up.
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!((r1.hits(), r2.hits()), (4, 4));
    });
}
