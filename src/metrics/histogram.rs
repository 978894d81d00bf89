//! The one latency [`Histogram`] of `/metrics`: fixed buckets whose upper bounds a [`Bounds`]
//! type names (microseconds; `+Inf` follows), counted with relaxed atomic adds by any thread
//! ([`Counter`], the default) or by its one writer's plain load and store ([`Cell`]: a
//! worker's own figures), rendered in the Prometheus text format (buckets cumulative, bounds
//! in seconds), one histogram or the sum of several ([`render_sum`]).
//!
//! Owns counting and the sample lines of one histogram series; the family's name, its
//! `# HELP`/`# TYPE` lines (written with [`family`](super::family)) and its labels are the
//! caller's.

use std::fmt::{self, Write as _};
use std::marker::PhantomData;
use std::time::Duration;

use super::counter::{Cell, Counter};

/// The most finite bounds a [`Bounds`] may list.
pub const MAX_BOUNDS: usize = 16;

/// What a histogram counts with: [`Counter`] (any writer) or [`Cell`] (one writer).
pub trait Tally: Default + fmt::Debug {
    /// Adds `n`.
    fn add(&self, n: u64);
    /// Reads the value.
    fn get(&self) -> u64;
}

impl Tally for Counter {
    #[inline]
    fn add(&self, n: u64) {
        Counter::add(self, n);
    }
    #[inline]
    fn get(&self) -> u64 {
        Counter::get(self)
    }
}

impl Tally for Cell {
    #[inline]
    fn add(&self, n: u64) {
        Cell::add(self, n);
    }
    #[inline]
    fn get(&self) -> u64 {
        Cell::get(self)
    }
}

/// The upper bounds of a histogram's buckets, microseconds, increasing; a last `+Inf`
/// bucket follows them. At most [`MAX_BOUNDS`].
pub trait Bounds {
    /// The bounds.
    const US: &'static [u64];
}

/// A fixed-bucket latency histogram. Buckets are stored non-cumulative and summed when
/// rendered; the count is the sum of the buckets (so it always equals the `+Inf` bucket).
/// `C` is what it counts with (see [`Tally`]).
pub struct Histogram<B, C = Counter> {
    /// Observations per bucket of `B::US`, then `+Inf` (slots past it stay 0).
    buckets: [C; MAX_BOUNDS + 1],
    /// Sum of the observations, whole microseconds.
    sum_us: C,
    bounds: PhantomData<fn() -> B>,
}

impl<B, C: Tally> Default for Histogram<B, C> {
    fn default() -> Self {
        Histogram {
            buckets: Default::default(),
            sum_us: C::default(),
            bounds: PhantomData,
        }
    }
}

impl<B, C: Tally> fmt::Debug for Histogram<B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram")
            .field("buckets", &self.buckets)
            .field("sum_us", &self.sum_us)
            .finish()
    }
}

impl<B: Bounds, C: Tally> Histogram<B, C> {
    /// Refuses, when this is compiled, bounds that do not fit the buckets.
    const FITS: () = assert!(B::US.len() <= MAX_BOUNDS, "too many histogram bounds");

    /// Records one observation: its bucket is the first bound it does not pass, to the
    /// nanosecond; the sum takes its whole microseconds.
    pub fn observe(&self, d: Duration) {
        let ns = d.as_nanos();
        self.record(|b| ns <= u128::from(b) * 1_000, micros(d), 1);
    }

    /// Records one observation of `us` whole microseconds.
    pub fn observe_us(&self, us: u64) {
        self.record(|b| us <= b, us, 1);
    }

    /// Records `n` observations of `us` whole microseconds each.
    #[inline]
    pub fn observe_n_us(&self, us: u64, n: u64) {
        self.record(|b| us <= b, us.saturating_mul(n), n);
    }

    fn record(&self, within: impl Fn(u64) -> bool, sum_us: u64, n: u64) {
        let () = Self::FITS;
        let i = B::US.iter().position(|&b| within(b)).unwrap_or(B::US.len());
        if let Some(c) = self.buckets.get(i) {
            c.add(n);
        }
        self.sum_us.add(sum_us);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(C::get).sum()
    }

    /// Sum of the observations, microseconds.
    pub fn sum_us(&self) -> u64 {
        self.sum_us.get()
    }

    /// The smallest bucket bound (µs) at or under which a fraction `q` of the observations
    /// fall (`u64::MAX` for the `+Inf` bucket, 0 when empty).
    pub fn quantile_us(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let want = ((n as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.get();
            if seen >= want {
                return B::US.get(i).copied().unwrap_or(u64::MAX);
            }
        }
        u64::MAX
    }

    /// Appends the series' sample lines: `{name}_bucket` per bound (`le` in seconds) and
    /// `+Inf`, cumulative, then `{name}_sum` (seconds) and `{name}_count`. `labels` (e.g.
    /// `shard="0"`, or empty) go before `le` and on the sum and count.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        render_sum(out, name, labels, [self]);
    }
}

/// [`Histogram::render`] of the sum of `hs` (one series: e.g. every worker's own histogram
/// of one figure).
pub fn render_sum<'a, B: Bounds + 'a, C: Tally + 'a>(
    out: &mut String,
    name: &str,
    labels: &str,
    hs: impl IntoIterator<Item = &'a Histogram<B, C>> + Clone,
) {
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cum = 0;
    for i in 0..=B::US.len() {
        let bucket = |h: &Histogram<B, C>| h.buckets.get(i).map_or(0, C::get);
        cum += hs.clone().into_iter().map(bucket).sum::<u64>();
        match B::US.get(i) {
            Some(&us) => {
                let le = us as f64 / 1e6;
                let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cum}");
            }
            None => {
                let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cum}");
            }
        }
    }
    let sum_us: u64 = hs.into_iter().map(|h| h.sum_us.get()).sum();
    let sum = sum_us as f64 / 1e6;
    if labels.is_empty() {
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cum}");
    } else {
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {cum}");
    }
}

/// A duration's whole microseconds (saturating).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Ms;
    impl Bounds for Ms {
        const US: &'static [u64] = &[1_000, 2_500, 10_000_000];
    }

    #[test]
    fn buckets_are_chosen_to_the_nanosecond_and_rendered_cumulative() {
        let h = Histogram::<Ms>::default();
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_nanos(1_000_001));
        h.observe_us(1_000);
        h.observe(Duration::from_secs(11));
        assert_eq!(h.count(), 4);
        assert_eq!(h.quantile_us(0.5), 1_000);
        assert_eq!(h.quantile_us(0.75), 2_500);
        assert_eq!(h.quantile_us(1.0), u64::MAX);
        let mut s = String::new();
        h.render(&mut s, "x_seconds", "");
        assert_eq!(
            s,
            "x_seconds_bucket{le=\"0.001\"} 2\nx_seconds_bucket{le=\"0.0025\"} 3\n\
             x_seconds_bucket{le=\"10\"} 3\nx_seconds_bucket{le=\"+Inf\"} 4\n\
             x_seconds_sum 11.003\nx_seconds_count 4\n"
        );
        let mut s = String::new();
        h.render(&mut s, "x_seconds", "log=\"w0\"");
        assert!(
            s.starts_with("x_seconds_bucket{log=\"w0\",le=\"0.001\"} 2\n"),
            "{s}"
        );
        assert!(s.ends_with("x_seconds_sum{log=\"w0\"} 11.003\nx_seconds_count{log=\"w0\"} 4\n"));
    }
}
