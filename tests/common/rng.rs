//! A small seeded RNG for reproducible "random" input and schedules: the crate's own
//! SplitMix64 (`walletrelay::rng`) with the helpers tests want. Not for anything that needs
//! real randomness.

use walletrelay::rng::SplitMix;

/// Seeded splitmix64.
pub struct Rng(SplitMix);

impl Rng {
    /// A generator starting from `seed` (the same seed gives the same sequence).
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix(seed))
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (near enough for tests).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}
