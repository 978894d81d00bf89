//! Hostile clients (issue 5 §3 c), against the real binary over real sockets: 1,000
//! subscribers that never read, beside 4 that keep up, while 800 messages of 2 KiB are
//! published. The non-readers are closed with 1008 once their outbound queue is full (what
//! they got before is intact and in order), the readers lose nothing, the server's memory
//! stays bounded, and when the non-readers come back the cache replays every message.
//! Figures are printed (`--nocapture`) and recorded in `docs/RELIABILITY-hostile.md`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::raw_ws::{OP_CLOSE, OP_PING, OP_TEXT};
use common::{raise_nofile_limit, rss_kib, topic, Frame, Next, RawWs, Server, SockOpts, Ws};
use serde_json::Value;

const NON_READERS: usize = 1000;
const READERS: usize = 4;
/// The server's outbound limit per connection (bytes).
const MAX_OUT: usize = 131_072;
const NR_MESSAGES: usize = 800;
const NR_SIZE: usize = 2048;
/// How far (in messages) the publisher may run ahead of the slowest reader: LEAD x 2 KiB
/// stays well inside MAX_OUT plus the kernel's buffer.
const LEAD: usize = 64;

/// Message `i` (1-based): `NR_SIZE` bytes, distinct, its number readable at the front.
fn nr_message(i: usize) -> &'static str {
    static ALL: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let all = ALL.get_or_init(|| {
        (0..=NR_MESSAGES)
            .map(|i| {
                let mut m = format!("msg-{i:06}-");
                let fill = (b'a' + (i % 26) as u8) as char;
                while m.len() < NR_SIZE {
                    m.push(fill);
                }
                m
            })
            .collect()
    });
    &all[i]
}

/// The message number of a push if it carries exactly `nr_message(n)` (a push ends with
/// `"message":"<message>"}}}`).
fn nr_push(payload: &[u8]) -> Option<usize> {
    let end = payload.len().checked_sub(4)?;
    let start = end.checked_sub(NR_SIZE)?;
    if &payload[end..] != b"\"}}}"
        || payload.get(start.checked_sub(11)?..start)? != b"\"message\":\""
    {
        return None;
    }
    let n: usize = std::str::from_utf8(&payload[start + 4..start + 10])
        .ok()?
        .parse()
        .ok()?;
    ((1..=NR_MESSAGES).contains(&n) && &payload[start..end] == nr_message(n).as_bytes())
        .then_some(n)
}

/// A subscriber that never reads, over a connection that announces an internet-sized MSS
/// (1400 bytes) and a 64 KiB receive buffer. On loopback the MSS is ~64 KiB, with which
/// Linux grows the server's send buffer for the connection to ~4 MiB at once: a client
/// that never reads would absorb that much in kernel buffers before the server's own
/// outbound limit came into play. With a real MSS it absorbs a few hundred KiB at most.
fn non_reader(server: &Server, tp: &str) -> RawWs {
    let mut c = RawWs::upgrade(server.tcp_with(SockOpts {
        rcvbuf: Some(65536),
        mss: Some(1400),
    }));
    c.subscribe(tp);
    c
}

/// A reader that keeps up: reads every message, in order, and nothing more, saying how
/// far it has read in `progress`.
fn read_every_push(w: &mut Ws, tp: &str, progress: &AtomicUsize) -> Result<(), String> {
    let mut n = 0;
    while n < NR_MESSAGES {
        match w.sock.read() {
            Ok(tungstenite::Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str())
                    .map_err(|e| format!("push #{} not JSON: {e}", n + 1))?;
                let m = v["params"]["data"]["message"].as_str().unwrap_or("");
                if v["params"]["data"]["topic"] != *tp || m != nr_message(n + 1) {
                    return Err(format!("push #{} is not message #{}", n + 1, n + 1));
                }
                n += 1;
                progress.store(n, Ordering::SeqCst);
            }
            Ok(tungstenite::Message::Close(c)) => {
                return Err(format!(
                    "closed by the server after {n} of {NR_MESSAGES} pushes: {c:?}"
                ))
            }
            Ok(_) => {}
            Err(e) => return Err(format!("after {n} pushes: {e}")),
        }
    }
    match w.recv_within(300) {
        None => Ok(()),
        Some(v) => Err(format!("more than {NR_MESSAGES} pushes: {v}")),
    }
}

/// Publishes messages 1 to `NR_MESSAGES`, never more than `LEAD` ahead of the slowest
/// reader ("readers that keep up": a debug-build reader on a busy 2-core machine can be
/// starved for long stretches; that is not what this test is about). The non-readers still
/// fall behind without bound and must be closed.
fn publish_all(publ: &mut Ws, tp: &str, progress: &[AtomicUsize]) {
    for i in 1..=NR_MESSAGES {
        let wait_until = Instant::now() + Duration::from_secs(30);
        while progress
            .iter()
            .map(|p| p.load(Ordering::SeqCst))
            .min()
            .unwrap_or(0)
            + LEAD
            < i
            && Instant::now() < wait_until
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        publ.publish(tp, nr_message(i));
    }
}

/// A non-reader reads at last: pushes 1, 2, ..., k intact and in order, a close frame
/// 1008, then the end of the stream. Returns k and how it ended.
fn drain_non_reader(c: &mut RawWs) -> (usize, String) {
    let mut k = 0;
    let end = loop {
        match c.next() {
            Next::Frame(Frame {
                op: OP_TEXT,
                payload,
                ..
            }) => match nr_push(&payload) {
                Some(n) if n == k + 1 => k = n,
                other => break format!("push #{} is message {other:?}", k + 1),
            },
            Next::Frame(f) if f.op == OP_PING => {}
            Next::Frame(f) if f.op == OP_CLOSE => {
                let after = c.next();
                break format!("close {:?} then {after:?}", f.close_code());
            }
            other => break format!("{other:?} without a close frame"),
        }
    };
    (k, end)
}

/// Non-reader `i` comes back and subscribes: the cache gives it every message (all 800 are
/// cached), in order.
fn come_back(server: &Server, tp: &str, i: usize) -> Result<(), String> {
    let mut c = RawWs::open(server);
    let id = c.call("waku_subscribe", serde_json::json!({ "topic": tp }));
    let v = c.recv_json();
    if v["id"] != id || !v["result"].is_string() {
        return Err(format!("returning {i}: subscribe answer {v}"));
    }
    for n in 1..=NR_MESSAGES {
        match c.next() {
            Next::Frame(Frame {
                op: OP_TEXT,
                payload,
                ..
            }) => {
                if nr_push(&payload) != Some(n) {
                    return Err(format!(
                        "returning {i}: replay #{n} is message {:?}",
                        nr_push(&payload)
                    ));
                }
            }
            other => return Err(format!("returning {i}: replay #{n}: {other:?}")),
        }
    }
    Ok(())
}

/// Every non-reader comes back (4 at a time), see [`come_back`].
fn all_come_back(server: &Server, tp: &str) -> Vec<Result<(), String>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|part| {
                s.spawn(move || {
                    let mine = part * (NON_READERS / 4)..(part + 1) * (NON_READERS / 4);
                    mine.map(|i| come_back(server, tp, i)).collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// What publishing past the non-readers gave.
struct Published {
    publish_time: Duration,
    reader_results: Vec<Result<(), String>>,
    /// Per non-reader: (index, pushes it got before its close, how its stream ended).
    ends: Vec<(usize, usize, String)>,
    rss_after: u64,
}

/// Publishes every message while `READERS` readers keep up and the non-readers read
/// nothing; then each non-reader reads, at once and in parallel (the server gives a
/// connection it closed 10 s to take what is queued for it). `peak` follows the server's
/// RSS meanwhile.
fn publish_past(server: &Server, tp: &str, lazy: &mut [RawWs], peak: &Mutex<u64>) -> Published {
    let pid = server.child.id();
    let stop = AtomicBool::new(false);
    let progress: Vec<AtomicUsize> = (0..READERS).map(|_| AtomicUsize::new(0)).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let r = rss_kib(pid);
                let mut p = peak.lock().unwrap();
                *p = (*p).max(r);
                drop(p);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let readers: Vec<_> = progress
            .iter()
            .map(|progress| {
                let mut w = server.ws();
                w.subscribe(tp);
                s.spawn(move || read_every_push(&mut w, tp, progress))
            })
            .collect();
        // Whatever happens below (a failed assertion included), stop the sampler.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let _stop = Stop(&stop);
        let start = Instant::now();
        let mut publ = server.ws();
        publish_all(&mut publ, tp, &progress);
        let publish_time = start.elapsed();
        let rss_after = rss_kib(pid);
        let drains: Vec<_> = lazy
            .chunks_mut(NON_READERS / 4)
            .enumerate()
            .map(|(part, chunk)| {
                s.spawn(move || {
                    let first = part * (NON_READERS / 4);
                    let ends = chunk.iter_mut().map(drain_non_reader);
                    ends.enumerate()
                        .map(|(j, (k, end))| (first + j, k, end))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let reader_results = readers
            .into_iter()
            .map(|r| r.join().expect("reader thread"))
            .collect();
        let ends = drains.into_iter().flat_map(|h| h.join().unwrap()).collect();
        Published {
            publish_time,
            reader_results,
            ends,
            rss_after,
        }
    })
}

#[test]
fn subscribers_that_never_read_are_closed_with_1008_memory_stays_bounded_and_they_catch_up() {
    raise_nofile_limit();
    // (No heartbeat during the test: the non-readers send nothing for a while.)
    let max_out = MAX_OUT.to_string();
    let mut server = Server::start(&[
        "--threads",
        "2",
        "--max-outbound",
        &max_out,
        "--ping-interval",
        "600",
    ]);
    let tp = topic();

    // Opened from 4 threads (their order does not matter: nothing is published yet).
    let mut lazy: Vec<RawWs> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (server, tp) = (&server, &tp);
                s.spawn(move || {
                    (0..NON_READERS / 4)
                        .map(|_| non_reader(server, tp))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let rss_before = server.rss_kib();
    let peak = Mutex::new(rss_before);
    let p = publish_past(&server, &tp, &mut lazy, &peak);
    let rss_peak = *peak.lock().unwrap();
    server.assert_alive("after publishing to subscribers that never read");
    let mut failures: Vec<String> = p
        .reader_results
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| r.err().map(|e| format!("reading subscriber {i}: {e}")))
        .collect();
    let mut before_close = Vec::new();
    for (i, k, end) in p.ends {
        before_close.push(k);
        if end != "close Some(1008) then Eof" {
            failures.push(format!("non-reader {i}: after {k} pushes: {end}"));
        }
    }
    let slow_closes = server.dropped("slow_consumer");
    drop(lazy);

    // They come back and subscribe: with what they read before the close, they have
    // everything.
    let back_start = Instant::now();
    failures.extend(
        all_come_back(&server, &tp)
            .into_iter()
            .filter_map(Result::err),
    );
    let back_time = back_start.elapsed();
    before_close.sort();
    eprintln!(
        "non-readers: {NON_READERS} never-reading subscribers + {READERS} readers, \
         {NR_MESSAGES} messages of {NR_SIZE} B published in {:?}; \
         slow_consumer closes {slow_closes}; pushes a non-reader got before \
         its close: min {} median {} max {}; server RSS before {rss_before} KiB, peak {rss_peak} \
         KiB, after {} KiB; {NON_READERS} returning subscribers replayed \
         {NR_MESSAGES} each in {back_time:?}",
        p.publish_time,
        before_close.first().unwrap_or(&0),
        before_close.get(before_close.len() / 2).unwrap_or(&0),
        before_close.last().unwrap_or(&0),
        p.rss_after,
    );
    if slow_closes != NON_READERS as f64 {
        failures.push(format!(
            "{slow_closes} connections closed as slow consumers; exactly the {NON_READERS} \
             non-readers should be"
        ));
    }
    // Each non-reader may hold up to MAX_OUT queued before it is closed; allow half as much
    // again for allocator slack, plus 32 MiB for everything else (the cache, the replays).
    let growth = rss_peak.saturating_sub(rss_before);
    let bound_kib = (NON_READERS * MAX_OUT * 3 / 2 / 1024 + 32 * 1024) as u64;
    if growth >= bound_kib {
        failures.push(format!(
            "server RSS grew by {growth} KiB ({rss_before} -> peak {rss_peak} KiB), \
             bound {bound_kib} KiB"
        ));
    }
    server.assert_alive("after the non-readers returned");
    server.assert_serving("the non-readers");
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}
