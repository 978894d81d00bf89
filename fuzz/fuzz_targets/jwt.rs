//! Relay auth on hostile input: `auth::verify` (directly and through a `TokenCache`) over an
//! arbitrary token, and `UpgradeAuth::from_request` over an arbitrary query and
//! `Authorization` value.
//!
//! Checks, besides "no panic": a token longer than the cap is refused as too long before
//! anything else; an accepted token verifies again to identical claims, its client id is a
//! `did:key`, a token accepted with an audience list is accepted without one, and the cache
//! answers what `verify` answers, on its miss and on its hit (sharing the client id); every
//! refusal's reason is its `Display`; the upgrade parse is deterministic, never yields an
//! empty token, and its token goes through `verify` too.
//!
//! Input layout: byte 0 picks the clock (low 3 bits, a table around the committed SDK
//! vector's window) and whether the rest is an upgrade request (bit 3: query, then `\n`,
//! then the header value) or a token (taken as UTF-8, else lossily).
#![no_main]

use libfuzzer_sys::fuzz_target;
use walletrelay::auth::{self, AuthConfig, AuthError, TokenCache, UpgradeAuth};

/// Clocks: inside the SDK vector's window (iat 1_700_000_000, exp +86400), at its edges
/// with and without the leeway, and the extremes.
const NOWS: [u64; 8] = [
    1_700_000_000,
    1_700_043_200,
    1_699_999_880,
    1_699_999_879,
    1_700_086_520,
    1_700_086_521,
    0,
    u64::MAX,
];

fn check_token(token: &str, now: u64) {
    let open = AuthConfig::default();
    let strict = AuthConfig {
        audiences: vec!["wss://relay.walletconnect.org".to_owned()],
        ..AuthConfig::default()
    };
    let got = auth::verify(token, now, &open);
    if token.len() > auth::MAX_TOKEN_LEN {
        assert_eq!(got, Err(AuthError::TooLong));
        return;
    }
    let got_strict = auth::verify(token, now, &strict);
    if got_strict.is_ok() {
        assert_eq!(got_strict, got, "an audience list only narrows");
    }
    match &got {
        Ok(claims) => {
            assert!(claims.client_id.starts_with("did:key:z"));
            assert_eq!(auth::verify(token, now, &open).as_ref(), Ok(claims));
        }
        Err(e) => assert_eq!(e.to_string(), e.reason()),
    }
    let mut cache = TokenCache::new(2);
    for (i, cfg) in [&open, &open, &strict].into_iter().enumerate() {
        let cached = cache.check(token, now, cfg).map(|k| k.did());
        let direct = auth::verify(token, now, cfg).map(|c| c.client_id.to_string());
        assert_eq!(cached, direct);
        if i == 1 && got.is_ok() {
            assert_eq!(cache.verifications(), 1, "the second check was a hit");
        }
    }
    if got.is_ok() {
        let a = cache.check(token, now, &open);
        let b = cache.check(token, now, &open);
        if let (Ok(a), Ok(b)) = (a, b) {
            assert!(std::sync::Arc::ptr_eq(&a, &b));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let now = NOWS[usize::from(flags & 7)];
    if flags & 8 != 0 {
        let (query, header) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        let query = String::from_utf8_lossy(query);
        let u = UpgradeAuth::from_request(&query, header);
        assert_eq!(u, UpgradeAuth::from_request(&query, header));
        if let Some(t) = &u.token {
            assert!(!t.is_empty());
            check_token(t, now);
        }
        return;
    }
    match std::str::from_utf8(rest) {
        Ok(token) => check_token(token, now),
        Err(_) => check_token(&String::from_utf8_lossy(rest), now),
    }
});
