//! The alert and recording rules (`deploy/prometheus/rules.yml`) and the metrics they read,
//! checked with Prometheus's own tool: `promtool check rules` (the file is valid, every
//! expression parses), `promtool test rules` on `rules_test.yml` (each alert fires on the
//! series made for it and stays quiet before its `for` or on a healthy relay), every alert
//! tested both ways with its `runbook_url` at a section of docs/ALERTS.md, and `promtool
//! check metrics` on a live `/metrics` of the real binary (the journal engine and, when
//! `redis-server` is there, the Redis engine, after some traffic so that the histograms have
//! samples): no naming or help complaint.
//!
//! Needs `promtool` (Debian's `prometheus` package: installed with apt-get when missing and
//! running as root; otherwise the tests that run it are skipped, see `common::skip`).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::apt::tool;
use common::http::get;
use common::redis::RedisServer;
use common::{skip, topic, Server, TempDir};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// `promtool`, or `None` when it is missing and cannot be installed (the test is skipped).
fn promtool(test: &str) -> Option<PathBuf> {
    match tool("promtool", "prometheus") {
        Ok(p) => Some(p),
        Err(reason) => {
            skip::skip(test, &reason);
            None
        }
    }
}

/// Runs promtool with `args` in `deploy/prometheus` (with `stdin` piped in when given);
/// panics with its output unless it succeeds. Returns stdout and stderr together.
fn run(promtool: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(promtool)
        .args(args)
        .current_dir(repo("deploy/prometheus"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .expect("write promtool's stdin");
    drop(input);
    let out = child.wait_with_output().expect("wait for promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// The alerts of rules.yml: `(name, runbook_url)`.
fn alerts() -> Vec<(String, String)> {
    let rules = read("deploy/prometheus/rules.yml");
    let mut out: Vec<(String, String)> = Vec::new();
    for line in rules.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert: ") {
            out.push((name.to_string(), String::new()));
        } else if let Some(url) = line.strip_prefix("runbook_url: ") {
            let last = out.last_mut().expect("a runbook_url after its alert");
            last.1 = url.trim_matches('"').to_string();
        }
    }
    out
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let Some(promtool) = promtool("promtool_checks_the_rules_and_their_unit_tests_pass") else {
        return;
    };
    let checked = run(&promtool, &["check", "rules", "rules.yml"], None);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run(&promtool, &["test", "rules", "rules_test.yml"], None);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_alert_is_tested_both_ways_and_has_a_runbook_section() {
    let alerts = alerts();
    assert!(alerts.len() >= 20, "only {} alerts", alerts.len());
    // Which alerts the unit tests expect firing, and which they expect quiet.
    let tests = read("deploy/prometheus/rules_test.yml");
    let (mut fires, mut quiet) = (Vec::new(), Vec::new());
    let mut current = None;
    let mut lines = tests.lines().map(str::trim).peekable();
    while let Some(line) = lines.next() {
        if let Some(name) = line.strip_prefix("alertname: ") {
            current = Some(name.to_string());
        } else if line == "exp_alerts: []" {
            quiet.extend(current.clone());
        } else if line == "exp_alerts:"
            && lines.peek().is_some_and(|l| l.starts_with("- exp_labels"))
        {
            fires.extend(current.clone());
        }
    }
    let doc = read("docs/ALERTS.md");
    let sections: Vec<&str> = doc.split("\n## ").skip(1).collect();
    for (name, url) in &alerts {
        assert!(fires.contains(name), "no test makes {name} fire");
        assert!(quiet.contains(name), "no test shows {name} quiet");
        let anchor = name.to_lowercase();
        assert_eq!(
            url,
            &format!("docs/ALERTS.md#{anchor}"),
            "{name}'s runbook_url"
        );
        let section = sections
            .iter()
            .find(|s| s.lines().next() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("docs/ALERTS.md has no section `## {name}`"));
        for part in ["**Means**", "**Check**", "**Do**"] {
            assert!(section.contains(part), "{name}'s section has no {part}");
        }
    }
    // And no section or test for an alert that is gone.
    for s in &sections {
        let title = s.lines().next().unwrap_or_default();
        assert!(
            alerts.iter().any(|(n, _)| n == title),
            "docs/ALERTS.md: `{title}` is no alert"
        );
    }
    for name in fires.iter().chain(&quiet) {
        assert!(
            alerts.iter().any(|(n, _)| n == name),
            "rules_test.yml: `{name}` is no alert"
        );
    }
}

/// Some publishes, each delivered, so that the histograms have samples.
fn traffic(s: &Server) {
    let (mut sub, mut publ) = (s.ws(), s.ws());
    for i in 0..20 {
        let t = topic();
        sub.subscribe(&t);
        publ.publish(&t, &format!("{i:04x}"));
        let _ = sub.next_push();
    }
}

/// `promtool check metrics` on the admin `/metrics` of `s` after [`traffic`]: no complaint.
fn check_live_metrics(promtool: &Path, s: &Server, engine: &str) {
    traffic(s);
    let r = s.admin_request(&get("/metrics"));
    let text = r.body_str();
    assert!(text.contains("walletrelay_build_info"), "{engine}: {text}");
    let complaints = run(promtool, &["check", "metrics"], Some(text));
    assert_eq!(
        complaints.trim(),
        "",
        "{engine}: promtool check metrics complained"
    );
}

#[test]
fn a_live_metrics_page_passes_promtool_check_metrics() {
    let test = "a_live_metrics_page_passes_promtool_check_metrics";
    let Some(promtool) = promtool(test) else {
        return;
    };
    let dir = TempDir::new("promtool-metrics");
    let admin = ["--admin-listen", "127.0.0.1:0", "--threads", "2"];
    let journal = Server::start(&[&admin[..], &["--data-dir", dir.arg()]].concat());
    check_live_metrics(&promtool, &journal, "journal");
    drop(journal);
    match tool("redis-server", "redis-server") {
        Ok(_) => {
            let redis = RedisServer::start();
            let url = redis.url();
            let s = Server::start(&[&admin[..], &["--redis", &url]].concat());
            check_live_metrics(&promtool, &s, "redis");
        }
        Err(reason) => skip::skip(&format!("{test} (the Redis engine)"), &reason),
    }
}
