//! A node cut off from Redis: partitions, not crashes (DECISIONS §7 and §12, issue 46 §3).
//! Two `walletrelay` nodes, each in a network namespace of its own, share Redis in a third
//! (`common::netns`): a standalone server, or a primary, a replica and 3 Sentinels. Node A
//! publishes on 3 topics and node B on 3 others, one message every 20 ms each; B's
//! subscribers listen to A's topics, A's and B's to B's. Then A's link to Redis is cut: its
//! packets vanish without an answer, as when a cable or a switch port is lost (A keeps its
//! link to the host, so the test still reaches it). What must hold:
//! - while cut, A answers every publish it received after the cut -32000 `storage
//!   unavailable`, never `true`; its `/health` is 503 (its command and pub/sub connections
//!   both down); its WebSocket connections stay open;
//! - B keeps working: every publish of B is answered `true` and reaches B's subscribers;
//! - once the link is back, A's publishes are answered `true` again, and A's subscribers get
//!   every message B published meanwhile, in order, with no gap and no duplicate, on the
//!   connections they had; a late subscriber gets every acknowledged message, in order.
//!
//! The Sentinels must not fail over (the Redis processes are fine, only A is cut). Waits are
//! bounded; none of them is an assertion about time. Without root or `ip`, each test is
//! counted as skipped (`common::skip`).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::cluster::{check_delivery, health, Outcome, Sent, Subscriber};
use common::netns::{Lab, NsKind, NsRedis, PRIMARY_PORT};
use common::skip::skip;
use common::wait::{poll, wait_for, WAIT};
use common::{topic, Server, Ws};
use serde_json::{json, Value};

/// Topics each node publishes on.
const TOPICS: usize = 3;
/// How often a [`Paced`] publisher publishes.
const PACE: Duration = Duration::from_millis(20);
/// How long a node may take to store publishes again once its link is back: the reconnect
/// backoff tops out at 5 s, a Sentinel shard asks up to 3 Sentinels (2 s connect timeout
/// each) first; a bound, well above both.
const BACK: Duration = Duration::from_secs(60);

/// Whether an answer is -32000 `storage unavailable`.
fn unavailable(o: &Outcome) -> bool {
    matches!(o, Outcome::Refused(-32000, m) if m == "storage unavailable")
}

/// What a [`Paced`] publisher saw.
#[derive(Default)]
struct Log {
    /// Messages in the order sent, each with when it was written to the socket.
    sent: Vec<(String, Instant)>,
    /// Answers by message, each with when it was read.
    answered: HashMap<String, (Instant, Outcome)>,
    /// Whether its connection failed.
    closed: bool,
}

impl Log {
    /// Answered messages whose (send time, answer) satisfy `f`.
    fn count(&self, f: impl Fn(Instant, &Outcome) -> bool) -> usize {
        let ok =
            |(m, at): &&(String, Instant)| self.answered.get(m).is_some_and(|(_, o)| f(*at, o));
        self.sent.iter().filter(ok).count()
    }

    /// Messages sent at or after `t` and answered `true`, in send order.
    fn acked_sent_after(&self, t: Instant) -> Vec<String> {
        let acked = |m: &String| matches!(self.answered.get(m), Some((_, Outcome::Acked)));
        let after = self.sent.iter().filter(|(m, at)| *at >= t && acked(m));
        after.map(|(m, _)| m.clone()).collect()
    }

    /// The same as a [`Sent`], with `marker` appended as acknowledged.
    fn to_sent(&self, marker: &str) -> Sent {
        let mut s = Sent::default();
        for (m, _) in &self.sent {
            if let Some((_, o)) = self.answered.get(m) {
                s.outcome.insert(m.clone(), o.clone());
            }
            s.order.push(m.clone());
        }
        s.order.push(marker.to_string());
        s.outcome.insert(marker.to_string(), Outcome::Acked);
        s
    }
}

/// A connection publishing `<name>-<n>` on one topic every [`PACE`] on its own thread,
/// without waiting for answers, recording when each was sent and answered.
struct Paced {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
    thread: Option<JoinHandle<()>>,
}

impl Paced {
    fn start(mut ws: Ws, topic: &str, name: &str) -> Paced {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Log::default()));
        let (stop2, log2) = (Arc::clone(&stop), Arc::clone(&log));
        let (topic, name) = (topic.to_string(), name.to_string());
        ws.sock
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(5)))
            .expect("timeout");
        let thread = std::thread::spawn(move || {
            let closed = |log: &Mutex<Log>| log.lock().unwrap().closed = true;
            let mut waiting: HashMap<u64, String> = HashMap::new();
            let (mut n, mut next, mut drain_until) = (0u64, Instant::now(), None);
            loop {
                if stop2.load(Ordering::Relaxed) {
                    // Stopped: the answers still due, for at most WAIT.
                    let until = *drain_until.get_or_insert(Instant::now() + WAIT);
                    if waiting.is_empty() || Instant::now() > until {
                        return;
                    }
                } else if Instant::now() >= next {
                    n += 1;
                    next += PACE;
                    let (id, msg) = (3_000_000 + n, format!("{name}-{n}"));
                    let req = json!({"id": id, "jsonrpc": "2.0", "method": "waku_publish",
                        "params": {"topic": topic, "message": msg, "ttl": 21600}});
                    let frame = tungstenite::Message::text(req.to_string());
                    if ws.sock.send(frame).is_err() {
                        return closed(&log2);
                    }
                    let at = Instant::now();
                    log2.lock().unwrap().sent.push((msg.clone(), at));
                    waiting.insert(id, msg);
                }
                let v: Value = match ws.sock.read() {
                    Ok(tungstenite::Message::Text(t)) => match serde_json::from_str(t.as_str()) {
                        Ok(v) => v,
                        Err(_) => continue,
                    },
                    Ok(tungstenite::Message::Close(_)) => return closed(&log2),
                    Ok(_) => continue,
                    Err(tungstenite::Error::Io(e))
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        continue
                    }
                    Err(_) => return closed(&log2),
                };
                let Some(msg) = v["id"].as_u64().and_then(|id| waiting.remove(&id)) else {
                    continue;
                };
                let outcome = if v["result"] == true {
                    Outcome::Acked
                } else {
                    let e = &v["error"];
                    let text = e["message"].as_str().unwrap_or("").to_string();
                    Outcome::Refused(e["code"].as_i64().unwrap_or(0), text)
                };
                let at = Instant::now();
                log2.lock().unwrap().answered.insert(msg, (at, outcome));
            }
        });
        Paced {
            stop,
            log,
            thread: Some(thread),
        }
    }

    /// [`Log::count`] of what it saw so far.
    fn count(&self, f: impl Fn(Instant, &Outcome) -> bool) -> usize {
        self.log.lock().unwrap().count(f)
    }

    /// [`Log::acked_sent_after`] of what it saw so far.
    fn acked_sent_after(&self, t: Instant) -> Vec<String> {
        self.log.lock().unwrap().acked_sent_after(t)
    }

    /// Whether its connection failed.
    fn closed(&self) -> bool {
        self.log.lock().unwrap().closed
    }

    /// Stops publishing, waits (at most [`WAIT`]) for the answers still due; what it saw.
    fn finish(mut self) -> Log {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("publisher thread");
        }
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// The first place where `got` and `want` differ, said briefly (`None`: they are equal).
fn first_difference(got: &[String], want: &[String]) -> Option<String> {
    if got == want {
        return None;
    }
    let i = got.iter().zip(want).take_while(|(g, w)| g == w).count();
    Some(format!(
        "{} received, {} expected; first difference at {i}: got {:?}, expected {:?}",
        got.len(),
        want.len(),
        got.get(i),
        want.get(i)
    ))
}

/// Waits until each subscriber received every acknowledged message of its topic (the
/// marker last of all), stops it and checks what it got: each acknowledged message once,
/// in order, the marker last; with `exact`, exactly what was sent (its publisher had no
/// refusal), so no gap either. Returns what each got.
fn check_subscribers(
    who: &str,
    subs: Vec<Subscriber>,
    sent: &[&Sent],
    exact: bool,
) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for (i, (sub, s)) in subs.into_iter().zip(sent).enumerate() {
        let who = format!("{who} {i}");
        sub.wait_all(&who, &s.acked());
        let (_, got) = sub.finish();
        check_delivery(&who, &got, &[s]);
        assert_eq!(got.last(), s.order.last(), "{who}: the marker is not last");
        if exact {
            if let Some(d) = first_difference(&got, &s.order) {
                panic!("{who}: not every message exactly once, in order: {d}");
            }
        }
        all.push(got);
    }
    all
}

/// The scenario of the module's comment, on Redis of `kind`.
fn partition(test: &str, kind: NsKind) {
    let lab = match Lab::new(2) {
        Ok(lab) => lab,
        Err(why) => return skip(test, &why),
    };
    let redis = NsRedis::start(&lab, kind);
    let url = redis.url();
    let flags = [
        "--threads",
        "2",
        "--redis",
        url.as_str(),
        "--max-cached-per-topic",
        "100000",
    ];
    let (a, b): (Server, Server) = (lab.start_node(0, &flags), lab.start_node(1, &flags));
    let ta: Vec<String> = (0..TOPICS).map(|_| topic()).collect();
    let tb: Vec<String> = (0..TOPICS).map(|_| topic()).collect();
    let subscribe = |s: &Server, ts: &[String]| -> Vec<Subscriber> {
        ts.iter().map(|t| Subscriber::start(s.ws(), t)).collect()
    };
    let (b_on_ta, a_on_tb, b_on_tb) = (subscribe(&b, &ta), subscribe(&a, &tb), subscribe(&b, &tb));
    let publish = |s: &Server, ts: &[String], name: &str| -> Vec<Paced> {
        let each = ts.iter().enumerate();
        each.map(|(i, t)| Paced::start(s.ws(), t, &format!("{name}{i}")))
            .collect()
    };
    let (a_pubs, b_pubs) = (publish(&a, &ta, "a"), publish(&b, &tb, "b"));
    let acked = |_: Instant, o: &Outcome| *o == Outcome::Acked;
    wait_for("10 acknowledged publishes per topic before the cut", || {
        a_pubs.iter().chain(&b_pubs).all(|p| p.count(acked) >= 10)
    });
    wait_for("A's /health 204 before the cut", || health(&a) == 204);

    // The cut: nothing A receives from now on can reach Redis until the link is back.
    lab.cut(0);
    let cut_at = Instant::now();
    let down = poll(WAIT, || (health(&a) == 503).then(Instant::now))
        .unwrap_or_else(|| panic!("A's /health never answered 503 while cut off from Redis"));
    let mut why = String::new();
    wait_for(
        "A's /health to report its command and pub/sub connections down",
        || {
            let (status, body) = a.get("/health");
            why = String::from_utf8_lossy(&body).into_owned();
            status == Some(503) && why.contains("commands") && why.contains("pub/sub")
        },
    );
    wait_for("A's publishes refused while cut off", || {
        let refused = |at: Instant, o: &Outcome| at >= cut_at && unavailable(o);
        a_pubs.iter().all(|p| p.count(refused) >= 3)
    });
    // B keeps working: it stores, and its subscribers get what it stored.
    wait_for("B's publishes acknowledged while A is cut off", || {
        let during = |at: Instant, o: &Outcome| at >= down && *o == Outcome::Acked;
        b_pubs.iter().all(|p| p.count(during) >= 3)
    });
    for (i, (p, s)) in b_pubs.iter().zip(&b_on_tb).enumerate() {
        let who = format!("B's subscriber {i} of B's topic while A is cut off");
        s.wait_all(&who, &p.acked_sent_after(down));
    }
    for (i, p) in a_pubs.iter().enumerate() {
        assert!(
            !p.closed(),
            "A's publisher {i}: its WebSocket closed during the cut"
        );
    }
    eprintln!(
        "{test}: A's /health 503 {:?} after the cut: {why}",
        down - cut_at
    );

    // The link is back.
    let restore_at = Instant::now();
    lab.restore(0);
    let again = poll(BACK, || {
        let after = |at: Instant, o: &Outcome| at >= restore_at && *o == Outcome::Acked;
        a_pubs
            .iter()
            .all(|p| p.count(after) >= 1)
            .then(Instant::now)
    })
    .unwrap_or_else(|| panic!("A's publishes not acknowledged again within {BACK:?}"));
    wait_for("A's /health 204 again", || health(&a) == 204);
    wait_for("5 more acknowledged publishes per topic", || {
        let after = |at: Instant, o: &Outcome| at >= again && *o == Outcome::Acked;
        a_pubs.iter().chain(&b_pubs).all(|p| p.count(after) >= 5)
    });
    let a_logs: Vec<Log> = a_pubs.into_iter().map(Paced::finish).collect();
    let b_logs: Vec<Log> = b_pubs.into_iter().map(Paced::finish).collect();

    // The answers.
    let mut refused_during = 0;
    for (who, logs) in [("A", &a_logs), ("B", &b_logs)] {
        for (i, log) in logs.iter().enumerate() {
            let s = log.to_sent("");
            assert!(!log.closed, "{who}'s publisher {i}: its WebSocket closed");
            assert_eq!(log.answered.len(), log.sent.len(), "{who} {i}: unanswered");
            let other = s.other_errors();
            assert!(
                other.is_empty(),
                "{who} {i}: answers other than true or -32000: {other:?}"
            );
        }
    }
    for (i, log) in a_logs.iter().enumerate() {
        // Received by A after the cut, answered before the link was back: never `true`.
        let wrong: Vec<&String> = log
            .sent
            .iter()
            .filter(|(m, at)| {
                let (ans, o) = &log.answered[m];
                *at >= cut_at && *ans < restore_at && !unavailable(o)
            })
            .map(|(m, _)| m)
            .collect();
        assert!(
            wrong.is_empty(),
            "A acknowledged publishes it received while cut off from Redis: {wrong:?}"
        );
        refused_during += log.count(|at, o| at >= cut_at && unavailable(o));
        assert!(
            log.count(|at, o| at >= restore_at && *o == Outcome::Acked) > 0,
            "A's publisher {i}: nothing acknowledged after the link came back"
        );
    }
    for (i, log) in b_logs.iter().enumerate() {
        let refused = log.count(|_, o| unavailable(o));
        assert_eq!(
            refused, 0,
            "B's publisher {i} was refused: B never lost Redis"
        );
    }

    // One marker per topic after everything, from the node that published on it; then
    // what each subscriber got.
    let marker = |who: &str, i: usize| format!("{who}-marker-{i}");
    let mut wa = a.ws();
    let mut wb = b.ws();
    for i in 0..TOPICS {
        wa.publish(&ta[i], &marker("a", i));
        wb.publish(&tb[i], &marker("b", i));
    }
    let sent_a: Vec<Sent> = a_logs
        .iter()
        .enumerate()
        .map(|(i, l)| l.to_sent(&marker("a", i)))
        .collect();
    let sent_b: Vec<Sent> = b_logs
        .iter()
        .enumerate()
        .map(|(i, l)| l.to_sent(&marker("b", i)))
        .collect();
    let (sa, sb): (Vec<&Sent>, Vec<&Sent>) = (sent_a.iter().collect(), sent_b.iter().collect());
    check_subscribers(
        "A's subscriber (it was cut off) of B's topic",
        a_on_tb,
        &sb,
        true,
    );
    check_subscribers("B's subscriber of B's topic", b_on_tb, &sb, true);
    let got_ta = check_subscribers("B's subscriber of A's topic", b_on_ta, &sa, false);
    // A publish answered -32000 may still have been stored (DECISIONS §7: the reverse never
    // happens): one in flight when the link went, whose bytes reached Redis later.
    let stored_anyway: usize = got_ta
        .iter()
        .zip(&sent_a)
        .map(|(got, s)| {
            let refused = |m: &&String| s.outcome.get(*m).is_some_and(unavailable);
            got.iter().filter(refused).count()
        })
        .sum();
    // Late subscribers, on the node that was cut off.
    let late_ta = subscribe(&a, &ta);
    let late_tb = subscribe(&a, &tb);
    check_subscribers("a late subscriber on A of A's topic", late_ta, &sa, false);
    check_subscribers("a late subscriber on A of B's topic", late_tb, &sb, true);

    if kind == NsKind::Sentinel {
        let reported = redis.reported_primaries();
        assert!(
            reported.iter().all(|p| *p == Some(PRIMARY_PORT)),
            "the Sentinels failed over (only a node was cut, Redis was fine): {reported:?}"
        );
    }
    let count = |logs: &[Log], f: fn(Instant, &Outcome) -> bool| -> usize {
        logs.iter().map(|l| l.count(f)).sum()
    };
    eprintln!(
        "{test}: cut for {:?}; A's publishes acknowledged again {:?} after the link came back; \
         A: {} acknowledged, {refused_during} refused -32000 while cut ({stored_anyway} refused \
         but stored and delivered); B: {} acknowledged, none refused; nothing acknowledged \
         lost, duplicated or out of order",
        restore_at - cut_at,
        again - restore_at,
        count(&a_logs, |_, o| *o == Outcome::Acked),
        count(&b_logs, |_, o| *o == Outcome::Acked),
    );
}

#[test]
fn standalone_node_cut_off_refuses_stays_open_and_catches_up() {
    partition(
        "standalone_node_cut_off_refuses_stays_open_and_catches_up",
        NsKind::Standalone,
    );
}

#[test]
fn sentinel_node_cut_off_from_every_redis_process_refuses_and_catches_up() {
    partition(
        "sentinel_node_cut_off_from_every_redis_process_refuses_and_catches_up",
        NsKind::Sentinel,
    );
}
