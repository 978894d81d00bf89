//! The admin address (`--admin-listen`), the drain (`--drain`, SIGTERM, `POST /drain`),
//! `/ready` on both ports, the subcommands `walletrelay probe` and `walletrelay drain`, and
//! `walletrelay --version`: the real binary on loopback, driven as an operator's tools
//! (Prometheus, a load balancer, Kubernetes probes and `preStop`) drive it.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::process::{Command, Output};

use common::http::{parse_head, HttpConn, Resp};
use common::redis::RedisServer;
use common::wait::{poll, wait_for, wait_until, WAIT};
use common::{topic, Server, Ws};

/// The binary itself, for the subcommands and `--version`.
fn walletrelay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .args(args)
        .output()
        .expect("run walletrelay")
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
}

fn admin_get(s: &Server, path: &str) -> Resp {
    s.admin_request(&get(path))
}

fn post_drain(s: &Server) -> Resp {
    s.admin_request("POST /drain HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
}

/// The error text of a JSON error answer.
fn error_of(r: &Resp) -> String {
    r.json()["error"].as_str().unwrap_or_default().to_string()
}

/// The value of an unlabelled sample `name` in Prometheus text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits for the close frame of `ws` (however long the drain lasts, within [`WAIT`]);
/// returns its code.
fn close_code(ws: &mut Ws) -> u16 {
    ws.sock.get_ref().set_read_timeout(Some(WAIT)).unwrap();
    loop {
        match ws.sock.read() {
            Ok(tungstenite::Message::Close(Some(f))) => return u16::from(f.code),
            Ok(tungstenite::Message::Close(None)) => panic!("close frame without a code"),
            Ok(tungstenite::Message::Text(t)) => panic!("unexpected message {t}"),
            Ok(_) => continue,
            Err(e) => panic!("no close frame: {e}"),
        }
    }
}

/// Waits for the process to exit; returns its exit code.
fn exit_code(s: &mut Server) -> Option<i32> {
    let st = poll(WAIT, || s.child.try_wait().expect("try_wait")).expect("the server did not exit");
    st.code()
}

/// A publish on one connection reaches a subscriber on another.
fn relays(sub: &mut Ws, publ: &mut Ws) {
    let t = topic();
    sub.subscribe(&t);
    publ.publish(&t, "cafe");
    let (_, got_topic, msg) = sub.next_push();
    assert_eq!((got_topic.as_str(), msg.as_str()), (t.as_str(), "cafe"));
}

#[test]
fn every_admin_route_answers_as_the_table_says() {
    let s = Server::start(&["--admin-listen", "127.0.0.1:0", "--threads", "2"]);
    let m = admin_get(&s, "/metrics");
    assert_eq!(m.status, 200);
    assert_eq!(
        m.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = m.body_str().to_string();
    // Today's families, and the ones the admin address adds.
    for family in [
        "walletrelay_connections_open",
        "walletrelay_messages_published_total",
        "walletrelay_loop_iteration_seconds",
        "walletrelay_build_info",
        "walletrelay_ready",
        "walletrelay_draining",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} missing"
        );
    }
    let build = format!(
        "walletrelay_build_info{{version=\"{}\",commit=\"",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&build), "{build} missing");
    assert!(text.contains("redis_layout=\"5\",journal_layout=\"1\"} 1\n"));
    assert_eq!(sample(&text, "walletrelay_ready"), Some(1.0));
    assert_eq!(sample(&text, "walletrelay_draining"), Some(0.0));
    assert!(sample(&text, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(sample(&text, "process_open_fds").unwrap() >= 3.0);
    // No other site's page may read the admin address.
    assert_eq!(m.header("Access-Control-Allow-Origin"), None);
    assert_eq!(m.header("Cache-Control"), Some("no-store"));

    for path in ["/health", "/live", "/ready"] {
        assert_eq!(admin_get(&s, path).status, 204, "{path}");
    }
    let page = admin_get(&s, "/status");
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("Content-Type"),
        Some("text/html; charset=utf-8")
    );
    assert!(page.body_str().contains("<html"), "{}", page.body_str());

    // HEAD works where GET does: the same head, no body.
    for path in ["/metrics", "/status", "/live"] {
        let head = s.admin_request(&format!("HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n"));
        let got = admin_get(&s, path);
        assert_eq!(head.status, got.status, "{path}");
        assert!(head.body.is_empty());
        if path == "/status" {
            let len = head.header("Content-Length").unwrap();
            assert_eq!(len, got.body.len().to_string());
        }
    }
    // Wrong method: 405 with Allow; unknown path: 404 (whatever the method).
    let r = admin_get(&s, "/drain");
    assert_eq!((r.status, r.header("Allow")), (405, Some("POST")));
    r.assert_json_error();
    let r = s.admin_request("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert_eq!((r.status, r.header("Allow")), (405, Some("GET, HEAD")));
    for raw in [
        get("/"),
        get("/hello"),
        get("/api/v1/wallets"),
        get("/metricsx"),
    ] {
        assert_eq!(s.admin_request(&raw).status, 404, "{raw}");
    }
    let r = s.admin_request("DELETE /nope HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 404);

    // Keep-alive and pipelining: answers in request order on one connection.
    let mut c = HttpConn::new(s.admin_tcp());
    c.send(format!("{}{}{}", get("/live"), get("/nope"), get("/ready")).as_bytes());
    assert_eq!(c.response(false).status, 204);
    assert_eq!(c.response(false).status, 404);
    assert_eq!(c.response(false).status, 204);
    c.send(get("/health").as_bytes());
    assert_eq!(c.response(false).status, 204);

    // The clients' port is not the admin address.
    assert_eq!(s.request(&get("/hello")).status, 200);
    assert_eq!(s.request(&get("/live")).status, 404);
    assert_eq!(s.request(&get("/status")).status, 404);
}

#[test]
fn metrics_leave_the_public_port_only_while_an_admin_address_is_set() {
    let plain = Server::start(&[]);
    let m = plain.request(&get("/metrics"));
    assert_eq!(m.status, 200);
    assert!(m.body_str().contains("# TYPE walletrelay_ready gauge"));
    assert_eq!(plain.request(&get("/ready")).status, 204);

    let s = Server::start(&["--admin-listen", "127.0.0.1:0"]);
    let m = s.request(&get("/metrics"));
    assert_eq!(m.status, 404);
    m.assert_json_error();
    let head = s.request("HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(head.status, 404);
    // Everything else there as before, and /ready for load balancers on the traffic port.
    assert_eq!(s.request(&get("/hello")).status, 200);
    assert_eq!(s.request(&get("/health")).status, 204);
    assert_eq!(s.request(&get("/ready")).status, 204);
    let head = s.request("HEAD /ready HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(head.status, 204);
    let r = s.request("POST /ready HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(r.status, 405);
    let mut sub = s.ws();
    let mut publ = s.ws();
    relays(&mut sub, &mut publ);
    assert_eq!(admin_get(&s, "/metrics").status, 200);
}

/// From the first SIGTERM `/ready` is 503 on both ports while the node keeps serving its
/// clients and accepting new ones; when the drain time is over it closes them with 1001
/// and exits 0.
#[test]
fn sigterm_drains_then_closes_with_1001() {
    let mut s = Server::start_logged(&[
        "--admin-listen",
        "127.0.0.1:0",
        "--drain",
        // Long enough for the steps below on a loaded machine; how long is never checked.
        "15",
        "--threads",
        "2",
    ]);
    let mut before = s.ws();
    let mut publ = s.ws();
    relays(&mut before, &mut publ);
    s.signal(libc::SIGTERM);
    wait_for("/ready 503 after SIGTERM", || {
        admin_get(&s, "/ready").status == 503
    });
    let r = admin_get(&s, "/ready");
    assert_eq!(error_of(&r), "draining");
    let r = s.request(&get("/ready"));
    assert_eq!((r.status, error_of(&r)), (503, "draining".to_string()));
    assert!(s
        .wait_log(0, "SIGTERM: draining for 15.0 s", WAIT)
        .is_some());
    // Still a working node: /health, /live, old and new connections, publish/subscribe.
    assert_eq!(admin_get(&s, "/health").status, 204);
    assert_eq!(admin_get(&s, "/live").status, 204);
    let text = admin_get(&s, "/metrics").body_str().to_string();
    assert_eq!(sample(&text, "walletrelay_draining"), Some(1.0));
    assert_eq!(sample(&text, "walletrelay_ready"), Some(0.0));
    let mut during = s.ws();
    relays(&mut during, &mut publ);
    relays(&mut before, &mut during);
    assert_eq!(s.request(&get("/hello")).status, 200);
    // Then the clients are told the server is going away, and it exits.
    assert_eq!(close_code(&mut before), 1001);
    assert_eq!(close_code(&mut during), 1001);
    assert_eq!(close_code(&mut publ), 1001);
    assert_eq!(exit_code(&mut s), Some(0));
    let log = s.log();
    assert!(log.contains("drain over: shutting down"), "{log}");
    assert!(!log.contains("ended early"), "{log}");
}

/// A second SIGTERM ends the drain at once; SIGINT never drains.
#[test]
fn a_second_sigterm_or_a_sigint_ends_the_drain_at_once() {
    let mut s = Server::start_logged(&["--admin-listen", "127.0.0.1:0", "--drain", "600"]);
    let mut ws = s.ws();
    s.signal(libc::SIGTERM);
    wait_for("/ready 503 after SIGTERM", || {
        admin_get(&s, "/ready").status == 503
    });
    assert!(s.wait_log(0, "SIGTERM: draining", WAIT).is_some());
    s.signal(libc::SIGTERM);
    // Far sooner than the 600 s drain: the wait ends when the process does.
    assert_eq!(close_code(&mut ws), 1001);
    assert_eq!(exit_code(&mut s), Some(0));
    assert!(s.log().contains("drain ended early; shutting down"));

    let mut s = Server::start_logged(&["--admin-listen", "127.0.0.1:0", "--drain", "600"]);
    let mut ws = s.ws();
    assert_eq!(admin_get(&s, "/ready").status, 204);
    s.signal(libc::SIGINT);
    assert_eq!(close_code(&mut ws), 1001);
    assert_eq!(exit_code(&mut s), Some(0));
    assert!(!s.log().contains("draining"), "{}", s.log());
}

/// `POST /drain` starts the drain without stopping anything; a SIGTERM afterwards waits
/// only for what is left of it.
#[test]
fn post_drain_then_sigterm_waits_for_what_is_left() {
    let mut s = Server::start_logged(&["--admin-listen", "127.0.0.1:0", "--drain", "4"]);
    let mut ws = s.ws();
    assert_eq!(admin_get(&s, "/ready").status, 204);
    let r = post_drain(&s);
    assert_eq!(r.status, 202);
    let v = r.json();
    assert_eq!(v["draining"], true, "{v}");
    assert_eq!(v["drain_seconds"], 4, "{v}");
    let first = v["remaining_ms"].as_u64().unwrap();
    assert!(first <= 4000, "{v}");
    assert!(s.wait_log(0, "POST /drain: draining", WAIT).is_some());
    assert_eq!(error_of(&admin_get(&s, "/ready")), "draining");
    // Idempotent: a second POST says what is left of the same drain.
    let again = post_drain(&s).json();
    assert!(again["remaining_ms"].as_u64().unwrap() <= first, "{again}");
    // Nothing stops: the node serves on after the drain time, /ready stays 503.
    wait_for("the drain time to pass", || {
        post_drain(&s).json()["remaining_ms"] == 0
    });
    let mut publ = s.ws();
    relays(&mut ws, &mut publ);
    assert_eq!(admin_get(&s, "/ready").status, 503);
    // The drain is over: SIGTERM shuts down at once.
    s.signal(libc::SIGTERM);
    assert_eq!(close_code(&mut ws), 1001);
    assert_eq!(exit_code(&mut s), Some(0));
    let log = s.log();
    assert!(log.contains("SIGTERM: shutting down"), "{log}");

    // Begun by POST /drain and still running: SIGTERM waits for the rest of it.
    let mut s = Server::start_logged(&["--admin-listen", "127.0.0.1:0", "--drain", "600"]);
    assert_eq!(post_drain(&s).status, 202);
    s.signal(libc::SIGTERM);
    let line = s.wait_log(0, "s left of the drain POST /drain began", WAIT);
    assert!(line.is_some(), "{}", s.log());
    s.assert_alive("while what is left of the drain runs");
    assert_eq!(s.request(&get("/hello")).status, 200);
    s.signal(libc::SIGINT);
    assert_eq!(exit_code(&mut s), Some(0));
}

/// A page of another site open in the operator's browser cannot drain the node.
#[test]
fn post_drain_from_another_sites_page_is_refused() {
    let s = Server::start(&["--admin-listen", "127.0.0.1:0", "--drain", "600"]);
    let r = s.admin_request(
        "POST /drain HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\n\
         Content-Type: text/plain\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(r.status, 403);
    assert_eq!(admin_get(&s, "/ready").status, 204);
    let host = s.admin_addr.unwrap().to_string();
    let r = s.admin_request(&format!(
        "POST /drain HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nContent-Length: 0\r\n\r\n"
    ));
    assert_eq!(r.status, 202);
    assert_eq!(admin_get(&s, "/ready").status, 503);
}

/// `/ready` is 503 while the engine cannot store (Redis unreachable), and 204 again once
/// it can; `/live` says the workers turn all along.
#[test]
fn ready_is_503_while_redis_is_unreachable() {
    let mut redis = RedisServer::start();
    let s = Server::start(&[
        "--admin-listen",
        "127.0.0.1:0",
        "--redis",
        &redis.url(),
        "--threads",
        "2",
    ]);
    wait_for("/ready 204 on Redis", || {
        admin_get(&s, "/ready").status == 204
    });
    redis.kill();
    wait_for("/ready 503 without Redis", || {
        admin_get(&s, "/ready").status == 503
    });
    let r = admin_get(&s, "/ready");
    let why = error_of(&r);
    assert_ne!(why, "draining");
    assert!(why.contains("redis"), "{why}");
    assert_eq!(s.request(&get("/ready")).status, 503);
    assert_eq!(admin_get(&s, "/health").status, 503);
    assert_eq!(admin_get(&s, "/live").status, 204);
    let text = admin_get(&s, "/metrics").body_str().to_string();
    assert_eq!(sample(&text, "walletrelay_ready"), Some(0.0));
    assert_eq!(sample(&text, "walletrelay_draining"), Some(0.0));
    redis.restart();
    wait_for("/ready 204 with Redis back", || {
        admin_get(&s, "/ready").status == 204
    });
    assert_eq!(s.request(&get("/ready")).status, 204);
}

#[test]
fn probe_exits_0_on_2xx_and_1_otherwise() {
    let s = Server::start(&["--admin-listen", "127.0.0.1:0"]);
    let admin = s.admin_addr.unwrap();
    let run = |url: String| {
        let out = walletrelay(&["probe", &url]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    assert_eq!(run(format!("http://{admin}/ready")).0, Some(0));
    assert_eq!(run(format!("http://{admin}/live")).0, Some(0));
    assert_eq!(run(format!("http://{}/hello", s.addr)).0, Some(0));
    assert_eq!(
        run(format!("http://localhost:{}/ready", s.addr.port())).0,
        Some(0)
    );
    let (code, err) = run(format!("http://{admin}/nope"));
    assert_eq!(code, Some(1));
    assert!(err.contains("HTTP/1.1 404 Not Found"), "{err}");
    assert_eq!(post_drain(&s).status, 202);
    let (code, err) = run(format!("http://{admin}/ready"));
    assert_eq!(code, Some(1));
    assert!(err.contains("503") && err.contains("draining"), "{err}");
    // Nothing listening, a scheme it does not speak, no answer at all.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let (code, err) = run(format!("http://127.0.0.1:{port}/ready"));
    assert_eq!(code, Some(1));
    assert!(err.contains("connecting to"), "{err}");
    assert_eq!(run(format!("https://{admin}/ready")).0, Some(1));
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (code, err) = run(format!("http://{}/", silent.local_addr().unwrap()));
    assert_eq!(code, Some(1));
    assert!(err.contains("reading from"), "{err}");
    // Usage.
    assert_eq!(walletrelay(&["probe"]).status.code(), Some(2));
    let help = walletrelay(&["probe", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("usage: walletrelay probe URL"));
}

/// `walletrelay drain ADMIN_ADDR`: the node drains, the command returns once the drain
/// time has passed, and the node still serves until it is told to stop.
#[test]
fn drain_subcommand_waits_for_the_drain_time() {
    let mut s = Server::start_logged(&["--admin-listen", "127.0.0.1:0", "--drain", "1"]);
    let mut ws = s.ws();
    let admin = s.admin_addr.unwrap().to_string();
    let out = walletrelay(&["drain", &admin]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("is draining"), "{err}");
    assert!(s.log().contains("POST /drain: draining"));
    assert_eq!(admin_get(&s, "/ready").status, 503);
    s.assert_alive("after walletrelay drain");
    let mut publ = s.ws();
    relays(&mut ws, &mut publ);
    // Again, as a second preStop would: the drain is over, it returns at once.
    let out = walletrelay(&["drain", &format!("http://{admin}")]);
    assert_eq!(out.status.code(), Some(0));
    s.signal(libc::SIGTERM);
    assert_eq!(close_code(&mut ws), 1001);
    assert_eq!(exit_code(&mut s), Some(0));
    assert!(s.log().contains("SIGTERM: shutting down"));
    // Nobody there, or not an address.
    let out = walletrelay(&["drain", &admin]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(walletrelay(&["drain", "nowhere"]).status.code(), Some(1));
    assert_eq!(walletrelay(&["drain"]).status.code(), Some(2));
}

#[test]
fn version_names_the_version_the_commit_and_the_data_layouts() {
    let out = walletrelay(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    let prefix = format!("walletrelay {} (commit ", env!("CARGO_PKG_VERSION"));
    let rest = lines[0].strip_prefix(&prefix).expect(&text);
    let (commit, date) = rest
        .strip_suffix(')')
        .and_then(|r| r.split_once(", "))
        .expect(&text);
    assert!(
        commit == "unknown"
            || commit
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.'),
        "{commit}"
    );
    let digits: Vec<&str> = date.split('-').collect();
    assert!(
        digits.len() == 3 && digits.iter().all(|d| d.parse::<u32>().is_ok()),
        "{date}"
    );
    assert_eq!(
        lines[1],
        "data layouts: redis 5 (reads 4-5, writes 4-5), journal 1 (reads 1, writes 1)"
    );
    // The numbers are the ones the code writes.
    assert_eq!(
        walletrelay::engine::redis::cluster::ring::RING_VERSION,
        walletrelay::layout::REDIS
    );
    assert_eq!(walletrelay::store::files::FILE_MAGIC, b"walletrelay-log1");
    // `--help` names the subcommands; the server's flags parse as before.
    let help = String::from_utf8(walletrelay(&["--help"]).stdout).unwrap();
    assert!(
        help.contains("walletrelay probe URL")
            && help.contains("walletrelay drain ADMIN_ADDR")
            && help.contains("walletrelay switch-layout ADMIN_ADDR")
    );
    assert!(help.contains("--admin-listen <ADDR>") && help.contains("--drain <SECONDS>"));
    let printed = walletrelay(&["--print-config", "--admin-listen", "127.0.0.1:9091"]);
    let printed = String::from_utf8(printed.stdout).unwrap();
    assert!(
        printed.contains("[admin]\nadmin-listen = \"127.0.0.1:9091\"  # flag\ndrain = 0\n"),
        "{printed}"
    );
    let unknown = walletrelay(&["probes"]);
    assert_eq!(
        unknown.status.code(),
        Some(2),
        "a positional argument is still refused"
    );
}

/// Bad input is answered, slow or many clients are bounded, and none of it stops the admin
/// thread.
#[test]
fn malformed_and_oversized_requests_are_answered_and_never_stop_it() {
    let s = Server::start(&["--admin-listen", "127.0.0.1:0", "--head-timeout", "1"]);
    let answer_of = |raw: &[u8]| {
        let mut c = s.admin_tcp();
        c.write_all(raw).unwrap();
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        let end = common::http::head_end(&got).expect("an answer head");
        let (status, headers) = parse_head(std::str::from_utf8(&got[..end]).unwrap()).unwrap();
        let close = common::http::find_header(&headers, "Connection").map(str::to_string);
        (status, close)
    };
    let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    big.resize(20_000, b'a');
    big.extend_from_slice(b"\r\n\r\n");
    let cases: [(&[u8], u16); 6] = [
        (b"GARBAGE\x01 / HTTP/1.1\r\n\r\n", 400),
        (b"GET /live HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
        (&big, 431),
        (
            b"POST /drain HTTP/1.1\r\nContent-Length: 100000\r\n\r\n",
            413,
        ),
        (
            b"POST /drain HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            411,
        ),
        (b"GET /live HTTP/2.0\r\n\r\n", 505),
    ];
    for (raw, want) in cases {
        let (status, close) = answer_of(raw);
        assert_eq!(
            status,
            want,
            "{:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(40)])
        );
        assert_eq!(close.as_deref(), Some("close"));
        assert_eq!(admin_get(&s, "/live").status, 204);
    }
    // The 413 did not begin a drain.
    assert_eq!(admin_get(&s, "/ready").status, 204);

    // A head that never ends is closed at --head-timeout; meanwhile others are served.
    let mut slow = s.admin_tcp();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        .unwrap();
    assert_eq!(admin_get(&s, "/health").status, 204);
    let mut tmp = [0u8; 64];
    match slow.read(&mut tmp) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("a stalled head was not closed: {other:?}"),
    }

    // More connections than it keeps: the extra ones are closed, the thread serves on.
    let held: Vec<_> = (0..80).map(|_| s.admin_tcp()).collect();
    assert!(wait_until(WAIT, || {
        held.iter().filter(|c| closed_by_peer(c)).count() >= 16
    }));
    drop(held);
    wait_for("the admin address after a connection flood", || {
        std::net::TcpStream::connect(s.admin_addr.unwrap()).is_ok()
            && admin_get(&s, "/live").status == 204
    });

    // A flood of pipelined requests on one connection is answered in order, in full.
    let mut c = HttpConn::new(s.admin_tcp());
    let flood: String = (0..200).map(|_| get("/live")).collect();
    let writer = {
        let mut w = c.s.try_clone().unwrap();
        std::thread::spawn(move || w.write_all(flood.as_bytes()).unwrap())
    };
    for _ in 0..200 {
        assert_eq!(c.response(false).status, 204);
    }
    writer.join().unwrap();
    assert_eq!(admin_get(&s, "/metrics").status, 200);
    // The clients' port never noticed.
    assert_eq!(s.request(&get("/hello")).status, 200);
}

/// Whether the server closed `c` (a read sees EOF or a reset at once).
fn closed_by_peer(c: &std::net::TcpStream) -> bool {
    c.set_nonblocking(true).unwrap();
    let mut tmp = [0u8; 1];
    let closed = match (&*c).read(&mut tmp) {
        Ok(0) => true,
        Err(e) => e.kind() == ErrorKind::ConnectionReset,
        Ok(_) => false,
    };
    c.set_nonblocking(false).unwrap();
    closed
}
