//! A reader too slow for its outbound buffer (DECISIONS §3): it is closed with 1008, nothing
//! is lost for the other subscribers, the drop is counted, and the messages stay cached for
//! its return (the newest 1,000 per topic).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::raw_ws::{OP_CLOSE, OP_PING, OP_TEXT};
use common::{topic, Frame, Next, RawWs, Server, SockOpts, THREADS};
use serde_json::{json, Value};

const MESSAGES: usize = 3000;
const SIZE: usize = 8192;
const CACHE: usize = 1000;

/// Message `i` (1-based): 8 KB, distinct, its number readable at the front.
fn message(i: usize) -> String {
    let mut m = format!("msg-{i:06}-");
    let fill = (b'a' + (i % 26) as u8) as char;
    while m.len() < SIZE {
        m.push(fill);
    }
    m
}

/// A server with `threads` workers, a 256 KiB outbound limit, and 120 s for a closed
/// connection to take what is queued for it.
fn slow_reader_server(threads: &str) -> Server {
    Server::start(&[
        "--threads",
        threads,
        "--max-outbound",
        "262144",
        "--close-timeout",
        "120",
    ])
}

/// Sends `waku_subscribe` for `tp` (the connection's first request, id 1) without reading
/// the answer.
fn send_subscribe(c: &mut RawWs, tp: &str) {
    assert_eq!(c.call("waku_subscribe", json!({ "topic": tp })), 1);
}

/// Subscribes `c` to `tp` and reads the (text) answer.
fn subscribe(c: &mut RawWs, tp: &str, who: &str) {
    send_subscribe(c, tp);
    match c.next() {
        Next::Frame(Frame { op: OP_TEXT, .. }) => {}
        other => panic!("{who}'s subscribe: {other:?}"),
    }
}

#[test]
fn slow_reader_is_closed_with_1008_others_lose_nothing_and_it_gets_the_cache_back_1_thread() {
    slow_reader_scenario(THREADS[0]);
}

#[test]
fn slow_reader_is_closed_with_1008_others_lose_nothing_and_it_gets_the_cache_back_4_threads() {
    slow_reader_scenario(THREADS[1]);
}

#[test]
fn slow_reader_that_resumes_soon_after_the_cutoff_reads_up_to_a_1008_close() {
    for t in THREADS {
        let s = slow_reader_server(t);
        let tp = topic();
        let mut slow = RawWs::open(&s);
        subscribe(&mut slow, &tp, "slow client");
        // Publish until the server reports the slow consumer dropped, then read at once.
        let mut publisher = s.ws();
        let mut sent = 0;
        while s.dropped("slow_consumer") < 1.0 {
            assert!(sent < MESSAGES, "never cut off after {sent} messages");
            for _ in 0..25 {
                sent += 1;
                publisher.publish(&tp, &message(sent));
            }
        }
        let End {
            pushes,
            close,
            problem,
        } = read_until_end(&mut slow);
        if let Some(p) = problem {
            panic!("[--threads {t}] after {pushes} correct pushes: {p}");
        }
        assert_eq!(close, Some(1008), "[--threads {t}] after {pushes} pushes");
        assert!(pushes < sent, "[--threads {t}] {pushes} pushes of {sent}");
    }
}

/// How many bytes of pushes a subscriber that never reads (4 KiB receive buffer) absorbs
/// before the server cuts it off, with the server's other arguments `extra`.
fn bytes_absorbed_before_cutoff(extra: &[&str]) -> usize {
    let mut args = vec!["--threads", "1", "--max-outbound", "65536"];
    args.extend_from_slice(extra);
    let s = Server::start(&args);
    let tp = topic();
    let mut stalled = RawWs::upgrade(s.tcp_with(SockOpts {
        rcvbuf: Some(4096),
        ..SockOpts::default()
    }));
    subscribe(&mut stalled, &tp, "stalled client");
    let mut publisher = s.ws();
    let mut sent = 0;
    while s.dropped("slow_consumer") < 1.0 {
        assert!(sent < MESSAGES, "never cut off after {sent} messages");
        sent += 1;
        publisher.publish(&tp, &message(sent));
    }
    sent * SIZE
}

/// `TCP_NOTSENT_LOWAT` (`--notsent-lowat`, 16 KiB by default): a client that stops reading
/// is cut off once its receive window, 16 KiB unsent in the kernel and `--max-outbound` are
/// full, not after a whole kernel send buffer (256 KiB with the default `--sndbuf`) has
/// been written to it first, work and kernel memory spent on a client that reads nothing.
#[test]
fn a_reader_that_stops_reading_is_cut_off_without_filling_a_kernel_send_buffer() {
    let absorbed = bytes_absorbed_before_cutoff(&[]);
    // 64 KiB queue + 16 KiB unsent + a few KiB of window + one kernel write's overshoot.
    assert!(
        absorbed <= 192 << 10,
        "absorbed {absorbed} bytes before the cut-off"
    );
    // The same client against a server without the option fills the send buffer first.
    let without = bytes_absorbed_before_cutoff(&["--notsent-lowat", "0"]);
    assert!(
        without >= absorbed + (128 << 10),
        "without --notsent-lowat {without} bytes, with {absorbed}"
    );
}

fn slow_reader_scenario(threads: &str) {
    let s = slow_reader_server(threads);
    let tp = topic();

    // The slow client subscribes, then stops reading.
    let mut slow = RawWs::open(&s);
    send_subscribe(&mut slow, &tp);

    // The reading subscriber takes every push in a thread of its own, and says how far it
    // has read: it stands for a client that keeps up, so the publisher never runs more than
    // READER_LEAD messages (128 KiB) ahead of it, half its outbound limit. Without that, a
    // debug-build reader starved of CPU on a loaded 2-core machine can fall 256 KiB behind
    // and is (rightly) cut off as slow too.
    const READER_LEAD: usize = 16;
    let read = Arc::new(AtomicUsize::new(0));
    let mut reader = s.ws();
    reader.subscribe(&tp);
    let reading = std::thread::spawn({
        let read = Arc::clone(&read);
        move || {
            let mut got = Vec::with_capacity(MESSAGES);
            for _ in 0..MESSAGES {
                let (_, topic, msg) = reader.next_push();
                got.push((topic, msg));
                read.fetch_add(1, Ordering::SeqCst);
            }
            // Nothing beyond the 3,000.
            assert_eq!(reader.recv_within(300), None);
            got
        }
    });

    // Make sure the slow client's subscription is in place before publishing: its answer
    // is the first frame it has (read it, then read nothing more).
    match slow.next() {
        Next::Frame(f) if f.op == OP_TEXT => {
            let v = f.json();
            assert_eq!(v["id"], 1, "{v}");
            assert!(v["result"].is_string(), "{v}");
        }
        other => panic!("slow client's subscribe: {other:?}"),
    }

    let mut publisher = s.ws();
    for i in 1..=MESSAGES {
        while i > read.load(Ordering::SeqCst) + READER_LEAD && !reading.is_finished() {
            std::thread::sleep(Duration::from_millis(1));
        }
        // `publish` asserts the `true` result.
        publisher.publish(&tp, &message(i));
    }

    let got = reading
        .join()
        .expect("the reading subscriber lost messages");
    assert_eq!(got.len(), MESSAGES);
    for (i, (topic, msg)) in got.iter().enumerate() {
        assert_eq!(topic, &tp);
        assert!(
            *msg == message(i + 1),
            "reading subscriber: push #{} is not message #{} (starts {:?})",
            i + 1,
            i + 1,
            &msg[..16]
        );
    }

    // Now the slow client reads everything that was buffered for it: pushes of the topic
    // (in order, without gaps), then a close frame 1008, then the end of the stream.
    // A missing close frame is recorded, not asserted at once, so that the rest of the
    // scenario (metrics, the cache) is checked too; the test fails at the end.
    let End {
        pushes,
        close,
        problem,
    } = read_until_end(&mut slow);
    let mut failure = None;
    if let Some(p) = problem {
        failure = Some(format!(
            "[--threads {threads}] the slow client, after {pushes} correct pushes: {p}"
        ));
    } else if close != Some(1008) {
        failure = Some(format!(
            "[--threads {threads}] the slow client's stream ended after {pushes} pushes with \
             close code {close:?}, not a close frame 1008"
        ));
    }
    assert!(pushes < MESSAGES, "the slow client was never cut off");

    assert!(
        s.dropped("slow_consumer") >= 1.0,
        "slow_consumer drops not counted"
    );

    // It comes back and gets the newest 1,000 messages from the cache, oldest first, and
    // nothing more; its connection stays open.
    let mut back = RawWs::open(&s);
    let start = Instant::now();
    let mut failures: Vec<String> = failure.into_iter().collect();
    match read_replay(&mut back, &tp, MESSAGES - CACHE + 1, CACHE).and_then(|()| back.ping_pong()) {
        Ok(()) => assert!(start.elapsed() < Duration::from_secs(30)),
        Err(e) => failures.push(format!(
            "[--threads {threads}] the returning client's replay of the newest {CACHE} \
             cached messages: {e}"
        )),
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How a slow client's stream ended.
struct End {
    /// Complete, correct pushes read.
    pushes: usize,
    /// Code of the close frame, if one came.
    close: Option<u16>,
    /// What went wrong on the way, if anything (the stream is not read further).
    problem: Option<String>,
}

/// Reads what the server sends until the stream ends: pushes (which must be messages 1, 2,
/// 3, ... intact and in order), then at most one close frame, then EOF.
fn read_until_end(c: &mut RawWs) -> End {
    let mut end = End {
        pushes: 0,
        close: None,
        problem: None,
    };
    loop {
        match c.next() {
            Next::Frame(Frame {
                op: OP_TEXT,
                payload,
                ..
            }) => {
                if end.close.is_some() {
                    end.problem = Some("a text frame after the close frame".into());
                    return end;
                }
                let k = end.pushes + 1;
                let v: Value = match serde_json::from_slice(&payload) {
                    Ok(v) => v,
                    Err(e) => {
                        end.problem = Some(format!(
                            "push #{k} is not JSON ({e}): the byte stream is corrupted; \
                             its text around column 158: {:?}",
                            String::from_utf8_lossy(
                                &payload[140.min(payload.len())..180.min(payload.len())]
                            )
                        ));
                        return end;
                    }
                };
                if v["method"] != "waku_subscription"
                    || v["params"]["data"]["message"].as_str() != Some(message(k).as_str())
                {
                    end.problem = Some(format!("push #{k} is not message #{k}"));
                    return end;
                }
                end.pushes = k;
            }
            Next::Frame(f) if f.op == OP_PING => {}
            Next::Frame(f) if f.op == OP_CLOSE => {
                if end.close.is_some() || f.payload.len() < 2 {
                    end.problem = Some("a second close frame, or one without a code".into());
                    return end;
                }
                end.close = f.close_code();
            }
            Next::Frame(f) => {
                end.problem = Some(format!(
                    "unexpected frame {:#x} ({} B)",
                    f.op,
                    f.payload.len()
                ));
                return end;
            }
            Next::Eof => return end,
            Next::Cut { buffered, error } => {
                end.problem = Some(format!(
                    "the stream was cut inside a frame ({buffered} bytes of a frame, then {}) \
                     with no close frame: the server dropped output it had queued (including \
                     the 1008 close)",
                    error.map_or_else(|| "EOF".into(), |e| e.to_string())
                ));
                return end;
            }
            Next::Timeout => {
                end.problem = Some(format!(
                    "nothing more within the read timeout after {} pushes",
                    end.pushes
                ));
                return end;
            }
        }
    }
}

/// Subscribes `c` to `tp` and reads the subscribe answer and then `n` pushes, which must be
/// messages `first`, `first + 1`, ... intact and in order. Returns how it ended if not.
fn read_replay(c: &mut RawWs, tp: &str, first: usize, n: usize) -> Result<(), String> {
    send_subscribe(c, tp);
    match c.next() {
        Next::Frame(f) if f.op == OP_TEXT => {
            let v = f.json();
            assert_eq!(v["id"], 1, "{v}");
        }
        other => return Err(format!("subscribe answer: {other:?}")),
    }
    for k in 0..n {
        match c.next() {
            Next::Frame(Frame {
                op: OP_TEXT,
                payload,
                ..
            }) => {
                let v: Value = serde_json::from_slice(&payload).map_err(|e| {
                    format!(
                        "push #{} is not JSON ({e}); {} bytes, starts {:?}, ends {:?}",
                        k + 1,
                        payload.len(),
                        String::from_utf8_lossy(&payload[..payload.len().min(120)]),
                        String::from_utf8_lossy(&payload[payload.len().saturating_sub(60)..])
                    )
                })?;
                let want = message(first + k);
                if v["params"]["data"]["message"].as_str() != Some(want.as_str()) {
                    return Err(format!("push #{} is not message #{}", k + 1, first + k));
                }
            }
            Next::Frame(f) if f.op == OP_CLOSE => {
                return Err(format!("close frame {:?} after {k} pushes", f.close_code()))
            }
            other => return Err(format!("after {k} pushes: {other:?}")),
        }
    }
    Ok(())
}

#[test]
fn replay_of_many_large_cached_messages_arrives_intact_and_in_order() {
    // 100 cached messages of 8 KB (800 KB) fit the default 4 MiB outbound buffer.
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let tp = topic();
        let mut publisher = s.ws();
        for i in 1..=100 {
            publisher.publish(&tp, &message(i));
        }
        let mut c = RawWs::open(&s);
        if let Err(e) = read_replay(&mut c, &tp, 1, 100).and_then(|()| c.ping_pong()) {
            panic!("[--threads {t}] replay of 100 cached 8 KB messages: {e}");
        }
    }
}

#[test]
fn replay_of_a_full_topic_cache_is_not_treated_as_a_slow_consumer() {
    // A fresh, reading subscriber of a topic with 1,000 cached 8 KB messages (8 MB, more
    // than the 4 MiB default outbound buffer) must get them all: it is not slow, the replay
    // is just large.
    let s = Server::start(&["--threads", "1"]);
    let tp = topic();
    let mut publisher = s.ws();
    for i in 1..=CACHE {
        publisher.publish(&tp, &message(i));
    }
    let mut c = RawWs::open(&s);
    if let Err(e) = read_replay(&mut c, &tp, 1, CACHE).and_then(|()| c.ping_pong()) {
        panic!("replay of {CACHE} cached 8 KB messages: {e}");
    }
    assert_eq!(s.dropped("slow_consumer"), 0.0);
}
