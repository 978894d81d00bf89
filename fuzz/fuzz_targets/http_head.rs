//! `http::parse` on arbitrary bytes with the default `Limits`: no panic, and the answer is
//! consistent: a complete request never claims more bytes than it was given nor a body
//! over the limit, its prefixes are "incomplete" (never "invalid"), and an incomplete
//! buffer never exceeds the head limit.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use walletrelay::config::Limits;
use walletrelay::http::{self, route};

static LIMITS: OnceLock<Limits> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let limits = LIMITS.get_or_init(Limits::default);
    match http::parse(data, limits) {
        Ok(Some((n, req))) => {
            assert!(n > 0 && n <= data.len());
            assert!(req.body.len() <= limits.max_body);
            assert!(req.path.starts_with('/') || req.path == "*");
            assert!(!req.path.contains('?'));
            let _ = route(req.method, req.path, true);
            // The same request cut short by one byte is "need more", not an error.
            assert!(
                matches!(http::parse(&data[..n - 1], limits), Ok(None)),
                "a prefix of a complete request was not incomplete"
            );
        }
        Ok(None) => assert!(data.len() <= limits.max_head + limits.max_body),
        Err(e) => {
            let s = e.status();
            assert!((400..=505).contains(&s));
        }
    }
});
