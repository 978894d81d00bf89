//! Nothing lost (issue 5 §5): many publishers put messages on many topics while subscribers
//! drop their connections at random (close handshake, plain TCP close, reset, or unsubscribe
//! and resubscribe on the same connection), come back and subscribe again. Every message is
//! published with a ttl that outlives the run and no topic gets near the per-topic cache cap
//! (1,000), so every subscriber is owed every message of its topics: live, or from the cache
//! replay after it resubscribes.
//!
//! What is checked, from what the clients saw (no timing involved):
//! 1. every publish is answered `true`;
//! 2. **at least once**: each subscriber received, over all its connections, every message
//!    published on each of its topics;
//! 3. **no gap inside a subscription**: what one subscription receives is the topic's cached
//!    history (the replay, oldest first) followed by the live messages, so it must be a
//!    prefix of the topic's full order (the longest sequence any subscription received, which
//!    must itself hold every message of the topic). A subscription that skipped a message
//!    and then got a later one lost it on the live path, even if a later replay made up for
//!    it; the "at least once" check alone would not see that;
//! 4. per publisher, messages of a topic arrive in the order they were published.
//!
//! `cargo test --test nothing_lost` runs 20,000 messages at `--threads 4` and at
//! `--threads 1`. The full 100,000 of issue 5 §5 is `#[ignore]`d (too slow for a debug build
//! on two cores); run it with
//! `cargo test --release --test nothing_lost -- --ignored --nocapture`.
//! `NOTHING_LOST_SEED=<n>` replays another random schedule.

// This test's own clients, in a file of their own (a test file's modules sit beside it).
#[path = "nothing_lost/clients.rs"]
mod clients;
mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clients::{publisher, subscriber};
use common::{raise_nofile_limit, Rng, Server};

/// Seconds every message lives in the cache: longer than any run.
const TTL: u64 = 86_400;

// ------------------------------------------------------------------------------------------
// The run

/// The shape of one run.
#[derive(Debug, Clone)]
struct Plan {
    threads: &'static str,
    messages: usize,
    topics: usize,
    publishers: usize,
    /// Subscribers that keep disconnecting.
    churners: usize,
    /// Topics each churner subscribes to.
    topics_per_churner: usize,
    /// Publishing is spread over about this long, so that it overlaps many reconnects.
    publish_for: Duration,
    /// A churner's connection lives this long (ms, uniform) before it drops it.
    session_ms: (u64, u64),
    /// ...and stays away this long (ms, uniform).
    offline_ms: (u64, u64),
    seed: u64,
}

impl Plan {
    fn new(threads: &'static str, messages: usize, publish_for: Duration) -> Plan {
        let seed = std::env::var("NOTHING_LOST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_0005);
        Plan {
            threads,
            messages,
            topics: 200,
            publishers: 4,
            churners: 24,
            topics_per_churner: 20,
            publish_for,
            session_ms: (100, 1200),
            offline_ms: (0, 300),
            seed,
        }
    }
}

/// One subscription (one `waku_subscribe` answer) and what it received, in order.
struct SubRecord {
    topic: usize,
    /// Which connection of its subscriber (0-based).
    session: usize,
    /// Message numbers received on it, in arrival order.
    seq: Vec<u32>,
}

/// How a churner's connections ended.
#[derive(Default, Debug)]
struct Endings {
    /// The client dropped the TCP connection without a close frame.
    dropped: usize,
    /// The client reset the connection (SO_LINGER 0).
    reset: usize,
    /// The client did the WebSocket close handshake.
    closed: usize,
    /// The server sent a close frame (by code).
    server_close: HashMap<u16, usize>,
    /// The server's stream ended (or failed) without a close frame.
    server_eof: usize,
    /// Unsubscribe + resubscribe on a live connection.
    resubscribed: usize,
}

/// What one subscriber saw over the whole run.
struct Report {
    name: String,
    topics: Vec<usize>,
    subs: Vec<SubRecord>,
    endings: Endings,
    sessions: usize,
    pushes: usize,
    /// Protocol problems seen (unknown subscription id, wrong topic, error answers, ...).
    problems: Vec<String>,
    /// The final connection got everything it was owed before the deadline.
    completed: bool,
}

/// Shared between the test's threads.
struct Shared {
    topics: Vec<String>,
    /// Set once every publish has been answered.
    published_all: AtomicBool,
    /// Messages per topic, set once every publish has been answered.
    per_topic: OnceLock<Vec<usize>>,
    /// Subscribers whose first subscriptions are answered (publishing waits for all).
    ready: AtomicUsize,
}

fn run(plan: Plan) {
    raise_nofile_limit();
    let started = Instant::now();
    let server = Server::start(&["--threads", plan.threads]);
    eprintln!("nothing_lost: {plan:?}");
    let topics: Vec<String> = (0..plan.topics).map(|_| common::topic()).collect();
    let shared = Shared {
        topics,
        published_all: AtomicBool::new(false),
        per_topic: OnceLock::new(),
        ready: AtomicUsize::new(0),
    };
    let mut rng = Rng::new(plan.seed);
    // Topic sets: every topic has at least one churner; the observer has them all.
    let mut sets: Vec<Vec<usize>> = vec![Vec::new(); plan.churners];
    for t in 0..plan.topics {
        sets[t % plan.churners].push(t);
    }
    for set in sets.iter_mut() {
        while set.len() < plan.topics_per_churner {
            let t = rng.below(plan.topics as u64) as usize;
            if !set.contains(&t) {
                set.push(t);
            }
        }
    }
    let subscribers = plan.churners + 1;
    let (published, reports) = std::thread::scope(|s| {
        let mut subs = Vec::new();
        let observer_topics: Vec<usize> = (0..plan.topics).collect();
        {
            let (server, shared, plan) = (&server, &shared, &plan);
            subs.push(s.spawn(move || {
                subscriber(
                    server,
                    shared,
                    plan,
                    "observer".into(),
                    observer_topics,
                    false,
                    plan.seed ^ 0xABCD,
                )
            }));
        }
        for (c, set) in sets.into_iter().enumerate() {
            let (server, shared, plan) = (&server, &shared, &plan);
            let seed = rng.next();
            subs.push(s.spawn(move || {
                subscriber(
                    server,
                    shared,
                    plan,
                    format!("churner {c}"),
                    set,
                    true,
                    seed,
                )
            }));
        }
        // Publishing starts once every subscriber holds its first subscriptions.
        let wait = Instant::now();
        while shared.ready.load(Ordering::SeqCst) < subscribers {
            assert!(
                wait.elapsed() < Duration::from_secs(60),
                "subscribers not ready"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let t0 = Instant::now();
        let pubs: Vec<_> = (0..plan.publishers)
            .map(|p| {
                let (server, shared, plan) = (&server, &shared, &plan);
                s.spawn(move || publisher(server, shared, plan, p))
            })
            .collect();
        let published: Vec<Vec<(u32, usize)>> = pubs
            .into_iter()
            .map(|h| h.join().expect("a publisher failed"))
            .collect();
        eprintln!(
            "nothing_lost: {} publishes answered in {:.1?}",
            plan.messages,
            t0.elapsed()
        );
        let mut per_topic = vec![0usize; plan.topics];
        for (_, t) in published.iter().flatten() {
            per_topic[*t] += 1;
        }
        shared.per_topic.set(per_topic).unwrap();
        shared.published_all.store(true, Ordering::SeqCst);
        let reports: Vec<Report> = subs
            .into_iter()
            .map(|h| h.join().expect("a subscriber failed"))
            .collect();
        (published, reports)
    });
    let elapsed = started.elapsed();

    // ---- Checks -------------------------------------------------------------------------
    let total: usize = published.iter().map(Vec::len).sum();
    assert_eq!(total, plan.messages, "publishes answered");
    // Per topic: every message, and each publisher's order.
    let mut of_topic: Vec<HashSet<u32>> = vec![HashSet::new(); plan.topics];
    let mut pub_rank: HashMap<u32, (usize, usize)> = HashMap::new();
    for (p, list) in published.iter().enumerate() {
        for (k, &(id, t)) in list.iter().enumerate() {
            of_topic[t].insert(id);
            pub_rank.insert(id, (p, k));
        }
    }
    let mut failures: Vec<String> = Vec::new();
    for r in &reports {
        for p in r.problems.iter().take(5) {
            failures.push(format!("{}: {p}", r.name));
        }
        if !r.completed {
            failures.push(format!(
                "{}: its last connection did not receive every message of its topics within \
                 90 s",
                r.name
            ));
        }
    }
    // 2. At least once.
    let mut missing_total = 0usize;
    for r in &reports {
        for &t in &r.topics {
            let got: HashSet<u32> = r
                .subs
                .iter()
                .filter(|s| s.topic == t)
                .flat_map(|s| s.seq.iter().copied())
                .collect();
            let missing: Vec<u32> = of_topic[t].difference(&got).copied().collect();
            let extra: Vec<u32> = got.difference(&of_topic[t]).copied().collect();
            missing_total += missing.len();
            if !missing.is_empty() {
                failures.push(format!(
                    "{}: topic {t}: {} of {} messages never received (e.g. {:?})",
                    r.name,
                    missing.len(),
                    of_topic[t].len(),
                    &missing[..missing.len().min(5)]
                ));
            }
            if !extra.is_empty() {
                failures.push(format!(
                    "{}: topic {t}: received messages never published on it: {:?}",
                    r.name,
                    &extra[..extra.len().min(5)]
                ));
            }
        }
    }
    // 3. Each subscription a prefix of the topic's order; 4. per-publisher order.
    let mut order: Vec<Option<&Vec<u32>>> = vec![None; plan.topics];
    for r in &reports {
        for s in &r.subs {
            if order[s.topic].is_none_or(|o| s.seq.len() > o.len()) {
                order[s.topic] = Some(&s.seq);
            }
        }
    }
    let mut gap_subs = 0usize;
    let mut dup_subs = 0usize;
    let mut reordered = 0usize;
    let mut subscriptions = 0usize;
    for r in &reports {
        for (i, s) in r.subs.iter().enumerate() {
            subscriptions += 1;
            let Some(full) = order[s.topic] else { continue };
            let mut seen = HashSet::new();
            if let Some(&d) = s.seq.iter().find(|&&m| !seen.insert(m)) {
                dup_subs += 1;
                failures.push(format!(
                    "{} subscription #{i} (connection {}, topic {}): message {d} delivered \
                     twice on one subscription",
                    r.name, s.session, s.topic
                ));
                continue;
            }
            let mut last: HashMap<usize, usize> = HashMap::new();
            for &m in &s.seq {
                let (p, k) = pub_rank[&m];
                if last.get(&p).is_some_and(|&prev| prev > k) {
                    reordered += 1;
                    failures.push(format!(
                        "{} subscription #{i} (topic {}): publisher {p}'s messages out of \
                         order at message {m}",
                        r.name, s.topic
                    ));
                    break;
                }
                last.insert(p, k);
            }
            if let Some(pos) = s.seq.iter().zip(full.iter()).position(|(a, b)| a != b) {
                gap_subs += 1;
                let got = s.seq[pos];
                let skipped: Vec<u32> = full[pos..]
                    .iter()
                    .take_while(|&&m| m != got)
                    .copied()
                    .collect();
                let detail = if full[pos..].contains(&got) {
                    format!(
                        "skipped {} message(s) {:?} and then received {got}: lost inside \
                         one subscription",
                        skipped.len(),
                        &skipped[..skipped.len().min(5)]
                    )
                } else {
                    format!("received {got} where the topic's order has {}", full[pos])
                };
                failures.push(format!(
                    "{} subscription #{i} (connection {}, topic {}, {} pushes): position \
                     {pos}: {detail}",
                    r.name,
                    s.session,
                    s.topic,
                    s.seq.len()
                ));
            }
        }
    }

    // ---- Figures ------------------------------------------------------------------------
    let pushes: usize = reports.iter().map(|r| r.pushes).sum();
    let sessions: usize = reports.iter().map(|r| r.sessions).sum();
    let mut endings = Endings::default();
    for r in &reports {
        endings.dropped += r.endings.dropped;
        endings.reset += r.endings.reset;
        endings.closed += r.endings.closed;
        endings.server_eof += r.endings.server_eof;
        endings.resubscribed += r.endings.resubscribed;
        for (c, n) in &r.endings.server_close {
            *endings.server_close.entry(*c).or_default() += n;
        }
    }
    let metric = |n: &str| server.metric(n);
    eprintln!(
        "nothing_lost [--threads {}]: {} messages on {} topics by {} publishers; {} subscribers \
         ({} churning), {} connections, {} subscriptions, {} pushes received; client endings: \
         {} dropped, {} reset, {} close handshakes, {} resubscribes on a live connection; \
         server closes {:?}, server EOFs {}; server: published {} stored {} delivered {} \
         dropped {}; {} duplicate / {} gapped / {} reordered subscriptions, {} messages \
         missing; {:.1?} in all",
        plan.threads,
        plan.messages,
        plan.topics,
        plan.publishers,
        reports.len(),
        plan.churners,
        sessions,
        subscriptions,
        pushes,
        endings.dropped,
        endings.reset,
        endings.closed,
        endings.resubscribed,
        endings.server_close,
        endings.server_eof,
        metric("walletrelay_messages_published_total"),
        metric("walletrelay_messages_stored_total"),
        metric("walletrelay_messages_delivered_total"),
        metric("walletrelay_messages_dropped_total"),
        dup_subs,
        gap_subs,
        reordered,
        missing_total,
        elapsed
    );
    if !failures.is_empty() {
        let n = failures.len();
        failures.truncate(40);
        panic!(
            "[--threads {}, seed {}] {n} failure(s):\n{}",
            plan.threads,
            plan.seed,
            failures.join("\n")
        );
    }
}

#[test]
fn twenty_thousand_messages_with_subscriber_churn_4_threads() {
    run(Plan::new("4", 20_000, Duration::from_secs(12)));
}

#[test]
fn twenty_thousand_messages_with_subscriber_churn_1_thread() {
    run(Plan::new("1", 20_000, Duration::from_secs(12)));
}

/// The full issue 5 §5 run. Slow in a debug build:
/// `cargo test --release --test nothing_lost -- --ignored --nocapture`.
#[test]
#[ignore]
fn hundred_thousand_messages_with_subscriber_churn_4_threads() {
    run(Plan::new("4", 100_000, Duration::from_secs(30)));
}

/// As above at one worker.
#[test]
#[ignore]
fn hundred_thousand_messages_with_subscriber_churn_1_thread() {
    run(Plan::new("1", 100_000, Duration::from_secs(30)));
}
