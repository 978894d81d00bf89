//! What the server process sets for its own memory at start: transparent huge pages are off
//! unless `--huge-pages` is given, so a growing message cache is backed by 4 KiB pages
//! (a 2 MB page is cleared whole on first touch, stalling the worker that faults it).

mod common;

use common::skip::skip;
use common::{proc_field, topic, Server};

/// Why a test here cannot run on this kernel.
const NO_THP_FIELD: &str = "this kernel reports no THP_enabled in /proc/<pid>/status";

/// Fills the server's message cache with about `mib` MiB of distinct 1 KiB messages over
/// 64 topics, 256 publishes in flight at a time.
fn fill_cache(server: &Server, mib: usize) {
    let mut ws = server.ws();
    let topics: Vec<String> = (0..64).map(|_| topic()).collect();
    let body = "ab".repeat(500);
    let mut id = 1_000_000u64;
    for _ in 0..mib * 4 {
        for _ in 0..256 {
            id += 1;
            ws.send(&serde_json::json!({"id": id, "jsonrpc": "2.0", "method": "waku_publish",
                "params": {"topic": topics[id as usize % 64], "message": format!("{id}{body}"), "ttl": 21600}}));
        }
        for _ in 0..256 {
            let r = ws.recv();
            assert_eq!(r["result"], true, "publish failed: {r}");
        }
    }
}

#[test]
fn huge_pages_are_off_by_default_and_the_cache_grows_on_small_pages() {
    let server = Server::start(&["--threads", "1"]);
    let pid = server.child.id();
    let Some(enabled) = proc_field(pid, "status", "THP_enabled:") else {
        skip(
            "huge_pages_are_off_by_default_and_the_cache_grows_on_small_pages",
            NO_THP_FIELD,
        );
        return;
    };
    assert_eq!(enabled, 0, "THP_enabled of the server process");
    // Memory touched before `main` turned them off (the allocator's first arenas) may sit
    // on a few; what the cache adds must not.
    let huge = || proc_field(pid, "smaps_rollup", "AnonHugePages:").expect("AnonHugePages");
    let before = huge();
    fill_cache(&server, 48);
    let after = huge();
    eprintln!("huge pages: {before} kB at start, {after} kB after caching 48 MiB");
    assert!(
        after <= before,
        "kB of anonymous huge pages: {before} at start, {after} after caching 48 MiB"
    );
}

#[test]
fn huge_pages_flag_leaves_them_to_the_system_setting() {
    let test = "huge_pages_flag_leaves_them_to_the_system_setting";
    if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
        skip(test, "this kernel has no transparent huge pages");
        return;
    }
    let server = Server::start(&["--threads", "1", "--huge-pages"]);
    let pid = server.child.id();
    let Some(enabled) = proc_field(pid, "status", "THP_enabled:") else {
        skip(test, NO_THP_FIELD);
        return;
    };
    assert_eq!(
        enabled, 1,
        "THP_enabled of the server process with --huge-pages"
    );
}
