//! What else a restart restores (DECISIONS §6): webhook registrations (a webhook registered
//! before a `kill -9` is called for a publish after the restart, also when `--threads`
//! changed), and each message's absolute expiry (its time to live keeps running while the
//! server is down: a message whose ttl ends during the outage is not served after it; one
//! that expired stays gone through restarts at other worker counts, which rewrite the logs,
//! while the others keep their order and their dedup).

mod common;

use std::time::Duration;

use common::durability::{history, Node};
use common::webhook::{Receiver, Reply};
use common::TempDir;
use serde_json::json;

#[test]
fn a_webhook_registered_before_kill_9_fires_after_the_restart() {
    let hooks = Receiver::start(|_| Reply::Status(200));
    let dir = TempDir::new("webhook");
    let topics: Vec<String> = (0..4).map(|_| common::topic()).collect();
    let node = Node::start(&dir, &["--threads", "2", "--webhook-allow-private"]);
    for t in &topics {
        let (status, body) = node.register_webhook(t, &hooks.url(&format!("/hook/{t}")));
        assert_eq!((status, body.as_str()), (200, r#"{"success":true}"#));
    }
    node.kill9();

    for threads in ["1", "2"] {
        let node = Node::start(&dir, &["--threads", threads, "--webhook-allow-private"]);
        let (_, webhooks, line) = node.recovered();
        assert_eq!(webhooks, topics.len() as u64, "{line}");
        for t in &topics {
            node.ws()
                .publish(t, &format!("after restart at --threads {threads}"));
            let seen = hooks
                .next(Duration::from_secs(10))
                .unwrap_or_else(|| panic!("no webhook call for {t} at --threads {threads}"));
            assert_eq!(seen.method, "POST");
            assert_eq!(seen.target, format!("/hook/{t}"));
            let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
            assert_eq!(body, json!({ "topic": t }));
        }
        // Registering again after the restart keeps one registration: one call a publish.
        let (status, _) =
            node.register_webhook(&topics[0], &hooks.url(&format!("/hook/{}", topics[0])));
        assert_eq!(status, 200);
        node.ws()
            .publish(&topics[0], &format!("once at --threads {threads}"));
        assert!(hooks.next(Duration::from_secs(10)).is_some());
        assert!(
            hooks.next(Duration::from_millis(300)).is_none(),
            "called twice"
        );
        node.kill9();
    }
}

#[test]
fn a_message_whose_ttl_ends_while_the_server_is_down_is_gone_after_the_restart() {
    let dir = TempDir::new("ttl");
    let topic = common::topic();
    let node = Node::start(&dir, &["--threads", "1"]);
    let mut ws = node.ws();
    for (message, ttl) in [("short", 2), ("long", 3600), ("short too", 1)] {
        let r = ws.call(
            "waku_publish",
            json!({ "topic": topic, "message": message, "ttl": ttl }),
        );
        assert_eq!(r["result"], true, "{r}");
    }
    node.kill9();
    // Down longer than the short messages' ttl: they expire during the outage.
    std::thread::sleep(Duration::from_secs(3));
    let node = Node::start(&dir, &["--threads", "1"]);
    let (messages, _, line) = node.recovered();
    assert_eq!(messages, 1, "{line}");
    assert!(line.contains("2 expired"), "{line}");
    assert_eq!(history(&node, &topic, "marker"), ["long"]);
}

/// Publishes `message` to `topic` with `ttl` seconds and requires `true`.
fn publish_ttl(node: &Node, topic: &str, message: &str, ttl: u32) {
    let r = node.ws().call(
        "waku_publish",
        json!({ "topic": topic, "message": message, "ttl": ttl }),
    );
    assert_eq!(r["result"], true, "{r}");
}

#[test]
fn an_expired_message_stays_gone_and_the_others_keep_their_place_across_other_worker_counts() {
    let dir = TempDir::new("ttl-layouts");
    // Enough topics that several workers are homes of some.
    let topics: Vec<String> = (0..8).map(|_| common::topic()).collect();
    let node = Node::start(&dir, &["--threads", "4"]);
    for t in &topics {
        for (message, ttl) in [("a", 3600), ("short", 1), ("b", 3600)] {
            publish_ttl(&node, t, message, ttl);
        }
    }
    // Expired while the server runs (and its records still in the log) or while it is down.
    std::thread::sleep(Duration::from_millis(2500));
    node.kill9();

    let node = Node::start(&dir, &["--threads", "1"]);
    let (messages, _, line) = node.recovered();
    assert!(line.contains("rewritten to the new layout"), "{line}");
    assert_eq!(messages, 2 * topics.len() as u64, "{line}");
    for t in &topics {
        assert_eq!(history(&node, t, "m1"), ["a", "b"], "{t}");
        publish_ttl(&node, t, "short again", 1);
        publish_ttl(&node, t, "c", 3600);
    }
    std::thread::sleep(Duration::from_millis(2500));
    node.kill9();

    // Rewritten for four workers again, then adopted as it is: the same histories, in their
    // order (each check's marker joins them).
    let mut want = vec!["a", "b", "m1", "c"];
    for (run, rewritten) in [("m2", true), ("m3", false)] {
        let node = Node::start(&dir, &["--threads", "4"]);
        let (messages, _, line) = node.recovered();
        assert_eq!(line.contains("rewritten"), rewritten, "{line}");
        assert_eq!(messages, (want.len() * topics.len()) as u64, "{line}");
        for t in &topics {
            assert_eq!(history(&node, t, run), want, "{t}");
        }
        want.push(run);
        // Still cached, so still a duplicate: counted, not stored again.
        let dups = node.dropped("duplicate");
        publish_ttl(&node, &topics[0], "a", 3600);
        assert_eq!(node.dropped("duplicate"), dups + 1.0);
        node.kill9();
    }
}
