//! A worker's cache of verified tokens, so a client reconnecting with the same JWT (the SDK
//! keeps one for a day) skips the signature check. One per worker thread, no locks. Owns only
//! the map and its bound; verification is [`super::verify`]'s.
//!
//! Keyed by the SHA-256 of the token bytes (a client cannot choose collisions); holds the
//! client id and the claims a hit must still check (`iat`, `exp`, `aud`), so a hit answers
//! exactly what [`super::verify`] would answer now with the current config. Only successes
//! are cached. Bounded: when full, the entry inserted first is dropped (FIFO; an expired entry
//! stays until its turn, refusing its token meanwhile).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ring::digest::{digest, SHA256};

use super::jwt::{check_claims, verify_full, AuthError, MAX_TOKEN_LEN};
use super::{AuthConfig, ClientKey};

/// Entries a cache holds by default: some 4096 * ~100 bytes (an entry, its key twice, the
/// client's shared key).
pub const DEFAULT_CAPACITY: usize = 4096;

/// A cached verified token.
#[derive(Debug)]
struct Entry {
    /// Shared by every connection of the token.
    client: Arc<ClientKey>,
    iat: u64,
    exp: u64,
    /// The token's `aud`, kept only when audiences are checked (a hit with audiences
    /// configured and none kept verifies in full).
    aud: Option<Box<str>>,
}

/// The bounded per-worker cache of verified tokens.
#[derive(Debug)]
pub struct TokenCache {
    map: HashMap<Key, Entry>,
    /// Keys in insertion order, each exactly once: the eviction order.
    order: VecDeque<Key>,
    capacity: usize,
    /// Full verifications run (misses that reached [`super::verify`]).
    verifications: u64,
}

impl Default for TokenCache {
    fn default() -> Self {
        TokenCache::new(DEFAULT_CAPACITY)
    }
}

impl TokenCache {
    /// A cache of at most `capacity` tokens (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        TokenCache {
            map: HashMap::with_capacity(capacity.min(DEFAULT_CAPACITY)),
            order: VecDeque::with_capacity(capacity.min(DEFAULT_CAPACITY)),
            capacity,
            verifications: 0,
        }
    }

    /// The client id of `token` at `now` (Unix seconds): from the cache when this worker has
    /// verified the token before (expiry, `iat` and audience are checked again), else by
    /// [`super::verify`], caching a success.
    pub fn check(
        &mut self,
        token: &str,
        now: u64,
        cfg: &AuthConfig,
    ) -> Result<Arc<ClientKey>, AuthError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(AuthError::TooLong);
        }
        let key = key_of(token);
        if let Some(e) = self.map.get(&key) {
            let aud = match (&e.aud, cfg.audiences.is_empty()) {
                (Some(a), _) => Some(&**a),
                (None, true) => Some(""),
                (None, false) => None,
            };
            if let Some(aud) = aud {
                check_claims(e.iat, e.exp, aud, now, cfg)?;
                return Ok(Arc::clone(&e.client));
            }
        }
        self.verifications = self.verifications.wrapping_add(1);
        let v = verify_full(token, now, cfg)?;
        while self.map.len() >= self.capacity {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.map.remove(&old);
        }
        let client = Arc::new(ClientKey(v.key));
        let aud = (!cfg.audiences.is_empty()).then_some(v.aud);
        let entry = Entry {
            client: Arc::clone(&client),
            iat: v.iat,
            exp: v.claims.exp,
            aud,
        };
        if self.map.insert(key, entry).is_none() {
            self.order.push_back(key);
        }
        Ok(client)
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Full verifications run so far (cache misses that got as far as [`super::verify`]).
    pub fn verifications(&self) -> u64 {
        self.verifications
    }
}

/// The SHA-256 of the token bytes.
/// A token's key in the cache: the first 128 bits of its SHA-256 (a second token with the
/// same key would need a second preimage of them).
type Key = [u8; 16];

fn key_of(token: &str) -> Key {
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest(&SHA256, token.as_bytes()).as_ref()[..16]);
    key
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::test_signer::Signer;
    use super::super::tests::{cfg, vectors, with_aud, OTHER_AUD, SDK_AUD};
    use super::super::verify;
    use super::*;

    #[test]
    fn cache_hit_skips_verification_and_shares_the_client_id() {
        let v = vectors();
        let mut c = TokenCache::default();
        let now = v.valid.iat;
        let a = c.check(&v.valid.token, now, &cfg()).unwrap();
        let b = c.check(&v.valid.token, now + 60, &cfg()).unwrap();
        assert_eq!(c.verifications(), 1);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.did(), v.iss);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn cached_token_still_expires_and_checks_the_audience() {
        let v = vectors();
        let mut c = TokenCache::default();
        assert!(c.check(&v.valid.token, v.valid.iat, &cfg()).is_ok());
        assert!(c.check(&v.valid.token, v.valid.exp + 120, &cfg()).is_ok());
        assert_eq!(
            c.check(&v.valid.token, v.valid.exp + 121, &cfg()),
            Err(AuthError::Expired)
        );
        assert_eq!(
            c.check(&v.valid.token, v.valid.iat, &with_aud(&[OTHER_AUD])),
            Err(AuthError::Audience)
        );
        // Cached without audiences: a check with audiences verifies in full.
        assert_eq!(c.verifications(), 2);
        // A hit answers what verify answers.
        for now in [0, v.valid.iat - 121, v.valid.iat, v.valid.exp + 121] {
            for cfg in [cfg(), with_aud(&[SDK_AUD]), with_aud(&[OTHER_AUD])] {
                let hit = c.check(&v.valid.token, now, &cfg).map(|id| id.did());
                let fresh = verify(&v.valid.token, now, &cfg).map(|cl| cl.client_id.to_string());
                assert_eq!(hit, fresh, "now {now}");
            }
        }
    }

    #[test]
    fn failures_are_not_cached() {
        let v = vectors();
        let mut c = TokenCache::default();
        for _ in 0..3 {
            assert_eq!(
                c.check(&v.expired.token, v.valid.iat, &cfg()),
                Err(AuthError::Expired)
            );
        }
        assert_eq!(c.verifications(), 3);
        assert!(c.is_empty());
        let big = "A".repeat(MAX_TOKEN_LEN + 1);
        assert_eq!(c.check(&big, 0, &cfg()), Err(AuthError::TooLong));
        assert_eq!(c.verifications(), 3);
    }

    #[test]
    fn cache_is_bounded_and_evicts_the_oldest() {
        let s = Signer::random();
        let tokens: Vec<String> = (0..10)
            .map(|i| s.sign(&format!("{i}"), "a", 100, 200))
            .collect();
        let mut c = TokenCache::new(4);
        for t in &tokens {
            c.check(t, 150, &cfg()).unwrap();
            assert!(c.len() <= 4);
        }
        assert_eq!(c.len(), 4);
        assert_eq!(c.verifications(), 10);
        // The last four are cached, the first six were evicted.
        for t in &tokens[6..] {
            c.check(t, 150, &cfg()).unwrap();
        }
        assert_eq!(c.verifications(), 10);
        c.check(&tokens[0], 150, &cfg()).unwrap();
        assert_eq!(c.verifications(), 11);
        assert_eq!(c.len(), 4);
        // Expired entries stay until their turn (refusing), never growing the cache.
        for (i, t) in tokens.iter().enumerate() {
            let r = c.check(t, 1_000, &cfg());
            assert_eq!(r, Err(AuthError::Expired), "{i}");
            assert!(c.len() <= 4);
        }
        let mut tiny = TokenCache::new(0);
        tiny.check(&tokens[0], 150, &cfg()).unwrap();
        tiny.check(&tokens[1], 150, &cfg()).unwrap();
        assert_eq!(tiny.len(), 1);
    }
}
