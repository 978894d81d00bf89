//! The head of a metric family in the Prometheus text format (version 0.0.4): its `# HELP`
//! and `# TYPE` lines, written here for every module that renders part of `/metrics`
//! (`metrics` itself, `store`, `webhook`, `cluster`), so that no family is declared by hand.
//!
//! Owns the two lines only; the family's samples and their labels are the caller's (a
//! [`Histogram`](super::Histogram) writes its own series).

use std::fmt::{Display, Write as _};

/// What a family measures: its `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that only grows (its name ends in `_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Buckets, a sum and a count (`_bucket`, `_sum`, `_count`).
    Histogram,
}

impl Kind {
    /// The word the `# TYPE` line gives.
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Appends the `# HELP` and `# TYPE` lines of the family `name`; its samples follow. `help`
/// is one line of text (no backslash or line break, which the format would need escaped).
pub fn family(out: &mut String, name: impl Display, kind: Kind, help: impl Display) {
    // Writing into a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {}", kind.as_str());
}

/// Appends a family of one unlabelled sample: its head, then `name value`.
pub fn single(
    out: &mut String,
    name: impl Display,
    kind: Kind,
    help: impl Display,
    v: impl Display,
) {
    family(out, &name, kind, help);
    let _ = writeln!(out, "{name} {v}");
}

/// Appends a family whose samples differ by one label: its head, then
/// `name{label="value"} v` for each `(value, v)` of `samples`.
pub fn labelled<'a>(
    out: &mut String,
    (name, kind, help): (impl Display, Kind, impl Display),
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, u64)>,
) {
    family(out, &name, kind, help);
    for (value, v) in samples {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_its_help_and_type_lines() {
        let mut s = String::new();
        family(&mut s, "x_total", Kind::Counter, "Things counted.");
        single(
            &mut s,
            format_args!("x_{}", "depth"),
            Kind::Gauge,
            format_args!("{} now.", "Depth"),
            3,
        );
        family(&mut s, "x_seconds", Kind::Histogram, "Durations.");
        let by_kind = ("x_by_total", Kind::Counter, "By kind.");
        labelled(&mut s, by_kind, "kind", [("a", 1), ("b", 0)]);
        assert_eq!(
            s,
            "# HELP x_total Things counted.\n# TYPE x_total counter\n\
             # HELP x_depth Depth now.\n# TYPE x_depth gauge\nx_depth 3\n\
             # HELP x_seconds Durations.\n# TYPE x_seconds histogram\n\
             # HELP x_by_total By kind.\n# TYPE x_by_total counter\n\
             x_by_total{kind=\"a\"} 1\nx_by_total{kind=\"b\"} 0\n"
        );
    }
}
