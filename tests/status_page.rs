//! The status page on the admin address (`GET /status`, `src/admin/status.html`) in a real
//! browser: Debian's `chromium`, headless, driven over the DevTools protocol (a WebSocket to
//! its `--remote-debugging-port`), loads the page from a real relay (the journal engine) that
//! holds a few WebSockets and relays a steady trickle of publishes. What the page shows (each
//! figure's `data-value`) must match the relay's own `/metrics`: the connections and topics,
//! a non-zero publishes/s, the version, the engine, the ready state, the p99s of the three
//! histograms within their buckets; after `POST /drain` it must say "draining". A screenshot
//! goes to `target/status-page.png` (docs/status-page.png is a copy: docs/OBSERVABILITY.md
//! says how it is made). Also: the page is self-contained (no URL of another origin, a CSP
//! that allows none).
//!
//! Needs `chromium` (installed with apt-get when missing and running as root; otherwise
//! skipped, see `common::skip`).

mod common;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::apt::tool;
use common::http::{get, HttpConn};
use common::metrics::sum;
use common::wait::poll_every;
use common::{skip, topic, Server, TempDir, Ws};
use serde_json::{json, Value};

/// Bound on each wait (the browser starting, the page showing what is asked).
const WITHIN: Duration = Duration::from_secs(30);

const PAGE: &str = include_str!("../src/admin/status.html");

#[test]
fn the_status_page_is_self_contained() {
    for needle in ["http://", "https://", "src=", "<link", "@import", "url("] {
        assert!(!PAGE.contains(needle), "status.html has `{needle}`");
    }
    assert!(
        PAGE.contains("Content-Security-Policy"),
        "no CSP in status.html"
    );
    assert!(
        PAGE.contains("default-src 'self'"),
        "the CSP allows other origins"
    );
}

/// Chromium, killed on drop, with its own profile directory.
struct Browser {
    child: Child,
    _profile: TempDir,
    /// The DevTools port.
    port: u16,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Chromium headless on `url`, its DevTools on a port it picks (read back from its
    /// profile's `DevToolsActivePort`).
    fn open(bin: &Path, url: &str) -> Browser {
        let profile = TempDir::new("chromium");
        let child = Command::new(bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--window-size=1100,640",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.arg()))
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run chromium");
        let file = profile.join("DevToolsActivePort");
        let port = poll_every(Duration::from_millis(100), WITHIN, || {
            let text = std::fs::read_to_string(&file).ok()?;
            text.lines().next()?.trim().parse::<u16>().ok()
        })
        .expect("chromium wrote no DevToolsActivePort");
        Browser {
            child,
            _profile: profile,
            port,
        }
    }

    /// The DevTools WebSocket URL of the page showing `url`.
    fn page(&self, url: &str) -> String {
        poll_every(Duration::from_millis(100), WITHIN, || {
            // HTTP/1.1 (it ignores 1.0), answered by Content-Length on a connection it keeps.
            let sock = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
            let mut c = HttpConn::new(sock);
            // The URLs it answers are built from the Host header: it must name the port.
            let port = self.port;
            c.send(format!("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes());
            let list: Value = serde_json::from_slice(&c.response(false).body).ok()?;
            let page = list.as_array()?.iter().find(|t| t["url"] == url)?;
            Some(page["webSocketDebuggerUrl"].as_str()?.to_string())
        })
        .unwrap_or_else(|| panic!("chromium shows no page {url}"))
    }
}

/// A DevTools session on one page.
struct DevTools {
    ws: tungstenite::WebSocket<TcpStream>,
    next: u64,
}

impl DevTools {
    fn connect(url: &str) -> DevTools {
        let host = url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .expect("a ws:// URL");
        let sock = TcpStream::connect(host).expect("connect to DevTools");
        sock.set_read_timeout(Some(WITHIN)).expect("timeout");
        let (ws, _) = tungstenite::client(url, sock).expect("DevTools handshake");
        DevTools { ws, next: 1 }
    }

    /// Calls `method`; its `result` (events on the way are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let req = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(tungstenite::Message::text(req)).expect("send");
        loop {
            let msg = self.ws.read().expect("a DevTools answer");
            let Ok(text) = msg.to_text() else { continue };
            let v: Value = serde_json::from_str(text).expect("DevTools JSON");
            if v["id"] == id {
                assert!(v["error"].is_null(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The page's figures: each element id with its `data-value` and text.
    fn figures(&mut self) -> Value {
        let js = "JSON.stringify(Object.fromEntries([...document.querySelectorAll('[id]')]\
                  .map(e => [e.id, {value: e.dataset.value ?? null, text: e.textContent}])))";
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": js, "returnByValue": true}),
        );
        let text = r["result"]["value"].as_str().unwrap_or("{}");
        serde_json::from_str(text).expect("figures JSON")
    }
}

/// The number in `figures[id].value`, if any.
fn number(figures: &Value, id: &str) -> Option<f64> {
    figures[id]["value"].as_str()?.parse().ok()
}

/// Publishes on `publ` to a topic `sub` reads, about every 20 ms, until `stop`.
fn trickle(mut publ: Ws, mut sub: Ws, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let t = topic();
        sub.subscribe(&t);
        let mut i = 0u32;
        while !stop.load(Ordering::Relaxed) {
            publ.publish(&t, &format!("{i:08x}"));
            let _ = sub.next_push();
            i += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

#[test]
fn the_status_page_shows_what_metrics_says_in_a_real_browser() {
    let test = "the_status_page_shows_what_metrics_says_in_a_real_browser";
    let chromium = match tool("chromium", "chromium") {
        Ok(p) => p,
        Err(reason) => return skip::skip(test, &reason),
    };
    let dir = TempDir::new("status-page");
    let s = Server::start(&[
        "--admin-listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--drain",
        "60",
        "--data-dir",
        dir.arg(),
    ]);
    let admin = s.admin_addr.expect("admin address");
    // Four WebSockets: two idle subscribers and a publisher with its reader.
    let mut idle = [s.ws(), s.ws()];
    for ws in &mut idle {
        ws.subscribe(&topic());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = trickle(s.ws(), s.ws(), stop.clone());

    let url = format!("http://{admin}/status");
    let browser = Browser::open(&chromium, &url);
    let mut dt = DevTools::connect(&browser.page(&url));
    let metrics = || s.admin_request(&get("/metrics")).body_str().to_string();

    // Until the page has two polls with traffic between them (a rate and p99s).
    let shown = poll_every(Duration::from_millis(500), WITHIN, || {
        let f = dt.figures();
        let ok = number(&f, "publishes").is_some_and(|p| p > 0.0)
            && number(&f, "n-store").is_some_and(|n| n > 0.0);
        ok.then_some(f)
    });
    let f = shown.unwrap_or_else(|| panic!("the page never showed publishes: {}", dt.figures()));
    let text = metrics();
    assert_eq!(
        number(&f, "connections"),
        Some(sum(&text, "walletrelay_connections_open"))
    );
    assert_eq!(number(&f, "connections"), Some(4.0), "{f}");
    assert_eq!(
        number(&f, "topics"),
        Some(sum(&text, "walletrelay_topics")),
        "{f}"
    );
    assert_eq!(f["ready"]["value"], "ready", "{f}");
    assert_eq!(f["health"]["value"], "true", "{f}");
    assert_eq!(f["engine"]["value"], "journal", "{f}");
    assert_eq!(f["version"]["value"], env!("CARGO_PKG_VERSION"), "{f}");
    // The p99s of the three histograms: a value within their buckets (50 µs .. 5 s).
    for id in ["p99-ack", "p99-delivery", "p99-store"] {
        let v = number(&f, id).unwrap_or_else(|| panic!("{id} shows no p99: {f}"));
        assert!(v > 0.0 && v <= 5.0, "{id} = {v}");
    }

    let png = dt.call("Page.captureScreenshot", json!({"format": "png"}));
    let data = png["data"].as_str().expect("screenshot data");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("base64");
    assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
    let shot = target_dir().join("status-page.png");
    std::fs::write(&shot, &bytes).expect("write the screenshot");
    eprintln!("screenshot: {}", shot.display());

    // The drain: the page says so.
    let r = s.admin_request("POST /drain HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(r.status, 202);
    let draining = poll_every(Duration::from_millis(300), WITHIN, || {
        (dt.figures()["ready"]["value"] == "draining").then_some(())
    });
    assert!(
        draining.is_some(),
        "the page never showed the drain: {}",
        dt.figures()
    );
    stop.store(true, Ordering::Relaxed);
    let _ = traffic.join();
}
