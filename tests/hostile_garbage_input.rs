//! Hostile clients (issue 5 §3 d), against the real binary over real sockets: garbage,
//! truncated and oversize input, as HTTP heads and as WebSocket frames, gets the documented
//! answer (RFC 6455, DECISIONS §3: 400 / 408 / 411 / 413 / 431 / 505, close 1002 / 1007 /
//! 1009, JSON-RPC -32700 on an open connection), and the server keeps serving. The input is
//! "random" from a seeded RNG, so a failure replays. Figures are printed (`--nocapture`)
//! and recorded in `docs/RELIABILITY-hostile.md`.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use common::http::status_of;
use common::raw_ws::{client_frame, OP_CONT, OP_TEXT};
use common::{topic, RawWs, Rng, Server, THREADS};
use serde_json::json;

/// The server's `--max-message`.
const MAX_MESSAGE: u64 = 65536;

/// What RFC 6455 and DECISIONS §3 say about a frame starting with `b`, from its header alone:
/// `Some(code)` for a close, `None` when the header is acceptable.
fn header_verdict(b: &[u8], max: u64) -> Option<u16> {
    let (b0, b1) = (b[0], b[1]);
    let op = b0 & 0x0F;
    if b0 & 0x70 != 0 || !matches!(op, 0 | 1 | 2 | 8 | 9 | 10) || b1 & 0x80 == 0 {
        return Some(1002);
    }
    let len7 = (b1 & 0x7F) as u64;
    if op >= 8 && (b0 & 0x80 == 0 || len7 > 125) {
        return Some(1002);
    }
    let len = match len7 {
        126 => u16::from_be_bytes([b[2], b[3]]) as u64,
        127 => {
            let mut l = [0u8; 8];
            l.copy_from_slice(&b[2..10]);
            let l = u64::from_be_bytes(l);
            if l >> 63 != 0 {
                return Some(1002);
            }
            l
        }
        l => l,
    };
    (len > max).then_some(1009)
}

/// Sends `bytes` as an HTTP request on a fresh connection, half-closes if asked, and reads
/// until the server closes. Returns (status, everything received, how it ended).
fn http_garbage(server: &Server, bytes: &[u8], half_close: bool) -> (Option<u16>, Vec<u8>, String) {
    let mut s = server.tcp();
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut got = Vec::new();
    let end = match s.read_to_end(&mut got) {
        Ok(_) => "EOF".to_string(),
        Err(e) => e.to_string(),
    };
    (status_of(&got), got, end)
}

#[test]
fn garbage_truncated_and_oversize_input_gets_the_documented_answer() {
    // The worker counts run side by side, each against its own server: the stalled-head
    // checks wait for the head timeout, and waiting for it once per count in a row only
    // costs time.
    std::thread::scope(|s| {
        let runs: Vec<_> = THREADS
            .iter()
            .map(|t| s.spawn(move || garbage_scenario(t)))
            .collect();
        for r in runs {
            if let Err(panic) = r.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

fn garbage_scenario(threads: &str) {
    let mut server = Server::start(&[
        "--threads",
        threads,
        "--head-timeout",
        "2",
        "--max-message",
        "65536",
    ]);
    let mut rng = Rng::new(0x6a7b_a6e0 + threads.len() as u64);
    let mut seen = vec![
        random_heads(&server, &mut rng),
        cut_heads(&server),
        stalled_heads(&server),
        oversize_heads(&server),
    ];
    server.assert_serving("garbage heads");

    seen.push(random_frames(&server, &mut rng));
    seen.push(oversize_and_invalid_frames(&server));
    seen.push(garbage_json(&server, &mut rng));
    server.assert_alive("after garbage frames");
    server.assert_serving("garbage frames");
    let protocol_closes = server
        .try_metric("walletrelay_protocol_closes_total")
        .expect("/metrics");
    eprintln!(
        "garbage [--threads {threads}]: {}; protocol_closes_total {protocol_closes}",
        seen.join("; ")
    );
}

// ------------------------------------------------------------------------------------------
// HTTP heads

/// Random bytes, not starting with a token character: 400, then close. A request line
/// followed by garbage header bytes: 400.
fn random_heads(server: &Server, rng: &mut Rng) -> String {
    for i in 0..50 {
        let n = 1 + rng.below(3000) as usize;
        let mut b = rng.bytes(n);
        b[0] = [0x00u8, 0x01, 0x7f, 0xff, b'(', b'@'][i % 6];
        let (st, got, end) = http_garbage(server, &b, false);
        assert_eq!(
            st,
            Some(400),
            "random head #{i} ({n} bytes): got {:?} ({end})",
            String::from_utf8_lossy(&got)
        );
    }
    for i in 0..20 {
        let mut b = b"GET /hello HTTP/1.1\r\n".to_vec();
        let mut g = rng.bytes(200);
        g[0] = 0x01;
        b.extend(g);
        let (st, got, end) = http_garbage(server, &b, false);
        assert_eq!(
            st,
            Some(400),
            "garbage header #{i}: got {:?} ({end})",
            String::from_utf8_lossy(&got)
        );
    }
    "70 random heads -> 400".into()
}

/// A head cut mid-line, then EOF: closed, no answer (or a 4xx at most).
fn cut_heads(server: &Server) -> String {
    for cut in [3usize, 10, 21, 30] {
        let head = b"GET /hello HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n";
        let t0 = Instant::now();
        let (st, got, end) = http_garbage(server, &head[..cut], true);
        assert!(
            got.is_empty() || st.is_some_and(|s| (400..500).contains(&s)),
            "head cut at {cut} then EOF: got {:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "closed after {:?} ({end})",
            t0.elapsed()
        );
    }
    "head cut then EOF -> closed".into()
}

/// A head cut mid-line that just stops, and a body that stops short of its
/// `Content-Length`: 408 at the head timeout, both (sent side by side: both wait for it).
fn stalled_heads(server: &Server) -> String {
    let (head, body) = std::thread::scope(|s| {
        let head = s.spawn(|| http_garbage(server, b"GET /hello HTTP/1.1\r\nHos", false).0);
        let body = http_garbage(
            server,
            b"POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"topic\":",
            false,
        )
        .0;
        (head.join().expect("stalled head"), body)
    });
    assert_eq!(head, Some(408), "a stalled head");
    assert_eq!(body, Some(408), "a stalled body");
    "stalled head / body -> 408".into()
}

/// A 17 KiB head (finished or not) or 100 header lines: 431; a body over 64 KiB: 413;
/// chunked: 411; not HTTP/1.x: 505.
fn oversize_heads(server: &Server) -> String {
    let mut big = b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 17 * 1024));
    big.extend(b"\r\n\r\n");
    let (st, got, _) = http_garbage(server, &big, false);
    assert_eq!(
        st,
        Some(431),
        "17 KiB head: {:?}",
        String::from_utf8_lossy(&got)
    );
    // A 17 KiB head that never ends: 431 too (not a wait for the timeout).
    let t0 = Instant::now();
    let (st, _, _) = http_garbage(server, &big[..big.len() - 4], false);
    assert_eq!(st, Some(431), "17 KiB unfinished head");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "431 took {:?}",
        t0.elapsed()
    );
    let mut many = b"GET /hello HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..100 {
        many.extend(format!("X-H{i}: v\r\n").as_bytes());
    }
    many.extend(b"\r\n");
    assert_eq!(
        http_garbage(server, &many, false).0,
        Some(431),
        "100 header lines"
    );
    let (st, _, _) = http_garbage(
        server,
        b"POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 70000\r\n\r\n",
        false,
    );
    assert_eq!(st, Some(413), "70000-byte body");
    let (st, _, _) = http_garbage(
        server,
        b"POST /subscribe HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        false,
    );
    assert_eq!(st, Some(411), "chunked body");
    let (st, _, _) = http_garbage(server, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", false);
    assert_eq!(st, Some(505), "HTTP/2 preface");
    "17 KiB head / 100 headers -> 431, 70 kB body -> 413, chunked -> 411, HTTP/2 -> 505".into()
}

// ------------------------------------------------------------------------------------------
// WebSocket frames

/// 100 random frames, each on its own connection: the close code the header calls for,
/// then EOF; with an acceptable header, the server must not hang on to the half-closed
/// peer.
fn random_frames(server: &Server, rng: &mut Rng) -> String {
    let mut verdicts = [0usize; 3];
    for i in 0..100 {
        let mut c = RawWs::open(server);
        let n = 16 + rng.below(600) as usize;
        let b = rng.bytes(n);
        c.send_raw(&b);
        match header_verdict(&b, MAX_MESSAGE) {
            Some(code) => {
                let (got, end) = c.close_code_and_end();
                assert_eq!(
                    got,
                    Some(code),
                    "random frame #{i} {:02x?}: {end}",
                    &b[..16]
                );
                assert_eq!(end, "EOF", "random frame #{i}: after the close frame");
                verdicts[(code == 1009) as usize] += 1;
            }
            None => {
                // Whatever follows, half-close and require the stream to end.
                verdicts[2] += 1;
                let _ = c.sock.shutdown(Shutdown::Write);
                let (_, end) = c.close_code_and_end();
                assert!(
                    end == "EOF" || end == "Eof",
                    "random frame #{i} with an acceptable header, then EOF: {end}"
                );
            }
        }
    }
    format!(
        "100 random frames: {} -> 1002, {} -> 1009, {} acceptable headers -> closed at EOF",
        verdicts[0], verdicts[1], verdicts[2]
    )
}

/// Oversize frames (announced or sent), fragments adding up past `--max-message`, and
/// invalid UTF-8 text get their close codes, then EOF.
fn oversize_and_invalid_frames(server: &Server) -> String {
    // The header of a masked binary frame announcing `len` bytes (and nothing more).
    let announce = |len: u64| {
        let mut c = RawWs::open(server);
        let mut h = vec![0x82, 0xFF];
        h.extend_from_slice(&len.to_be_bytes());
        h.extend_from_slice(&[1, 2, 3, 4]);
        c.send_raw(&h);
        c.close_code_and_end()
    };
    // 2^62 bytes: 1009 at once (nothing is allocated for it).
    assert_eq!(
        announce(1 << 62),
        (Some(1009), "EOF".into()),
        "2^62-byte frame"
    );
    // 2^63 (top bit set, invalid per RFC 6455 §5.2): 1002.
    assert_eq!(
        announce(1 << 63),
        (Some(1002), "EOF".into()),
        "2^63-byte frame"
    );
    // A frame over --max-message actually sent in full: 1009.
    let mut c = RawWs::open(server);
    let _ = c.try_send_raw(&client_frame(true, OP_TEXT, &[b' '; 100_000]));
    assert_eq!(
        c.close_code_and_end(),
        (Some(1009), "EOF".into()),
        "100 kB frame"
    );
    // Fragments adding up past --max-message: 1009.
    let mut c = RawWs::open(server);
    let chunk = vec![b' '; 30_000];
    let mut f = client_frame(false, OP_TEXT, &chunk);
    f.extend(client_frame(false, OP_CONT, &chunk));
    f.extend(client_frame(true, OP_CONT, &chunk));
    let _ = c.try_send_raw(&f);
    assert_eq!(
        c.close_code_and_end(),
        (Some(1009), "EOF".into()),
        "90 kB in fragments"
    );
    // Invalid UTF-8 text: 1007.
    let mut c = RawWs::open(server);
    c.send_frame(true, OP_TEXT, b"{\"id\":1,\"x\":\"\xff\xfe\"}");
    assert_eq!(
        c.close_code_and_end(),
        (Some(1007), "EOF".into()),
        "invalid UTF-8"
    );
    "2^62 -> 1009, 2^63 -> 1002, 100 kB frame / 90 kB fragments -> 1009, invalid UTF-8 -> 1007"
        .into()
}

/// Random bytes inside a valid text frame: -32700 (or 1007 when not UTF-8), and after a
/// parse error the connection stays open and usable; garbage JSON inside binary frames:
/// -32700 too.
fn garbage_json(server: &Server, rng: &mut Rng) -> String {
    let mut parse_errors = 0;
    for i in 0..30 {
        let mut c = RawWs::open(server);
        let n = 1 + rng.below(500) as usize;
        let mut p = rng.bytes(n);
        if i % 2 == 0 {
            // Printable garbage: valid UTF-8, invalid JSON.
            for b in p.iter_mut() {
                *b = b'!' + (*b % 90);
            }
            p[0] = b'{';
        }
        c.send_frame(true, OP_TEXT, &p);
        if std::str::from_utf8(&p).is_ok() {
            let v = c.recv_json();
            assert_eq!(v["error"]["code"], -32700, "garbage JSON #{i}: {v}");
            assert!(v["id"].is_null(), "{v}");
            c.call("waku_subscribe", json!({ "topic": topic() }));
            assert!(
                c.recv_json()["result"].is_string(),
                "connection unusable after a parse error"
            );
            parse_errors += 1;
        } else {
            assert_eq!(
                c.close_code_and_end(),
                (Some(1007), "EOF".into()),
                "non-UTF-8 text #{i}"
            );
        }
    }
    let mut c = RawWs::open(server);
    for _ in 0..10 {
        c.send_binary(&rng.bytes(64));
        let v = c.recv_json();
        assert_eq!(v["error"]["code"], -32700, "{v}");
    }
    format!("{parse_errors} garbage JSON texts + 10 binary -> -32700 and still open")
}
