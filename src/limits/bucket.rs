//! Token buckets: a plain 16-byte struct (tokens and the time of the last refill, in the
//! worker clock's milliseconds) and the [`Rate`] it refills at, kept apart so that a bucket
//! carries no copy of its configuration; and [`ConnBuckets`], a WebSocket's own three
//! buckets with one refill time between them (40 bytes with its refusals, where three
//! [`Bucket`]s alone take 48: it lives in every WebSocket's state). Both do the same arithmetic ([`Rate::refilled`],
//! [`Rate::wait_from`]). Nothing here allocates.

/// How fast a bucket refills and how many tokens it holds at most. A burst of 0 is "off":
/// every request passes and nothing is counted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Tokens added per millisecond.
    per_ms: f64,
    /// Most tokens held (and what a fresh bucket starts with).
    burst: f64,
}

/// The longest `retryAfterMs` ever answered (a day): a rate so low that the wait would be
/// longer says "not today" just as well.
pub const MAX_WAIT_MS: u64 = 86_400_000;

impl Rate {
    /// The rate that lets everything through.
    pub const OFF: Rate = Rate {
        per_ms: 0.0,
        burst: 0.0,
    };

    /// `per_sec` tokens a second, at most `burst`; off when either is 0 (or not a number).
    pub fn new(per_sec: f64, burst: f64) -> Rate {
        if per_sec.is_nan() || burst.is_nan() || per_sec <= 0.0 || burst <= 0.0 {
            return Rate::OFF;
        }
        Rate {
            per_ms: per_sec / 1000.0,
            burst,
        }
    }

    /// Whether this rate lets everything through.
    #[inline]
    pub fn is_off(&self) -> bool {
        self.burst <= 0.0
    }

    /// This rate shared evenly by `n` workers: rate and burst divided by `n`, the burst at
    /// least 1 (DECISIONS §11 allows a split instead of a lock).
    pub fn split(self, n: usize) -> Rate {
        if self.is_off() || n <= 1 {
            return self;
        }
        let n = n as f64;
        Rate {
            per_ms: self.per_ms / n,
            burst: (self.burst / n).max(1.0),
        }
    }

    /// `tokens` after `elapsed` ms of refill, at most the burst.
    #[inline]
    fn refilled(self, tokens: f64, elapsed: u64) -> f64 {
        (tokens + elapsed as f64 * self.per_ms).min(self.burst)
    }

    /// Milliseconds until `n` tokens may be taken from `tokens` (0: now; this rate is on).
    /// A request larger than the burst needs a full bucket.
    #[inline]
    fn wait_from(self, tokens: f64, n: f64) -> u64 {
        let need = n.min(self.burst);
        if tokens >= need {
            return 0;
        }
        let ms = ((need - tokens) / self.per_ms).ceil();
        (ms as u64).clamp(1, MAX_WAIT_MS)
    }

    /// Milliseconds an empty bucket takes to fill up (0 when off).
    pub fn fill_ms(&self) -> u64 {
        if self.is_off() {
            return 0;
        }
        (self.burst / self.per_ms).min(MAX_WAIT_MS as f64) as u64
    }
}

/// A token bucket. Starts full.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bucket {
    /// Tokens now (may go below 0: a request larger than the burst is let through when the
    /// bucket is full, and leaves a debt).
    tokens: f64,
    /// When `tokens` was last brought up to date (worker clock, ms).
    last: u64,
}

impl Bucket {
    /// A full bucket of `rate` at `now`.
    pub fn full(rate: Rate, now: u64) -> Bucket {
        Bucket {
            tokens: rate.burst,
            last: now,
        }
    }

    /// Brings the tokens up to `now`.
    #[inline]
    fn refill(&mut self, rate: Rate, now: u64) {
        if now > self.last {
            self.tokens = rate.refilled(self.tokens, now - self.last);
            self.last = now;
        }
    }

    /// Milliseconds until `n` tokens may be taken (0: now). A request larger than the burst
    /// needs a full bucket.
    #[inline]
    pub fn wait(&mut self, rate: Rate, now: u64, n: f64) -> u64 {
        if rate.is_off() {
            return 0;
        }
        self.refill(rate, now);
        rate.wait_from(self.tokens, n)
    }

    /// Takes `n` tokens (after [`Bucket::wait`] said 0).
    #[inline]
    pub fn take(&mut self, rate: Rate, n: f64) {
        if !rate.is_off() {
            self.tokens -= n;
        }
    }

    /// Whether the bucket is full at `now` (nothing would be lost by forgetting it).
    pub fn is_full(&mut self, rate: Rate, now: u64) -> bool {
        if rate.is_off() {
            return true;
        }
        self.refill(rate, now);
        self.tokens >= rate.burst
    }
}

/// A WebSocket's own buckets (publishes, bytes, subscriptions, indexed like `Kind`) and its
/// refusals in a row. One refill time serves the three: they are all brought up to date
/// together, which gives the tokens each would have with its own time (a refill capped at
/// the burst, then another, holds what one refill over both spans would:
/// `min(min(t + a, b) + c, b) == min(t + a + c, b)` for `a, c >= 0`), in 40 bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnBuckets {
    /// Tokens now, per bucket (may go below 0, as [`Bucket`]'s).
    tokens: [f64; 3],
    /// When `tokens` were last brought up to date (worker clock, ms).
    last: u64,
    /// Requests refused since the last one let through (closed at 100: a byte holds it).
    pub refusals: u8,
}

impl ConnBuckets {
    /// Full buckets of `rates` at `now`.
    pub fn full(rates: &[Rate; 3], now: u64) -> ConnBuckets {
        ConnBuckets {
            tokens: rates.map(|r| r.burst),
            last: now,
            refusals: 0,
        }
    }

    /// Brings every bucket up to `now`.
    #[inline]
    pub fn refill(&mut self, rates: &[Rate; 3], now: u64) {
        if now > self.last {
            let elapsed = now - self.last;
            for (t, r) in self.tokens.iter_mut().zip(rates) {
                if !r.is_off() {
                    *t = r.refilled(*t, elapsed);
                }
            }
            self.last = now;
        }
    }

    /// Milliseconds until `n` tokens may be taken from bucket `i` (0: now), as of the last
    /// [`ConnBuckets::refill`].
    #[inline]
    pub fn wait(&self, rates: &[Rate; 3], i: usize, n: f64) -> u64 {
        match (rates.get(i), self.tokens.get(i)) {
            (Some(r), Some(&t)) if !r.is_off() => r.wait_from(t, n),
            _ => 0,
        }
    }

    /// Takes `n` tokens from bucket `i` (after [`ConnBuckets::wait`] said 0).
    #[inline]
    pub fn take(&mut self, rates: &[Rate; 3], i: usize, n: f64) {
        if let (Some(r), Some(t)) = (rates.get(i), self.tokens.get_mut(i)) {
            if !r.is_off() {
                *t -= n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_burst_then_waits_for_the_rate() {
        let r = Rate::new(10.0, 5.0);
        let mut b = Bucket::full(r, 1000);
        for _ in 0..5 {
            assert_eq!(b.wait(r, 1000, 1.0), 0);
            b.take(r, 1.0);
        }
        // 10 a second: one token every 100 ms.
        assert_eq!(b.wait(r, 1000, 1.0), 100);
        assert_eq!(b.wait(r, 1050, 1.0), 50);
        assert_eq!(b.wait(r, 1100, 1.0), 0);
        b.take(r, 1.0);
        // Never more than the burst, however long it idles.
        assert!(b.is_full(r, 1_000_000));
        assert_eq!(b.wait(r, 1_000_000, 5.0), 0);
        b.take(r, 5.0);
        assert_eq!(b.wait(r, 1_000_000, 1.0), 100);
    }

    #[test]
    fn larger_than_the_burst_needs_a_full_bucket_and_leaves_a_debt() {
        let r = Rate::new(1000.0, 100.0);
        let mut b = Bucket::full(r, 0);
        assert_eq!(b.wait(r, 0, 250.0), 0);
        b.take(r, 250.0);
        // 150 tokens owed, then 1: 151 ms at one a millisecond.
        assert_eq!(b.wait(r, 0, 1.0), 151);
        assert_eq!(b.wait(r, 0, 1000.0), 250);
    }

    #[test]
    fn off_lets_everything_through() {
        for r in [Rate::new(0.0, 10.0), Rate::new(5.0, 0.0), Rate::OFF] {
            assert!(r.is_off());
            let mut b = Bucket::full(r, 0);
            for _ in 0..1000 {
                assert_eq!(b.wait(r, 0, 1e9), 0);
                b.take(r, 1e9);
            }
            assert_eq!(r.fill_ms(), 0);
        }
        assert!(Rate::new(f64::NAN, 1.0).is_off());
    }

    #[test]
    fn split_divides_rate_and_burst_keeping_one() {
        let r = Rate::new(100.0, 1000.0).split(4);
        assert_eq!(r, Rate::new(25.0, 250.0));
        assert_eq!(Rate::new(1.0, 2.0).split(8), Rate::new(0.125, 1.0));
        assert_eq!(Rate::new(1.0, 2.0).split(1), Rate::new(1.0, 2.0));
        assert!(Rate::OFF.split(4).is_off());
    }

    #[test]
    fn conn_buckets_with_one_refill_time_answer_as_separate_buckets() {
        let rates = [Rate::new(10.0, 5.0), Rate::new(1000.0, 100.0), Rate::OFF];
        let mut own = ConnBuckets::full(&rates, 1000);
        let mut sep = rates.map(|r| Bucket::full(r, 1000));
        // Bucket 0 used at every step, bucket 1 now and then: same answers either way.
        for (now, n0, n1) in [
            (1000, 3.0, 250.0),
            (1000, 2.0, 0.0),
            (1030, 1.0, 0.0),
            (1099, 1.0, 1.0),
            (1100, 1.0, 0.0),
            (1151, 1.0, 40.0),
            (1400, 4.0, 0.0),
            (9000, 5.0, 100.0),
        ] {
            own.refill(&rates, now);
            for (i, n) in [(0, n0), (1, n1), (2, 7.0)] {
                if n == 0.0 {
                    continue;
                }
                let w = sep[i].wait(rates[i], now, n);
                assert_eq!(own.wait(&rates, i, n), w, "bucket {i} at {now}");
                if w == 0 {
                    own.take(&rates, i, n);
                    sep[i].take(rates[i], n);
                }
            }
        }
    }

    #[test]
    fn a_rate_too_low_to_refill_caps_the_wait() {
        let r = Rate::new(1e-9, 1.0);
        let mut b = Bucket::full(r, 0);
        b.take(r, 1.0);
        assert_eq!(b.wait(r, 10, 1.0), MAX_WAIT_MS);
        assert_eq!(r.fill_ms(), MAX_WAIT_MS);
    }
}
