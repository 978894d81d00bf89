//! The configuration file through the real binary: `--config FILE` values take effect (a
//! flag and an environment variable still win), `--print-config` shows the result with
//! secrets masked, a bad file refuses the start naming the key and its line, and SIGHUP
//! applies new `project-ids` and TLS files from the file (a bad file keeps the old ones).

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::raw_ws::{upgrade_request, RFC_KEY};
use common::tls::TlsSetup;
use common::wait::wait_until;
use common::{Server, TempDir};

const RELOAD_WAIT: Duration = Duration::from_secs(10);

/// Runs the binary to its end with `args` and the environment `env` (nothing else of the
/// tests' usual environment).
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run walletrelay")
}

fn write(dir: &TempDir, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn values_from_the_file_take_effect_below_flags_and_the_environment() {
    let dir = TempDir::new("config-effect");
    let file = write(
        &dir,
        "relay.toml",
        "service-name = \"FromFile\"\n\n[workers]\nthreads = 2\n\n[limits]\nmax-head = 1024\n\
         max-connections-per-ip = 1\n",
    );
    let s = Server::start(&["--config", &file]);
    let hello = String::from_utf8_lossy(
        &s.raw_exchange(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .into_owned();
    assert!(
        hello.contains("Hello World, this is FromFile v2.0"),
        "{hello}"
    );
    // `max-head` from the file: a 2 KiB head is refused.
    let big = format!(
        "GET /hello HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(2048)
    );
    let answer = String::from_utf8_lossy(&s.raw_exchange(big.as_bytes())).into_owned();
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // The test environment turns `max-connections-per-ip` off: the variable beats the file,
    // so two connections from 127.0.0.1 are both served.
    let (_a, _b) = (s.tcp(), s.tcp());
    let again = String::from_utf8_lossy(
        &s.raw_exchange(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .into_owned();
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    drop(s);

    // A flag beats the file.
    let s = Server::start(&["--config", &file, "--service-name", "FromFlag"]);
    let hello = String::from_utf8_lossy(
        &s.raw_exchange(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .into_owned();
    assert!(hello.contains("this is FromFlag v2.0"), "{hello}");
}

#[test]
fn print_config_shows_every_source_and_masks_secrets() {
    let dir = TempDir::new("config-print");
    let file = write(
        &dir,
        "relay.toml",
        "[workers]\nthreads = 2\nbacklog = 10\n\n[redis]\n\
         redis = [\"redis://relay:hunter2@10.0.0.1:6379/0\", \
         \"redis+sentinel://10.0.0.2:26379/mymaster?sentinel_password=s3cret\"]\n\n\
         [limits]\nmax-connections-per-ip = 20\n",
    );
    let out = run(
        &["--config", &file, "--threads", "3", "--print-config"],
        &[("WALLETRELAY_BACKLOG", "77")],
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "threads = 3  # flag",
        "backlog = 77  # env",
        "max-connections-per-ip = 20  # file",
        "redis = [\"redis://relay:***@10.0.0.1:6379/0\", \
         \"redis+sentinel://10.0.0.2:26379/mymaster?sentinel_password=***\"]  # file",
        "max-message = 1048576",
        "[limits]",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing in\n{text}"
        );
    }
    assert!(
        !text.contains("hunter2") && !text.contains("s3cret"),
        "{text}"
    );
    // What it prints is itself a configuration file that loads.
    let printed = write(&dir, "printed.toml", &text);
    let out = run(&["--config", &printed, "--print-config"], &[]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_bad_file_refuses_the_start_with_the_key_and_its_line() {
    let dir = TempDir::new("config-bad");
    let cases = [
        (
            "service-name = \"x\"\n\n[limits]\nmax-conections-per-ip = 20\n",
            ":4: unknown key \"max-conections-per-ip\" in [limits]",
        ),
        (
            "[limits]\nmax-message = 5\n\n\n\n\nmax-connections-per-ip = \"x\"\n",
            ":7: max-connections-per-ip: invalid value \"x\": invalid digit found in string",
        ),
        (
            "[storage]\nfsync = \"sometimes\"\n",
            ":2: fsync: invalid value \"sometimes\"",
        ),
        (
            "threads = 2\n",
            ":1: unknown key \"threads\" (it belongs in [workers])",
        ),
    ];
    for (text, want) in cases {
        let file = write(&dir, "bad.toml", text);
        let out = run(&["--config", &file, "--listen", "127.0.0.1:0"], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let want = format!("walletrelay: config {file}{want}");
        assert!(stderr.contains(&want), "{want:?} not in {stderr:?}");
        assert!(out.stdout.is_empty(), "it must not have started");
    }
    let out = run(
        &["--config", &dir.join("none.toml").display().to_string()],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("none.toml: No such file"));
}

#[test]
fn the_example_file_loads() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/walletrelay.toml");
    let out = run(
        &["--config", example.to_str().unwrap(), "--print-config"],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
}

/// The head of the answer to an upgrade with this `projectId` (read up to its blank line:
/// a 101 leaves the connection open).
fn upgrade(s: &Server, project: &str) -> String {
    let req = upgrade_request(&format!("/?projectId={project}"), RFC_KEY, "");
    let mut c = s.tcp();
    c.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[test]
fn sighup_applies_new_project_ids_from_the_file_and_keeps_them_on_a_bad_file() {
    let dir = TempDir::new("config-sighup");
    let file = write(&dir, "relay.toml", "[auth]\nproject-ids = \"p1\"\n");
    let s = Server::start_logged(&["--threads", "2", "--config", &file]);
    assert!(upgrade(&s, "p1").starts_with("HTTP/1.1 101"));
    assert!(upgrade(&s, "p2").starts_with("HTTP/1.1 403"));

    // A bad file: logged with its line, nothing changes, the server goes on.
    write(
        &dir,
        "relay.toml",
        "[auth]\nproject-ids = \"p1,p2\"\nbogus = 1\n",
    );
    let mark = s.log().len();
    s.signal(libc::SIGHUP);
    let line = s
        .wait_log(mark, "unknown key", RELOAD_WAIT)
        .expect("the bad file was not logged");
    assert!(
        line.contains("relay.toml:3: unknown key \"bogus\""),
        "{line}"
    );
    assert!(upgrade(&s, "p2").starts_with("HTTP/1.1 403"));
    assert!(upgrade(&s, "p1").starts_with("HTTP/1.1 101"));

    // A good one: the new list, on every worker; a key that needs a restart is named.
    write(
        &dir,
        "relay.toml",
        "[auth]\nproject-ids = \"p1,p2\"\n[limits]\nmax-head = 4096\n",
    );
    let mark = s.log().len();
    s.signal(libc::SIGHUP);
    s.wait_log(mark, "project-ids changed", RELOAD_WAIT)
        .expect("the new list was not logged");
    assert!(
        s.wait_log(mark, "max-head changed", RELOAD_WAIT).is_some(),
        "{}",
        s.log()
    );
    let all_allowed = || (0..8).all(|_| upgrade(&s, "p2").starts_with("HTTP/1.1 101"));
    assert!(
        wait_until(RELOAD_WAIT, all_allowed),
        "p2 not allowed after SIGHUP"
    );

    // The key gone from the file: any project again.
    write(&dir, "relay.toml", "");
    let mark = s.log().len();
    s.signal(libc::SIGHUP);
    s.wait_log(mark, "project-ids unset", RELOAD_WAIT)
        .expect("the removal was not logged");
    let any = || (0..8).all(|_| upgrade(&s, "p9").starts_with("HTTP/1.1 101"));
    assert!(
        wait_until(RELOAD_WAIT, any),
        "p9 not allowed once the list is gone"
    );
}

#[test]
fn sighup_moves_to_the_tls_files_the_file_names_now() {
    let tls = TlsSetup::new();
    let dir = TempDir::new("config-tls");
    let second = tls.ca.leaf(2);
    let (cert2, key2) = second.write_to(&dir.0);
    let tls_table = |cert: &Path, key: &Path| {
        format!(
            "[tls]\ntls-cert = \"{}\"\ntls-key = \"{}\"\n",
            cert.display(),
            key.display()
        )
    };
    let file = write(&dir, "relay.toml", &tls_table(&tls.cert, &tls.key));
    // The listener from a flag, its certificate and key from the file.
    let s = Server::start_logged(&[
        "--threads",
        "1",
        "--config",
        &file,
        "--tls-listen",
        "127.0.0.1:0",
    ]);
    let config = || tls.ca.client_config(&[&rustls::version::TLS13]);
    assert_eq!(
        s.tls(&config()).conn.peer_certificates().unwrap()[0],
        tls.leaf.der
    );

    write(&dir, "relay.toml", &tls_table(&cert2, &key2));
    let mark = s.log().len();
    s.signal(libc::SIGHUP);
    let line = s
        .wait_log(mark, "reload: TLS certificate", RELOAD_WAIT)
        .expect("not reloaded");
    assert!(line.contains(&cert2.display().to_string()), "{line}");
    let moved = || s.tls(&config()).conn.peer_certificates().unwrap()[0] == second.der;
    assert!(
        wait_until(RELOAD_WAIT, moved),
        "new connections still see the old certificate"
    );
}
