//! Hot registry reload: SIGHUP re-reads `--registry-dir`, and every worker answers from
//! the new index between two requests, so a registry update needs no restart. New
//! entries appear in listings and searches with new ETags (answers the workers had cached
//! are not served again); a directory that fails to load keeps the old answers and the
//! log says why. Connections open across the reload keep working.

mod common;

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
