//! The clients of `nothing_lost.rs`: publishers that number their messages, and subscribers
//! that churn (or observe) and record, per subscription, what arrived in which order.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::Message;

use super::{Endings, Plan, Report, Shared, SubRecord, TTL};
use crate::common::{reset_on_close, Rng, Server, Ws};

fn message_text(id: u32, topic: usize, rng: &mut Rng) -> String {
    let pad = rng.below(160) as usize;
    let mut m = format!("{id}.{topic}.");
    for _ in 0..pad {
        m.push((b'a' + rng.below(26) as u8) as char);
    }
    m
}

pub(super) fn message_id(text: &str) -> Option<u32> {
    text.split('.').next()?.parse().ok()
}

/// Publisher `p`: publishes messages `p, p + P, p + 2P, ...` on random topics, 64 requests
/// in flight, paced to spread over `plan.publish_for`. Returns `(id, topic)` in order.
pub(super) fn publisher(
    server: &Server,
    shared: &Shared,
    plan: &Plan,
    p: usize,
) -> Vec<(u32, usize)> {
    let mut rng = Rng::new(plan.seed ^ (0x1000 + p as u64).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut ws = server.ws();
    let ids: Vec<u32> = (p..plan.messages)
        .step_by(plan.publishers)
        .map(|i| i as u32)
        .collect();
    let n = ids.len().max(1);
    let start = Instant::now();
    let mut out = Vec::with_capacity(ids.len());
    let mut in_flight = 0usize;
    let mut answered = 0usize;
    let read_answer = |ws: &mut Ws, answered: &mut usize| loop {
        match ws.sock.read().expect("publisher read") {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(t.as_str()).expect("publisher: JSON");
                assert_eq!(v["result"], true, "publish not accepted: {v}");
                *answered += 1;
                return;
            }
            Message::Close(c) => panic!("publisher {p} closed by the server: {c:?}"),
            _ => continue,
        }
    };
    for (k, &id) in ids.iter().enumerate() {
        let due = plan.publish_for.mul_f64(k as f64 / n as f64);
        let now = start.elapsed();
        if due > now {
            ws.sock.flush().expect("publisher flush");
            std::thread::sleep(due - now);
        }
        let topic = rng.below(plan.topics as u64) as usize;
        let text = message_text(id, topic, &mut rng);
        let req = json!({"id": id, "jsonrpc": "2.0", "method": "waku_publish",
                         "params": {"topic": shared.topics[topic], "message": text, "ttl": TTL}});
        ws.sock
            .write(Message::text(req.to_string()))
            .expect("publisher write");
        out.push((id, topic));
        in_flight += 1;
        if in_flight >= 64 {
            ws.sock.flush().expect("publisher flush");
            while in_flight > 32 {
                read_answer(&mut ws, &mut answered);
                in_flight -= 1;
            }
        }
    }
    ws.sock.flush().expect("publisher flush");
    while in_flight > 0 {
        read_answer(&mut ws, &mut answered);
        in_flight -= 1;
    }
    assert_eq!(answered, ids.len());
    out
}

/// A subscriber: `churn` ones drop their connection now and then and come back; the other
/// (the observer) keeps one connection for the whole run. Every subscriber finishes on a
/// connection opened after the last publish was answered, and reads until it holds every
/// message of its topics (or a deadline passes).
pub(super) fn subscriber(
    server: &Server,
    shared: &Shared,
    plan: &Plan,
    name: String,
    topics: Vec<usize>,
    churn: bool,
    seed: u64,
) -> Report {
    let mut rng = Rng::new(seed);
    let mut r = Report {
        name,
        topics: topics.clone(),
        subs: Vec::new(),
        endings: Endings::default(),
        sessions: 0,
        pushes: 0,
        problems: Vec::new(),
        completed: false,
    };
    let mut signalled_ready = false;
    let mut final_deadline: Option<Instant> = None;
    loop {
        let final_session = shared.published_all.load(Ordering::SeqCst);
        if final_session && final_deadline.is_none() {
            final_deadline = Some(Instant::now() + Duration::from_secs(90));
        }
        let session = r.sessions;
        r.sessions += 1;
        let mut ws = server.ws();
        ws.sock
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        // Subscription id -> index in `r.subs`; request id -> topic (pending answers).
        let mut by_id: HashMap<String, usize> = HashMap::new();
        let mut pending: HashMap<u64, usize> = HashMap::new();
        // The subscription currently held on each topic (index in `r.subs`).
        let mut current: HashMap<usize, usize> = HashMap::new();
        let mut next_rpc = 1u64;
        for &t in &topics {
            let req = json!({"id": next_rpc, "jsonrpc": "2.0", "method": "waku_subscribe",
                             "params": {"topic": shared.topics[t]}});
            pending.insert(next_rpc, t);
            next_rpc += 1;
            ws.sock.write(Message::text(req.to_string())).unwrap();
        }
        ws.sock.flush().unwrap();
        let mut lifetime = if churn && !final_session {
            Some(Duration::from_millis(
                rng.range(plan.session_ms.0, plan.session_ms.1),
            ))
        } else {
            None
        };
        let opened = Instant::now();
        // How the session ended: `None` while it lasts.
        let mut ended = false;
        let mut closing_since: Option<Instant> = None;
        let mut reads_since_check = 0usize;
        while !ended {
            let mut idle = false;
            match ws.sock.read() {
                Ok(Message::Text(t)) => {
                    let v: Value = match serde_json::from_str(t.as_str()) {
                        Ok(v) => v,
                        Err(e) => {
                            r.problems.push(format!("not JSON ({e}): {t}"));
                            continue;
                        }
                    };
                    if v["method"] == "waku_subscription" {
                        r.pushes += 1;
                        let sid = v["params"]["id"].as_str().unwrap_or("");
                        let topic = v["params"]["data"]["topic"].as_str().unwrap_or("");
                        let msg = v["params"]["data"]["message"].as_str().unwrap_or("");
                        let Some(&si) = by_id.get(sid) else {
                            r.problems.push(format!(
                                "session {session}: push for an unknown subscription: {v}"
                            ));
                            continue;
                        };
                        let want = &shared.topics[r.subs[si].topic];
                        if topic != want {
                            r.problems.push(format!(
                                "session {session}: push of topic {topic} on the \
                                 subscription of {want}"
                            ));
                            continue;
                        }
                        match message_id(msg) {
                            Some(id) => r.subs[si].seq.push(id),
                            None => r.problems.push(format!("unknown message {msg:?}")),
                        }
                    } else if let Some(id) = v["id"].as_u64() {
                        let Some(t) = pending.remove(&id) else {
                            // An unsubscribe answer.
                            if v["result"] != true {
                                r.problems.push(format!("unsubscribe refused: {v}"));
                            }
                            continue;
                        };
                        let Some(sid) = v["result"].as_str() else {
                            r.problems.push(format!("subscribe refused: {v}"));
                            continue;
                        };
                        r.subs.push(SubRecord {
                            topic: t,
                            session,
                            seq: Vec::new(),
                        });
                        by_id.insert(sid.to_string(), r.subs.len() - 1);
                        current.insert(t, r.subs.len() - 1);
                        if !signalled_ready && pending.is_empty() {
                            signalled_ready = true;
                            shared.ready.fetch_add(1, Ordering::SeqCst);
                        }
                    } else {
                        r.problems.push(format!("unexpected message {v}"));
                    }
                }
                Ok(Message::Close(c)) => {
                    if closing_since.is_none() {
                        let code = c.map_or(1005, |c| u16::from(c.code));
                        *r.endings.server_close.entry(code).or_default() += 1;
                    }
                    ended = true;
                }
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut =>
                {
                    idle = true
                }
                Err(tungstenite::Error::ConnectionClosed)
                | Err(tungstenite::Error::AlreadyClosed)
                    if closing_since.is_some() =>
                {
                    ended = true
                }
                Err(_) => {
                    r.endings.server_eof += 1;
                    ended = true;
                }
            }
            if ended {
                break;
            }
            if let Some(since) = closing_since {
                if since.elapsed() > Duration::from_secs(5) {
                    r.problems
                        .push(format!("session {session}: close handshake not answered"));
                    break;
                }
                continue;
            }
            if final_session || !churn {
                reads_since_check += 1;
                if !idle && reads_since_check < 256 {
                    continue;
                }
                reads_since_check = 0;
                // Done when every topic's current subscription holds the whole topic, or
                // once publishing is over for the observer (then it opens a final one too).
                if let Some(per_topic) = shared.per_topic.get() {
                    if !final_session {
                        break;
                    }
                    // (A count suffices here: the checks after the run look at every
                    // message.)
                    let done = topics.iter().all(|t| {
                        current
                            .get(t)
                            .is_some_and(|&si| r.subs[si].seq.len() >= per_topic[*t])
                    });
                    if done {
                        r.completed = true;
                        break;
                    }
                    if final_deadline.is_some_and(|d| Instant::now() > d) {
                        break;
                    }
                }
                continue;
            }
            if shared.published_all.load(Ordering::SeqCst) {
                // Publishing ended during this session: finish on a fresh connection.
                break;
            }
            let Some(life) = lifetime else { continue };
            if opened.elapsed() < life || !pending.is_empty() {
                continue;
            }
            match rng.below(10) {
                0..=2 => {
                    r.endings.dropped += 1;
                    let _ = ws.sock.get_ref().shutdown(std::net::Shutdown::Both);
                    break;
                }
                3..=4 => {
                    r.endings.reset += 1;
                    reset_on_close(ws.sock.get_ref());
                    break;
                }
                5..=7 => {
                    r.endings.closed += 1;
                    let _ = ws.sock.close(None);
                    closing_since = Some(Instant::now());
                }
                _ => {
                    // Resubscribe some topics on this connection and carry on.
                    r.endings.resubscribed += 1;
                    let k = rng.range(1, topics.len() as u64) as usize;
                    for _ in 0..k {
                        let t = topics[rng.below(topics.len() as u64) as usize];
                        let Some(&si) = current.get(&t) else { continue };
                        let Some(sid) =
                            by_id.iter().find(|(_, &v)| v == si).map(|(k, _)| k.clone())
                        else {
                            continue;
                        };
                        current.remove(&t);
                        let unsub = json!({"id": next_rpc, "jsonrpc": "2.0",
                            "method": "waku_unsubscribe",
                            "params": {"topic": shared.topics[t], "id": sid}});
                        next_rpc += 1;
                        let sub = json!({"id": next_rpc, "jsonrpc": "2.0",
                            "method": "waku_subscribe",
                            "params": {"topic": shared.topics[t]}});
                        pending.insert(next_rpc, t);
                        next_rpc += 1;
                        let _ = ws.sock.write(Message::text(unsub.to_string()));
                        let _ = ws.sock.write(Message::text(sub.to_string()));
                    }
                    let _ = ws.sock.flush();
                    lifetime = Some(
                        opened.elapsed()
                            + Duration::from_millis(
                                rng.range(plan.session_ms.0, plan.session_ms.1),
                            ),
                    );
                }
            }
        }
        drop(ws);
        if r.completed || final_deadline.is_some_and(|d| Instant::now() > d) {
            break;
        }
        if churn && !shared.published_all.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(
                rng.range(plan.offline_ms.0, plan.offline_ms.1),
            ));
        }
    }
    if !signalled_ready {
        shared.ready.fetch_add(1, Ordering::SeqCst);
    }
    r
}
