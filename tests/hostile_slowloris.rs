//! Hostile clients (issue 5 §3 a), against the real binary over real sockets: 2,000
//! slowloris connections (a head dribbled a byte a second, or nothing at all) are cut by the
//! head timeout with a 408 while a normal client keeps being served, and the server's memory
//! and connection count come back. Times are only checked against generous bounds; figures
//! are printed (`--nocapture`) and recorded in `docs/RELIABILITY-hostile.md`.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::checks::{relay_round_trip, HELLO};
use common::http::{get, status_of};
use common::{raise_nofile_limit, HttpConn, Server, Ws};

/// Slowloris connections open at once.
const SLOW: usize = 2000;
/// How long the attack goes on (closed connections are replaced until then).
const ATTACK: Duration = Duration::from_secs(10);
/// The server's `--head-timeout`, seconds.
const HEAD_TIMEOUT: f64 = 2.0;

/// The head a slowloris client dribbles, then `a` forever (it never ends).
const SLOW_HEAD: &[u8] =
    b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\nX-Slow: ";

fn slow_byte(i: usize) -> u8 {
    SLOW_HEAD.get(i).copied().unwrap_or(b'a')
}

/// One slowloris connection.
struct Slow {
    sock: TcpStream,
    opened: Instant,
    next_send: Instant,
    sent: usize,
    got: Vec<u8>,
    /// Sends nothing at all (an idle connection rather than a dribbling one).
    silent: bool,
}

/// How a slowloris connection ended.
struct SlowEnd {
    silent: bool,
    lifetime: Duration,
    got: Vec<u8>,
    sent: usize,
    how: String,
}

/// Opens slowloris connection number `i` (every tenth is silent) and sends its first byte.
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
    http: HttpConn,
    sub: Ws,
    publ: Ws,
    n: usize,
}

impl Normal {
    fn new(server: &Server) -> Normal {
        Normal {
            http: HttpConn::open(server),
            sub: server.ws(),
            publ: server.ws(),
            n: 0,
        }
    }

    /// Returns how long each of the three parts took.
    fn round(&mut self, server: &Server) -> [Duration; 3] {
        let start = Instant::now();
        self.n += 1;
        self.http.send(get("/hello").as_bytes());
        let r = self.http.try_response(false).expect("/hello answer");
        assert_eq!(r.status, 200);
        assert_eq!(r.body, HELLO.as_bytes());
        let hello = start.elapsed();
        assert_eq!(server.get("/health").0, Some(204), "/health");
        let health = start.elapsed() - hello;
        relay_round_trip(&mut self.sub, &mut self.publ, self.n);
        [hello, health, start.elapsed() - hello - health]
    }
}

fn percentile(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let mut s = v.to_vec();
    s.sort();
    s[((s.len() - 1) as f64 * p).round() as usize]
}

/// What the attack left: how each slowloris connection ended, the ones still open at the
/// end (their age), the most open at once, and the normal client's rounds meanwhile.
struct Attack {
    ends: Vec<SlowEnd>,
    leftovers: Vec<Duration>,
    peak_open: usize,
    during: Vec<[Duration; 3]>,
}

/// Keeps `SLOW` slowloris connections open for `ATTACK` (replacing each one the server
/// closes), then waits (at most 30 s) for the server to close the rest, while `normal`
/// keeps doing rounds.
fn attack(server: &Server, normal: &mut Normal) -> Attack {
    let attacking = AtomicBool::new(true);
    let ready = AtomicBool::new(false);
    let peak_open = Mutex::new(0usize);
    let (ends, leftovers, during) = std::thread::scope(|s| {
        let attacker = s.spawn(|| {
            let mut slots: Vec<Option<Slow>> =
                (0..SLOW).map(|i| Some(open_slow(server, i))).collect();
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
                            open_slow(server, opened)
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
        let mut during = Vec::new();
        while attacking.load(Ordering::SeqCst) {
            during.push(normal.round(server));
        }
        let (ends, leftovers) = attacker.join().expect("attacker");
        (ends, leftovers, during)
    });
    let peak_open = *peak_open.lock().unwrap();
    Attack {
        ends,
        leftovers,
        peak_open,
        during,
    }
}

/// The endings sorted: answered 408, closed silently (an idle connection may be), and
/// wrong ones (another answer, or closed before the head timeout).
struct Verdicts {
    got_408: usize,
    closed_silently: usize,
    bad: Vec<String>,
    lifetimes: Vec<Duration>,
}

fn judge(ends: &[SlowEnd]) -> Verdicts {
    let mut v = Verdicts {
        got_408: 0,
        closed_silently: 0,
        bad: Vec::new(),
        lifetimes: Vec::new(),
    };
    for e in ends {
        v.lifetimes.push(e.lifetime);
        match status_of(&e.got) {
            Some(408) => v.got_408 += 1,
            // An idle connection (it sent nothing) may be closed without an answer.
            None if e.got.is_empty() && e.silent => v.closed_silently += 1,
            _ => v.bad.push(format!(
                "{} connection: after {:?} and {} bytes sent, got {:?} ({}), not a 408",
                if e.silent { "an idle" } else { "a dribbling" },
                e.lifetime,
                e.sent,
                String::from_utf8_lossy(&e.got[..e.got.len().min(200)]),
                e.how
            )),
        }
        if e.lifetime < Duration::from_secs_f64(HEAD_TIMEOUT * 0.75) {
            v.bad.push(format!(
                "closed after {:?}, before the {HEAD_TIMEOUT} s head timeout ({} bytes sent, \
                 {} bytes got, {})",
                e.lifetime,
                e.sent,
                e.got.len(),
                e.how
            ));
        }
    }
    v
}

/// Prints the attack's figures (recorded in `docs/RELIABILITY-hostile.md`).
fn report(a: &Attack, v: &Verdicts, before: &[Duration], during: &[Duration], rss: (u64, u64)) {
    let slowest_parts: Vec<Duration> = (0..3)
        .map(|i| a.during.iter().map(|p| p[i]).max().unwrap_or_default())
        .collect();
    eprintln!(
        "slowloris: {} connections ({} at once), {} answered 408, {} closed without an answer \
         (silent ones), {} still open at the end; lifetime p50 {:?} max {:?}; normal rounds \
         before: {} p50 {:?} p99 {:?} max {:?}; during: {} p50 {:?} p99 {:?} max {:?} (slowest \
         keep-alive /hello {:?}, fresh-connection /health {:?}, relay round trip {:?}); \
         server RSS {} KiB before, {} KiB at the end of the attack",
        a.ends.len(),
        a.peak_open,
        v.got_408,
        v.closed_silently,
        a.leftovers.len(),
        percentile(&v.lifetimes, 0.5),
        percentile(&v.lifetimes, 1.0),
        before.len(),
        percentile(before, 0.5),
        percentile(before, 0.99),
        percentile(before, 1.0),
        during.len(),
        percentile(during, 0.5),
        percentile(during, 0.99),
        percentile(during, 1.0),
        slowest_parts[0],
        slowest_parts[1],
        slowest_parts[2],
        rss.0,
        rss.1
    );
}

#[test]
fn slowloris_connections_are_cut_by_the_head_timeout_while_normal_clients_are_served() {
    raise_nofile_limit();
    let mut server = Server::start(&["--threads", "2", "--head-timeout", "2"]);
    let base_open = server.wait_metric(
        "walletrelay_connections_open",
        Duration::from_secs(5),
        |v| v <= 1.0,
    );
    let mut normal = Normal::new(&server);
    let before_parts: Vec<[Duration; 3]> = (0..30).map(|_| normal.round(&server)).collect();
    let rss_before = server.rss_kib();

    let a = attack(&server, &mut normal);
    server.assert_alive("after the slowloris attack");
    let rss_after = server.rss_kib();
    let total = |p: &[Duration; 3]| p[0] + p[1] + p[2];
    let before: Vec<Duration> = before_parts.iter().map(total).collect();
    let during: Vec<Duration> = a.during.iter().map(total).collect();
    let v = judge(&a.ends);
    let worst = v.lifetimes.iter().max().copied().unwrap_or_default();
    report(&a, &v, &before, &during, (rss_before, rss_after));

    // Every slowloris connection was cut, with a 408, after the head timeout.
    assert!(
        a.leftovers.is_empty(),
        "{} slowloris connections still open 30 s after the attack (oldest {:?})",
        a.leftovers.len(),
        a.leftovers.iter().max()
    );
    assert!(
        v.bad.is_empty(),
        "{} wrong endings, e.g.:\n{}",
        v.bad.len(),
        v.bad[..v.bad.len().min(10)].join("\n")
    );
    assert!(
        a.ends.len() >= SLOW,
        "{} slowloris connections",
        a.ends.len()
    );
    assert!(v.got_408 >= SLOW * 8 / 10, "only {} got 408", v.got_408);
    assert!(
        worst < Duration::from_secs_f64(HEAD_TIMEOUT + 10.0),
        "a slowloris connection lived {worst:?} with a {HEAD_TIMEOUT} s head timeout"
    );
    // The normal client was served all along.
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
    // And the server is back where it was.
    let open = server.wait_metric(
        "walletrelay_connections_open",
        Duration::from_secs(10),
        |v| v <= base_open + 3.0,
    );
    // The normal client's three connections are still open.
    assert_eq!(open, base_open + 3.0, "connections_open after the attack");
    server.assert_serving("the slowloris attack");
    eprintln!(
        "slowloris: server RSS {} KiB once the attack is over",
        server.rss_kib()
    );
}
