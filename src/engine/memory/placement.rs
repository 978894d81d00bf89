//! Where a topic lives among the workers: its home worker, chosen by the topic's hash, and
//! the content hash that dedup compares. One [`Placement`] is shared by every worker's
//! engine (same keys), random per process (kept in the data directory by the durable
//! engine, so that topics keep their homes across restarts).

/// Which worker is home of a topic, and the content hash used for dedup. Shared by all
/// workers (same keys), random per process.
#[derive(Debug, Clone)]
pub struct Placement {
    hasher: ahash::RandomState,
    /// Content hashes: foldhash, faster than ahash on a message-sized input without AES
    /// instructions enabled at build time (docs/PERFORMANCE.md, "Smaller choices"); a
    /// collision only costs a byte comparison in the dedup check.
    content: foldhash::quality::SeedableRandomState,
    workers: usize,
}

impl Placement {
    /// A random placement over `workers` workers.
    pub fn new(workers: usize, seeds: [u64; 4]) -> Placement {
        Placement {
            hasher: ahash::RandomState::with_seeds(seeds[0], seeds[1], seeds[2], seeds[3]),
            content: foldhash::quality::SeedableRandomState::with_seed(
                seeds[0] ^ seeds[3].rotate_left(17),
                foldhash::SharedSeed::global_random(),
            ),
            workers: workers.max(1),
        }
    }

    /// The home worker of `topic`.
    pub fn of(&self, topic: &str) -> usize {
        if self.workers <= 1 {
            return 0;
        }
        (self.hasher.hash_one(topic) % self.workers as u64) as usize
    }

    /// Content hash of an encoded message (dedup), given its beta part
    /// (`{"topic":T,"message":M`, `Body::beta_bytes`): the hash of the contents of `M`'s
    /// JSON string, as [`Placement::message_hash`] gives it. Dedup compares messages of one
    /// topic only, whose `T` is the same, so the message alone decides; and a message that
    /// JSON writes as it is (most) can be hashed before its body is encoded (see
    /// `Engine::prepare_publish`). Bytes of another shape are hashed whole.
    pub fn content_hash(&self, beta: &[u8]) -> u64 {
        self.message_hash(message_contents(beta).unwrap_or(beta))
    }

    /// Content hash of a message whose JSON string contents are `contents` (the message
    /// itself when JSON needs no escape in it).
    pub fn message_hash(&self, contents: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.content.hash_one(contents)
    }
}

/// The bytes between the quotes of the `message` string in `{"topic":T,"message":M`. The
/// first `,"message":"` is the one after `T`: inside a JSON string every `"` follows a `\`.
fn message_contents(beta: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b",\"message\":\"";
    let at = memchr::memmem::find(beta, KEY)? + KEY.len();
    beta.get(at..beta.len().checked_sub(1)?)
        .filter(|_| beta.last() == Some(&b'"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash of a body is its message's: from the message itself when JSON writes it as it
    /// is (what `Engine::prepare_publish` computes before encoding), from its JSON contents
    /// otherwise; the topic never counts, whatever it holds.
    #[test]
    fn a_body_hashes_as_its_message() {
        use crate::message::{Body, Meta};
        let p = Placement::new(1, [5, 6, 7, 8]);
        let beta = |t: &str, m: &str| Body::encode(t, m, Meta::default()).beta_bytes().to_vec();
        for t in ["abc", "", "a\\", "\",\"message\":\"x", "é\u{1}"] {
            for m in ["hello", "", "a\"b", "x\\", "\",\"message\":\"", "\u{7f}ü"] {
                let b = beta(t, m);
                let mut json = Vec::new();
                crate::json::write_str(&mut json, m);
                let contents = &json[1..json.len() - 1];
                assert_eq!(p.content_hash(&b), p.message_hash(contents), "{t:?} {m:?}");
                if contents == m.as_bytes() {
                    assert_eq!(p.content_hash(&b), p.message_hash(m.as_bytes()));
                }
                assert_eq!(p.content_hash(&b), p.content_hash(&beta("other", m)));
            }
        }
        assert_ne!(
            p.content_hash(&beta("t", "a")),
            p.content_hash(&beta("t", "b"))
        );
        // Bytes of another shape are hashed whole.
        assert_eq!(p.content_hash(b"{}"), p.message_hash(b"{}"));
    }

    #[test]
    fn homes_are_stable_and_spread() {
        let h = Placement::new(4, [1, 2, 3, 4]);
        let mut seen = [0usize; 4];
        for i in 0..1000 {
            let t = format!("topic-{i}");
            assert_eq!(h.of(&t), h.clone().of(&t));
            seen[h.of(&t)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 150), "{seen:?}");
    }
}
