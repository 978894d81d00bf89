//! `/metrics` scraping for the tests: pure readers of Prometheus text (also used on the
//! webhook pool's own rendering) and [`Server`] methods that fetch it. It only reads values;
//! which value is right is the tests' business.

use std::time::Duration;

use super::http::{body_of, status_of};
use super::wait::poll_every;
use super::Server;

/// The metric name of a sample line (`name{labels} value` or `name value`).
fn name_of(line: &str) -> &str {
    line.split(['{', ' ']).next().unwrap_or("")
}

fn value_of(line: &str) -> Option<f64> {
    line.rsplit(' ').next()?.parse().ok()
}

/// The sum of every series of metric `name` (0 when there is none).
pub fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && name_of(l) == name)
        .filter_map(value_of)
        .sum::<f64>()
        + 0.0
}

/// The sum of the labelled series of metric `name` whose labels contain `label` (written
/// as on the wire: `reason="slow_consumer"`).
pub fn sum_labelled(text: &str, name: &str, label: &str) -> f64 {
    let open = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&open) && l.contains(label))
        .filter_map(value_of)
        .sum::<f64>()
        + 0.0
}

/// The value of one series written exactly as `series` (`name{labels}` or `name`).
pub fn series(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

impl Server {
    /// The body of `GET /metrics`, or `None` when it did not answer 200 (a refused
    /// connection reads as nothing).
    pub fn metrics_text(&self) -> Option<String> {
        let raw =
            self.raw_exchange(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        (status_of(&raw) == Some(200)).then(|| String::from_utf8_lossy(body_of(&raw)).to_string())
    }

    /// A metric summed over all its series; 0 when `/metrics` did not answer.
    pub fn metric(&self, name: &str) -> f64 {
        self.try_metric(name).unwrap_or(0.0)
    }

    /// A metric summed over all its series, or `None` when `/metrics` did not answer 200.
    pub fn try_metric(&self, name: &str) -> Option<f64> {
        Some(sum(&self.metrics_text()?, name))
    }

    /// One series (name with labels, exactly as on the wire); 0 if absent.
    pub fn series(&self, s: &str) -> f64 {
        self.metrics_text()
            .and_then(|t| series(&t, s))
            .unwrap_or(0.0)
    }

    /// `walletrelay_messages_dropped_total{reason="<reason>"}`.
    pub fn dropped(&self, reason: &str) -> f64 {
        let text = self.metrics_text().unwrap_or_default();
        sum_labelled(
            &text,
            "walletrelay_messages_dropped_total",
            &format!("reason=\"{reason}\""),
        )
    }

    /// Polls a metric until `/metrics` answers and `ok` holds (or `within` passes); returns
    /// the last value (NaN if `/metrics` never answered).
    pub fn wait_metric(&self, name: &str, within: Duration, ok: impl Fn(f64) -> bool) -> f64 {
        let mut last = None;
        let every = Duration::from_millis(100);
        let found = poll_every(every, within, || {
            last = self.try_metric(name);
            last.filter(|v| ok(*v))
        });
        found.or(last).unwrap_or(f64::NAN)
    }
}
