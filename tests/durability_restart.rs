//! Nothing lost across a restart (DECISIONS §6, issue 15 §2), through the real binary: a
//! server on a data directory is loaded by pipelined publishers on several topics and
//! killed with `kill -9` (or stopped with SIGTERM); a restart on the same directory, also
//! with another `--threads`, gives a new subscriber every message that was answered `true`,
//! once, in the order it was published; a republished message is still a duplicate.
//!
//! What a publisher sent but never saw answered may or may not come back (it may have been
//! stored just before the kill); it must then be in its place. Nothing else may appear.

mod common;

use common::durability::{by_topic, check_all, check_history, history_on, Load, Node, Plan};
use common::TempDir;

/// Publishes acknowledged before the kill, all publishers together.
const ACKED_BEFORE_KILL: usize = 1500;

#[test]
fn kill_9_under_load_loses_no_acknowledged_message_whatever_the_thread_counts() {
    let dir = TempDir::new("kill9");
    let node = Node::start(&dir, &["--threads", "2"]);
    let load = Load::start(node.addr, Plan::new(3, 2));
    load.wait_acked(ACKED_BEFORE_KILL);
    node.kill9();
    let topics = by_topic(&load.join());
    let acked: usize = topics.iter().map(|t| t.2.len()).sum();
    assert!(acked >= ACKED_BEFORE_KILL);

    // Another worker count: every topic's records go to its new home.
    let node = Node::start(&dir, &["--threads", "3"]);
    let (messages, _, line) = node.recovered();
    assert!(messages as usize >= acked, "{line}");
    assert!(line.contains("rewritten to the new layout"), "{line}");
    let now = check_all(&node, &topics, "after-first-restart");

    // A cached message published again is a duplicate: counted, not delivered again.
    let (topic, _, acked0) = &topics[0];
    let mut sub = node.ws();
    let before = history_on(&mut sub, &node, topic, "dup-marker-1");
    assert_eq!(before, now[0]);
    let dups = node.dropped("duplicate");
    node.ws().publish(topic, &acked0[0]);
    assert_eq!(node.dropped("duplicate"), dups + 1.0);
    node.ws().publish(topic, "dup-marker-2");
    let (_, _, next) = sub.next_push();
    assert_eq!(next, "dup-marker-2", "the duplicate was delivered again");
    node.kill9();

    // And back to the first layout: the same histories, markers included.
    let node = Node::start(&dir, &["--threads", "2"]);
    let (again, _, line) = node.recovered();
    for (i, (topic, _, _)) in topics.iter().enumerate() {
        let mut want = now[i].clone();
        if i == 0 {
            want.extend(["dup-marker-1".to_string(), "dup-marker-2".to_string()]);
        }
        let mut sub = node.ws();
        let got = history_on(&mut sub, &node, topic, "final");
        check_history(topic, &got, &want, &want);
    }
    assert_eq!(
        again as usize,
        now.iter().map(Vec::len).sum::<usize>() + 2,
        "{line}"
    );
}

#[test]
fn with_fsync_always_acknowledged_publishes_survive_kill_9() {
    let dir = TempDir::new("always");
    let args = ["--threads", "2", "--fsync", "always"];
    let node = Node::start(&dir, &args);
    let load = Load::start(node.addr, Plan::new(3, 2));
    load.wait_acked(ACKED_BEFORE_KILL / 2);
    node.kill9();
    let published = load.join();
    let errors: Vec<_> = published.iter().flat_map(|p| p.errors.clone()).collect();
    assert!(errors.is_empty(), "refused publishes: {errors:?}");
    let topics = by_topic(&published);

    // Same layout: the workers adopt their segments (no rewrite).
    let node = Node::start(&dir, &args);
    let (_, _, line) = node.recovered();
    assert!(!line.contains("rewritten"), "{line}");
    check_all(&node, &topics, "after-restart");
    assert!(node.metric("walletrelay_store_syncs_total") > 0.0);
}

#[test]
fn sigterm_flushes_everything_exits_0_and_a_restart_has_it_all() {
    let dir = TempDir::new("sigterm");
    let args = ["--threads", "2", "--fsync", "off"];
    let node = Node::start(&dir, &args);
    let load = Load::start(
        node.addr,
        Plan {
            window: 16,
            per_topic: 200,
            ..Plan::new(2, 2)
        },
    );
    load.wait_acked(400);
    load.stop();
    let topics = by_topic(&load.join());
    for (topic, sent, acked) in &topics {
        assert_eq!(sent, acked, "{topic}: every publish answered true");
    }
    let status = node.sigterm();
    assert!(status.success(), "exit status after SIGTERM: {status}");

    let node = Node::start(&dir, &args);
    let (messages, _, line) = node.recovered();
    let published: usize = topics.iter().map(|t| t.2.len()).sum();
    assert_eq!(messages as usize, published, "{line}");
    check_all(&node, &topics, "after-restart");
    // The directory holds only the server's own files.
    assert_eq!(node.metric("walletrelay_store_foreign_files"), 0.0);
    assert!(!node.log().iter().any(|l| l.contains("not ours")));
}
