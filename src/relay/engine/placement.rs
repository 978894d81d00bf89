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

    /// Content hash of an encoded message (dedup).
    pub fn content_hash(&self, data: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.content.hash_one(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
