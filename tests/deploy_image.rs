//! The image (issue 54, item 1): `./Containerfile` built here exactly as users build it (its
//! `FROM` images made locally by `scripts/images`: a debootstrap Debian and a stand-in of the
//! official Rust image with this machine's toolchain), once per tree state, then run with
//! podman on loopback ports and a named volume for the data directory:
//! - the image's metadata: uid 10001, the volume, the ports, the entrypoint and default
//!   arguments, the health check, SIGTERM as the stop signal, the OCI labels;
//! - the running server: uid 10001 (the container's process seen in `/proc`), `podman
//!   healthcheck run` healthy, today's SDK (`@walletconnect/sign-client` 2.25.0, through
//!   `tests/e2e-sdk/sdk.mjs`) pairs, requests and disconnects through it;
//! - durability: the SDK's request and a raw publish are acknowledged, the container is
//!   killed (`podman kill -s KILL`), a new one on the same volume serves both;
//! - SIGTERM as PID 1 (`podman stop`): `/ready` 503 during the drain, the clients closed
//!   with 1001, exit 0 before podman's own kill;
//! - SIGHUP (`podman kill -s HUP`) re-reads `--project-ids @FILE` from a mounted file.
//!
//! Needs root (rootful podman; installed with apt-get when missing, skipped otherwise),
//! Node.js and npm (the SDK). The first build takes minutes (docs/DEPLOY.md has the times).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::http::get;
use common::node;
use common::podman::{self, Container, Net, Volume};
use common::raw_ws::{upgrade_request, RFC_KEY};
use common::skip::skip;
use common::tempdir::TempDir;
use common::wait::{wait_for, wait_until, WAIT};
use common::ws::Ws;
use serde_json::json;

/// The tag the tests build and run (INTERFACE-54: `:test` in tests).
const TAG: &str = "localhost/walletrelay:test";

/// The data directory in the image (its `VOLUME`).
const DATA: &str = "/var/lib/walletrelay";

/// Upper bound for one run of the SDK script (its own timeout is 120 s).
const SCRIPT_DEADLINE: Duration = Duration::from_secs(180);

/// The SDK package whose presence means `npm ci` has run.
const MARKER: &str = "@walletconnect/sign-client";

/// The image, built when the tree changed; `None` (the test is skipped) without podman.
fn image(test: &str) -> Option<String> {
    if let Err(why) = podman::available() {
        skip(test, &why);
        return None;
    }
    Some(podman::walletrelay_image(TAG))
}

/// A free loopback port (bound, then let go).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("addr").port()
}

/// The image's ports published on free loopback ports (podman's default network).
fn published() -> Net {
    Net::Publish {
        public: free_port(),
        admin: free_port(),
    }
}

/// Runs the image on `net` with `volume` as its data directory, `opts` for podman and `args`
/// for the server (none: the image's default arguments).
fn start(
    image: &str,
    what: &str,
    net: Net,
    volume: &Volume,
    opts: &[&str],
    args: &[&str],
) -> Container {
    let mount = format!("{}:{DATA}", volume.name);
    let mut all = vec!["-v", mount.as_str()];
    all.extend_from_slice(opts);
    Container::run(image, what, net, &all, args)
}

/// The close code of the next close frame on `ws`.
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

/// The status of a GET on the admin address.
fn admin_status(c: &Container, path: &str) -> u16 {
    c.server.admin_request(&get(path)).status
}

#[test]
fn the_image_runs_as_uid_10001_is_healthy_and_serves_todays_sdk() {
    let Some(image) = image("the_image_runs_as_uid_10001_is_healthy_and_serves_todays_sdk") else {
        return;
    };
    // What the image says of itself.
    let config = podman::podman_ok(&["image", "inspect", "--format", "{{json .Config}}", &image]);
    let config: serde_json::Value = serde_json::from_str(&config).expect("image config");
    assert_eq!(config["User"], "10001:10001", "{config}");
    assert!(config["Volumes"].get(DATA).is_some(), "{config}");
    for port in ["8080/tcp", "9091/tcp"] {
        assert!(config["ExposedPorts"].get(port).is_some(), "{config}");
    }
    assert_eq!(config["Entrypoint"], json!(["/usr/local/bin/walletrelay"]));
    assert_eq!(
        config["Cmd"],
        json!([
            "--listen",
            "0.0.0.0:8080",
            "--admin-listen",
            "0.0.0.0:9091",
            "--data-dir",
            DATA,
            "--log-format",
            "json",
            "--drain",
            "5"
        ])
    );
    assert_eq!(config["StopSignal"], "SIGTERM");
    let labels = &config["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert!(labels["org.opencontainers.image.source"].is_string());
    let health = podman::podman_ok(&[
        "image",
        "inspect",
        "--format",
        "{{json .HealthCheck}}",
        &image,
    ]);
    assert!(
        health.contains(
            r#""CMD","/usr/local/bin/walletrelay","probe","http://127.0.0.1:9091/ready""#
        ),
        "{health}"
    );

    let volume = Volume::new("data");
    let c = start(&image, "sdk", published(), &volume, &[], &[]);
    let pid: u32 = c.inspect("{{.State.Pid}}").parse().expect("pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line");
    assert_eq!(
        uid.split_whitespace().collect::<Vec<_>>(),
        ["10001"; 4],
        "real, effective, saved, file-system uid: {status}"
    );
    assert_eq!(admin_status(&c, "/health"), 204);
    // The image's own health check, run by podman in the container (its probe, no curl).
    let healthy = || {
        podman::podman(&["healthcheck", "run", &c.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(
        wait_until(WAIT, healthy),
        "podman healthcheck run: not healthy"
    );

    node::ensure_node_modules("e2e-sdk", MARKER);
    let url = format!("ws://{}", c.server.addr);
    node::run_script(
        "e2e-sdk",
        "sdk.mjs",
        &[("SCENARIO", "session"), ("RELAY_URL", url.as_str())],
        SCRIPT_DEADLINE,
        &format!("SCENARIO=session, relay {url} in the container {}", c.name),
    );
}

#[test]
fn an_acknowledged_message_survives_a_kill_9_of_the_container() {
    let Some(image) = image("an_acknowledged_message_survives_a_kill_9_of_the_container") else {
        return;
    };
    node::ensure_node_modules("e2e-sdk", MARKER);
    let volume = Volume::new("data");
    let net = published();
    let mut c = Some(start(&image, "kill9", net, &volume, &[], &[]));
    let url = format!("ws://{}", c.as_ref().expect("the container").server.addr);
    let t = common::topic();
    let mut restarted = false;
    node::run_script_interactive(
        "e2e-sdk",
        "sdk.mjs",
        &[("SCENARIO", "restart"), ("RELAY_URL", url.as_str())],
        SCRIPT_DEADLINE,
        &format!("SCENARIO=restart, relay {url} in a container killed and run again"),
        |line| {
            if line.trim() != "READY_FOR_RESTART" || restarted {
                return None;
            }
            let mut old = c.take().expect("the first container");
            // The SDK's request is acknowledged (the script said so); one more publish of
            // the test's own, acknowledged too, then the kill.
            let mut p = old.server.ws();
            let r = p.call(
                "irn_publish",
                json!({"topic": t, "message": "kept", "ttl": 3600, "tag": 1108}),
            );
            assert_eq!(r["result"], true, "{r}");
            old.kill("KILL");
            assert_eq!(old.wait_exit(WAIT), 137, "killed by SIGKILL");
            drop(old);
            eprintln!("deploy_image: container killed (SIGKILL); a new one on the same volume");
            c = Some(start(&image, "kill9-again", net, &volume, &[], &[]));
            restarted = true;
            Some("RESTARTED".to_string())
        },
    );
    assert!(restarted, "the script never asked for the restart");
    let c = c.expect("the second container");
    let mut sub = c.server.ws();
    let r = sub.call("irn_subscribe", json!({ "topic": t }));
    assert!(r["result"].is_string(), "{r}");
    let push = sub.recv();
    assert_eq!(push["params"]["data"]["message"], "kept", "{push}");
}

#[test]
fn sigterm_to_the_container_drains_closes_with_1001_and_exits_0() {
    let Some(image) = image("sigterm_to_the_container_drains_closes_with_1001_and_exits_0") else {
        return;
    };
    let volume = Volume::new("data");
    // The image's default arguments: a drain of 5 s (how long it takes is never checked).
    let mut c = start(&image, "sigterm", published(), &volume, &[], &[]);
    let mut a = c.server.ws();
    let mut b = c.server.ws();
    let t = common::topic();
    b.subscribe(&t);
    a.publish(&t, "before the stop");
    assert_eq!(b.next_push().2, "before the stop");
    assert_eq!(admin_status(&c, "/ready"), 204);
    // podman sends the image's STOPSIGNAL, and SIGKILL only after 60 s (exit code 137).
    let mut stop = podman::podman(&["stop", "-t", "60", &c.name])
        .stdout(Stdio::null())
        .spawn()
        .expect("podman stop");
    wait_for("/ready 503 during the drain", || {
        admin_status(&c, "/ready") == 503
    });
    assert_eq!(close_code(&mut a), 1001);
    assert_eq!(close_code(&mut b), 1001);
    assert!(stop.wait().expect("podman stop").success());
    assert_eq!(c.wait_exit(WAIT), 0, "exited by itself, not killed");
    let log = c.log();
    assert!(log.contains("drain over: shutting down"), "{log}");
    // The server's log is one JSON object per line (--log-format json); podman's own
    // complaints on the same stderr (no systemd here for the health check's timer) are not.
    let mut objects = 0;
    for line in log
        .lines()
        .filter(|l| !l.starts_with("time=") && !l.is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(v["level"].is_string(), "{line}");
        objects += 1;
    }
    assert!(objects > 0, "{log}");
}

/// The answer to a WebSocket upgrade with `query`, read until the server closes.
fn upgrade_answer(c: &Container, query: &str) -> String {
    let req = upgrade_request(&format!("/?{query}"), RFC_KEY, "");
    let mut s = c.server.tcp();
    std::io::Write::write_all(&mut s, req.as_bytes()).expect("send the upgrade");
    let mut buf = [0u8; 1024];
    let n = std::io::Read::read(&mut s, &mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn sighup_to_the_container_rereads_the_project_ids_of_a_mounted_file() {
    let Some(image) = image("sighup_to_the_container_rereads_the_project_ids_of_a_mounted_file")
    else {
        return;
    };
    let dir = TempDir::new("projects");
    std::fs::write(dir.join("ids"), "# allowed\np1\n").expect("write the ids");
    let mount = format!("{}:/etc/walletrelay:ro", dir.arg());
    let volume = Volume::new("data");
    // On the host's network this time, with the addresses given as flags.
    let (public, admin) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let args = [
        "--listen",
        &public,
        "--admin-listen",
        &admin,
        "--data-dir",
        DATA,
        "--log-format",
        "json",
        "--project-ids",
        "@/etc/walletrelay/ids",
    ];
    let c = start(&image, "sighup", Net::Host, &volume, &["-v", &mount], &args);
    assert!(upgrade_answer(&c, "projectId=p1").starts_with("HTTP/1.1 101"));
    let ans = upgrade_answer(&c, "projectId=p2");
    assert!(ans.starts_with("HTTP/1.1 403"), "{ans}");
    std::fs::write(dir.join("ids"), "p2\n").expect("rewrite the ids");
    c.kill("HUP");
    let allowed = || upgrade_answer(&c, "projectId=p2").starts_with("HTTP/1.1 101");
    assert!(wait_until(WAIT, allowed), "p2 allowed after SIGHUP");
    assert!(upgrade_answer(&c, "projectId=p1").starts_with("HTTP/1.1 403"));
    assert!(c.wait_log("project-ids", WAIT).is_some(), "{}", c.log());
}
