//! The registry's query handling: a synthetic `GET /api/v1/<input> HTTP/1.1` head goes
//! through `http::parse` and, when it parses and routes to the registry, through
//! `Registry::respond`. Generic on purpose: it only needs `load(None, base)` and
//! `respond(&Request)`, whatever the registry module grows into.
//!
//! Input layout: byte 0 picks optional headers (gzip, If-None-Match, HEAD); the rest is
//! the path-and-query after `/api/v1/`.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use walletrelay::config::Limits;
use walletrelay::http::{self, Method, Route};
use walletrelay::outbuf::OutBuf;
use walletrelay::registry::Registry;

static STATE: OnceLock<(Registry, Limits)> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let (registry, limits) = STATE.get_or_init(|| {
        let r = Registry::load(None, "https://x").expect("the embedded registry loads");
        (r, Limits::default())
    });
    let Some((&flags, target)) = data.split_first() else {
        return;
    };
    let mut raw = Vec::with_capacity(target.len() + 128);
    raw.extend_from_slice(if flags & 4 != 0 { b"HEAD" } else { b"GET" });
    raw.extend_from_slice(b" /api/v1/");
    raw.extend_from_slice(target);
    raw.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\n");
    if flags & 1 != 0 {
        raw.extend_from_slice(b"Accept-Encoding: gzip\r\n");
    }
    if flags & 2 != 0 {
        raw.extend_from_slice(b"If-None-Match: \"");
        raw.extend_from_slice(&target[..target.len().min(40)]);
        raw.extend_from_slice(b"\"\r\n");
    }
    raw.extend_from_slice(b"\r\n");
    let Ok(Some((_, req))) = http::parse(&raw, limits) else {
        return;
    };
    if http::route(req.method, req.path, false) != Route::Registry {
        return;
    }
    let resp = registry.respond(&req);
    assert!((200..600).contains(&resp.status), "status {}", resp.status);
    let mut out = OutBuf::default();
    let head_only = req.method == Method::Head;
    http::response::write(
        &mut out,
        &resp,
        b"Thu, 01 Jan 1970 00:00:00 GMT",
        head_only,
        false,
    );
    assert!(!out.is_empty());
});
