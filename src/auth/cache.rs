//! A worker's cache of verified tokens, so a client reconnecting with the same JWT (the SDK
//! keeps one for a day) skips the signature check. One per worker thread, no locks. Owns only
//! the map and its bound; verification is [`super::verify`]'s.
//!
//! Keyed by the SHA-256 of the token bytes (a client cannot choose collisions); holds the
//! client id and the claims a hit must still check (`iat`, `exp`, `aud`), so a hit answers
//! exactly what [`super::verify`] would answer now with the current config. Only successes
//! are cached. Bounded: when full, the entry inserted first is dropped (FIFO; an expired entry
//! stays until its turn, refusing its token meanwhile).
//!
//! A worker may also queue the misses of one round ([`TokenCache::check_or_queue`]) and
//! verify them together at its end ([`TokenCache::settle`]): one Ed25519 batch equation for
//! the whole queue, each token on its own only when the batch fails. The connections then
//! ask again and hit the cache (or the round's refusals). What each token is answered is what
//! [`super::verify`] answers, in the same order of checks.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ring::digest::{digest, SHA256};

use super::jwt::{self, check_claims, claims_of, verify_full, AuthError, Verified, MAX_TOKEN_LEN};
use super::{AuthConfig, ClientKey};

/// Entries a cache holds by default: some 4096 * ~100 bytes (an entry, its key twice, the
/// client's shared key).
pub const DEFAULT_CAPACITY: usize = 4096;

/// Tokens verified in one batch at most: one invalid token makes at most this many single
/// checks.
pub const MAX_BATCH: usize = 64;

/// Tokens queued in one round at most (in batches of [`MAX_BATCH`]); more are verified as
/// they come. Well under [`DEFAULT_CAPACITY`], so a settled token is still cached when its
/// connection asks again.
pub const MAX_QUEUE: usize = 1024;

/// What [`TokenCache::check_or_queue`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The answer, now.
    Done(Result<Arc<ClientKey>, AuthError>),
    /// Queued: ask again after [`TokenCache::settle`].
    Queued,
}

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
    /// Misses of this round, to verify in [`TokenCache::settle`] (key, token).
    queue: Vec<(Key, Box<str>)>,
    /// What the last [`TokenCache::settle`] refused, until the next one: the answer of the
    /// connections that asked again.
    refused: HashMap<Key, AuthError>,
    /// Batches run, and the tokens in them.
    batches: (u64, u64),
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
            queue: Vec::new(),
            refused: HashMap::new(),
            batches: (0, 0),
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
        if let Some(hit) = self.hit(&key, now, cfg) {
            return hit;
        }
        self.verifications = self.verifications.wrapping_add(1);
        let v = verify_full(token, now, cfg)?;
        Ok(self.insert(key, v, cfg))
    }

    /// [`TokenCache::check`], but a miss is queued for the round's [`TokenCache::settle`]
    /// instead of verified now (unless the queue is full). A token refused by the last
    /// settle is answered its refusal.
    pub fn check_or_queue(&mut self, token: &str, now: u64, cfg: &AuthConfig) -> Check {
        if token.len() > MAX_TOKEN_LEN {
            return Check::Done(Err(AuthError::TooLong));
        }
        let key = key_of(token);
        if let Some(hit) = self.hit(&key, now, cfg) {
            return Check::Done(hit);
        }
        if let Some(e) = self.refused.get(&key) {
            return Check::Done(Err(*e));
        }
        if self.queue.iter().any(|(k, _)| *k == key) {
            return Check::Queued;
        }
        if self.queue.len() >= MAX_QUEUE.min(self.capacity / 2) {
            return Check::Done(self.check(token, now, cfg));
        }
        self.queue.push((key, token.into()));
        Check::Queued
    }

    /// True when tokens wait for [`TokenCache::settle`].
    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Verifies the queued tokens at `now`: the signatures in batches of [`MAX_BATCH`]
    /// (each on its own if its batch fails, or if it is alone), then the claims; caches the
    /// valid ones and keeps the refusals until the next settle.
    pub fn settle(&mut self, now: u64, cfg: &AuthConfig) {
        self.refused.clear();
        let mut queue = std::mem::take(&mut self.queue);
        for batch in queue.chunks(MAX_BATCH) {
            self.settle_batch(batch, now, cfg);
        }
        queue.clear();
        self.queue = queue;
    }

    fn settle_batch(&mut self, batch: &[(Key, Box<str>)], now: u64, cfg: &AuthConfig) {
        let mut parsed = Vec::with_capacity(batch.len());
        for (key, token) in batch {
            self.verifications = self.verifications.wrapping_add(1);
            match jwt::parse(token) {
                Ok(p) => parsed.push((*key, &**token, p)),
                Err(e) => {
                    self.refused.insert(*key, e);
                }
            }
        }
        let all_ok = parsed.len() > 1 && {
            let items: Vec<(&str, &jwt::Parsed)> = parsed.iter().map(|(_, t, p)| (*t, p)).collect();
            self.batches.0 += 1;
            self.batches.1 += items.len() as u64;
            jwt::batch_ok(&items)
        };
        for (key, token, p) in parsed {
            if !all_ok && !p.signature_ok(token) {
                self.refused.insert(key, AuthError::Signature);
                continue;
            }
            match claims_of(&p.payload, p.key, now, cfg) {
                Ok(v) => {
                    self.insert(key, v, cfg);
                }
                Err(e) => {
                    self.refused.insert(key, e);
                }
            }
        }
    }

    /// Batches run by [`TokenCache::settle`], and the tokens they held.
    pub fn batches(&self) -> (u64, u64) {
        self.batches
    }

    /// The answer of a cached token at `now`, if this config lets the entry answer.
    fn hit(
        &self,
        key: &Key,
        now: u64,
        cfg: &AuthConfig,
    ) -> Option<Result<Arc<ClientKey>, AuthError>> {
        let e = self.map.get(key)?;
        let aud = match (&e.aud, cfg.audiences.is_empty()) {
            (Some(a), _) => &**a,
            (None, true) => "",
            (None, false) => return None,
        };
        Some(check_claims(e.iat, e.exp, aud, now, cfg).map(|()| Arc::clone(&e.client)))
    }

    fn insert(&mut self, key: Key, v: Verified, cfg: &AuthConfig) -> Arc<ClientKey> {
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
        client
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

    /// Asks until the answer is not `Queued`, settling in between (what a worker does).
    fn ask(
        c: &mut TokenCache,
        token: &str,
        now: u64,
        cfg: &AuthConfig,
    ) -> Result<String, AuthError> {
        match c.check_or_queue(token, now, cfg) {
            Check::Done(r) => r.map(|id| id.did()),
            Check::Queued => {
                c.settle(now, cfg);
                match c.check_or_queue(token, now, cfg) {
                    Check::Done(r) => r.map(|id| id.did()),
                    Check::Queued => panic!("queued again after settle"),
                }
            }
        }
    }

    #[test]
    fn queued_tokens_are_answered_what_verify_answers() {
        let v = vectors();
        let signers: Vec<Signer> = (0..20).map(|_| Signer::random()).collect();
        let now = 1_000_000;
        let mut tokens: Vec<String> = signers
            .iter()
            .map(|s| s.sign("sub", SDK_AUD, now, now + 3_600))
            .collect();
        let mut forged = signers[3].sign("other", SDK_AUD, now, now + 3_600);
        forged.replace_range(forged.len() - 4.., "AAAA");
        tokens.push(forged);
        // Expired with a good signature; and expired with a bad one (the signature is
        // checked first, as verify does).
        tokens.push(signers[4].sign("old", SDK_AUD, now - 90_000, now - 3_600));
        let mut both = signers[5].sign("old", SDK_AUD, now - 90_000, now - 3_600);
        both.replace_range(both.len() - 4.., "AAAA");
        tokens.push(both);
        tokens.push("not.a.token".into());
        tokens.push(v.valid.token.clone());
        for cfg in [cfg(), with_aud(&[SDK_AUD]), with_aud(&[OTHER_AUD])] {
            let mut c = TokenCache::default();
            for t in &tokens {
                assert_eq!(c.check_or_queue(t, now, &cfg), Check::Queued);
            }
            // The same token twice in a round is queued once.
            assert_eq!(c.check_or_queue(&tokens[0], now, &cfg), Check::Queued);
            c.settle(now, &cfg);
            for (i, t) in tokens.iter().enumerate() {
                let fresh = verify(t, now, &cfg).map(|cl| cl.client_id.to_string());
                assert_eq!(ask(&mut c, t, now, &cfg), fresh, "token {i}");
            }
            // One batch of all that parsed; it failed (a forged one), so each was checked
            // on its own, and nothing was verified twice.
            assert_eq!(c.batches(), (1, tokens.len() as u64 - 1));
            assert_eq!(c.verifications(), tokens.len() as u64);
        }
    }

    #[test]
    fn a_batch_of_valid_tokens_is_cached_in_one_go() {
        let now = 1_000_000;
        let signers: Vec<Signer> = (0..(MAX_BATCH + 10)).map(|_| Signer::random()).collect();
        let tokens: Vec<String> = signers
            .iter()
            .map(|s| s.sign("sub", SDK_AUD, now, now + 3_600))
            .collect();
        let mut c = TokenCache::default();
        for t in &tokens {
            assert_eq!(c.check_or_queue(t, now, &cfg()), Check::Queued);
        }
        c.settle(now, &cfg());
        assert_eq!(c.len(), tokens.len());
        assert_eq!(c.batches(), (2, tokens.len() as u64));
        for (t, s) in tokens.iter().zip(&signers) {
            match c.check_or_queue(t, now + 1, &cfg()) {
                Check::Done(Ok(id)) => assert_eq!(id.did(), s.iss),
                other => panic!("{other:?}"),
            }
        }
        // A lone token is checked on its own, not as a batch of one.
        let lone = Signer::random().sign("sub", SDK_AUD, now, now + 3_600);
        assert_eq!(c.check_or_queue(&lone, now, &cfg()), Check::Queued);
        c.settle(now, &cfg());
        assert_eq!(c.batches(), (2, tokens.len() as u64));
        assert!(matches!(
            c.check_or_queue(&lone, now, &cfg()),
            Check::Done(Ok(_))
        ));
        // A full queue verifies at once; refusals last until the next settle only.
        let mut small = TokenCache::new(4);
        let a = Signer::random().sign("a", SDK_AUD, now, now + 3_600);
        let b = Signer::random().sign("b", SDK_AUD, now, now + 3_600);
        let d = Signer::random().sign("d", SDK_AUD, now, now + 3_600);
        assert_eq!(small.check_or_queue(&a, now, &cfg()), Check::Queued);
        assert_eq!(small.check_or_queue(&b, now, &cfg()), Check::Queued);
        assert!(matches!(
            small.check_or_queue(&d, now, &cfg()),
            Check::Done(Ok(_))
        ));
        small.settle(now, &cfg());
        let mut bad = a.clone();
        bad.replace_range(bad.len() - 4.., "AAAA");
        assert_eq!(small.check_or_queue(&bad, now, &cfg()), Check::Queued);
        small.settle(now, &cfg());
        assert_eq!(
            small.check_or_queue(&bad, now, &cfg()),
            Check::Done(Err(AuthError::Signature))
        );
        small.settle(now, &cfg());
        assert_eq!(small.check_or_queue(&bad, now, &cfg()), Check::Queued);
    }
}
