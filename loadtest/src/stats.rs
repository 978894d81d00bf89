//! Figures: latency histograms (HdrHistogram, microseconds), labelled counters, and the report
//! every subcommand prints: a readable table and one JSON line.
//!
//! Owns formatting only; the scenarios decide what to count.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::serialization::{Deserializer, Serializer as _, V2Serializer};
use hdrhistogram::Histogram;

/// Highest latency recorded exactly: one hour, in µs. Larger values saturate.
const MAX_US: u64 = 3_600_000_000;

/// Length of one interval of a [`Lat`]'s timeline: a whole second of Unix time, so that the
/// intervals of every generator started with the same `--start-at` line up exactly.
pub const INTERVAL_NS: u64 = 1_000_000_000;

/// Most intervals a timeline keeps (a day of seconds and then some); later ones are counted
/// in the total only.
const MAX_INTERVALS: usize = 100_000;

/// A latency histogram in microseconds, and the same values per [`INTERVAL_NS`] of Unix
/// time in which they were recorded (the timeline an HdrHistogram interval log holds).
///
/// Closed intervals are kept as V2-encoded bytes (hundreds of bytes each instead of the
/// 190 KB of a histogram's counts), so a long run's timeline stays small.
#[derive(Clone, Debug)]
pub struct Lat {
    /// Every value recorded.
    all: Histogram<u64>,
    /// The interval being recorded.
    cur: Option<Box<Current>>,
    /// Closed intervals: Unix second, encoded histogram. Unordered, possibly several per
    /// second (one per thread merged in).
    done: Vec<(u64, Vec<u8>)>,
    /// Values left out of the timeline (past [`MAX_INTERVALS`], or not encodable).
    dropped: u64,
}

/// The open interval of a timeline.
#[derive(Clone, Debug)]
struct Current {
    /// Unix second it covers.
    sec: u64,
    /// Its bounds, ns since the process's epoch (`crate::clock`).
    from: u64,
    to: u64,
    h: Histogram<u64>,
}

impl Default for Lat {
    fn default() -> Self {
        Self::new()
    }
}

/// An empty histogram with the bounds every [`Lat`] has (3 significant digits, 1 µs to 1 h).
pub fn empty_hist() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, MAX_US, 3) {
        Ok(h) => h,
        Err(e) => unreachable!("constant histogram bounds are valid: {e}"),
    }
}

impl Lat {
    /// An empty histogram (3 significant digits, 1 µs to 1 h).
    pub fn new() -> Self {
        Lat {
            all: empty_hist(),
            cur: None,
            done: Vec::new(),
            dropped: 0,
        }
    }

    /// Record a duration given in nanoseconds (rounded to the nearest µs), seen at `at_ns`
    /// (ns since the process's epoch: the event loop's `now`), into the total and the
    /// interval of `at_ns`.
    pub fn record(&mut self, ns: u64, at_ns: u64) {
        let us = (ns + 500) / 1000;
        self.all.saturating_record(us);
        let open = match &self.cur {
            Some(c) => at_ns >= c.from && at_ns < c.to,
            None => false,
        };
        if !open && !self.roll(at_ns) {
            self.dropped += 1;
            return;
        }
        if let Some(c) = self.cur.as_mut() {
            c.h.saturating_record(us);
        }
    }

    /// Close the open interval and open the one of `at_ns`; false if the timeline is full.
    fn roll(&mut self, at_ns: u64) -> bool {
        self.close_current();
        if self.done.len() >= MAX_INTERVALS {
            return false;
        }
        let base = crate::clock::epoch_unix_ns();
        let sec = (base + at_ns) / INTERVAL_NS;
        let from = (sec * INTERVAL_NS).saturating_sub(base);
        let to = ((sec + 1) * INTERVAL_NS).saturating_sub(base);
        match self.cur.as_mut() {
            Some(c) => {
                c.h.reset();
                (c.sec, c.from, c.to) = (sec, from, to);
            }
            None => {
                self.cur = Some(Box::new(Current {
                    sec,
                    from,
                    to,
                    h: empty_hist(),
                }))
            }
        }
        true
    }

    /// Move the open interval, if it holds anything, to the closed ones.
    fn close_current(&mut self) {
        let Some(c) = self.cur.as_mut() else {
            return;
        };
        if c.h.is_empty() {
            return;
        }
        let mut bytes = Vec::new();
        match V2Serializer::new().serialize(&c.h, &mut bytes) {
            Ok(_) => self.done.push((c.sec, bytes)),
            Err(_) => self.dropped += c.h.len(),
        }
        c.h.reset();
    }

    /// Record a duration in ns into the total only (no timeline), for unit tests.
    #[cfg(test)]
    pub fn record_ns(&mut self, ns: u64) {
        self.all.saturating_record((ns + 500) / 1000);
    }

    /// Add another histogram's counts (and its timeline).
    pub fn merge(&mut self, other: &Lat) {
        // Both have the same bounds, so adding cannot fail.
        let _ = self.all.add(&other.all);
        let mut o = other.clone();
        o.close_current();
        self.done.append(&mut o.done);
        self.dropped += o.dropped;
    }

    /// Add one interval read from a log: `h`, decoded from `encoded` (V2 or V2 deflate),
    /// recorded in Unix second `sec`. False if `h` holds values beyond 1 h.
    pub fn add_interval(&mut self, sec: u64, h: &Histogram<u64>, encoded: Vec<u8>) -> bool {
        if self.all.add(h).is_err() {
            return false;
        }
        self.done.push((sec, encoded));
        true
    }

    /// Every value recorded.
    pub fn hist(&self) -> &Histogram<u64> {
        &self.all
    }

    /// The timeline in order: `f(unix_second, histogram of that second)` for every second
    /// in which something was recorded (threads' shares added up). One histogram is
    /// decoded at a time.
    pub fn for_each_interval<E>(
        &self,
        mut f: impl FnMut(u64, &Histogram<u64>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut me = self.clone();
        me.close_current();
        me.done.sort_by_key(|(sec, _)| *sec);
        let mut acc = empty_hist();
        let mut i = 0;
        while i < me.done.len() {
            let sec = me.done[i].0;
            acc.reset();
            while i < me.done.len() && me.done[i].0 == sec {
                let decoded: Option<Histogram<u64>> =
                    Deserializer::new().deserialize(&mut &me.done[i].1[..]).ok();
                if let Some(h) = decoded {
                    let _ = acc.add(&h);
                }
                i += 1;
            }
            f(sec, &acc)?;
        }
        Ok(())
    }

    /// The quantiles we report.
    pub fn summary(&self) -> LatSummary {
        summarize(&self.all)
    }
}

/// The quantiles we report of any histogram in µs.
pub fn summarize(h: &Histogram<u64>) -> LatSummary {
    if h.is_empty() {
        return LatSummary::default();
    }
    LatSummary {
        count: h.len(),
        mean: h.mean(),
        p50: h.value_at_quantile(0.50),
        p90: h.value_at_quantile(0.90),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
    }
}

/// Quantiles of one histogram, µs.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct LatSummary {
    /// Values recorded.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest value.
    pub max: u64,
}

/// Counts by label (close reasons, HTTP statuses, error codes).
pub type Counts = BTreeMap<String, u64>;

/// Add `b` into `a`.
pub fn merge_counts(a: &mut Counts, b: &Counts) {
    for (k, v) in b {
        *a.entry(k.clone()).or_insert(0) += v;
    }
}

/// One reported value.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// An integer.
    Int(u64),
    /// A float, printed with the given decimals.
    Float(f64, usize),
    /// Text.
    Str(String),
}

/// What a subcommand prints.
pub struct Report {
    scenario: String,
    rows: Vec<(String, Val)>,
    lats: Vec<(String, LatSummary)>,
    /// The histograms behind `lats`, for `--hlog`.
    hists: Vec<(String, Lat)>,
    counts: Vec<(String, Counts)>,
    notes: Vec<String>,
}

impl Report {
    /// An empty report for `scenario`.
    pub fn new(scenario: &str) -> Self {
        Report {
            scenario: scenario.to_string(),
            rows: Vec::new(),
            lats: Vec::new(),
            hists: Vec::new(),
            counts: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// An integer row.
    pub fn int(&mut self, key: &str, v: u64) -> &mut Self {
        self.rows.push((key.to_string(), Val::Int(v)));
        self
    }

    /// A float row.
    pub fn float(&mut self, key: &str, v: f64, decimals: usize) -> &mut Self {
        self.rows.push((key.to_string(), Val::Float(v, decimals)));
        self
    }

    /// A text row.
    pub fn text(&mut self, key: &str, v: &str) -> &mut Self {
        self.rows.push((key.to_string(), Val::Str(v.to_string())));
        self
    }

    /// A latency histogram.
    pub fn lat(&mut self, key: &str, lat: &Lat) -> &mut Self {
        self.lats.push((key.to_string(), lat.summary()));
        self.hists.push((key.to_string(), lat.clone()));
        self
    }

    /// The latency histograms, in the order added (the first is the headline).
    pub fn hists(&self) -> &[(String, Lat)] {
        &self.hists
    }

    /// A table of labelled counts (always included, possibly empty).
    pub fn counts(&mut self, key: &str, c: &Counts) -> &mut Self {
        self.counts.push((key.to_string(), c.clone()));
        self
    }

    /// A warning printed under the table (also in the JSON as `notes`).
    pub fn note(&mut self, s: String) -> &mut Self {
        self.notes.push(s);
        self
    }

    /// The readable table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "== {} ==", self.scenario);
        for (k, v) in &self.rows {
            let _ = writeln!(s, "  {:<32} {:>16}", k, fmt_val(v));
        }
        if !self.lats.is_empty() {
            let _ = writeln!(
                s,
                "  {:<26} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
                "latency (µs)", "count", "p50", "p90", "p99", "p99.9", "max"
            );
            for (k, l) in &self.lats {
                let _ = writeln!(
                    s,
                    "  {:<26} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
                    k, l.count, l.p50, l.p90, l.p99, l.p999, l.max
                );
            }
        }
        for (k, c) in &self.counts {
            if c.is_empty() {
                let _ = writeln!(s, "  {k}: none");
            } else {
                let items: Vec<String> = c.iter().map(|(l, n)| format!("{l}={n}")).collect();
                let _ = writeln!(s, "  {k}: {}", items.join(" "));
            }
        }
        for n in &self.notes {
            let _ = writeln!(s, "  NOTE: {n}");
        }
        s
    }

    /// One JSON object on one line.
    pub fn json(&self) -> String {
        let mut s = String::from("{");
        let _ = write!(s, "\"scenario\":{}", json_str(&self.scenario));
        for (k, v) in &self.rows {
            let _ = write!(s, ",{}:", json_str(k));
            match v {
                Val::Int(i) => {
                    let _ = write!(s, "{i}");
                }
                Val::Float(f, d) if f.is_finite() => {
                    let _ = write!(s, "{f:.d$}");
                }
                Val::Float(..) => s.push_str("null"),
                Val::Str(t) => s.push_str(&json_str(t)),
            }
        }
        for (k, l) in &self.lats {
            let _ = write!(
                s,
                ",{}:{{\"count\":{},\"mean\":{:.1},\"p50\":{},\"p90\":{},\"p99\":{},\"p99_9\":{},\"max\":{}}}",
                json_str(&format!("{k}_us")),
                l.count,
                l.mean,
                l.p50,
                l.p90,
                l.p99,
                l.p999,
                l.max
            );
        }
        for (k, c) in &self.counts {
            let _ = write!(s, ",{}:{{", json_str(k));
            for (i, (l, n)) in c.iter().enumerate() {
                let _ = write!(s, "{}{}:{}", if i > 0 { "," } else { "" }, json_str(l), n);
            }
            s.push('}');
        }
        if !self.notes.is_empty() {
            let notes: Vec<String> = self.notes.iter().map(|n| json_str(n)).collect();
            let _ = write!(s, ",\"notes\":[{}]", notes.join(","));
        }
        s.push('}');
        s
    }
}

fn fmt_val(v: &Val) -> String {
    match v {
        Val::Int(i) => group(*i),
        Val::Float(f, d) => format!("{f:.d$}"),
        Val::Str(t) => t.clone(),
    }
}

/// 1234567 -> "1,234,567".
fn group(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles() {
        let mut l = Lat::new();
        for us in 1..=1000u64 {
            l.record_ns(us * 1000);
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        assert_eq!(s.p50, 500);
        assert_eq!(s.p99, 990);
        assert_eq!(s.max, 1000);
        let mut m = Lat::new();
        m.merge(&l);
        m.merge(&l);
        assert_eq!(m.summary().count, 2000);
        assert_eq!(Lat::new().summary(), LatSummary::default());
    }

    #[test]
    fn report_json_is_one_line() {
        let mut r = Report::new("pairs");
        let mut l = Lat::new();
        l.record_ns(1500);
        let mut c = Counts::new();
        c.insert("200".into(), 3);
        r.int("pairs", 10)
            .float("deliveries_per_s", 12.345, 1)
            .text("mode", "open \"loop\"")
            .lat("delivery", &l)
            .counts("status", &c);
        let j = r.json();
        assert!(!j.contains('\n'));
        assert_eq!(
            j,
            "{\"scenario\":\"pairs\",\"pairs\":10,\"deliveries_per_s\":12.3,\"mode\":\"open \\\"loop\\\"\",\
             \"delivery_us\":{\"count\":1,\"mean\":2.0,\"p50\":2,\"p90\":2,\"p99\":2,\"p99_9\":2,\"max\":2},\
             \"status\":{\"200\":3}}"
        );
        assert!(r.table().contains("deliveries_per_s"));
    }

    #[test]
    fn grouping() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1234567), "1,234,567");
    }
}
