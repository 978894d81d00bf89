//! The registry from `--registry-dir`: a generated registry is served, a directory with bad
//! data stops the start naming the file and the entry, and hot reload: SIGHUP re-reads the
//! directory, and every worker answers from the new index between two requests, so a
//! registry update needs no restart. New entries appear in listings and searches with new
//! ETags (answers the workers had cached are not served again); a directory that fails to
//! load keeps the old answers and the log says why. Connections open across the reload keep
//! working.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::http::HttpConn;
use common::wait::poll;
use common::{Resp, Server, TempDir};

const WAIT: Duration = Duration::from_secs(10);

fn get(s: &Server, target: &str) -> Resp {
    s.request(&format!("GET {target} HTTP/1.1\r\nHost: t\r\n\r\n"))
}

/// A directory holding the embedded registry files.
fn registry_dir() -> TempDir {
    let dir = TempDir::new("registry-reload");
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/registry");
    for f in ["wallets.json", "dapps.json"] {
        std::fs::copy(data.join(f), dir.join(f)).unwrap();
    }
    dir
}

/// Adds a wallet named `name` at the end of `wallets.json`.
fn add_wallet(dir: &TempDir, id: &str, name: &str) {
    let entry = serde_json::json!({"id": id, "name": name, "homepage": "https://example.com/"});
    add_entry(dir, id, &entry.to_string());
}

/// Adds `"<id>": <entry>` at the end of `wallets.json`.
fn add_entry(dir: &TempDir, id: &str, entry: &str) {
    let path = dir.join("wallets.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let end = text.rfind('}').unwrap();
    let updated = format!("{},\n  \"{id}\": {entry}\n}}\n", text[..end].trim_end());
    // Written whole and renamed over the old file, as a deploy tool would.
    let tmp = dir.join("wallets.json.new");
    std::fs::write(&tmp, updated).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

/// Polls `target` until its ETag differs from `old` (bounded); returns the answer.
fn until_new_etag(s: &Server, target: &str, old: &str) -> Resp {
    let mut last = None;
    let new = poll(WAIT, || {
        let r = get(s, target);
        if r.header("ETag") != Some(old) {
            return Some(r);
        }
        last = Some(r);
        None
    });
    new.or(last).expect("asked at least once")
}

#[test]
fn sighup_serves_an_edited_registry_with_new_etags_and_keeps_it_when_broken() {
    let dir = registry_dir();
    let s = Server::start_logged(&["--threads", "2", "--registry-dir", dir.0.to_str().unwrap()]);
    let all = get(&s, "/api/v1/all");
    let (count, tag) = (
        all.json()["count"].as_u64().unwrap(),
        all.header("ETag").unwrap().to_string(),
    );
    // A search the workers cache (its answer is over the cache's minimum size).
    let search = "/api/v1/all?search=wallet";
    let before = get(&s, search);
    let before_total = before.json()["total"].as_u64().unwrap();
    assert_eq!(get(&s, search).body, before.body, "cached answer differs");
    assert_eq!(get(&s, "/api/v1/all?search=zzreloaded").json()["total"], 0);
    let mut kept = HttpConn::open(&s);
    kept.send(b"GET /api/v1/wallets?entries=1&page=1 HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(kept.response(false).status, 200);

    let id = "f".repeat(64);
    add_wallet(&dir, &id, "Zzreloaded Wallet");
    let mark = s.log().len();
    s.signal(libc::SIGHUP);
    s.wait_log(mark, "registry reloaded", WAIT)
        .expect("the reload was not logged");
    let after = until_new_etag(&s, "/api/v1/all", &tag);
    let new_tag = after.header("ETag").unwrap().to_string();
    assert_ne!(new_tag, tag, "the ETag did not change");
    assert_eq!(after.json()["count"].as_u64().unwrap(), count + 1);
    // Every worker answers from the new index (connections land on either).
    for _ in 0..20 {
        let r = get(&s, search);
        let v = r.json();
        assert_eq!(
            v["total"].as_u64().unwrap(),
            before_total + 1,
            "stale search"
        );
        assert_ne!(r.header("ETag"), before.header("ETag"));
        let hit = get(&s, "/api/v1/all?search=zzreloaded").json();
        assert_eq!(hit["total"], 1, "{hit}");
        assert_eq!(
            get(&s, "/api/v1/all").header("ETag"),
            Some(new_tag.as_str())
        );
    }
    // The old tag no longer matches; the new one does.
    let nm = s.request(&format!(
        "GET /api/v1/all HTTP/1.1\r\nHost: t\r\nIf-None-Match: {tag}\r\n\r\n"
    ));
    assert_eq!(nm.status, 200);
    let nm = s.request(&format!(
        "GET /api/v1/all HTTP/1.1\r\nHost: t\r\nIf-None-Match: {new_tag}\r\n\r\n"
    ));
    assert_eq!(nm.status, 304);
    // The connection from before the reload is served from the new index.
    kept.send(b"GET /api/v1/all HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(kept.response(false).header("ETag"), Some(new_tag.as_str()));

    // A broken file: the reload fails, says why, and the answers stay.
    std::fs::write(dir.join("dapps.json"), "{ not json").unwrap();
    let mark = s.log().len();
    s.signal(libc::SIGHUP);
    let line = s
        .wait_log(mark, "registry not reloaded", WAIT)
        .expect("the failed reload was not logged");
    assert!(line.contains("dapps.json"), "{line}");
    for _ in 0..10 {
        let r = get(&s, "/api/v1/all");
        assert_eq!(r.header("ETag"), Some(new_tag.as_str()));
        assert_eq!(r.json()["count"].as_u64().unwrap(), count + 1);
    }
    // An entry without a name: the message names the file and the entry.
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/registry/dapps.json"),
        dir.join("dapps.json"),
    )
    .unwrap();
    let nameless = "e".repeat(64);
    add_entry(&dir, &nameless, &format!("{{\"id\": \"{nameless}\"}}"));
    let mark = s.log().len();
    s.signal(libc::SIGHUP);
    let line = s
        .wait_log(mark, "registry not reloaded", WAIT)
        .expect("the failed reload was not logged");
    assert!(
        line.contains("wallets.json") && line.contains(&nameless),
        "{line}"
    );
    assert_eq!(
        get(&s, "/api/v1/all").header("ETag"),
        Some(new_tag.as_str())
    );
    kept.send(b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(kept.response(false).status, 200);
}

#[test]
fn sighup_without_registry_dir_or_tls_changes_nothing() {
    let s = Server::start_logged(&["--threads", "1"]);
    let tag = get(&s, "/api/v1/all").header("ETag").unwrap().to_string();
    let mark = s.log().len();
    s.signal(libc::SIGHUP);
    s.wait_log(mark, "SIGHUP", WAIT).expect("SIGHUP not logged");
    s.assert_serving("SIGHUP");
    assert_eq!(get(&s, "/api/v1/all").header("ETag"), Some(tag.as_str()));
}

// ------------------------------------------------------------------------------------------
// Loading at start

#[test]
fn registry_dir_serves_a_generated_registry() {
    let dir = TempDir::new("gen");
    let out = Command::new(env!("CARGO_BIN_EXE_registry-gen"))
        .args(["--entries", "2000", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = Server::start(&["--registry-dir", dir.arg()]);
    let all = get(&s, "/api/v1/all").json();
    assert_eq!(all["count"], 2000);
    let w = get(&s, "/api/v1/wallets").json()["count"].as_u64().unwrap();
    let d = get(&s, "/api/v1/dapps").json()["count"].as_u64().unwrap();
    assert_eq!(w + d - 2000, 2000 * 6 / 245, "hybrids counted once in /all");
    let page = get(&s, "/api/v1/all?search=wallet&entries=50&page=2").json();
    assert!(page["total"].as_u64().unwrap() > 50);
    assert_eq!(page["count"], 50);
}

/// Runs the server expecting it to refuse to start; returns its stderr.
fn refuses_to_start(dir: &std::path::Path) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "none",
            "--registry-dir",
        ])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let Some(status) = poll(Duration::from_secs(20), || child.try_wait().unwrap()) else {
        let _ = child.kill();
        panic!("server started on bad data");
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(!out.contains("listening"), "it must not listen: {out}");
    assert!(!status.success());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    err
}

#[test]
fn registry_dir_with_bad_data_stops_the_start_naming_file_and_entry() {
    let dir = TempDir::new("bad");
    let good_w = r#"{"w1":{"id":"w1","name":"W"}}"#;
    let cases: [(&str, &str, &[&str]); 5] = [
        (
            good_w,
            r#"{"d1":{"id":"d1","name":"D"},"d2":{"id":"d2"}}"#,
            &["dapps.json", "d2", "name"],
        ),
        (
            r#"{"w1":{"name":"W"}}"#,
            "{}",
            &["wallets.json", "w1", "id"],
        ),
        (
            r#"{"w1":{"id":"w2","name":"W"}}"#,
            "{}",
            &["wallets.json", "w1", "w2"],
        ),
        (good_w, "{\"d1\": {", &["dapps.json", "line"]),
        (
            r#"{"w1":{"id":"w1","name":7}}"#,
            "{}",
            &["wallets.json", "w1", "name"],
        ),
    ];
    for (w, d, want) in cases {
        std::fs::write(dir.join("wallets.json"), w).unwrap();
        std::fs::write(dir.join("dapps.json"), d).unwrap();
        let err = refuses_to_start(dir.path());
        for needle in want {
            assert!(err.contains(needle), "{needle:?} not in: {err}");
        }
    }
    std::fs::remove_file(dir.join("dapps.json")).unwrap();
    let err = refuses_to_start(dir.path());
    assert!(err.contains("dapps.json"), "{err}");
}
