//! The latency lab of `loadtest` (issue 58), the real binary against the real server:
//! several generators started together with `--start-at` write HdrHistogram interval logs
//! (`--hlog`) that `loadtest merge` adds up exactly; a target that is not loopback is
//! refused unless `--allow-remote`, which says what it sends where, and is tested only
//! against a server in a network namespace this test makes itself (`common::netns`, veth
//! pairs in `10.213.X.0/24`; skipped without root or `ip`); `loadtest report` writes one
//! self-contained HTML page that Debian's Chromium, headless, renders to a screenshot
//! (installed with apt-get as root when missing; skipped otherwise).
//!
//! Every load is small (10 or 20 pairs, 100 to 200 publishes a second, 1 to 2 s) and goes to
//! loopback or to the test's own namespace. No figure of time decides a pass.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::apt::tool;
use common::loadtest_bin::{json, loadtest, run, stderr};
use common::netns::Lab;
use common::skip::skip;
use common::{Server, TempDir};

/// A short open-loop `pairs` run against `url`, its latencies written to `hlog`.
fn pairs_args<'a>(url: &'a str, hlog: &'a str) -> Vec<&'a str> {
    vec![
        "pairs",
        "--url",
        url,
        "--pairs",
        "10",
        "--rate",
        "200",
        "--duration",
        "2s",
        "--warmup",
        "200ms",
        "--drain",
        "500ms",
        "--hlog",
        hlog,
    ]
}

/// Unix time now, seconds.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The `#[BaseTime: ..]` of a log, Unix seconds.
fn base_time(text: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix("#[BaseTime: "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no BaseTime in {text}"))
}

#[test]
fn two_generators_started_together_merge_into_one_exact_log() {
    let server = Server::start(&["--data-dir", "none"]);
    let url = format!("ws://{}/", server.addr);
    let dir = TempDir::new("lab-merge");
    let (a, b, m) = (dir.join("a.hlog"), dir.join("b.hlog"), dir.join("m.hlog"));
    let (a, b, m) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        m.to_str().unwrap(),
    );
    let at = format!("{:.3}", unix_now() + 4.0);
    let spawn = |hlog: &str| {
        let mut args = pairs_args(&url, hlog);
        args.extend(["--start-at", &at]);
        Command::new(loadtest())
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn loadtest")
    };
    let (ga, gb) = (spawn(a), spawn(b));
    let (oa, ob) = (
        ga.wait_with_output().expect("a"),
        gb.wait_with_output().expect("b"),
    );
    assert!(oa.status.success(), "{}", stderr(&oa));
    assert!(ob.status.success(), "{}", stderr(&ob));
    let (ja, jb) = (json(&oa), json(&ob));
    for j in [&ja, &jb] {
        assert_eq!(j["lost"], 0, "{j}");
        assert!(
            j["publish_delivery_us"]["count"].as_u64().unwrap() > 0,
            "{j}"
        );
    }
    // Neither began before the agreed time: its first interval is not earlier.
    let start: f64 = at.parse().unwrap();
    for p in [a, b] {
        let text = std::fs::read_to_string(p).unwrap();
        assert!(base_time(&text) >= start.floor(), "{p}: {text}");
        assert!(text.contains(
            "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\""
        ));
        assert!(text.contains("#[StartTime: "));
    }
    let merged = run(&["merge", a, b, "--out", m]);
    assert!(merged.status.success(), "{}", stderr(&merged));
    let jm = json(&merged);
    assert_eq!(jm["generators"], 2);
    for key in ["publish_delivery_us", "publish_ack_us", "send_lag_us"] {
        let sum = ja[key]["count"].as_u64().unwrap() + jb[key]["count"].as_u64().unwrap();
        assert_eq!(jm[key]["count"].as_u64(), Some(sum), "{key}: {jm}");
        let max = ja[key]["max"].as_u64().max(jb[key]["max"].as_u64());
        assert_eq!(jm[key]["max"].as_u64(), max, "{key}: {jm}");
    }
    // The merged log is a log like the others: merging it alone gives the same figures.
    let again = run(&["merge", m]);
    assert!(again.status.success(), "{}", stderr(&again));
    let ja2 = json(&again);
    assert_eq!(ja2["publish_delivery_us"], jm["publish_delivery_us"]);
    assert_eq!(ja2["generators"], 2);
}

#[test]
fn a_start_in_the_past_and_a_remote_target_without_the_flag_are_refused() {
    let past = format!("{:.3}", unix_now() - 30.0);
    let o = run(&["pairs", "--url", "ws://127.0.0.1:9/", "--start-at", &past]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("in the past"), "{}", stderr(&o));
    let o = run(&[
        "pairs",
        "--url",
        "ws://127.0.0.1:9/",
        "--start-at",
        "tomorrow",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // Refused before any socket is opened: nothing is sent to this documentation address.
    let o = run(&["pairs", "--url", "ws://192.0.2.1:9/"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("refusing non-loopback host"),
        "{}",
        stderr(&o)
    );
    let o = run(&["pairs", "--allow-remote", "--url", "ws://relay.example/"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("give the server's IP address"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn allow_remote_loads_a_server_in_a_namespace_the_test_made() {
    let test = "allow_remote_loads_a_server_in_a_namespace_the_test_made";
    let lab = match Lab::new(1) {
        Ok(l) => l,
        Err(why) => return skip(test, &why),
    };
    let node = lab.start_node(0, &[]);
    assert!(!node.addr.ip().is_loopback());
    let url = format!("ws://{}/", node.addr);
    let dir = TempDir::new("lab-remote");
    let hlog = dir.join("remote.hlog");
    let hlog = hlog.to_str().unwrap();
    let refused = run(&pairs_args(&url, hlog));
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let mut args = pairs_args(&url, hlog);
    args.push("--allow-remote");
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let said = stderr(&o);
    assert!(
        said.contains(&format!(
            "--allow-remote: sending pairs: 20 connections (10 pairs), 200 publishes/s in all \
             of 512 hex characters to {}",
            node.addr
        )),
        "{said}"
    );
    let j = json(&o);
    assert_eq!(j["lost"], 0, "{j}");
    assert!(
        j["publish_delivery_us"]["count"].as_u64().unwrap() > 0,
        "{j}"
    );
    assert!(Path::new(hlog).exists());
}

#[test]
fn a_report_of_two_runs_renders_in_headless_chromium() {
    let test = "a_report_of_two_runs_renders_in_headless_chromium";
    let chromium = match tool("chromium", "chromium") {
        Ok(c) => c,
        Err(why) => return skip(test, &why),
    };
    let dir = TempDir::new("lab-report");
    let (a, b) = (dir.join("relay.hlog"), dir.join("floor.hlog"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let server = Server::start(&["--data-dir", "none"]);
    let o = run(&pairs_args(&format!("ws://{}/", server.addr), a));
    assert!(o.status.success(), "{}", stderr(&o));
    drop(server);
    // The trivial forwarder, the floor, on a port of its own.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let listen = format!("127.0.0.1:{port}");
    let mut fwd = Command::new(loadtest())
        .args(["forwarder", "--listen", &listen, "--duration", "60s"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the forwarder");
    common::wait::poll(common::wait::WAIT, || {
        std::net::TcpStream::connect(&listen).ok()
    })
    .expect("the forwarder listens");
    let o = run(&pairs_args(&format!("ws://{listen}/"), b));
    let _ = fwd.kill();
    let _ = fwd.wait();
    assert!(o.status.success(), "{}", stderr(&o));
    let html = dir.join("report.html");
    let svg = dir.join("spectrum.svg");
    let o = run(&[
        "report",
        &format!("walletrelay={a}"),
        &format!("forwarder={b}"),
        "--out",
        html.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        "--title",
        "lab test",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = std::fs::read_to_string(&html).unwrap();
    for external in ["src=", "href=", "url(", "@import", "<script", "<link"] {
        assert!(
            !page.contains(external),
            "the page refers outside itself: {external}"
        );
    }
    assert_eq!(
        page.matches("<svg").count(),
        3,
        "spectrum, latency, throughput"
    );
    for shown in [
        "walletrelay (publish_delivery)",
        "forwarder (publish_delivery)",
        "percentile spectrum",
        "latency per second",
        "throughput per second",
        "send lag p99",
        "run delay ms",
        "<td>target_rate</td><td>200</td>",
    ] {
        assert!(page.contains(shown), "{shown} missing");
    }
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.contains("<polyline"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let shot = target.join("loadtest-report.png");
    let _ = std::fs::remove_file(&shot);
    let st = Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1150,2000",
        ])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", html.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run chromium");
    assert!(st.success(), "chromium failed: {st}");
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG screenshot");
    assert!(png.len() > 20_000, "a page with charts, not a blank one");
    eprintln!("{test}: screenshot {}", shot.display());
}
