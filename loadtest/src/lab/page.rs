//! What `loadtest report` shows: for each run, its tail (a table and the percentile
//! spectrum, as HdrHistogram's plotter draws it: latency against the percentile on a log
//! scale of 1/(1-q)), latency (p50, p99, max per second) and throughput over the run's time,
//! the generator's own figures (send lag, loop turn, CPU, run delay) and the run's
//! parameters, as one HTML file with inline SVG and inline CSS, nothing fetched.
//!
//! Owns the page's contents; the drawing is [`super::svg`]'s, the data [`super::hlog`]'s.

use std::fmt::Write as _;
use std::path::PathBuf;

use hdrhistogram::Histogram;
use serde_json::Value;

use super::hlog::{report_fields, Log};
use super::svg::{esc, fmt_num, fmt_us, Axis, Chart, Line, COLOURS};
use super::LabError;
use crate::stats::{Lat, INTERVAL_NS};

/// Percentiles of the tail table.
const TAIL: [(f64, &str); 8] = [
    (50.0, "p50"),
    (90.0, "p90"),
    (99.0, "p99"),
    (99.9, "p99.9"),
    (99.99, "p99.99"),
    (99.999, "p99.999"),
    (100.0, "max"),
    (0.0, "count"),
];

/// Decades of the spectrum's axis: up to p99.999.
const SPECTRUM_DECADES: f64 = 5.0;

/// One second of a run.
#[derive(Debug, Clone, Copy)]
struct Second {
    /// Seconds since the run's first.
    t: f64,
    p50: u64,
    p99: u64,
    max: u64,
    count: u64,
}

/// One run as the page shows it.
pub struct Run {
    label: String,
    path: PathBuf,
    /// The latency charted.
    name: String,
    total: Histogram<u64>,
    seconds: Vec<Second>,
    log: Log,
}

impl Run {
    /// A run from its log; `latency` names the series to chart (default: the headline).
    pub fn new(
        label: String,
        path: PathBuf,
        log: Log,
        latency: Option<&str>,
    ) -> Result<Run, LabError> {
        let found = match latency {
            Some(n) => log.get(n).map(|l| (n.to_string(), l)),
            None => log.headline().map(|(n, l)| (n.to_string(), l)),
        };
        let Some((name, lat)) = found else {
            return Err(LabError::NoSeries {
                run: label,
                name: latency.unwrap_or("").to_string(),
                have: log
                    .series
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let seconds = per_second(lat);
        Ok(Run {
            total: lat.hist().clone(),
            label,
            path,
            name,
            seconds,
            log,
        })
    }

    fn generators(&self) -> Vec<serde_json::Map<String, Value>> {
        self.log
            .reports
            .iter()
            .filter_map(|l| report_fields(l))
            .collect()
    }
}

fn per_second(lat: &Lat) -> Vec<Second> {
    let mut out = Vec::new();
    let mut first = None;
    let _ = lat.for_each_interval(|sec, h| -> Result<(), ()> {
        let f = *first.get_or_insert(sec);
        out.push(Second {
            t: (sec - f) as f64 * INTERVAL_NS as f64 / 1e9,
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
            count: h.len(),
        });
        Ok(())
    });
    out
}

/// The percentile spectrum of every run on one chart.
pub fn spectrum(title: &str, runs: &[Run]) -> Chart {
    let top = runs.iter().map(|r| r.total.max()).max().unwrap_or(1) as f64;
    let mut x = Axis::linear("percentile", 0.0, SPECTRUM_DECADES, |_| String::new());
    x.ticks = (0..=SPECTRUM_DECADES as i32)
        .map(|d| {
            let label = match d {
                0 => "0%".to_string(),
                _ => format!("{}%", 100.0 - 100.0 * 10f64.powi(-d)),
            };
            (d as f64, label)
        })
        .collect();
    let y = Axis::linear("latency", 0.0, top * 1.05, fmt_us);
    let lines = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let n = r.total.len().max(1) as f64;
            let reach = n.log10().min(SPECTRUM_DECADES);
            let mut points: Vec<(f64, f64)> = (0..=500)
                .map(|k| SPECTRUM_DECADES * k as f64 / 500.0)
                .take_while(|x| *x <= reach)
                .map(|x| {
                    let q = 1.0 - 10f64.powf(-x);
                    (x, r.total.value_at_quantile(q) as f64)
                })
                .collect();
            points.push((reach, r.total.max() as f64));
            Line {
                name: format!("{} ({})", r.label, r.name),
                colour: COLOURS[i % COLOURS.len()],
                dash: None,
                points,
            }
        })
        .collect();
    Chart {
        title: format!("{title}: percentile spectrum"),
        x,
        y,
        lines,
    }
}

/// The time axis of the per-second charts: up to the last second of any run.
fn time_axis(runs: &[Run]) -> Axis {
    let t_max = runs
        .iter()
        .filter_map(|r| r.seconds.last().map(|s| s.t))
        .fold(1.0, f64::max);
    Axis::linear("seconds since the run's first", 0.0, t_max, fmt_num)
}

/// `f` of every second of every run.
fn every_second(runs: &[Run], f: fn(&Second) -> u64) -> impl Iterator<Item = u64> + '_ {
    runs.iter().flat_map(move |r| r.seconds.iter().map(f))
}

/// A per-second figure as a line: its name, its dash pattern, how to read it.
type Metric = (&'static str, Option<&'static str>, fn(&Second) -> u64);

/// p50, p99 and max per second of every run.
fn over_time(runs: &[Run]) -> Chart {
    let lo = every_second(runs, |s| s.p50).min().unwrap_or(1).max(1) as f64;
    let hi = every_second(runs, |s| s.max).max().unwrap_or(10) as f64;
    let mut lines = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let metrics: [Metric; 3] = [
            ("p50", None, |s| s.p50),
            ("p99", Some("6 3"), |s| s.p99),
            ("max", Some("2 3"), |s| s.max),
        ];
        for (m, dash, f) in metrics {
            lines.push(Line {
                name: format!("{} {m}", r.label),
                colour: COLOURS[i % COLOURS.len()],
                dash,
                points: r.seconds.iter().map(|s| (s.t, f(s) as f64)).collect(),
            });
        }
    }
    Chart {
        title: "latency per second: p50, p99, max".into(),
        x: time_axis(runs),
        y: Axis::log("latency", lo, hi, fmt_us),
        lines,
    }
}

/// Values recorded per second of every run.
fn throughput(runs: &[Run]) -> Chart {
    let hi = every_second(runs, |s| s.count).max().unwrap_or(1) as f64;
    let secs = INTERVAL_NS as f64 / 1e9;
    let lines = runs
        .iter()
        .enumerate()
        .map(|(i, r)| Line {
            name: format!("{} ({} per s)", r.label, r.name),
            colour: COLOURS[i % COLOURS.len()],
            dash: None,
            points: r
                .seconds
                .iter()
                .map(|s| (s.t, s.count as f64 / secs))
                .collect(),
        })
        .collect();
    Chart {
        title: "throughput per second".into(),
        x: time_axis(runs),
        y: Axis::linear("per second", 0.0, hi / secs * 1.05, fmt_num),
        lines,
    }
}

/// The page.
pub fn html(title: &str, runs: &[Run]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}}\
         table{{border-collapse:collapse;margin:8px 0 20px}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}\
         td:first-child,th:first-child{{text-align:left}}h2{{margin-top:28px}}\
         .k{{color:#666}}</style></head><body>\n<h1>{t}</h1>\n",
        t = esc(title)
    );
    s.push_str("<p class=\"k\">Latencies in µs, measured from each message's intended send time (open loop: coordinated omission corrected as wrk2 does); HdrHistogram, 3 significant digits.</p>\n");
    // Tail table.
    s.push_str("<h2>Tail</h2>\n<table><tr><th>run</th><th>latency</th>");
    for (_, h) in TAIL {
        let _ = write!(s, "<th>{h}</th>");
    }
    s.push_str("</tr>\n");
    for r in runs {
        let _ = write!(s, "<tr><td>{}</td><td>{}</td>", esc(&r.label), esc(&r.name));
        for (p, h) in TAIL {
            let v = match h {
                "count" => r.total.len(),
                "max" => r.total.max(),
                _ => r.total.value_at_percentile(p),
            };
            let _ = write!(s, "<td>{}</td>", fmt_num(v as f64));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    for c in [spectrum(title, runs), over_time(runs), throughput(runs)] {
        let _ = writeln!(s, "<figure>{}</figure>", c.svg());
    }
    generator_figures(&mut s, runs);
    parameters(&mut s, runs);
    s.push_str("<p class=\"k\">Made by <code>loadtest report</code> from ");
    let files: Vec<String> = runs
        .iter()
        .map(|r| format!("<code>{}</code>", esc(&r.path.display().to_string())))
        .collect();
    s.push_str(&files.join(", "));
    s.push_str(".</p>\n</body></html>\n");
    s
}

/// Send lag and loop turn from the log's histograms, CPU and run delay from the
/// generators' reports (summed over generators).
fn generator_figures(s: &mut String, runs: &[Run]) {
    s.push_str(
        "<h2>The generator's own figures</h2>\n<table><tr><th>run</th><th>generators</th>\
         <th>send lag p99 / p99.9 / max</th><th>loop turn p99 / p99.9 / max</th>\
         <th>CPU ms</th><th>run delay ms</th><th>CPU µs per message</th></tr>\n",
    );
    for r in runs {
        let tri = |name: &str| {
            r.log
                .series
                .iter()
                .find(|(n, _)| n == name || n.ends_with(&format!(".{name}")))
                .map(|(_, l)| {
                    let h = l.hist();
                    format!(
                        "{} / {} / {}",
                        fmt_num(h.value_at_quantile(0.99) as f64),
                        fmt_num(h.value_at_quantile(0.999) as f64),
                        fmt_num(h.max() as f64)
                    )
                })
                .unwrap_or_else(|| "-".into())
        };
        let gens = r.generators();
        let sum = |k: &str| -> Option<f64> {
            let v: Vec<f64> = gens
                .iter()
                .filter_map(|g| g.get(k).and_then(Value::as_f64))
                .collect();
            (!v.is_empty()).then(|| v.iter().sum())
        };
        let cpu = sum("generator_cpu_ms");
        let per_msg = cpu
            .filter(|_| !r.total.is_empty())
            .map(|c| format!("{:.2}", c * 1000.0 / r.total.len() as f64))
            .unwrap_or_else(|| "-".into());
        let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{} µs</td><td>{} µs</td><td>{}</td><td>{}</td>\
             <td>{}</td></tr>",
            esc(&r.label),
            gens.len(),
            tri("send_lag"),
            tri("generator_loop_turn"),
            show(cpu),
            show(sum("generator_run_delay_ms")),
            per_msg
        );
    }
    s.push_str("</table>\n");
}

/// Every scalar of the generators' reports: one row per key, the values of a run's
/// generators together (one value if they agree).
fn parameters(s: &mut String, runs: &[Run]) {
    s.push_str("<h2>Parameters and figures of each generator</h2>\n");
    for r in runs {
        let gens = r.generators();
        let _ = writeln!(
            s,
            "<h3>{}</h3>\n<table><tr><th>key</th><th>value</th></tr>",
            esc(&r.label)
        );
        let mut keys: Vec<&String> = Vec::new();
        for g in &gens {
            for (k, v) in g {
                if !v.is_object() && !v.is_array() && !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        for k in keys {
            let mut vals: Vec<String> = gens
                .iter()
                .map(|g| match g.get(k.as_str()) {
                    Some(Value::String(t)) => t.clone(),
                    Some(v) => v.to_string(),
                    None => "-".into(),
                })
                .collect();
            vals.dedup();
            let _ = writeln!(
                s,
                "<tr><td>{}</td><td>{}</td></tr>",
                esc(k),
                esc(&vals.join(" / "))
            );
        }
        s.push_str("</table>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_self_contained_and_shows_every_run() {
        let mk = |scale: u64| {
            let mut l = Lat::new();
            for i in 0..20_000u64 {
                l.record((100 + i % 900) * scale * 1000, i * 100_000);
            }
            let mut lag = Lat::new();
            lag.record(5_000, 0);
            Log {
                series: vec![("publish_delivery".into(), l), ("send_lag".into(), lag)],
                reports: vec![
                    "{\"scenario\":\"pairs\",\"target_rate\":1000,\"generator_cpu_ms\":40.0}"
                        .into(),
                ],
            }
        };
        let runs = vec![
            Run::new("relay".into(), "a".into(), mk(2), None).unwrap(),
            Run::new("floor".into(), "b".into(), mk(1), None).unwrap(),
        ];
        let page = html("t", &runs);
        for bad in ["src=", "href=", "url(", "@import", "<script", "<link"] {
            assert!(!page.contains(bad), "{bad}");
        }
        assert_eq!(page.matches("<svg").count(), 3);
        assert!(page.contains("relay (publish_delivery)") && page.contains("floor"));
        assert!(page.contains("<td>target_rate</td><td>1000</td>"));
        // CPU per message: 40 ms over 20,000 messages.
        assert!(page.contains("<td>2.00</td>"), "{page}");
        assert!(Run::new("x".into(), "c".into(), mk(1), Some("nope")).is_err());
    }
}
