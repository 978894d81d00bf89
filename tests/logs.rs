//! The log as an operator's shipper reads it (DECISIONS, "Logs"): `--log-format json` writes
//! one JSON object per stderr line (time, level, target, message, fields), `RUST_LOG` filters
//! it, and the text format keeps its look with the fields appended; and no secret reaches
//! stderr or stdout in either format, while the events around each secret are logged (a
//! Redis URL's password, a password file, a Redis that refuses the password or is down,
//! JWTs in `?auth=`, `Authorization: Bearer` and `registerAuth`, webhook and push URLs with
//! userinfo, path and query secrets, the relay's key, the TLS key, SIGHUP, shutdown).
//!
//! Every server here is the real binary on loopback sockets, its stdout and stderr read
//! whole; Redis is a real `redis-server` with `--requirepass`.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use common::jwt::{now_s, Signer};
use common::redis::RedisServer;
use common::tls::TlsSetup;
use common::wait::{poll, wait_until};
use common::webhook::{Receiver, Reply};
use common::{limits_off, topic, Server, TempDir, Ws};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(15);

/// The binary with its stdout and stderr kept whole.
struct Run {
    server: Server,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// Reads `from` line by line into `into` (and each line to `lines`, if given).
fn keep(
    from: impl std::io::Read + Send + 'static,
    into: &Arc<Mutex<String>>,
    lines: Option<mpsc::Sender<String>>,
) -> std::thread::JoinHandle<()> {
    let into = Arc::clone(into);
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut buf = Vec::new();
        while matches!(r.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            // Lossy: a stray byte must not hide the rest of the output from the checks.
            let line = String::from_utf8_lossy(&buf).to_string();
            into.lock().unwrap().push_str(&line);
            if let Some(tx) = &lines {
                let _ = tx.send(line);
            }
            buf.clear();
        }
    })
}

fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_walletrelay"));
    limits_off(&mut cmd);
    cmd.env_remove("WALLETRELAY_LOG_FORMAT")
        .env_remove("RUST_LOG");
    cmd.envs(env.iter().copied());
    if !args.contains(&"--listen") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    if !args.contains(&"--data-dir") {
        cmd.args(["--data-dir", "none"]);
    }
    cmd.args(args);
    cmd
}

impl Run {
    /// Starts the binary and waits until it names its plain listener on stdout.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Run {
        Self::start_cmd(command(args, env))
    }

    fn start_cmd(mut cmd: Command) -> Run {
        let mut child: Child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn walletrelay");
        let (out, err) = (Arc::default(), Arc::default());
        let (tx, rx) = mpsc::channel();
        let readers = vec![
            keep(child.stdout.take().unwrap(), &out, Some(tx)),
            keep(child.stderr.take().unwrap(), &err, None),
        ];
        let addr: SocketAddr = loop {
            match rx.recv_timeout(WAIT) {
                Ok(line) => {
                    if let Some(a) = line.trim().strip_prefix("walletrelay listening on ") {
                        break a.parse().expect("address");
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!("no listening line; stderr:\n{}", err.lock().unwrap());
                }
            }
        };
        Run {
            server: Server::adopt(addr, child),
            out,
            err,
            readers,
        }
    }

    fn stderr(&self) -> String {
        self.err.lock().unwrap().clone()
    }

    /// Waits until stderr has a line containing `needle`; that line.
    fn wait_line(&self, needle: &str) -> String {
        poll(WAIT, || {
            self.stderr()
                .lines()
                .find(|l| l.contains(needle))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no log line with {needle:?}:\n{}", self.stderr()))
    }

    /// SIGTERM, the exit awaited, the output read to its end: (stdout, stderr).
    fn stop(mut self) -> (String, String) {
        self.server.signal(libc::SIGTERM);
        let child = &mut self.server.child;
        let status = poll(WAIT, || child.try_wait().expect("wait")).expect("no exit after SIGTERM");
        assert!(status.success(), "exit status {status}");
        for r in self.readers.drain(..) {
            r.join().unwrap();
        }
        let out = self.out.lock().unwrap().clone();
        let err = self.err.lock().unwrap().clone();
        (out, err)
    }
}

/// Runs the binary to its own exit (a start that fails): (stdout, stderr).
fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let out = command(args, env)
        .stdin(Stdio::null())
        .output()
        .expect("run walletrelay");
    assert!(!out.status.success(), "it was meant to fail");
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Every line of `stderr` as a JSON record, checked for the five keys and their types.
fn records(stderr: &str) -> Vec<Value> {
    assert!(
        stderr.is_empty() || stderr.ends_with('\n'),
        "a cut line: {stderr:?}"
    );
    stderr
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}\nall:\n{stderr}"));
            let o = v
                .as_object()
                .unwrap_or_else(|| panic!("not an object: {l}"));
            let keys: Vec<&str> = o.keys().map(String::as_str).collect();
            assert_eq!(keys.len(), 5, "{l}");
            for k in ["time", "level", "target", "message", "fields"] {
                assert!(o.contains_key(k), "no {k:?}: {l}");
            }
            let time = v["time"].as_str().unwrap();
            let b = time.as_bytes();
            assert!(
                b.len() == 27
                    && b[4] == b'-'
                    && b[10] == b'T'
                    && b[19] == b'.'
                    && b[26] == b'Z'
                    && time[20..26].bytes().all(|c| c.is_ascii_digit()),
                "time {time:?}"
            );
            let level = v["level"].as_str().unwrap();
            assert!(
                ["error", "warn", "info", "debug", "trace"].contains(&level),
                "level {level:?}"
            );
            assert!(v["target"].is_string() && v["message"].is_string(), "{l}");
            assert!(v["fields"].is_object(), "{l}");
            v
        })
        .collect()
}

/// The first record whose message contains `needle`.
fn find<'a>(recs: &'a [Value], needle: &str) -> &'a Value {
    recs.iter()
        .find(|r| r["message"].as_str().unwrap().contains(needle))
        .unwrap_or_else(|| panic!("no record with {needle:?}: {recs:#?}"))
}

/// A directory whose name holds a quote, a newline, a tab, a control character and a byte
/// that is not UTF-8, with a configuration file in it.
fn awkward_config(parent: &TempDir) -> std::path::PathBuf {
    let mut name = b"we\"ird\nname\t\x01".to_vec();
    name.push(0xff);
    let dir = parent.0.join(std::ffi::OsStr::from_bytes(&name));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("relay.toml");
    std::fs::write(&file, "service-name = \"WalletRelay\"\n").unwrap();
    file
}

#[test]
fn json_lines_carry_the_five_keys_and_the_fields_of_the_main_events() {
    let tmp = TempDir::new("logs-json");
    let config = awkward_config(&tmp);
    let mut cmd = command(
        &["--log-format", "json", "--threads", "2"],
        &[("RUST_LOG", "debug")],
    );
    cmd.arg("--config").arg(&config);
    let run = Run::start_cmd(cmd);
    let addr = run.server.addr;
    // A debug record: an upgrade with a broken token.
    let refused = Ws::try_handshake(
        common::tcp_to(addr),
        &format!("ws://{addr}/?auth=x.y.z"),
        &[],
    );
    assert_eq!(refused.err().as_deref(), Some("status 401"));
    run.wait_line("relay auth refused");
    run.server.signal(libc::SIGHUP);
    run.wait_line("re-read");
    let (_, stderr) = run.stop();
    let recs = records(&stderr);

    let listening = find(&recs, "listening on");
    assert_eq!(listening["level"], "info");
    assert_eq!(listening["fields"]["addr"], addr.to_string());
    assert_eq!(listening["fields"]["tls"], false);
    assert_eq!(find(&recs, "2 workers")["fields"]["workers"], 2);
    assert_eq!(
        find(&recs, "SIGHUP: reloading")["fields"]["signal"],
        "SIGHUP"
    );
    let reread = find(&recs, "re-read");
    assert_eq!(
        (&reread["fields"]["reload"], &reread["fields"]["outcome"]),
        (&json!("config"), &json!("loaded"))
    );
    let down = find(&recs, "shutting down");
    assert_eq!(down["fields"]["signal"], "SIGTERM");
    assert_eq!(down["target"], "walletrelay::server");
    assert!(find(&recs, "shut down")["fields"]["took_ms"].is_u64());
    let auth = find(&recs, "relay auth refused");
    assert_eq!(auth["level"], "debug");
    assert_eq!(auth["fields"]["status"], 401);
    assert!(auth["fields"]["worker"].is_u64());

    // The awkward path is in one record, on one line, as its Display gives it.
    let shown = config.display().to_string();
    assert!(shown.contains("\n") && shown.contains('\u{fffd}'));
    let line = find(&recs, "configuration file");
    assert_eq!(line["message"], format!("configuration file {shown}"));
    assert_eq!(line["fields"]["path"], shown);
    let raw = stderr
        .lines()
        .find(|l| l.contains("configuration file"))
        .unwrap();
    assert!(raw.contains("we\\\"ird\\nname\\t\\u0001\u{fffd}"), "{raw}");
}

#[test]
fn rust_log_filters_the_json_records_by_level_and_target() {
    let run = Run::start(
        &["--threads", "1"],
        &[
            ("WALLETRELAY_LOG_FORMAT", "json"),
            ("RUST_LOG", "warn,walletrelay::server=info"),
        ],
    );
    let addr = run.server.addr;
    let _ = Ws::try_handshake(
        common::tcp_to(addr),
        &format!("ws://{addr}/?auth=x.y.z"),
        &[],
    );
    let (_, stderr) = run.stop();
    let recs = records(&stderr);
    // The server's own info lines pass; nobody else's info or debug does.
    find(&recs, "shutting down");
    find(&recs, "shut down");
    for r in &recs {
        let level = r["level"].as_str().unwrap();
        assert!(
            matches!(level, "warn" | "error") || r["target"] == "walletrelay::server",
            "{r}"
        );
    }
    assert!(!stderr.contains("listening on") && !stderr.contains("relay auth refused"));
}

#[test]
fn the_text_format_keeps_its_look_with_fields_appended() {
    let run = Run::start(&["--threads", "2"], &[("RUST_LOG", "info")]);
    let addr = run.server.addr;
    let (stdout, stderr) = run.stop();
    assert!(stdout.contains(&format!("walletrelay listening on {addr}\n")));
    assert!(!stderr.is_empty());
    for l in stderr.lines() {
        // `[2026-12-02T06:13:01Z INFO  walletrelay::server] message`
        let b = l.as_bytes();
        assert!(
            b.len() > 30 && b[0] == b'[' && b[5] == b'-' && b[11] == b'T' && b[20] == b'Z',
            "{l}"
        );
        let level = &l[22..27];
        assert!(
            ["ERROR", "WARN ", "INFO ", "DEBUG", "TRACE"].contains(&level),
            "{l}"
        );
        assert!(
            l[28..].starts_with("walletrelay") && l.contains("] "),
            "{l}"
        );
    }
    let listening = stderr.lines().find(|l| l.contains("listening on")).unwrap();
    assert!(
        listening.ends_with(&format!("] listening on {addr} addr={addr} tls=false")),
        "{listening}"
    );
    let down = stderr
        .lines()
        .find(|l| l.contains("shutting down"))
        .unwrap();
    assert!(
        down.ends_with("] SIGTERM: shutting down signal=SIGTERM"),
        "{down}"
    );
}

/// Everything secret the secrets test hands the server, and what it logged about each event.
struct Secrets(Vec<String>);

impl Secrets {
    fn add(&mut self, s: impl Into<String>) -> String {
        let s = s.into();
        self.0.push(s.clone());
        s
    }

    /// None of them anywhere in `text` (`what` names it).
    fn absent_from(&self, what: &str, text: &str) {
        for s in &self.0 {
            assert!(!text.contains(s.as_str()), "{s:?} is in {what}:\n{text}");
        }
    }
}

/// The base64 lines of a PEM file (its key material).
fn pem_body(pem: &str) -> Vec<String> {
    pem.lines()
        .filter(|l| !l.starts_with("-----") && l.len() > 16)
        .map(str::to_string)
        .collect()
}

#[test]
fn no_secret_is_logged_in_either_format() {
    for format in ["text", "json"] {
        secrets_stay_out_of(format);
    }
}

fn secrets_stay_out_of(format: &str) {
    let mut secrets = Secrets(Vec::new());
    let env = [("RUST_LOG", "trace")];
    let flag = ["--log-format", format];
    let checked = |what: &str, text: &str, secrets: &Secrets| {
        secrets.absent_from(what, text);
        if format == "json" && what.ends_with("stderr") {
            records(text);
        }
    };

    // Redis with a password: in the URL, then refused, then down.
    let pw = secrets.add(format!("redis-pw-{}", std::process::id()));
    let mut redis = RedisServer::start_with_password(&pw);
    let url = redis.url_with_password();
    let run = Run::start(
        &[&flag[..], &["--redis", &url, "--threads", "2"]].concat(),
        &env,
    );
    run.wait_line("redis shard 0");
    redis.kill();
    run.wait_line("reconnecting");
    redis.restart();
    run.wait_line("reconnected");
    run.server.signal(libc::SIGHUP);
    run.wait_line("SIGHUP");
    let (out, err) = run.stop();
    checked("the Redis node's stdout", &out, &secrets);
    checked("the Redis node's stderr", &err, &secrets);
    assert!(err.contains("shut down"), "{err}");

    let tmp = TempDir::new("logs-secrets");
    let wrong = secrets.add("wrong-redis-pw-in-a-file");
    let pw_file = tmp.join("redis-password");
    std::fs::write(&pw_file, format!("{wrong}\n")).unwrap();
    let (out, err) = run_to_exit(
        &[
            &flag[..],
            &[
                "--redis",
                &redis.url(),
                "--redis-password-file",
                pw_file.to_str().unwrap(),
            ],
        ]
        .concat(),
        &env,
    );
    checked("a refused start's stdout", &out, &secrets);
    checked("a refused start's stderr", &err, &secrets);
    assert!(
        err.contains("cannot start") && err.contains("AUTH"),
        "{err}"
    );
    redis.kill();
    let (out, err) = run_to_exit(&[&flag[..], &["--redis", &url]].concat(), &env);
    checked("a start without Redis: stdout", &out, &secrets);
    checked("a start without Redis: stderr", &err, &secrets);
    assert!(
        err.contains("cannot start") && err.contains("Redis"),
        "{err}"
    );

    // Webhooks, pushes, JWTs, the relay's key and TLS on a standalone node.
    let hooks = Receiver::start(|_| Reply::Status(400));
    let hook_user = secrets.add("hookuser-7f3a");
    let hook_pw = secrets.add("hook-pw-9c1e");
    let hook_path = secrets.add("hook-path-secret-55d0");
    let hook_query = secrets.add("hook-query-secret-a1b2");
    let hook = format!(
        "http://{hook_user}:{hook_pw}@{}/services/{hook_path}?token={hook_query}",
        hooks.addr
    );
    let push = Receiver::start(|_| Reply::Status(400));
    let push_pw = secrets.add("push-pw-3e4f");
    let push_query = secrets.add("push-query-secret-77aa");
    let push_url = format!(
        "http://pushuser:{push_pw}@{}/{{projectId}}?api_key={push_query}",
        push.addr
    );
    let tls = TlsSetup::new();
    for line in pem_body(&tls.leaf.key_pem) {
        secrets.add(line);
    }
    let data = TempDir::new("logs-data");
    let tls_args = tls.args();
    let tls_args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    let args = [
        &flag[..],
        &tls_args[..],
        &[
            "--threads",
            "2",
            "--data-dir",
            data.arg(),
            "--webhook-allow-private",
            "--push-url",
            &push_url,
        ],
    ]
    .concat();
    let run = Run::start(&args, &env);
    let addr = run.server.addr;
    run.wait_line("relay key: created");
    let seed = std::fs::read_to_string(data.join("relay-key.hex")).unwrap();
    secrets.add(seed.trim());

    // A webhook with userinfo, a path and a query secret, answered 400.
    let tp = topic();
    let (status, body) = run.server.register_webhook(&tp, &hook);
    assert_eq!(status, 200, "{body}");
    let mut publ = run.server.ws();
    publ.publish(&tp, "for the webhook");
    assert!(hooks.next(WAIT).is_some(), "the webhook was not called");
    let failed = run.wait_line("webhook call failed");
    assert!(
        failed.contains(&format!("http://{}", hooks.addr)),
        "{failed}"
    );

    // Relay auth: a broken token in the query, an expired one in the header.
    let broken = secrets.add("eyJhbGciOiJFZERTQSJ9.eyJicm9rZW4iOnRydWV9.c2lnbmF0dXJl");
    let r = Ws::try_handshake(
        common::tcp_to(addr),
        &format!("ws://{addr}/?auth={broken}"),
        &[],
    );
    assert_eq!(r.err().as_deref(), Some("status 401"));
    let old = Signer::random();
    let expired = secrets.add(old.token(now_s() - 7200, now_s() - 3600));
    let bearer = format!("Bearer {expired}");
    let r = Ws::try_handshake(
        common::tcp_to(addr),
        &format!("ws://{addr}/"),
        &[("Authorization", &bearer)],
    );
    assert_eq!(r.err().as_deref(), Some("status 401"));
    assert!(wait_until(WAIT, || run
        .stderr()
        .matches("relay auth refused")
        .count()
        >= 2));

    // A watch registration with an expired registerAuth.
    let t = now_s() - 7200;
    let watch_token = secrets.add(old.sign(&json!({
        "iss": old.did(), "aud": "https://relay.example", "sub": "https://svc.example/",
        "iat": t, "exp": t + 60, "act": "irn_watchRegister", "typ": "subscriber",
        "whu": hook, "tag": [1100], "sts": ["queued"],
    })));
    let r = publ.call("irn_watchRegister", json!({ "registerAuth": watch_token }));
    assert!(!r["error"].is_null(), "{r}");
    run.wait_line("watch registration refused");

    // A push to a sleeping wallet (a valid token, then its socket closed), answered 400.
    let wallet = Signer::random();
    let valid = secrets.add(wallet.fresh_token());
    let mut w = Ws::handshake(
        common::tcp_to(addr),
        &format!("ws://{addr}/?auth={valid}&projectId=p1"),
    );
    let wt = topic();
    w.call("irn_subscribe", json!({ "topic": wt }));
    drop(w);
    let open = run
        .server
        .wait_metric("walletrelay_websockets_open", WAIT, |v| v <= 1.0);
    assert!(open <= 1.0, "the wallet's socket is still open");
    let r = publ.call(
        "irn_publish",
        json!({"topic": wt, "message": "wake up", "ttl": 3600, "tag": 1100, "prompt": true}),
    );
    assert_eq!(r["result"], true, "{r}");
    let seen = push.next(WAIT).expect("no push reached the push server");
    assert!(seen.target.starts_with("/p1"), "{}", seen.target);
    let failed = poll(WAIT, || {
        run.stderr()
            .lines()
            .find(|l| l.contains("webhook call failed") && l.contains(&push.addr.to_string()))
            .map(str::to_string)
    })
    .unwrap_or_else(|| panic!("the failed push was not logged:\n{}", run.stderr()));
    assert!(
        failed.contains(&format!("http://{}", push.addr)),
        "{failed}"
    );

    run.server.signal(libc::SIGHUP);
    run.wait_line("reload: TLS certificate");
    let (out, err) = run.stop();
    checked("the standalone node's stdout", &out, &secrets);
    checked("the standalone node's stderr", &err, &secrets);
    assert!(err.contains("shut down"), "{err}");
    // The dependency that would print them at trace (ureq) logged at debug, masked.
    assert!(
        err.contains("ureq"),
        "ureq's debug lines are expected at RUST_LOG=trace"
    );
}
