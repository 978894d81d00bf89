//! The Grafana dashboard (`deploy/grafana/walletrelay.json`) and the recording rules
//! (`deploy/prometheus/rules.yml`) against a real Prometheus: Debian's `prometheus`, started
//! here with a 1 s scrape and evaluation interval and the rules loaded, scrapes two real
//! relays on their admin addresses (one on the journal engine, one on a real `redis-server`,
//! so that the journal's and Redis's panels both have data) while `loadtest pairs` drives
//! publishes through each (bounded: a fixed rate for a fixed time). Then every panel target's
//! `expr` (with the dashboard's variables put in as Grafana would: `$job`, `$instance` = All,
//! `$__rate_interval`) is run through `/api/v1/query` and must return at least one series; the
//! template variables' own queries must list the job and both instances; every recording rule
//! must evaluate to a series (the quantiles of the three histograms to a number), every rule
//! must report `health: ok`, and no alert may fire. No real Grafana runs here: what Grafana
//! would ask Prometheus is asked directly. Nothing is timed beyond bounded waits.
//!
//! Needs `prometheus` and `redis-server` (installed with apt-get when missing and running as
//! root; otherwise skipped, see `common::skip`), and builds `loadtest` if needed.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::apt::tool;
use common::redis::RedisServer;
use common::wait::poll_every;
use common::{skip, Server, TempDir};
use serde_json::Value;

/// How long the load runs (the queries are made while it runs).
const LOAD: &str = "40s";

/// Bound on waiting for each kind of data (scrapes, rate windows, rule evaluations).
const WITHIN: Duration = Duration::from_secs(40);

/// The histograms of what a user feels (their quantiles must have samples).
const HISTOGRAMS: [&str; 3] = [
    "walletrelay_publish_ack_seconds",
    "walletrelay_publish_delivery_seconds",
    "walletrelay_store_write_seconds",
];

/// What `$__rate_interval` becomes: a few scrapes of 1 s.
const RATE_INTERVAL: &str = "10s";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A child process killed (and reaped) on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `loadtest pairs` against `s`: 10 pairs, 100 publishes/s in all, for [`LOAD`].
fn load(loadtest: &Path, s: &Server) -> Killed {
    let url = format!("ws://{}/", s.addr);
    let child = Command::new(loadtest)
        .args(["pairs", "--url", &url, "--pairs", "10", "--rate", "100"])
        .args(["--duration", LOAD, "--warmup", "0s", "--drain", "1s"])
        .stdout(Stdio::null())
        .spawn()
        .expect("run loadtest");
    Killed(child)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("addr").port()
}

/// Percent-encodes `s` for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus started here, killed on drop.
struct Prometheus {
    addr: SocketAddr,
    _child: Killed,
    _dir: TempDir,
}

impl Prometheus {
    /// Scrapes `targets` (admin addresses) as job `walletrelay` every second, with rules.yml.
    fn start(bin: &Path, targets: &[SocketAddr]) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let rules = repo("deploy/prometheus/rules.yml");
        let targets: Vec<String> = targets.iter().map(|a| format!("\"{a}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - \"{}\"\n\
             scrape_configs:\n  - job_name: walletrelay\n    static_configs:\n      - targets: [{}]\n",
            rules.display(),
            targets.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run prometheus");
        let p = Prometheus {
            addr,
            _child: Killed(child),
            _dir: dir,
        };
        let ready = poll_every(Duration::from_millis(200), WITHIN, || {
            p.get("/-/ready").filter(|(status, _)| *status == 200)
        });
        assert!(ready.is_some(), "prometheus did not become ready on {addr}");
        p
    }

    /// `GET path` (HTTP/1.0: the answer is never chunked); the status and the body.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).ok()?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).ok()?;
        let (head, body) = raw.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_string()))
    }

    /// The `data` of an API answer whose status is "success".
    fn api(&self, path: &str) -> Value {
        let (status, body) = self
            .get(path)
            .unwrap_or_else(|| panic!("no answer to {path}"));
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(
            (status, v["status"].as_str()),
            (200, Some("success")),
            "{path}: {body}"
        );
        v["data"].clone()
    }

    /// The series an instant query returns.
    fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(expr)));
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

/// A panel's query as Grafana sends it with `$job` = walletrelay and `$instance` = All.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$job", "walletrelay")
        .replace("$instance", ".*")
}

/// Every panel target of the dashboard: `(panel title, expr)`.
fn panel_targets(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let panels = dash["panels"].as_array().expect("panels");
    // Rows may hold their panels when collapsed.
    let nested = panels
        .iter()
        .flat_map(|p| p["panels"].as_array().into_iter().flatten());
    for p in panels.iter().chain(nested) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            out.push((
                title,
                t["expr"].as_str().expect("a target's expr").to_string(),
            ));
        }
    }
    out
}

/// Checks the dashboard's shape: the schema, the datasource and job/instance variables,
/// every panel on `${datasource}`, the rows the issue names.
fn check_shape(dash: &Value) {
    assert!(
        dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion"
    );
    let vars = dash["templating"]["list"].as_array().expect("variables");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    assert_eq!(var("job")["type"], "query");
    assert_eq!(var("instance")["type"], "query");
    let panels = dash["panels"].as_array().expect("panels");
    let rows: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    for want in [
        "Traffic",
        "Latency",
        "Connections",
        "Store",
        "Redis",
        "Webhooks",
        "Process",
    ] {
        assert!(
            rows.iter().any(|r| r.starts_with(want)),
            "no row {want}: {rows:?}"
        );
    }
    // On Grafana's 24-column grid, no two panels overlap.
    let cells = |p: &Value| {
        let g = &p["gridPos"];
        let n = |k: &str| {
            g[k].as_u64()
                .unwrap_or_else(|| panic!("{}: gridPos.{k}", p["title"]))
        };
        (n("x"), n("y"), n("w"), n("h"))
    };
    for (i, a) in panels.iter().enumerate() {
        let (ax, ay, aw, ah) = cells(a);
        assert!(ax + aw <= 24, "{} is wider than the grid", a["title"]);
        for b in &panels[i + 1..] {
            let (bx, by, bw, bh) = cells(b);
            let apart = ax + aw <= bx || bx + bw <= ax || ay + ah <= by || by + bh <= ay;
            assert!(apart, "{} and {} overlap", a["title"], b["title"]);
        }
    }
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        }
    }
}

/// `label_values(METRIC, LABEL)` (a Grafana variable's query) through the labels API.
fn label_values(prom: &Prometheus, query: &str) -> Vec<String> {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not label_values(): {query}"));
    let (matcher, label) = inner.rsplit_once(',').expect("label_values(metric, label)");
    let path = format!(
        "/api/v1/label/{}/values?match[]={}",
        label.trim(),
        encode(&substitute(matcher.trim()))
    );
    let data = prom.api(&path);
    let values = data.as_array().cloned().unwrap_or_default();
    values
        .iter()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

#[test]
fn every_dashboard_panel_and_recording_rule_returns_series_from_a_real_prometheus() {
    let test = "every_dashboard_panel_and_recording_rule_returns_series_from_a_real_prometheus";
    let text = std::fs::read_to_string(repo("deploy/grafana/walletrelay.json")).expect("read");
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    check_shape(&dash);
    let prometheus = match tool("prometheus", "prometheus") {
        Ok(p) => p,
        Err(reason) => return skip::skip(test, &reason),
    };
    if let Err(reason) = tool("redis-server", "redis-server") {
        return skip::skip(test, &reason);
    }
    let t0 = Instant::now();
    let loadtest = common::loadtest_bin::loadtest();
    eprintln!("loadtest ready after {:?}", t0.elapsed());
    let dir = TempDir::new("dashboard-journal");
    let admin = ["--admin-listen", "127.0.0.1:0", "--threads", "2"];
    let journal = Server::start(&[&admin[..], &["--data-dir", dir.arg()]].concat());
    let redis = RedisServer::start();
    let url = redis.url();
    let clustered = Server::start(&[&admin[..], &["--redis", &url]].concat());
    let targets = [journal.admin_addr, clustered.admin_addr].map(|a| a.expect("admin address"));
    let prom = Prometheus::start(&prometheus, &targets);
    let _loads = [load(&loadtest, &journal), load(&loadtest, &clustered)];

    // Both relays scraped, and published to for a few rate windows.
    let scraped = poll_every(Duration::from_millis(500), WITHIN, || {
        let up = prom.query("sum(up{job=\"walletrelay\"})");
        let n = up.first()?["value"][1].as_str()?.parse::<f64>().ok()?;
        (n == 2.0).then_some(())
    });
    assert!(scraped.is_some(), "prometheus never scraped both relays");
    let published = poll_every(Duration::from_millis(500), WITHIN, || {
        let expr = "min(sum by (instance) (increase(walletrelay_messages_published_total[10s])))";
        let r = prom.query(expr);
        let n = r.first()?["value"][1].as_str()?.parse::<f64>().ok()?;
        (n > 0.0).then_some(())
    });
    assert!(published.is_some(), "the load never showed in the scrapes");
    eprintln!("both relays scraped under load after {:?}", t0.elapsed());

    // The variables' queries.
    let vars = dash["templating"]["list"].as_array().expect("variables");
    for v in vars.iter().filter(|v| v["type"] == "query") {
        let q = v["query"]["query"].as_str().expect("a variable's query");
        let found = poll_every(Duration::from_millis(500), WITHIN, || {
            let values = label_values(&prom, q);
            (!values.is_empty()).then_some(values)
        });
        let values = found.unwrap_or_else(|| panic!("variable {}: {q} lists nothing", v["name"]));
        if v["name"] == "instance" {
            for t in &targets {
                assert!(
                    values.contains(&t.to_string()),
                    "{q}: {values:?} misses {t}"
                );
            }
        } else {
            assert!(
                values.contains(&"walletrelay".to_string()),
                "{q}: {values:?}"
            );
        }
    }

    // Every panel target, then every recording rule: at least one series each (asked again
    // until the rate windows and the rules' first evaluations have data, within a bound).
    let rules = std::fs::read_to_string(repo("deploy/prometheus/rules.yml")).expect("rules");
    let records = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .map(|r| ("recording rule".to_string(), r.to_string()));
    let queries: Vec<(String, String)> = panel_targets(&dash).into_iter().chain(records).collect();
    assert!(queries.len() > 60, "only {} queries", queries.len());
    let deadline = Instant::now() + WITHIN;
    let mut empty = Vec::new();
    for (what, expr) in &queries {
        let expr = substitute(expr);
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        // The p50s and p99s of what a user feels must be numbers too (not NaN: samples in
        // the window), for some engine.
        let quantile = ["histogram_quantile", ":p50_", ":p99_"]
            .iter()
            .any(|q| expr.contains(q));
        let felt = quantile && HISTOGRAMS.iter().any(|h| expr.contains(h));
        let found = poll_every(Duration::from_millis(500), left, || {
            let r = prom.query(&expr);
            let finite = r.iter().any(|s| {
                let v = s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok());
                v.is_some_and(f64::is_finite)
            });
            (!r.is_empty() && (finite || !felt)).then_some(r.len())
        });
        if found.is_none() {
            empty.push(format!("{what}: {expr}"));
        }
    }
    assert!(empty.is_empty(), "no series for:\n{}", empty.join("\n"));
    eprintln!(
        "{} queries answered after {:?}",
        queries.len(),
        t0.elapsed()
    );

    // Every rule evaluated without an error.
    let data = prom.api("/api/v1/rules");
    let groups = data["groups"].as_array().cloned().unwrap_or_default();
    let all: Vec<Value> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(all.len() > 50, "{} rules loaded", all.len());
    for r in &all {
        assert_eq!(r["health"], "ok", "rule {} : {}", r["name"], r["lastError"]);
    }
    // And no alert fires on two healthy relays (pending ones are only listed).
    let alerts = prom.api("/api/v1/alerts")["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for a in &alerts {
        eprintln!("alert {}: {}", a["labels"]["alertname"], a["state"]);
    }
    let firing: Vec<&Value> = alerts.iter().filter(|a| a["state"] == "firing").collect();
    assert!(
        firing.is_empty(),
        "alerts firing on healthy relays: {firing:?}"
    );
}
