//! Large and repeated registry answers over one connection: pipelined to a slow reader
//! (ranges of the sealed file sent part-way), and from the worker's answer cache. A part of
//! `registry_http.rs`, in a file of its own for its size.

use super::*;

/// Large answers leave the server as ranges of its sealed registry file (`sendfile`) between
/// in-memory heads and separators; a client that pipelines many of them and reads slowly
/// through a small receive buffer (so every send stops part-way) still gets each answer
/// whole, byte-identical to a single request, in order.
#[test]
fn pipelined_large_answers_to_a_slow_reader_arrive_whole_and_in_order() {
    let s = server();
    let targets: &[(&str, &str, &str)] = &[
        ("GET", "/api/v1/all", ""),
        ("GET", "/api/v1/all?entries=100&page=2", ""),
        ("HEAD", "/api/v1/all", ""),
        ("GET", "/api/v1/all", "Accept-Encoding: gzip\r\n"),
        ("GET", "/api/v1/all?search=wallet", ""),
        ("GET", "/api/v1/wallets?entries=50&page=1", ""),
        ("GET", "/api/v1/all?entries=200&page=1", ""),
        ("GET", "/api/v1/dapps", ""),
    ];
    let want: Vec<Resp> = targets
        .iter()
        .map(|(m, t, x)| request(&s, m, t, x))
        .collect();
    let mut c = s.tcp_with(SockOpts {
        rcvbuf: Some(4096),
        ..SockOpts::default()
    });
    c.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut all = String::new();
    for _ in 0..3 {
        for (m, t, x) in targets {
            all.push_str(&format!("{m} {t} HTTP/1.1\r\nHost: t\r\n{x}\r\n"));
        }
    }
    c.write_all(all.as_bytes()).unwrap();
    // A slow reader: a few KiB at a time, with pauses, through a 4 KiB buffer.
    let mut slow = HttpConn::new(SlowReader { s: c, reads: 0 });
    for round in 0..3 {
        for ((m, t, _), w) in targets.iter().zip(&want) {
            let got = slow.response(*m == "HEAD");
            assert_eq!(got.status, w.status, "{m} {t} (round {round})");
            assert_eq!(
                got.header("content-length"),
                w.header("content-length"),
                "{m} {t}"
            );
            assert!(got.body == w.body, "{m} {t} (round {round}): body differs");
        }
    }
}

/// A reader that takes at most 3,000 bytes per read and sleeps every 16 reads.
struct SlowReader {
    s: TcpStream,
    reads: u64,
}

impl Read for SlowReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reads += 1;
        if self.reads.is_multiple_of(16) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let n = buf.len().min(3000);
        self.s.read(&mut buf[..n])
    }
}

/// Repeated queries are answered from the worker's answer cache (`--answer-cache`): the
/// same bytes, headers and tags as a server without it, across many distinct queries that
/// overflow a small cache again and again (so answers come from fresh, refilled and
/// forgotten generations), in both encodings and pipelined.
#[test]
fn answer_cache_serves_the_same_bytes_as_no_cache() {
    let cached = Server::start(&["--threads", "1", "--answer-cache", "200000"]);
    let plain = Server::start(&["--threads", "1", "--answer-cache", "0"]);
    let mut targets = Vec::new();
    for q in ["wallet", "a", "e", "swap", "fi", "o"] {
        targets.push(format!("/api/v1/all?search={q}"));
        targets.push(format!("/api/v1/dapps?search={q}&entries=30"));
    }
    for n in [10, 25, 40, 70, 100] {
        targets.push(format!("/api/v1/all?entries={n}&page=2"));
    }
    let encodings = ["", "Accept-Encoding: gzip\r\n"];
    let want: Vec<Vec<Resp>> = encodings
        .iter()
        .map(|x| {
            targets
                .iter()
                .map(|t| request(&plain, "GET", t, x))
                .collect()
        })
        .collect();
    let mut c = HttpConn::open(&cached);
    for round in 0..3 {
        for (x, want) in encodings.iter().zip(&want) {
            let mut batch = String::new();
            for t in &targets {
                batch.push_str(&format!("GET {t} HTTP/1.1\r\nHost: t\r\n{x}\r\n"));
            }
            c.send(batch.as_bytes());
            for (t, w) in targets.iter().zip(want) {
                let got = c.response(false);
                assert_eq!(got.status, w.status, "{t} {x:?} round {round}");
                for h in ["etag", "content-encoding", "content-length", "vary"] {
                    assert_eq!(got.header(h), w.header(h), "{h} of {t} {x:?}");
                }
                assert!(got.body == w.body, "{t} {x:?} round {round}: body differs");
            }
        }
    }
}
