//! No acknowledged publish lost across a Redis failover (DECISIONS §12, issue 46 §2), with
//! real processes: two `walletrelay` nodes under steady publishing on 8 topics (publishers
//! on node A, live subscribers on node B) while the Redis primary is killed with `SIGKILL`
//! and Sentinel (or the Redis Cluster) promotes a replica; and a Redis Cluster reshard
//! (`redis-cli --cluster reshard`) of slots that hold live topics. What must hold: every
//! publish answered `true` is served to a late subscriber (a wallet that was offline), each
//! once and in order; every other answer is -32000 `storage unavailable`; the live
//! subscriptions stay open and miss nothing; publishes are acknowledged again once Redis has
//! a primary (how long that took is printed: docs/SCALING.md quotes it).
//!
//! The groups have two replicas per primary: with `--redis-wait-replicas 1`, a primary
//! promoted from a group of one replica has none left and must refuse every publish
//! (DECISIONS §12: refused rather than risk losing them) until one comes back.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::cluster::{
    check_delivery, health, nodes_args, publish_raw, Outcome, Publisher, Sent, Subscriber,
};
use common::metrics::sum;
use common::redis_topo::{key_slot, RedisCluster, RedisSetup, SentinelGroup, Topology};
use common::wait::{poll, wait_for, wait_until, WAIT};
use common::{topic, Server, Ws};
use serde_json::{json, Value};

/// Topics under load.
const TOPICS: usize = 8;
/// Publishes in flight per publisher.
const WINDOW: usize = 8;
/// Replicas per primary (see the module's comment).
const REPLICAS: usize = 2;
/// The node flags: history long enough for the whole test, `WAIT` for one replica.
const NODE_FLAGS: [&str; 4] = [
    "--max-cached-per-topic",
    "100000",
    "--redis-wait-replicas",
    "1",
];

/// A connection publishing one message every 20 ms on one topic, without waiting for the
/// answers, recording when each was sent and answered: when publishes were acknowledged
/// again after a kill.
struct Probe {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<ProbeLog>>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct ProbeLog {
    sent: Vec<(String, Instant)>,
    answered: HashMap<String, (Instant, Outcome)>,
}

impl Probe {
    fn start(mut ws: Ws, topic: &str, name: &str) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(ProbeLog::default()));
        let (stop2, log2, topic, name) = (
            Arc::clone(&stop),
            Arc::clone(&log),
            topic.to_string(),
            name.to_string(),
        );
        ws.sock
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(5)))
            .expect("timeout");
        let thread = std::thread::spawn(move || {
            let mut waiting: HashMap<u64, String> = HashMap::new();
            let (mut n, mut next) = (0u64, Instant::now());
            let mut drain_until = None;
            loop {
                if stop2.load(Ordering::Relaxed) {
                    let until = *drain_until.get_or_insert(Instant::now() + WAIT);
                    if waiting.is_empty() || Instant::now() > until {
                        return;
                    }
                } else if Instant::now() >= next {
                    n += 1;
                    next += Duration::from_millis(20);
                    let (id, msg) = (2_000_000 + n, format!("{name}-{n}"));
                    let req = json!({"id": id, "jsonrpc": "2.0", "method": "waku_publish",
                        "params": {"topic": topic, "message": msg, "ttl": 21600}});
                    if ws
                        .sock
                        .send(tungstenite::Message::text(req.to_string()))
                        .is_err()
                    {
                        return;
                    }
                    log2.lock()
                        .unwrap()
                        .sent
                        .push((msg.clone(), Instant::now()));
                    waiting.insert(id, msg);
                }
                let v: Value = match ws.sock.read() {
                    Ok(tungstenite::Message::Text(t)) => match serde_json::from_str(t.as_str()) {
                        Ok(v) => v,
                        Err(_) => continue,
                    },
                    Ok(_) => continue,
                    Err(tungstenite::Error::Io(e))
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        continue
                    }
                    Err(_) => return,
                };
                let Some(msg) = v["id"].as_u64().and_then(|id| waiting.remove(&id)) else {
                    continue;
                };
                let outcome = if v["result"] == true {
                    Outcome::Acked
                } else {
                    Outcome::Refused(
                        v["error"]["code"].as_i64().unwrap_or(0),
                        v["error"]["message"].as_str().unwrap_or("").to_string(),
                    )
                };
                log2.lock()
                    .unwrap()
                    .answered
                    .insert(msg, (Instant::now(), outcome));
            }
        });
        Probe {
            stop,
            log,
            thread: Some(thread),
        }
    }

    /// When the first publish sent after `t` was acknowledged (the earliest such answer).
    fn first_ack_sent_after(&self, t: Instant) -> Option<Instant> {
        let log = self.log.lock().unwrap();
        log.sent
            .iter()
            .filter(|(_, at)| *at > t)
            .filter_map(|(m, _)| match log.answered.get(m) {
                Some((at, Outcome::Acked)) => Some(*at),
                _ => None,
            })
            .min()
    }

    /// Stops; what it sent and how each was answered.
    fn finish(mut self) -> Sent {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("probe thread");
        }
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        let mut sent = Sent::default();
        for (m, _) in log.sent {
            if let Some((_, o)) = log.answered.get(&m) {
                sent.outcome.insert(m.clone(), o.clone());
            }
            sent.order.push(m);
        }
        sent
    }
}

/// `f` on a thread of its own, failing the test if it does not end within a minute (a
/// publisher whose answers never come would hang it).
fn within_a_minute<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} did not end within a minute"))
}

/// Publishes `message` from `ws` until it is answered `true` (retrying -32000).
fn publish_until_acked(ws: &mut Ws, topic: &str, message: &str) {
    let mut last = Value::Null;
    let ok = poll(WAIT, || {
        last = publish_raw(ws, topic, message, None);
        (last["result"] == true).then_some(())
    });
    assert!(ok.is_some(), "{message} never acknowledged: {last}");
}

/// A topic whose slot the primary on `port` serves.
fn topic_served_by(c: &RedisCluster, port: u16) -> String {
    let map = c.slot_map();
    std::iter::repeat_with(topic)
        .find(|t| {
            let s = key_slot(t.as_bytes());
            map.iter()
                .any(|r| r.port == port && r.start <= s && s <= r.end)
        })
        .expect("a topic")
}

/// Two nodes on a setup under load: a [`Publisher`] per topic on node A, a [`Subscriber`]
/// per topic on node B, and [`Probe`]s that time the recovery from a disruption.
struct Load {
    nodes: Vec<Server>,
    topics: Vec<String>,
    pubs: Vec<Publisher>,
    subs: Vec<Subscriber>,
    probes: Vec<(String, Probe)>,
}

impl Load {
    fn start(setup: &RedisSetup, topics: Vec<String>, probe_topics: Vec<String>) -> Load {
        let nodes = nodes_args(2, &setup.redis_args(), &NODE_FLAGS);
        let subs = topics
            .iter()
            .map(|t| Subscriber::start(nodes[1].ws(), t))
            .collect();
        let pubs = topics
            .iter()
            .enumerate()
            .map(|(i, t)| Publisher::start(nodes[0].ws(), t, &format!("t{i}"), WINDOW))
            .collect();
        let probes = probe_topics
            .iter()
            .enumerate()
            .map(|(i, t)| {
                (
                    t.clone(),
                    Probe::start(nodes[0].ws(), t, &format!("probe{i}")),
                )
            })
            .collect();
        let load = Load {
            nodes,
            topics,
            pubs,
            subs,
            probes,
        };
        // About a second of publishing, and some acknowledged on every topic.
        let t = Instant::now();
        wait_for("publishing before the disruption", || {
            load.pubs.iter().all(|p| p.acked() >= 20)
        });
        std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
        load
    }

    /// After the disruption at `at`: waits until a publish of `probe` sent after it is
    /// acknowledged (returns how long after `at`), then a second more, in which every
    /// publisher must get publishes acknowledged again.
    fn until_acked_again(&self, probe: usize, at: Instant) -> Duration {
        let p = &self.probes[probe].1;
        let first = poll(Duration::from_secs(90), || p.first_ack_sent_after(at));
        let first = first.unwrap_or_else(|| {
            panic!("no publish sent after the disruption was acknowledged within 90 s")
        });
        let acked: Vec<usize> = self.pubs.iter().map(Publisher::acked).collect();
        std::thread::sleep(Duration::from_secs(1));
        wait_for(
            "every topic acknowledged again after the disruption",
            || self.pubs.iter().zip(&acked).all(|(p, a)| p.acked() > *a),
        );
        first - at
    }

    /// Stops the load and checks it (see the module's comment); returns the number of
    /// publishes acknowledged and refused.
    fn finish_and_check(self, what: &str) -> (usize, usize) {
        let Load {
            nodes,
            topics,
            pubs,
            subs,
            probes,
        } = self;
        let sent: Vec<Sent> = pubs
            .into_iter()
            .map(|p| within_a_minute("a publisher's last answers", move || p.finish()))
            .collect();
        let (probe_topics, probe_sent): (Vec<String>, Vec<Sent>) = probes
            .into_iter()
            .map(|(t, p)| {
                (
                    t,
                    within_a_minute("a probe's last answers", move || p.finish()),
                )
            })
            .unzip();
        let (mut acked, mut refused) = (0, 0);
        for (i, s) in sent.iter().chain(&probe_sent).enumerate() {
            assert!(
                s.other_errors().is_empty(),
                "{what}, publisher {i}: answers other than true or -32000 storage unavailable: {:?}",
                s.other_errors()
            );
            assert_eq!(
                s.outcome.len(),
                s.order.len(),
                "{what}, publisher {i}: unanswered"
            );
            acked += s.acked().len();
            refused += s.unavailable();
        }
        // One more message per topic, after everything: the live subscriptions still work.
        let mut w = nodes[0].ws();
        let marker = |t: usize| format!("after-{t}");
        for (i, t) in topics.iter().enumerate() {
            publish_until_acked(&mut w, t, &marker(i));
        }
        for (i, sub) in subs.iter().enumerate() {
            let mut want = sent[i].acked();
            want.push(marker(i));
            sub.wait_all(&format!("{what}: live subscriber {i}"), &want);
        }
        let lates: Vec<Subscriber> = topics
            .iter()
            .chain(&probe_topics)
            .map(|t| Subscriber::start(nodes[1].ws(), t))
            .collect();
        for (i, late) in lates.iter().enumerate() {
            let mut want = sent.iter().chain(&probe_sent).nth(i).unwrap().acked();
            if i < topics.len() {
                want.push(marker(i));
            }
            late.wait_all(&format!("{what}: late subscriber {i}"), &want);
        }
        // A duplicate would come right behind the others.
        std::thread::sleep(Duration::from_millis(500));
        for (i, sub) in subs.into_iter().enumerate() {
            let who = format!("{what}: live subscriber {i}");
            let (ws, got) = sub.finish();
            assert!(ws.is_some(), "{who}: its connection closed");
            check_delivery(&who, &got, &[&sent[i]]);
        }
        for (i, late) in lates.into_iter().enumerate() {
            let who = format!("{what}: late subscriber {i}");
            let (_, got) = late.finish();
            let s = sent.iter().chain(&probe_sent).nth(i).unwrap();
            check_delivery(&who, &got, &[s]);
            if i < topics.len() {
                assert_eq!(got.last(), Some(&marker(i)), "{who}: the last one last");
            }
        }
        for (i, s) in nodes.iter().enumerate() {
            wait_for("/health 204", || health(s) == 204);
            let m = s.metrics_text().expect("/metrics");
            eprintln!(
                "{what}: node {i}: failovers {}, redirects {}, WAIT timeouts {}, refused without a primary {}",
                sum(&m, "walletrelay_redis_failovers_total"),
                sum(&m, "walletrelay_redis_redirects_total"),
                sum(&m, "walletrelay_redis_wait_timeouts_total"),
                sum(&m, "walletrelay_redis_refused_no_primary_total"),
            );
        }
        (acked, refused)
    }
}

/// A failover under load: kill, wait until Redis has a primary again, keep publishing until
/// publishes are acknowledged again, check; `kill` returns the killed port and when,
/// `failed_over` waits for the new primary and returns how long after the kill it came.
fn failover_under_load(
    what: &str,
    setup: &mut RedisSetup,
    probe_topics: Vec<(u16, String)>,
    kill: impl FnOnce(&mut RedisSetup) -> (u16, Instant),
    failed_over: impl FnOnce(&RedisSetup, u16, Instant) -> Duration,
) {
    let topics: Vec<String> = (0..TOPICS).map(|_| topic()).collect();
    let probe_ports: Vec<u16> = probe_topics.iter().map(|(p, _)| *p).collect();
    let load = Load::start(
        setup,
        topics,
        probe_topics.into_iter().map(|(_, t)| t).collect(),
    );
    let (old, killed_at) = kill(setup);
    let failover = failed_over(setup, old, killed_at);
    let probe = probe_ports
        .iter()
        .position(|p| *p == old)
        .expect("a probe topic on the killed primary");
    let recovered = load.until_acked_again(probe, killed_at);
    // Each node counts the failover when it next reads the map or reconnects (a node that
    // only subscribes may learn of it a refresh later): waited for, within the bound.
    let failovers = |s: &Server| {
        sum(
            &s.metrics_text().expect("/metrics"),
            "walletrelay_redis_failovers_total",
        )
    };
    for s in &load.nodes {
        wait_until(WAIT, || failovers(s) >= 1.0);
    }
    let nodes_failovers: Vec<f64> = load.nodes.iter().map(failovers).collect();
    let (acked, refused) = load.finish_and_check(what);
    eprintln!(
        "{what}: SIGKILL of the primary; Redis had a new primary {failover:?} after it; the \
         first publish sent after the kill was acknowledged {recovered:?} after it; \
         {acked} publishes acknowledged, {refused} refused -32000, none lost"
    );
    for (i, f) in nodes_failovers.iter().enumerate() {
        assert!(*f >= 1.0, "{what}: node {i} counted no failover");
    }
}

#[test]
fn sentinel_primary_killed_under_load_loses_no_acknowledged_publish() {
    let g = SentinelGroup::start_with(true, REPLICAS);
    let primary = g.primary_port();
    let mut setup = RedisSetup::of(vec![Topology::Sentinel(g)]);
    failover_under_load(
        "Sentinel",
        &mut setup,
        vec![(primary, topic())],
        |s| {
            let g = s.sentinel_mut().expect("sentinel");
            let old = g.primary_port();
            (old, g.kill_primary())
        },
        |s, old, _| {
            let g = s.sentinel().expect("sentinel");
            let took = g.wait_failover(old);
            g.wait_replicas(REPLICAS - 1);
            took
        },
    );
}

#[test]
fn cluster_primary_with_most_keys_killed_under_load_loses_no_acknowledged_publish() {
    let c = RedisCluster::start_with(REPLICAS);
    let probes: Vec<(u16, String)> = c
        .primaries()
        .into_iter()
        .map(|p| (p, topic_served_by(&c, p)))
        .collect();
    let mut setup = RedisSetup::of(vec![Topology::Cluster(c)]);
    failover_under_load(
        "Redis Cluster",
        &mut setup,
        probes,
        |s| {
            s.cluster_mut()
                .expect("cluster")
                .kill_primary_with_most_keys()
        },
        |s, _, at| {
            s.cluster().expect("cluster").wait_ok();
            at.elapsed()
        },
    );
}

#[test]
fn cluster_reshard_under_load_loses_and_duplicates_nothing() {
    /// Slots moved: the lowest ones of the first primary.
    const MOVED: u32 = 1000;
    let c = RedisCluster::start();
    let prim = c.primaries();
    let (from, to) = (prim[0], prim[1]);
    let mut from_slots: Vec<u16> = c
        .slots_of(from)
        .into_iter()
        .flat_map(|(a, b)| a..=b)
        .collect();
    from_slots.sort_unstable();
    let moving: Vec<u16> = from_slots[..MOVED as usize].to_vec();
    // Half the topics in the slots that move, half elsewhere.
    let topics: Vec<String> = (0..TOPICS)
        .map(|i| {
            std::iter::repeat_with(topic)
                .find(|t| moving.contains(&key_slot(t.as_bytes())) == (i % 2 == 0))
                .expect("a topic")
        })
        .collect();
    let probe = std::iter::repeat_with(topic)
        .find(|t| moving.contains(&key_slot(t.as_bytes())))
        .expect("a probe topic");
    let setup = RedisSetup::of(vec![Topology::Cluster(c)]);
    let load = Load::start(&setup, topics.clone(), vec![probe]);
    let at = Instant::now();
    let took = setup.cluster().expect("cluster").reshard(from, to, MOVED);
    let c = setup.cluster().expect("cluster");
    for t in topics.iter().step_by(2) {
        assert_eq!(c.slot_owner(key_slot(t.as_bytes())), to, "{t} moved");
    }
    let recovered = load.until_acked_again(0, at);
    let redirects = sum(
        &load.nodes[0].metrics_text().expect("/metrics"),
        "walletrelay_redis_redirects_total",
    );
    let (acked, refused) = load.finish_and_check("reshard");
    eprintln!(
        "reshard: {MOVED} slots with 4 live topics moved in {took:?} under load; a publish \
         sent after it began was acknowledged {recovered:?} after; {acked} acknowledged, \
         {refused} refused -32000, none lost or duplicated"
    );
    assert!(redirects >= 1.0, "node A followed no MOVED/ASK");
}
