//! Figures: latency histograms (HdrHistogram, microseconds), labelled counters, and the report
//! every subcommand prints: a readable table and one JSON line.
//!
//! Owns formatting only; the scenarios decide what to count.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;

/// Highest latency recorded exactly: one hour, in µs. Larger values saturate.
const MAX_US: u64 = 3_600_000_000;

/// A latency histogram in microseconds.
#[derive(Clone, Debug)]
pub struct Lat(Histogram<u64>);

impl Default for Lat {
    fn default() -> Self {
        Self::new()
    }
}

impl Lat {
    /// An empty histogram (3 significant digits, 1 µs to 1 h).
    pub fn new() -> Self {
        match Histogram::new_with_bounds(1, MAX_US, 3) {
            Ok(h) => Lat(h),
            Err(e) => unreachable!("constant histogram bounds are valid: {e}"),
        }
    }

    /// Record a duration given in nanoseconds (rounded to the nearest µs).
    pub fn record_ns(&mut self, ns: u64) {
        self.0.saturating_record((ns + 500) / 1000);
    }

    /// Add another histogram's counts.
    pub fn merge(&mut self, other: &Lat) {
        // Both have the same bounds, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// The quantiles we report.
    pub fn summary(&self) -> LatSummary {
        let h = &self.0;
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
        self
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
