//! Hostile and broken clients (issue 5 §3), against the real binary over real sockets:
//! slowloris, a connection flood past the limit, subscribers that never read, garbage and
//! oversize input, and clients that vanish or half-close. Each test asserts behaviour (the
//! documented answer or close, nothing lost, bounded memory, a healthy server afterwards);
//! times are only checked against generous bounds. Figures are printed (`--nocapture`) and
//! recorded in `docs/RELIABILITY-hostile.md`.

mod common;

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{raise_nofile_limit, topic, ws_upgrade, Server, Ws, THREADS, WS_UPGRADE};
use serde_json::{json, Value};

// ------------------------------------------------------------------------------------------
// Helpers

/// Seeded splitmix64: reproducible "random" input without an extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// The server process must still be running.
fn assert_alive(server: &mut Server, when: &str) {
    if let Ok(Some(status)) = server.child.try_wait() {
        panic!("the server process exited ({status}) {when}");
    }
}

/// Resident memory of a process, in KiB (`VmRSS` in `/proc/<pid>/status`).
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The status code of an HTTP answer (its first line), if the bytes start with one.
fn status_of(raw: &[u8]) -> Option<u16> {
    let line = raw.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let rest = line.strip_prefix("HTTP/1.1 ")?;
    rest.get(..3)?.parse().ok()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads one HTTP answer (head and `Content-Length` body) from a keep-alive connection.
fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<(u16, Vec<u8>)> {
    loop {
        if let Some(p) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..p]).to_string();
            let status = status_of(head.as_bytes()).ok_or_else(|| {
                io::Error::new(ErrorKind::InvalidData, format!("not an answer: {head:?}"))
            })?;
            let len: usize = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0);
            let need = p + 4 + len;
            while buf.len() < need {
                read_more(s, buf)?;
            }
            let body = buf[p + 4..need].to_vec();
            buf.drain(..need);
            return Ok((status, body));
        }
        read_more(s, buf)?;
    }
}

fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut tmp = [0u8; 16384];
    let n = s.read(&mut tmp)?;
    if n == 0 {
        return Err(io::Error::new(ErrorKind::UnexpectedEof, "EOF"));
    }
    buf.extend_from_slice(&tmp[..n]);
    Ok(())
}

/// `GET path` on a fresh connection with `Connection: close`; returns the status and body.
fn get(server: &Server, path: &str) -> (Option<u16>, Vec<u8>) {
    let raw = server.raw_exchange(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let body = find(&raw, b"\r\n\r\n").map_or(Vec::new(), |p| raw[p + 4..].to_vec());
    (status_of(&raw), body)
}

/// A metric summed over its series, or `None` when `/metrics` did not answer 200 (a
/// refused connection reads as nothing, which `Server::metric` would sum to 0).
fn metric(server: &Server, name: &str) -> Option<f64> {
    let raw = server.raw_exchange(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if status_of(&raw) != Some(200) {
        return None;
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    Some(
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.split(['{', ' ']).next() == Some(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
            + 0.0,
    )
}

/// Polls a metric until `/metrics` answers and `ok` holds (or `within` passes); returns the
/// last value (NaN if `/metrics` never answered).
fn wait_metric(server: &Server, name: &str, within: Duration, ok: impl Fn(f64) -> bool) -> f64 {
    let start = Instant::now();
    loop {
        let v = metric(server, name);
        if v.is_some_and(&ok) || start.elapsed() > within {
            return v.unwrap_or(f64::NAN);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A relay round trip on a fresh topic: subscribe, publish from another connection, receive.
fn relay_round_trip(sub: &mut Ws, publ: &mut Ws, n: usize) {
    let tp = topic();
    let id = sub.subscribe(&tp);
    let msg = format!("round trip {n}");
    publ.publish(&tp, &msg);
    let (_, t, m) = sub.next_push();
    assert_eq!((t.as_str(), m.as_str()), (tp.as_str(), msg.as_str()));
    let r = sub.call("waku_unsubscribe", json!({"topic": tp, "id": id}));
    assert_eq!(r["result"], true, "{r}");
}

/// The server still answers `/hello`, `/health` and a relay round trip.
fn assert_serving(server: &Server, what: &str) {
    let (st, body) = get(server, "/hello");
    assert_eq!(st, Some(200), "/hello after {what}");
    assert_eq!(
        body, b"Hello World, this is WalletRelay v2.0",
        "after {what}"
    );
    assert_eq!(get(server, "/health").0, Some(204), "/health after {what}");
    let (mut a, mut b) = (server.ws(), server.ws());
    relay_round_trip(&mut a, &mut b, 0);
}

fn percentile(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let mut s = v.to_vec();
    s.sort();
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn set_reset_on_close(s: &TcpStream) {
    socket2::SockRef::from(s)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER");
}

// ------------------------------------------------------------------------------------------
// A raw WebSocket client: frames built and decoded here, reading only when told to.

#[derive(Debug)]
enum Next {
    Frame {
        op: u8,
        payload: Vec<u8>,
    },
    /// EOF between frames.
    Eof,
    /// EOF or an error inside a frame (or a reset). (Fields are read through `Debug`.)
    #[allow(dead_code)]
    Cut {
        buffered: usize,
        error: String,
    },
    /// Nothing within the read timeout.
    Timeout,
}

struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
    pos: usize,
}

impl Raw {
    /// Upgrades a fresh connection at `/` and checks the 101.
    fn open(server: &Server) -> Raw {
        Raw::upgrade(server.tcp())
    }

    /// Like `open`, over a connection that announces an internet-sized MSS (1400 bytes)
    /// and a 64 KiB receive buffer. On loopback the MSS is ~64 KiB, with which Linux grows
    /// the server's send buffer for the connection to ~4 MiB at once: a client that never
    /// reads would absorb that much in kernel buffers before the server's own outbound
    /// limit came into play. With a real MSS it absorbs a few hundred KiB at most.
    fn open_internet_like(server: &Server) -> Raw {
        use socket2::{Domain, Protocol, Socket, Type};
        let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        sock.set_mss(1400).expect("TCP_MAXSEG");
        sock.set_recv_buffer_size(65536).expect("SO_RCVBUF");
        sock.connect(&server.addr.into()).expect("connect");
        let s: TcpStream = sock.into();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Raw::upgrade(s)
    }

    fn upgrade(mut s: TcpStream) -> Raw {
        let buf = ws_upgrade(&mut s);
        Raw { s, buf, pos: 0 }
    }

    fn frame(fin: bool, op: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut f = vec![if fin { 0x80 } else { 0 } | op];
        let n = payload.len();
        if n < 126 {
            f.push(0x80 | n as u8);
        } else if n <= 0xFFFF {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    fn send(&mut self, op: u8, payload: &[u8]) {
        self.s.write_all(&Raw::frame(true, op, payload)).unwrap();
    }

    fn send_json(&mut self, v: &Value) {
        self.send(1, v.to_string().as_bytes());
    }

    fn fill(&mut self, n: usize) -> Result<(), Next> {
        while self.buf.len() - self.pos < n {
            if self.pos > 0 && self.pos * 2 >= self.buf.len() {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + 65536, 0);
            let r = self.s.read(&mut self.buf[old..]);
            self.buf.truncate(old + *r.as_ref().unwrap_or(&0));
            let buffered = self.buf.len() - self.pos;
            match r {
                Ok(0) if buffered == 0 => return Err(Next::Eof),
                Ok(0) => {
                    return Err(Next::Cut {
                        buffered,
                        error: "EOF".into(),
                    })
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                    return Err(Next::Timeout)
                }
                Err(e) => {
                    return Err(Next::Cut {
                        buffered,
                        error: e.to_string(),
                    })
                }
            }
        }
        Ok(())
    }

    fn next(&mut self) -> Next {
        if let Err(e) = self.fill(2) {
            return e;
        }
        let b = &self.buf[self.pos..];
        let (b0, b1) = (b[0], b[1]);
        assert_eq!(b1 & 0x80, 0, "server frame is masked");
        let (len, off) = match b1 & 0x7F {
            126 => {
                if let Err(e) = self.fill(4) {
                    return e;
                }
                let b = &self.buf[self.pos..];
                (u16::from_be_bytes([b[2], b[3]]) as usize, 4)
            }
            127 => {
                if let Err(e) = self.fill(10) {
                    return e;
                }
                let mut l = [0u8; 8];
                l.copy_from_slice(&self.buf[self.pos + 2..self.pos + 10]);
                (u64::from_be_bytes(l) as usize, 10)
            }
            l => (l as usize, 2),
        };
        if let Err(e) = self.fill(off + len) {
            return e;
        }
        let payload = self.buf[self.pos + off..self.pos + off + len].to_vec();
        self.pos += off + len;
        Next::Frame {
            op: b0 & 0x0F,
            payload,
        }
    }

    /// The next frame must be a JSON text frame.
    fn json(&mut self) -> Value {
        match self.next() {
            Next::Frame { op: 1, payload } => serde_json::from_slice(&payload).expect("JSON"),
            other => panic!("expected a text frame, got {other:?}"),
        }
    }

    /// Reads until the server closes: returns the close code (None: no close frame) and
    /// whether the TCP stream then ended. Pings and text frames on the way are skipped.
    fn close_code(&mut self) -> (Option<u16>, String) {
        loop {
            match self.next() {
                Next::Frame { op: 8, payload } => {
                    let code =
                        (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
                    let end = match self.next() {
                        Next::Eof => "EOF".to_string(),
                        other => format!("{other:?}"),
                    };
                    return (code, end);
                }
                Next::Frame { .. } => continue,
                other => return (None, format!("{other:?}")),
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// (a) Slowloris

/// The head a slowloris client dribbles, then `a` forever (it never ends).
const SLOW_HEAD: &[u8] =
    b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\nX-Slow: ";

fn slow_byte(i: usize) -> u8 {
    SLOW_HEAD.get(i).copied().unwrap_or(b'a')
}

struct Slow {
    sock: TcpStream,
    opened: Instant,
    next_send: Instant,
    sent: usize,
    got: Vec<u8>,
    /// Sends nothing at all (an idle connection rather than a dribbling one).
    silent: bool,
}

struct SlowEnd {
    silent: bool,
    lifetime: Duration,
    got: Vec<u8>,
    sent: usize,
    how: String,
}

fn open_slow(server: &Server, i: usize) -> Slow {
    let mut sock = TcpStream::connect(server.addr).expect("slowloris connect");
    let _ = sock.set_nodelay(true);
    let silent = i.is_multiple_of(10);
    let mut sent = 0;
    if !silent {
        sock.write_all(&[slow_byte(0)]).unwrap();
        sent = 1;
    }
    sock.set_nonblocking(true).unwrap();
    let now = Instant::now();
    Slow {
        sock,
        opened: now,
        next_send: now + Duration::from_secs(1),
        sent,
        got: Vec::new(),
        silent,
    }
}

/// Advances one slowloris connection; returns how it ended, if it did.
fn step_slow(c: &mut Slow, now: Instant) -> Option<String> {
    let mut tmp = [0u8; 2048];
    loop {
        match c.sock.read(&mut tmp) {
            Ok(0) => return Some("EOF".into()),
            Ok(n) => c.got.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Some(format!("read: {e}")),
        }
    }
    if !c.silent && now >= c.next_send {
        match c.sock.write(&[slow_byte(c.sent)]) {
            Ok(_) => {
                c.sent += 1;
                c.next_send += Duration::from_secs(1);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Some(format!("write: {e}")),
        }
    }
    None
}

/// A normal client's round: `/hello` on a keep-alive connection, `/health` on a fresh one,
/// and a relay subscribe / publish / deliver round trip.
struct Normal {
    http: TcpStream,
    buf: Vec<u8>,
    sub: Ws,
    publ: Ws,
    n: usize,
}

impl Normal {
    fn new(server: &Server) -> Normal {
        Normal {
            http: server.tcp(),
            buf: Vec::new(),
            sub: server.ws(),
            publ: server.ws(),
            n: 0,
        }
    }

    /// Returns how long each of the three parts took.
    fn round(&mut self, server: &Server) -> [Duration; 3] {
        let start = Instant::now();
        self.n += 1;
        self.http
            .write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let (st, body) = read_response(&mut self.http, &mut self.buf).expect("/hello answer");
        assert_eq!(st, 200);
        assert_eq!(body, b"Hello World, this is WalletRelay v2.0");
        let hello = start.elapsed();
        assert_eq!(get(server, "/health").0, Some(204), "/health");
        let health = start.elapsed() - hello;
        relay_round_trip(&mut self.sub, &mut self.publ, self.n);
        [hello, health, start.elapsed() - hello - health]
    }
}

#[test]
fn slowloris_connections_are_cut_by_the_head_timeout_while_normal_clients_are_served() {
    raise_nofile_limit();
    const SLOW: usize = 2000;
    const ATTACK: Duration = Duration::from_secs(10);
    const HEAD_TIMEOUT: f64 = 2.0;
    let mut server = Server::start(&["--threads", "2", "--head-timeout", "2"]);
    let pid = server.child.id();
    let base_open = wait_metric(
        &server,
        "walletrelay_connections_open",
        Duration::from_secs(5),
        |v| v <= 1.0,
    );
    let mut normal = Normal::new(&server);
    let before_parts: Vec<[Duration; 3]> = (0..30).map(|_| normal.round(&server)).collect();
    let rss_before = rss_kib(pid);

    let attacking = AtomicBool::new(true);
    let ready = AtomicBool::new(false);
    let peak_open = Mutex::new(0usize);
    let (ends, leftovers, during_parts) = std::thread::scope(|s| {
        let attacker = s.spawn(|| {
            let mut slots: Vec<Option<Slow>> =
                (0..SLOW).map(|i| Some(open_slow(&server, i))).collect();
            let mut opened = SLOW;
            ready.store(true, Ordering::SeqCst);
            let start = Instant::now();
            let mut ends = Vec::new();
            loop {
                let now = Instant::now();
                let go_on = now.duration_since(start) < ATTACK;
                if !go_on {
                    attacking.store(false, Ordering::SeqCst);
                }
                let mut open = 0;
                for slot in slots.iter_mut() {
                    let Some(c) = slot else { continue };
                    if let Some(how) = step_slow(c, now) {
                        ends.push(SlowEnd {
                            silent: c.silent,
                            lifetime: c.opened.elapsed(),
                            got: std::mem::take(&mut c.got),
                            sent: c.sent,
                            how,
                        });
                        *slot = go_on.then(|| {
                            opened += 1;
                            open_slow(&server, opened)
                        });
                    }
                    if slot.is_some() {
                        open += 1;
                    }
                }
                {
                    let mut p = peak_open.lock().unwrap();
                    *p = (*p).max(open);
                }
                if !go_on && open == 0 {
                    break;
                }
                if now.duration_since(start) > ATTACK + Duration::from_secs(30) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let leftovers: Vec<Duration> =
                slots.iter().flatten().map(|c| c.opened.elapsed()).collect();
            (ends, leftovers)
        });
        while !ready.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut during_parts = Vec::new();
        while attacking.load(Ordering::SeqCst) {
            during_parts.push(normal.round(&server));
        }
        let (ends, leftovers) = attacker.join().expect("attacker");
        (ends, leftovers, during_parts)
    });
    assert_alive(&mut server, "after the slowloris attack");
    let rss_after = rss_kib(pid);
    let total = |p: &[Duration; 3]| p[0] + p[1] + p[2];
    let before: Vec<Duration> = before_parts.iter().map(total).collect();
    let during: Vec<Duration> = during_parts.iter().map(total).collect();
    let slowest_parts: Vec<Duration> = (0..3)
        .map(|i| during_parts.iter().map(|p| p[i]).max().unwrap_or_default())
        .collect();

    let mut got_408 = 0;
    let mut closed_silently = 0;
    let mut bad = Vec::new();
    let mut lifetimes = Vec::new();
    for e in &ends {
        lifetimes.push(e.lifetime);
        match status_of(&e.got) {
            Some(408) => got_408 += 1,
            // An idle connection (it sent nothing) may be closed without an answer.
            None if e.got.is_empty() && e.silent => closed_silently += 1,
            _ => bad.push(format!(
                "{} connection: after {:?} and {} bytes sent, got {:?} ({}), not a 408",
                if e.silent { "an idle" } else { "a dribbling" },
                e.lifetime,
                e.sent,
                String::from_utf8_lossy(&e.got[..e.got.len().min(200)]),
                e.how
            )),
        }
        if e.lifetime < Duration::from_secs_f64(HEAD_TIMEOUT * 0.75) {
            bad.push(format!(
                "closed after {:?}, before the {HEAD_TIMEOUT} s head timeout ({} bytes sent, \
                 {} bytes got, {})",
                e.lifetime,
                e.sent,
                e.got.len(),
                e.how
            ));
        }
    }
    let worst = lifetimes.iter().max().copied().unwrap_or_default();
    eprintln!(
        "slowloris: {} connections ({} at once), {} answered 408, {} closed without an answer \
         (silent ones), {} still open at the end; lifetime p50 {:?} max {:?}; normal rounds \
         before: {} p50 {:?} p99 {:?} max {:?}; during: {} p50 {:?} p99 {:?} max {:?} (slowest \
         keep-alive /hello {:?}, fresh-connection /health {:?}, relay round trip {:?}); \
         server RSS {} KiB before, {} KiB at the end of the attack",
        ends.len(),
        *peak_open.lock().unwrap(),
        got_408,
        closed_silently,
        leftovers.len(),
        percentile(&lifetimes, 0.5),
        worst,
        before.len(),
        percentile(&before, 0.5),
        percentile(&before, 0.99),
        percentile(&before, 1.0),
        during.len(),
        percentile(&during, 0.5),
        percentile(&during, 0.99),
        percentile(&during, 1.0),
        slowest_parts[0],
        slowest_parts[1],
        slowest_parts[2],
        rss_before,
        rss_after
    );
    assert!(
        leftovers.is_empty(),
        "{} slowloris connections still open 30 s after the attack (oldest {:?})",
        leftovers.len(),
        leftovers.iter().max()
    );
    assert!(
        bad.is_empty(),
        "{} wrong endings, e.g.:\n{}",
        bad.len(),
        bad[..bad.len().min(10)].join("\n")
    );
    assert!(ends.len() >= SLOW, "{} slowloris connections", ends.len());
    assert!(got_408 >= SLOW * 8 / 10, "only {got_408} got 408");
    assert!(
        worst < Duration::from_secs_f64(HEAD_TIMEOUT + 10.0),
        "a slowloris connection lived {worst:?} with a {HEAD_TIMEOUT} s head timeout"
    );
    assert!(
        during.len() >= 5,
        "only {} normal rounds during the attack",
        during.len()
    );
    assert!(
        percentile(&during, 1.0) < Duration::from_secs(10),
        "a normal round took {:?} during the attack",
        percentile(&during, 1.0)
    );
    let open = wait_metric(
        &server,
        "walletrelay_connections_open",
        Duration::from_secs(10),
        |v| v <= base_open + 3.0,
    );
    // The normal client's three connections are still open.
    assert_eq!(open, base_open + 3.0, "connections_open after the attack");
    assert_serving(&server, "the slowloris attack");
    eprintln!(
        "slowloris: server RSS {} KiB once the attack is over",
        rss_kib(pid)
    );
}

// ------------------------------------------------------------------------------------------
// (b) Connection flood

/// Connects `n` sockets from 4 threads at once (optionally sending `first` on each).
fn flood(server: &Server, n: usize, first: &[u8]) -> Vec<TcpStream> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    (0..n)
                        .filter(|i| i % 4 == t)
                        .map(|_| {
                            let mut c = TcpStream::connect(server.addr).expect("flood connect");
                            if !first.is_empty() {
                                let _ = c.write_all(first);
                            }
                            c
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// Flood connections the server closed (what each got), and those it holds (index, what
/// each got so far).
type Sorted = (Vec<Vec<u8>>, Vec<(usize, Vec<u8>)>);

/// Sorts flood connections into those the server closed (EOF or reset, with what they got)
/// and those it holds, waiting up to `within` for the closes to show.
fn classify(conns: &mut [TcpStream], want_held: usize, within: Duration) -> Sorted {
    for c in conns.iter() {
        c.set_nonblocking(true).unwrap();
    }
    let start = Instant::now();
    let mut got: Vec<Vec<u8>> = vec![Vec::new(); conns.len()];
    let mut closed = vec![false; conns.len()];
    loop {
        for (i, c) in conns.iter_mut().enumerate() {
            if closed[i] {
                continue;
            }
            let mut tmp = [0u8; 1024];
            loop {
                match c.read(&mut tmp) {
                    Ok(0) => {
                        closed[i] = true;
                        break;
                    }
                    Ok(n) => got[i].extend_from_slice(&tmp[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => {
                        closed[i] = true;
                        break;
                    }
                }
            }
        }
        let held = closed.iter().filter(|c| !**c).count();
        if held <= want_held || start.elapsed() > within {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut refused = Vec::new();
    let mut held = Vec::new();
    for (i, g) in got.into_iter().enumerate() {
        if closed[i] {
            refused.push(g);
        } else {
            held.push((i, g));
        }
    }
    (refused, held)
}

#[test]
fn connection_flood_past_the_limit_is_refused_at_once_and_the_server_recovers() {
    raise_nofile_limit();
    const LIMIT: usize = 50;
    // The flag as README.md and `src/config.rs` spell it.
    let mut server = Server::start(&[
        "--threads",
        "1",
        "--max-connections",
        "50",
        "--head-timeout",
        "60",
    ]);
    let base = wait_metric(
        &server,
        "walletrelay_connections_open",
        Duration::from_secs(5),
        |v| v <= 1.0,
    );
    assert_eq!(base, 1.0, "only the /metrics connection is open");
    let refused_before =
        metric(&server, "walletrelay_connections_refused_total").expect("/metrics");
    // Let the server reap that last /metrics connection before the flood takes the slots.
    std::thread::sleep(Duration::from_millis(300));

    // Wave 1: 1,000 idle connections at once.
    let t = Instant::now();
    let mut conns = flood(&server, 1000, b"");
    let connect_time = t.elapsed();
    let (refused, held) = classify(&mut conns, LIMIT, Duration::from_secs(10));
    let classify_time = t.elapsed();
    assert_eq!(
        held.len(),
        LIMIT,
        "connections held open at --max-connections {LIMIT}"
    );
    assert_eq!(refused.len(), 1000 - LIMIT);
    assert!(
        refused.iter().all(|g| g.is_empty()),
        "a refused connection got bytes: {:?}",
        refused
            .iter()
            .find(|g| !g.is_empty())
            .map(|g| String::from_utf8_lossy(g).to_string())
    );
    // While the flood holds every slot, a newcomer is turned away too, without an answer.
    let late = server.raw_exchange(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        late.is_empty(),
        "a request past the limit got {:?}",
        String::from_utf8_lossy(&late)
    );
    assert_alive(&mut server, "during the flood");
    drop(conns);
    let t2 = Instant::now();
    let mut healthy = false;
    while t2.elapsed() < Duration::from_secs(10) {
        if get(&server, "/health").0 == Some(204) {
            healthy = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let recover_time = t2.elapsed();
    assert!(healthy, "/health not 204 within 10 s of the flood's end");
    let refused_total = metric(&server, "walletrelay_connections_refused_total").expect("/metrics")
        - refused_before;
    assert!(
        refused_total >= (1000 - LIMIT + 1) as f64,
        "walletrelay_connections_refused_total rose by {refused_total}"
    );

    // Every wave-1 slot is free again (the server reaps the closed ones as it reads their
    // EOF; on a loaded machine that can trail the first /health answer).
    let open = wait_metric(
        &server,
        "walletrelay_connections_open",
        Duration::from_secs(10),
        |v| v <= 1.0,
    );
    assert_eq!(open, 1.0, "wave 1's connections are all closed");
    std::thread::sleep(Duration::from_millis(300));

    // Wave 2: 300 connections that each send a request: exactly the first 50 slots answer.
    let mut conns = flood(&server, 300, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    let (refused2, held2) = classify(&mut conns, LIMIT, Duration::from_secs(10));
    assert_eq!(held2.len(), LIMIT);
    // Held ones are answered (possibly still on their way): read what is missing.
    for (i, g) in &held2 {
        let c = &mut conns[*i];
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = g.clone();
        while find(&buf, b"\r\n\r\n").is_none() {
            read_more(c, &mut buf).expect("held connection's answer");
        }
        assert_eq!(
            status_of(&buf),
            Some(204),
            "{:?}",
            String::from_utf8_lossy(&buf)
        );
    }
    assert!(
        refused2.iter().all(|g| g.is_empty()),
        "a refused connection got an answer"
    );
    drop(conns);
    let open = wait_metric(
        &server,
        "walletrelay_connections_open",
        Duration::from_secs(10),
        |v| v <= base,
    );
    assert_eq!(open, base, "connections_open after the floods");
    let refused_total = metric(&server, "walletrelay_connections_refused_total").expect("/metrics")
        - refused_before;
    eprintln!(
        "flood: 1000 connections in {connect_time:?}, sorted in {classify_time:?}: {} held, {} \
         refused; recovered (/health 204) {recover_time:?} after release; second wave 300 with \
         requests: {} answered 204, {} refused; connections_refused_total +{refused_total}",
        held.len(),
        refused.len(),
        held2.len(),
        refused2.len()
    );
    assert_serving(&server, "the floods");
    assert_alive(&mut server, "after the floods");
}

/// README.md documents the per-worker connection limit as `--max-connections N`.
#[test]
fn the_readmes_max_connections_flag_is_accepted() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .args(["--max-connections", "50", "--help"])
        .output()
        .expect("run walletrelay");
    assert!(
        out.status.success(),
        "`walletrelay --max-connections 50` (README.md) is refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ------------------------------------------------------------------------------------------
// (c) Subscribers that never read

const NR_MESSAGES: usize = 800;
const NR_SIZE: usize = 2048;

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

#[test]
fn subscribers_that_never_read_are_closed_with_1008_memory_stays_bounded_and_they_catch_up() {
    raise_nofile_limit();
    const NON_READERS: usize = 1000;
    const READERS: usize = 4;
    /// The server's outbound limit per connection (bytes).
    const MAX_OUT: usize = 131_072;
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
    let pid = server.child.id();
    let tp = topic();

    let mut lazy: Vec<Raw> = (0..NON_READERS)
        .map(|i| {
            let mut c = Raw::open_internet_like(&server);
            c.send_json(
                &json!({"id": i, "jsonrpc": "2.0", "method": "waku_subscribe",
                                "params": {"topic": tp}}),
            );
            let v = c.json();
            assert!(v["result"].is_string(), "{v}");
            c
        })
        .collect();
    let rss_before = rss_kib(pid);
    let stop = AtomicBool::new(false);
    let peak = Mutex::new(rss_before);
    // Messages each reader has read so far, and how far the publisher may run ahead of the
    // slowest (LEAD x 2 KiB stays well inside MAX_OUT plus the kernel's buffer).
    let progress: Vec<AtomicUsize> = (0..READERS).map(|_| AtomicUsize::new(0)).collect();
    const LEAD: usize = 64;
    let (publish_time, reader_results, ends, rss_after) = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let r = rss_kib(pid);
                let mut p = peak.lock().unwrap();
                *p = (*p).max(r);
                drop(p);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let readers: Vec<_> = (0..READERS)
            .map(|r| {
                let mut w = server.ws();
                w.subscribe(&tp);
                let tp = tp.clone();
                let progress = &progress[r];
                s.spawn(move || -> Result<(), String> {
                    // Reads as fast as it can: every message, in order, and nothing more.
                    let mut n = 0;
                    while n < NR_MESSAGES {
                        match w.sock.read() {
                            Ok(tungstenite::Message::Text(t)) => {
                                let v: Value = serde_json::from_str(t.as_str())
                                    .map_err(|e| format!("push #{} not JSON: {e}", n + 1))?;
                                let m = v["params"]["data"]["message"].as_str().unwrap_or("");
                                if v["params"]["data"]["topic"] != *tp || m != nr_message(n + 1) {
                                    return Err(format!(
                                        "push #{} is not message #{}",
                                        n + 1,
                                        n + 1
                                    ));
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
                })
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
        for i in 1..=NR_MESSAGES {
            // "Readers that keep up": the publisher never runs more than LEAD messages ahead
            // of the slowest reader (a debug-build reader on a busy 2-core machine can be
            // starved for long stretches; that is not what this test is about). The
            // non-readers still fall behind without bound and must be closed.
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
            publ.publish(&tp, nr_message(i));
        }
        let publish_time = start.elapsed();
        let rss_after = rss_kib(pid);
        // Each non-reader now reads, at once and in parallel (the server gives a connection
        // it closed 10 s to take what is queued for it): pushes 1, 2, ..., k intact and in
        // order, a close frame 1008, then the end of the stream.
        let lazy_hs: Vec<_> = lazy
            .chunks_mut(NON_READERS / 4)
            .enumerate()
            .map(|(part, chunk)| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    for (j, c) in chunk.iter_mut().enumerate() {
                        let mut k = 0;
                        let end = loop {
                            match c.next() {
                                Next::Frame { op: 1, payload } => match nr_push(&payload) {
                                    Some(n) if n == k + 1 => k = n,
                                    other => break format!("push #{} is message {other:?}", k + 1),
                                },
                                Next::Frame { op: 9, .. } => {}
                                Next::Frame { op: 8, payload } => {
                                    let code = (payload.len() >= 2)
                                        .then(|| u16::from_be_bytes([payload[0], payload[1]]));
                                    let after = c.next();
                                    break format!("close {code:?} then {after:?}");
                                }
                                other => break format!("{other:?} without a close frame"),
                            }
                        };
                        out.push((part * (NON_READERS / 4) + j, k, end));
                    }
                    out
                })
            })
            .collect();
        let reader_results: Vec<Result<(), String>> = readers
            .into_iter()
            .map(|r| r.join().expect("reader thread"))
            .collect();
        let ends: Vec<(usize, usize, String)> = lazy_hs
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        (publish_time, reader_results, ends, rss_after)
    });
    let rss_peak = *peak.lock().unwrap();
    assert_alive(
        &mut server,
        "after publishing to subscribers that never read",
    );
    let mut failures: Vec<String> = reader_results
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| r.err().map(|e| format!("reading subscriber {i}: {e}")))
        .collect();
    let mut before_close = Vec::new();
    for (i, k, end) in ends {
        before_close.push(k);
        if end != "close Some(1008) then Eof" {
            failures.push(format!("non-reader {i}: after {k} pushes: {end}"));
        }
    }
    let slow_closes = server.dropped("slow_consumer");
    drop(lazy);
    // They come back and subscribe: the cache gives them every message (all 800 are cached),
    // so with what they read before the close they have everything.
    let back_start = Instant::now();
    let returned: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..NON_READERS)
            .collect::<Vec<_>>()
            .chunks(NON_READERS / 4)
            .map(|chunk| {
                let chunk = chunk.to_vec();
                let (server, tp) = (&server, &tp);
                s.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|i| {
                            let mut c = Raw::open(server);
                            c.send_json(
                                &json!({"id": 1, "jsonrpc": "2.0", "method": "waku_subscribe",
                                                "params": {"topic": tp}}),
                            );
                            let v = c.json();
                            if !v["result"].is_string() {
                                return Err(format!("returning {i}: subscribe answer {v}"));
                            }
                            for n in 1..=NR_MESSAGES {
                                match c.next() {
                                    Next::Frame { op: 1, payload }
                                        if nr_push(&payload) == Some(n) => {}
                                    Next::Frame { op: 1, payload } => {
                                        return Err(format!(
                                            "returning {i}: replay #{n} is message {:?}",
                                            nr_push(&payload)
                                        ))
                                    }
                                    other => {
                                        return Err(format!(
                                            "returning {i}: replay #{n}: {other:?}"
                                        ))
                                    }
                                }
                            }
                            Ok(())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let back_time = back_start.elapsed();
    failures.extend(returned.into_iter().filter_map(Result::err));
    before_close.sort();
    eprintln!(
        "non-readers: {NON_READERS} never-reading subscribers + {READERS} readers, \
         {NR_MESSAGES} messages of {NR_SIZE} B published in {publish_time:?}; \
         slow_consumer closes {slow_closes}; pushes a non-reader got before \
         its close: min {} median {} max {}; server RSS before {rss_before} KiB, peak {rss_peak} \
         KiB, after {rss_after} KiB; {NON_READERS} returning subscribers replayed \
         {NR_MESSAGES} each in {back_time:?}",
        before_close.first().unwrap_or(&0),
        before_close.get(before_close.len() / 2).unwrap_or(&0),
        before_close.last().unwrap_or(&0),
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
    assert_alive(&mut server, "after the non-readers returned");
    assert_serving(&server, "the non-readers");
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

// ------------------------------------------------------------------------------------------
// (d) Garbage, truncated and oversize input

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
    for t in THREADS {
        garbage_scenario(t);
    }
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
    let mut rng = Rng(0x6a7b_a6e0 + threads.len() as u64);
    let mut seen: Vec<String> = Vec::new();

    // --- HTTP heads ---
    // Random bytes, not starting with a token character: 400, then close.
    for i in 0..50 {
        let n = 1 + rng.below(3000) as usize;
        let mut b = rng.bytes(n);
        b[0] = [0x00u8, 0x01, 0x7f, 0xff, b'(', b'@'][i % 6];
        let (st, got, end) = http_garbage(&server, &b, false);
        assert_eq!(
            st,
            Some(400),
            "random head #{i} ({n} bytes): got {:?} ({end})",
            String::from_utf8_lossy(&got)
        );
    }
    // A request line followed by garbage header bytes: 400.
    for i in 0..20 {
        let mut b = b"GET /hello HTTP/1.1\r\n".to_vec();
        let mut g = rng.bytes(200);
        g[0] = 0x01;
        b.extend(g);
        let (st, got, end) = http_garbage(&server, &b, false);
        assert_eq!(
            st,
            Some(400),
            "garbage header #{i}: got {:?} ({end})",
            String::from_utf8_lossy(&got)
        );
    }
    seen.push("70 random heads -> 400".into());
    // A head cut mid-line, then EOF: closed, no answer (or a 4xx at most).
    for cut in [3usize, 10, 21, 30] {
        let head = b"GET /hello HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n";
        let t0 = Instant::now();
        let (st, got, end) = http_garbage(&server, &head[..cut], true);
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
    seen.push("head cut then EOF -> closed".into());
    // A head cut mid-line that just stops: 408 at the head timeout.
    let (st, _, _) = http_garbage(&server, b"GET /hello HTTP/1.1\r\nHos", false);
    assert_eq!(st, Some(408), "a stalled head");
    // A body that stops short of its Content-Length: 408 as well.
    let (st, _, _) = http_garbage(
        &server,
        b"POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"topic\":",
        false,
    );
    assert_eq!(st, Some(408), "a stalled body");
    seen.push("stalled head / body -> 408".into());
    // A 17 KiB head: 431.
    let mut big = b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 17 * 1024));
    big.extend(b"\r\n\r\n");
    let (st, got, _) = http_garbage(&server, &big, false);
    assert_eq!(
        st,
        Some(431),
        "17 KiB head: {:?}",
        String::from_utf8_lossy(&got)
    );
    // A 17 KiB head that never ends: 431 too (not a wait for the timeout).
    let t0 = Instant::now();
    let (st, _, _) = http_garbage(&server, &big[..big.len() - 4], false);
    assert_eq!(st, Some(431), "17 KiB unfinished head");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "431 took {:?}",
        t0.elapsed()
    );
    // 100 header lines: 431.
    let mut many = b"GET /hello HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..100 {
        many.extend(format!("X-H{i}: v\r\n").as_bytes());
    }
    many.extend(b"\r\n");
    assert_eq!(
        http_garbage(&server, &many, false).0,
        Some(431),
        "100 header lines"
    );
    // A body over 64 KiB: 413; chunked: 411; not HTTP/1.x: 505.
    let (st, _, _) = http_garbage(
        &server,
        b"POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 70000\r\n\r\n",
        false,
    );
    assert_eq!(st, Some(413), "70000-byte body");
    let (st, _, _) = http_garbage(
        &server,
        b"POST /subscribe HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        false,
    );
    assert_eq!(st, Some(411), "chunked body");
    let (st, _, _) = http_garbage(&server, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", false);
    assert_eq!(st, Some(505), "HTTP/2 preface");
    seen.push(
        "17 KiB head / 100 headers -> 431, 70 kB body -> 413, chunked -> 411, HTTP/2 -> 505".into(),
    );
    assert_serving(&server, "garbage heads");

    // --- WebSocket frames ---
    let max = 65536u64;
    let mut verdicts = [0usize; 3];
    for i in 0..100 {
        let mut c = Raw::open(&server);
        let n = 16 + rng.below(600) as usize;
        let b = rng.bytes(n);
        c.s.write_all(&b).unwrap();
        match header_verdict(&b, max) {
            Some(code) => {
                let (got, end) = c.close_code();
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
                // An acceptable header: whatever follows, the server must not hang on to a
                // half-closed peer. Half-close and require the stream to end.
                verdicts[2] += 1;
                let _ = c.s.shutdown(Shutdown::Write);
                let (_, end) = c.close_code();
                assert!(
                    end == "EOF" || end == "Eof",
                    "random frame #{i} with an acceptable header, then EOF: {end}"
                );
            }
        }
    }
    seen.push(format!(
        "100 random frames: {} -> 1002, {} -> 1009, {} acceptable headers -> closed at EOF",
        verdicts[0], verdicts[1], verdicts[2]
    ));
    // A header announcing 2^62 bytes: 1009 at once (nothing is allocated for it).
    let mut c = Raw::open(&server);
    let mut h = vec![0x82, 0xFF];
    h.extend_from_slice(&(1u64 << 62).to_be_bytes());
    h.extend_from_slice(&[1, 2, 3, 4]);
    c.s.write_all(&h).unwrap();
    assert_eq!(
        c.close_code(),
        (Some(1009), "EOF".into()),
        "2^62-byte frame"
    );
    // 2^63 (top bit set, invalid per RFC 6455 §5.2): 1002.
    let mut c = Raw::open(&server);
    let mut h = vec![0x82, 0xFF];
    h.extend_from_slice(&(1u64 << 63).to_be_bytes());
    h.extend_from_slice(&[1, 2, 3, 4]);
    c.s.write_all(&h).unwrap();
    assert_eq!(
        c.close_code(),
        (Some(1002), "EOF".into()),
        "2^63-byte frame"
    );
    // A frame over --max-message actually sent in full: 1009.
    let mut c = Raw::open(&server);
    let payload = vec![b' '; 100_000];
    let f = Raw::frame(true, 1, &payload);
    let _ = c.s.write_all(&f);
    assert_eq!(c.close_code(), (Some(1009), "EOF".into()), "100 kB frame");
    // Fragments adding up past --max-message: 1009.
    let mut c = Raw::open(&server);
    let chunk = vec![b' '; 30_000];
    let mut f = Raw::frame(false, 1, &chunk);
    f.extend(Raw::frame(false, 0, &chunk));
    f.extend(Raw::frame(true, 0, &chunk));
    let _ = c.s.write_all(&f);
    assert_eq!(
        c.close_code(),
        (Some(1009), "EOF".into()),
        "90 kB in fragments"
    );
    // Invalid UTF-8 text: 1007.
    let mut c = Raw::open(&server);
    c.send(1, b"{\"id\":1,\"x\":\"\xff\xfe\"}");
    assert_eq!(c.close_code(), (Some(1007), "EOF".into()), "invalid UTF-8");
    // Random bytes inside a valid text frame: -32700 (or 1007 when not UTF-8) and for a
    // parse error the connection stays open.
    let mut parse_errors = 0;
    for i in 0..30 {
        let mut c = Raw::open(&server);
        let n = 1 + rng.below(500) as usize;
        let mut p = rng.bytes(n);
        if i % 2 == 0 {
            // Printable garbage: valid UTF-8, invalid JSON.
            for b in p.iter_mut() {
                *b = b'!' + (*b % 90);
            }
            p[0] = b'{';
        }
        c.send(1, &p);
        if std::str::from_utf8(&p).is_ok() {
            let v = c.json();
            assert_eq!(v["error"]["code"], -32700, "garbage JSON #{i}: {v}");
            assert!(v["id"].is_null(), "{v}");
            c.send_json(
                &json!({"id": 2, "jsonrpc": "2.0", "method": "waku_subscribe",
                                "params": {"topic": topic()}}),
            );
            assert!(
                c.json()["result"].is_string(),
                "connection unusable after a parse error"
            );
            parse_errors += 1;
        } else {
            assert_eq!(
                c.close_code(),
                (Some(1007), "EOF".into()),
                "non-UTF-8 text #{i}"
            );
        }
    }
    // Garbage JSON inside binary frames: -32700, connection stays open.
    let mut c = Raw::open(&server);
    for _ in 0..10 {
        c.send(2, &rng.bytes(64));
        let v = c.json();
        assert_eq!(v["error"]["code"], -32700, "{v}");
    }
    seen.push(format!(
        "2^62 -> 1009, 2^63 -> 1002, 100 kB frame / 90 kB fragments -> 1009, invalid UTF-8 -> \
         1007, {parse_errors} garbage JSON texts + 10 binary -> -32700 and still open"
    ));
    assert_alive(&mut server, "after garbage frames");
    assert_serving(&server, "garbage frames");
    let protocol_closes = metric(&server, "walletrelay_protocol_closes_total").expect("/metrics");
    eprintln!(
        "garbage [--threads {threads}]: {}; protocol_closes_total {protocol_closes}",
        seen.join("; ")
    );
}

// ------------------------------------------------------------------------------------------
// (e) Clients that vanish mid-frame or half-close

#[test]
fn clients_that_vanish_or_half_close_leave_no_trace() {
    raise_nofile_limit();
    for t in THREADS {
        vanish_scenario(t);
    }
}

fn post_subscribe(topic: &str) -> Vec<u8> {
    let body = json!({"topic": topic, "webhook": "http://127.0.0.1:9/hook"}).to_string();
    format!(
        "POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn vanish_scenario(threads: &str) {
    let mut server = Server::start(&["--threads", threads]);
    let base_open = wait_metric(
        &server,
        "walletrelay_connections_open",
        Duration::from_secs(5),
        |v| v <= 1.0,
    );
    assert_eq!(base_open, 1.0, "only the /metrics connection is open");
    let mut counts: Vec<String> = Vec::new();

    // 1. A complete request, then half-close: the answer still comes, then EOF.
    for i in 0..30 {
        let mut s = server.tcp();
        s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read to EOF");
        assert_eq!(
            status_of(&got),
            Some(200),
            "half-closed /hello #{i}: {:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(
            got.ends_with(b"\r\n\r\nHello World, this is WalletRelay v2.0"),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
    }
    // Three pipelined requests, then half-close: three answers in order.
    for _ in 0..10 {
        let mut s = server.tcp();
        s.write_all(
            b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n\
              GET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut buf = Vec::new();
        let mut statuses = Vec::new();
        while let Ok((st, _)) = read_response(&mut s, &mut buf) {
            statuses.push(st);
        }
        assert_eq!(statuses, [200, 204, 404], "pipelined then half-closed");
    }
    // A webhook registration (answered by the topic's home worker), then half-close.
    for i in 0..20 {
        let mut s = server.tcp();
        s.write_all(&post_subscribe(&topic())).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read to EOF");
        assert_eq!(
            status_of(&got),
            Some(200),
            "half-closed POST /subscribe #{i}: {:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(
            got.ends_with(b"{\"success\":true}"),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
    }
    counts.push("30 GET + 10x3 pipelined + 20 POST /subscribe half-closed: all answered".into());

    // 2. WebSocket: upgrade and subscribe in one write, then half-close: 101 and the answer.
    // And a publish then half-close: delivered to a live subscriber.
    let mut listener = server.ws();
    let tp = topic();
    listener.subscribe(&tp);
    for i in 0..20 {
        let mut s = server.tcp();
        let mut b = WS_UPGRADE.to_vec();
        let req = if i % 2 == 0 {
            json!({"id": 7, "jsonrpc": "2.0", "method": "waku_subscribe", "params": {"topic": topic()}})
        } else {
            json!({"id": 7, "jsonrpc": "2.0", "method": "waku_publish",
                   "params": {"topic": tp, "message": format!("half-closed {i}"), "ttl": 60}})
        };
        b.extend(Raw::frame(true, 1, req.to_string().as_bytes()));
        s.write_all(&b).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut buf = Vec::new();
        loop {
            if let Some(p) = find(&buf, b"\r\n\r\n") {
                assert_eq!(status_of(&buf), Some(101));
                buf.drain(..p + 4);
                break;
            }
            read_more(&mut s, &mut buf).expect("101");
        }
        let mut c = Raw { s, buf, pos: 0 };
        let v = c.json();
        assert_eq!(v["id"], 7, "{v}");
        if i % 2 == 0 {
            assert!(v["result"].is_string(), "{v}");
        } else {
            assert_eq!(v["result"], true, "{v}");
            let (_, t, m) = listener.next_push();
            assert_eq!((t, m), (tp.clone(), format!("half-closed {i}")));
        }
        let (_, end) = c.close_code();
        assert!(
            end == "EOF" || end == "Eof",
            "half-closed WebSocket #{i}: {end}"
        );
    }
    counts.push("20 WebSockets half-closed after a request: answered, publishes delivered".into());

    // 3. Vanish mid-frame: subscribed WebSockets send part of a frame, then FIN or reset.
    let mut vanished = 0;
    for i in 0..60 {
        let mut c = Raw::open(&server);
        c.send_json(
            &json!({"id": 1, "jsonrpc": "2.0", "method": "waku_subscribe",
                            "params": {"topic": if i % 3 == 0 { tp.clone() } else { topic() }}}),
        );
        assert!(c.json()["result"].is_string());
        // Cut inside the header, the mask, the payload; or after a whole first fragment of a
        // fragmented message, inside the continuation.
        let mut f = Vec::new();
        if i % 4 == 3 {
            f.extend(Raw::frame(false, 1, b"{\"id\":2,"));
        }
        let start = f.len();
        f.extend(Raw::frame(
            i % 4 != 3,
            if i % 4 == 3 { 0 } else { 1 },
            &[b'x'; 1000],
        ));
        let cut = start + [1usize, 2, 5, 9, 100, 999][i % 6];
        c.s.write_all(&f[..cut]).unwrap();
        if i % 2 == 0 {
            set_reset_on_close(&c.s);
        } else {
            let _ = c.s.shutdown(Shutdown::Both);
        }
        vanished += 1;
    }
    // Vanish mid-head and mid-body (FIN or reset), right after a webhook registration, and
    // right after asking for an upgrade.
    for i in 0..80 {
        let mut s = server.tcp();
        let bytes: Vec<u8> = match i % 4 {
            0 => b"GET /hello HTTP/1.1\r\nHo".to_vec(),
            1 => {
                let mut b = post_subscribe(&topic());
                b.truncate(b.len() - 10);
                b
            }
            // A whole webhook registration, gone before its (possibly cross-worker) answer.
            2 => post_subscribe(&topic()),
            _ => WS_UPGRADE.to_vec(),
        };
        s.write_all(&bytes).unwrap();
        if i % 2 == 0 {
            set_reset_on_close(&s);
        }
        vanished += 1;
    }
    // Vanish with output queued: subscribers that stop reading while 8 KB messages pile up,
    // then reset.
    let busy = topic();
    let mut stalled: Vec<Raw> = (0..20)
        .map(|_| {
            let mut c = Raw::open(&server);
            c.send_json(
                &json!({"id": 1, "jsonrpc": "2.0", "method": "waku_subscribe",
                                "params": {"topic": busy}}),
            );
            assert!(c.json()["result"].is_string());
            c
        })
        .collect();
    let mut publ = server.ws();
    for i in 0..100 {
        publ.publish(&busy, &format!("{i:04}{}", "z".repeat(8192)));
    }
    for c in stalled.drain(..) {
        set_reset_on_close(&c.s);
        vanished += 1;
    }
    counts.push(format!(
        "{vanished} connections vanished mid-frame / mid-head / mid-body / with output queued"
    ));
    drop(publ);
    drop(listener);

    assert_alive(&mut server, "after the vanishing clients");
    assert_serving(&server, "vanishing clients");
    let open = wait_metric(
        &server,
        "walletrelay_connections_open",
        Duration::from_secs(20),
        |v| v <= base_open,
    );
    let ws_open = metric(&server, "walletrelay_websockets_open").expect("/metrics");
    let subs = wait_metric(
        &server,
        "walletrelay_subscriptions",
        Duration::from_secs(5),
        |v| v == 0.0,
    );
    eprintln!(
        "vanish [--threads {threads}]: {}; afterwards connections_open {open} (baseline \
         {base_open}), websockets_open {ws_open}, subscriptions {subs}",
        counts.join("; ")
    );
    assert_eq!(
        open, base_open,
        "walletrelay_connections_open did not return to its baseline"
    );
    assert_eq!(ws_open, 0.0, "walletrelay_websockets_open");
    assert_eq!(subs, 0.0, "walletrelay_subscriptions");
}
