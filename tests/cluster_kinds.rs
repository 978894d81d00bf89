//! Several nodes on Redis as operators run it (DECISIONS §12, issue 46 §1), with real
//! processes: the cluster tests of `cluster_nodes.rs` (cross-node delivery in order, a late
//! subscriber that gets the history then the live messages, one webhook POST per stored
//! publish in the cluster) against each shard kind: `rediss://` with an ACL user while the
//! default user is off, a Sentinel group (`redis+sentinel://`), a mixed `--redis` list
//! (standalone + TLS), and a Redis Cluster (`redis+cluster://`). Also: a wrong ACL password
//! refuses the start without the password in the message; the password from a file; TLS
//! client certificates; and the test harness's own topologies (`harness_*`).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::cluster::{
    check_delivery, health, node_args_logged, nodes_args, publish_raw, push, pushes, refused_start,
    topic_on, Publisher, Sent, Subscriber,
};
use common::redis_topo::{
    info_field, key_slot, RedisCluster, RedisKind, RedisSetup, RedisTlsAcl, SentinelGroup, Topology,
};
use common::wait::wait_for;
use common::webhook::{Receiver, Reply};
use common::{topic, Server};

/// Topics for a setup: one on each shard; on a Redis Cluster shard, one on each primary.
fn topics(setup: &RedisSetup) -> Vec<String> {
    let shards = setup.len();
    let mut tps: Vec<String> = (0..shards).map(|i| topic_on(i, shards)).collect();
    if let (1, Some(c)) = (shards, setup.cluster()) {
        let map = c.slot_map();
        let owner = |t: &str| {
            let slot = key_slot(t.as_bytes());
            map.iter()
                .find(|r| r.start <= slot && slot <= r.end)
                .map(|r| r.port)
        };
        tps.clear();
        for p in c.primaries() {
            tps.push(
                std::iter::repeat_with(topic)
                    .find(|t| owner(t) == Some(p))
                    .expect("a topic"),
            );
        }
    }
    tps
}

/// A publish on one node reaches a subscriber on the other, in order, and never the
/// publishing connection; both nodes are healthy.
fn cross_node_delivery(setup: &RedisSetup) {
    let n = nodes_args(2, &setup.redis_args(), &[]);
    for s in &n {
        assert_eq!(
            health(s),
            204,
            "/health of a node on {}",
            setup.redis_flag()
        );
    }
    for tp in topics(setup) {
        let mut sub = n[0].ws();
        sub.subscribe(&tp);
        let mut publ = n[1].ws();
        publ.subscribe(&tp);
        let sent: Vec<String> = (0..30).map(|i| format!("m{i}")).collect();
        for m in &sent {
            publ.publish(&tp, m);
        }
        assert_eq!(pushes(&mut sub, &tp, 30), sent, "node 1, in order");
        sub.publish(&tp, "back");
        // The publisher's first push is node 1's message: none of its own 30 came back.
        assert_eq!(push(&mut publ), (tp.clone(), "back".to_string()));
    }
}

/// A subscriber that arrives on the other node while publishing goes on gets the history,
/// then the live messages: every one once, in order, none missing.
fn late_subscriber(setup: &RedisSetup) {
    let n = nodes_args(
        2,
        &setup.redis_args(),
        &["--max-cached-per-topic", "100000"],
    );
    let tps = topics(setup);
    let pubs: Vec<Publisher> = tps
        .iter()
        .enumerate()
        .map(|(i, t)| Publisher::start(n[0].ws(), t, &format!("p{i}"), 8))
        .collect();
    wait_for("publishes before the late subscribers", || {
        pubs.iter().all(|p| p.acked() >= 100)
    });
    let lates: Vec<Subscriber> = tps
        .iter()
        .map(|t| Subscriber::start(n[1].ws(), t))
        .collect();
    let acked: Vec<usize> = pubs.iter().map(Publisher::acked).collect();
    wait_for("publishes after the late subscribers came", || {
        pubs.iter().zip(&acked).all(|(p, a)| p.acked() >= a + 100)
    });
    let sent: Vec<Sent> = pubs.into_iter().map(Publisher::finish).collect();
    for (i, (s, late)) in sent.iter().zip(lates).enumerate() {
        let who = format!("late subscriber of topic {i}");
        assert!(s.other_errors().is_empty(), "{who}: {:?}", s.other_errors());
        assert_eq!(s.unavailable(), 0, "{who}: Redis never went away");
        assert_eq!(
            s.outcome.len(),
            s.order.len(),
            "{who}: every publish answered"
        );
        late.wait_all(&who, &s.acked());
        // A duplicate would come right behind the last one.
        std::thread::sleep(Duration::from_millis(300));
        let (ws, got) = late.finish();
        assert!(ws.is_some(), "{who}: its connection closed");
        check_delivery(&who, &got, &[s]);
        assert_eq!(
            got, s.order,
            "{who}: history then live, each once, in order"
        );
    }
}

/// One webhook POST per stored publish in the cluster: registered on one node, published on
/// both, duplicates across nodes stored (and POSTed) once.
fn webhooks(setup: &RedisSetup) {
    // One webhook thread per node: each node's POSTs leave in order (the barrier below).
    let n = nodes_args(2, &setup.redis_args(), &["--webhook-threads", "1"]);
    let rx = Receiver::start(|_| Reply::Status(200));
    let tps = topics(setup);
    let bars = [topic(), topic()];
    for t in tps.iter().chain(&bars) {
        let (st, body) = n[0].register_webhook(t, &rx.url("/push"));
        assert_eq!(st, 200, "{body}");
    }
    for t in &tps {
        // Registered again on the other node: still one registration.
        assert_eq!(n[1].register_webhook(t, &rx.url("/push")).0, 200);
    }
    let (mut p0, mut p1) = (n[0].ws(), n[1].ws());
    for tp in &tps {
        for i in 0..10 {
            let (first, second) = if i % 2 == 0 {
                (&mut p0, &mut p1)
            } else {
                (&mut p1, &mut p0)
            };
            let m = format!("w{i}");
            assert_eq!(publish_raw(first, tp, &m, None)["result"], true);
            // The same message on the other node: a duplicate, no POST.
            assert_eq!(publish_raw(second, tp, &m, Some(true))["result"], true);
        }
        // Stored but prompt false: no POST.
        assert_eq!(
            publish_raw(&mut p1, tp, "quiet", Some(false))["result"],
            true
        );
    }
    // Barrier: each node's last POST; a wrong POST of that node would have left first.
    assert_eq!(publish_raw(&mut p0, &bars[0], "b", None)["result"], true);
    assert_eq!(publish_raw(&mut p1, &bars[1], "b", None)["result"], true);
    let mut counts = HashMap::new();
    wait_for("both barrier POSTs and the topics'", || {
        rx.count_by_topic(&mut counts);
        bars.iter().all(|b| counts.get(b) == Some(&1))
            && tps
                .iter()
                .all(|t| counts.get(t).copied().unwrap_or(0) >= 10)
    });
    rx.count_by_topic(&mut counts);
    for t in &tps {
        assert_eq!(counts.get(t), Some(&10), "one POST per stored publish");
    }
    assert_eq!(counts.len(), tps.len() + 2, "{counts:?}");
}

/// The three tests above against one kind of setup, each in a module named after the kind
/// (`cargo test --test cluster_kinds sentinel::`).
macro_rules! kind_tests {
    ($module:ident, $setup:expr $(, $attr:meta)?) => {
        mod $module {
            use super::*;

            #[test]
            $(#[$attr])?
            fn cross_node_delivery_in_order() {
                cross_node_delivery(&$setup);
            }

            #[test]
            $(#[$attr])?
            fn a_late_subscriber_gets_history_then_live_without_gap_or_duplicate() {
                late_subscriber(&$setup);
            }

            #[test]
            $(#[$attr])?
            fn one_webhook_post_per_stored_publish_in_the_cluster() {
                webhooks(&$setup);
            }
        }
    };
}

kind_tests!(tls_acl, RedisSetup::start(RedisKind::TlsAcl));
kind_tests!(sentinel, RedisSetup::start(RedisKind::Sentinel));
kind_tests!(
    mixed,
    RedisSetup::mixed(&[RedisKind::Standalone, RedisKind::TlsAcl])
);
kind_tests!(cluster, RedisSetup::start(RedisKind::Cluster));

/// `--redis URL --redis-tls-ca CA` for a TLS server, with `extra` flags after them.
fn tls_args(r: &RedisTlsAcl, url: String, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "--redis".to_string(),
        url,
        "--redis-tls-ca".to_string(),
        r.ca_path().display().to_string(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// A node refused for `why`: it exited with an error and said what went wrong with the
/// shard, and neither `secret` nor the real password appears in anything it wrote.
fn assert_refused_quietly(r: &RedisTlsAcl, args: &[String], secret: &str, why: &str) {
    let refused = refused_start(args, &[]);
    let all = format!("{}{}", refused.stderr, refused.stdout);
    assert!(!refused.status.success(), "{why}: exit {}", refused.status);
    for s in [secret, r.password()] {
        assert!(
            !all.contains(s),
            "{why}: a password is in its output:\n{all}"
        );
    }
    let said = refused.stderr.lines().last().unwrap_or("");
    eprintln!("{why}: refused: {said}");
    let lower = refused.stderr.to_lowercase();
    assert!(
        lower.contains("redis"),
        "{why}: the message does not say it is Redis:\n{}",
        refused.stderr
    );
    assert!(
        ["wrongpass", "noauth", "auth", "password"]
            .iter()
            .any(|w| lower.contains(w)),
        "{why}: the message does not say the login failed:\n{}",
        refused.stderr
    );
}

#[test]
fn a_wrong_acl_password_refuses_the_start_with_a_clear_message_without_the_password() {
    let r = RedisTlsAcl::start();
    let wrong = "nOtThErIgHtSeCrEt4711";
    let args = tls_args(&r, r.url_with_password(wrong), &[]);
    assert_refused_quietly(&r, &args, wrong, "a wrong password in the URL");
    // The same wrong password from a file.
    let dir = common::TempDir::new("wrong-password");
    let file = dir.join("password");
    std::fs::write(&file, format!("{wrong}\n")).unwrap();
    let args = tls_args(
        &r,
        r.url_without_password(),
        &["--redis-password-file", file.to_str().unwrap()],
    );
    assert_refused_quietly(&r, &args, wrong, "a wrong password from a file");
    // No user at all: the default user is off on this server.
    let anonymous = format!("rediss://127.0.0.1:{}/0", r.port());
    let args = tls_args(&r, anonymous, &[]);
    assert_refused_quietly(&r, &args, wrong, "no user while the default user is off");
}

#[test]
fn the_password_from_a_file_works_and_no_password_shows_in_logs_metrics_or_health() {
    let r = RedisTlsAcl::start();
    let in_url = tls_args(&r, r.url(), &[]);
    let from_file = tls_args(
        &r,
        r.url_without_password(),
        &["--redis-password-file", r.password_file().to_str().unwrap()],
    );
    // The same shard given both ways: one node each, one cluster.
    let n: Vec<Server> = [in_url, from_file]
        .iter()
        .map(|a| node_args_logged(a, &[]))
        .collect();
    let tp = topic();
    let mut sub = n[0].ws();
    sub.subscribe(&tp);
    let mut publ = n[1].ws();
    for i in 0..5 {
        publ.publish(&tp, &format!("m{i}"));
    }
    let want: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    assert_eq!(pushes(&mut sub, &tp, 5), want);
    for (i, s) in n.iter().enumerate() {
        let (status, body) = s.get("/health");
        assert_eq!(status, Some(204), "node {i}");
        let metrics = s.metrics_text().expect("/metrics");
        for (what, text) in [
            ("/health", String::from_utf8_lossy(&body).to_string()),
            ("/metrics", metrics),
            ("its log", s.log()),
        ] {
            assert!(
                !text.contains(r.password()),
                "node {i}: the password is in {what}"
            );
        }
    }
}

#[test]
fn a_client_certificate_is_presented_when_the_server_requires_one() {
    let r = RedisTlsAcl::start_mutual();
    let cert = r.client_cert_path().display().to_string();
    let key = r.client_key_path().display().to_string();
    let with_cert = tls_args(
        &r,
        r.url(),
        &["--redis-tls-cert", &cert, "--redis-tls-key", &key],
    );
    let n = nodes_args(2, &with_cert, &[]);
    let tp = topic();
    let mut sub = n[0].ws();
    sub.subscribe(&tp);
    n[1].ws().publish(&tp, "over mutual TLS");
    assert_eq!(push(&mut sub), (tp, "over mutual TLS".to_string()));
    // Without the certificate the server refuses the handshake, so the node its start.
    let without = tls_args(&r, r.url(), &[]);
    let refused = refused_start(&without, &[]);
    assert!(!refused.status.success(), "{}", refused.stderr);
    assert!(
        !refused.stderr.contains(r.password()),
        "the password is in its output:\n{}",
        refused.stderr
    );
}

/// The harness itself: each topology starts and answers, and a Sentinel group fails over.
#[test]
fn harness_topologies_start() {
    let t = RedisTlsAcl::start();
    assert_eq!(t.cli(&["PING"]).trim(), "PONG");
    let whoami = t.cli(&["ACL", "WHOAMI"]);
    assert_eq!(whoami.trim(), "relay");
    let anonymous = t.cli_as(None, &["PING"]);
    assert!(
        anonymous.as_ref().is_err_and(|e| e.contains("NOAUTH")),
        "the default user is off: {anonymous:?}"
    );
    assert!(t.cli_as(Some(("relay", "wrong")), &["PING"]).is_err());
    assert!(t.url().starts_with("rediss://relay:"), "{}", t.url());

    let mut g = SentinelGroup::start(false);
    let primary = g.primary_port();
    assert_eq!(
        primary,
        g.data_ports()[0],
        "the first data node is the primary"
    );
    let mut c = g.conn_primary();
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut c).unwrap();
    let acks: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut c).unwrap();
    assert_eq!(acks, 1, "the replica acknowledges");
    let started = std::time::Instant::now();
    let killed_at = g.kill_primary();
    let took = g.wait_failover(primary);
    eprintln!(
        "harness: Sentinel failover {took:?} after the kill ({:?} of waiting)",
        started.elapsed()
    );
    assert!(killed_at >= started);
    assert!(took < Duration::from_secs(15), "failover took {took:?}");
    assert_ne!(g.primary_port(), primary);
    let v: String = redis::cmd("GET")
        .arg("k")
        .query(&mut g.conn_primary())
        .unwrap();
    assert_eq!(v, "v", "the replicated key is on the new primary");

    let cl = RedisCluster::start();
    assert_eq!(cl.primaries().len(), 3);
    assert_eq!(cl.ports().len(), 6);
    for p in cl.ports() {
        let ci = cl.cli(p, &["CLUSTER", "INFO"]).unwrap();
        assert_eq!(info_field(&ci, "cluster_state"), Some("ok"), "port {p}");
    }

    // The flags a node gets for each kind.
    let (ca, url) = (t.ca_path().display().to_string(), t.url());
    let setup = RedisSetup::of(vec![Topology::TlsAcl(t), Topology::Sentinel(g)]);
    let sentinel_url = setup.sentinel().unwrap().url();
    assert!(sentinel_url.starts_with("redis+sentinel://127.0.0.1:"));
    assert!(sentinel_url.contains("/mymaster?addr=127.0.0.1:"));
    assert_eq!(
        setup.redis_args(),
        [
            "--redis".to_string(),
            format!("{url},{sentinel_url}"),
            "--redis-tls-ca".to_string(),
            ca
        ]
    );
    let cluster_url = Topology::Cluster(cl).url();
    assert!(cluster_url.starts_with("redis+cluster://127.0.0.1:"));
    assert_eq!(cluster_url.matches("&addr=").count(), 1, "{cluster_url}");
}

/// The harness's Redis Cluster: slots computed as Redis does, a reshard that moves them,
/// and a primary killed and failed over.
#[test]
fn harness_cluster_reshards_and_fails_over() {
    let mut c = RedisCluster::start();
    let port0 = c.ports()[0];
    for key in ["a", "topic{abc}x", "{abc}", "{}k", "x{}{y}", &topic()] {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut c.conn(port0))
            .unwrap();
        assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
    }
    let keys: Vec<String> = (0..600).map(|i| format!("key{i}")).collect();
    for k in &keys {
        let owner = c.slot_owner(key_slot(k.as_bytes()));
        let _: () = redis::cmd("SET")
            .arg(k)
            .arg(k)
            .query(&mut c.conn(owner))
            .unwrap();
    }
    let prim = c.primaries();
    let (from, to) = (prim[0], prim[1]);
    let first = c.slots_of(from)[0].0;
    let took = c.reshard(from, to, 100);
    eprintln!("harness: 100 slots resharded in {took:?}");
    assert_eq!(c.slot_owner(first), to);
    assert_eq!(c.slot_owner(first + 99), to);
    let moved: Vec<&String> = keys
        .iter()
        .filter(|k| (first..first + 100).contains(&key_slot(k.as_bytes())))
        .collect();
    assert!(!moved.is_empty());
    for k in moved {
        let v: Option<String> = redis::cmd("GET").arg(k).query(&mut c.conn(to)).unwrap();
        assert_eq!(v.as_deref(), Some(k.as_str()), "moved with its slot");
    }
    let (killed, _) = c.kill_primary_with_most_keys();
    assert!(prim.contains(&killed));
    let took = c.wait_ok();
    eprintln!("harness: cluster ok again {took:?} after killing {killed}");
    let now = c.primaries();
    assert_eq!(now.len(), 3, "{now:?}");
    assert!(!now.contains(&killed));
    for k in &keys {
        let owner = c.slot_owner(key_slot(k.as_bytes()));
        let v: Option<String> = redis::cmd("GET").arg(k).query(&mut c.conn(owner)).unwrap();
        assert_eq!(v.as_deref(), Some(k.as_str()), "{k} after the failover");
    }
}
