//! The latency lab: what happens to `--hlog` interval logs after the runs. `merge` adds up
//! the logs of several generators into one (exactly: histograms summed second by second),
//! `report` draws one or more runs as a self-contained HTML page.
//!
//! Owns no sockets and sends nothing; [`hlog`] owns the file format, [`svg`] the drawing,
//! [`page`] the report's contents.

pub mod hlog;
pub mod page;
pub mod svg;

use std::path::PathBuf;

use thiserror::Error;

use crate::cli::{MergeOpts, ReportOpts};
use crate::stats::Report;
use hlog::{report_fields, Log, LogError};

/// Why `merge` or `report` failed.
#[derive(Debug, Error)]
pub enum LabError {
    /// A log could not be read or written.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The report could not be written.
    #[error("{path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A run asked for a latency its log does not hold.
    #[error("{run}: no latency {name:?} in its log (it has: {have})")]
    NoSeries {
        /// The run's label.
        run: String,
        /// The name asked for.
        name: String,
        /// The names it has.
        have: String,
    },
}

/// Numeric fields of the generators' reports that add up across generators (counts,
/// rates, CPU time); the others are shown per generator.
const SUMMED: [&str; 9] = [
    "publishes_sent",
    "publishes_acked_per_s",
    "deliveries_per_s",
    "errors",
    "lost",
    "unacked",
    "send_refused",
    "generator_cpu_ms",
    "generator_run_delay_ms",
];

/// `loadtest merge`: the logs added up, written to `--out`; the table and JSON line.
pub fn merge(o: &MergeOpts) -> Result<Report, LabError> {
    let mut merged = Log::default();
    for p in &o.logs {
        merged.absorb(Log::read(p)?);
    }
    if let Some(out) = &o.out {
        merged.write(out)?;
    }
    Ok(merged_report(&merged, o.logs.len()))
}

/// The figures of a merged log.
pub fn merged_report(log: &Log, files: usize) -> Report {
    let mut r = Report::new("merge");
    let gens: Vec<_> = log
        .reports
        .iter()
        .filter_map(|l| report_fields(l))
        .collect();
    let mut scenarios: Vec<String> = gens
        .iter()
        .filter_map(|g| g.get("scenario").and_then(|v| v.as_str()).map(String::from))
        .collect();
    scenarios.dedup();
    r.int("logs", files as u64)
        .int("generators", log.reports.len() as u64)
        .text("scenarios", &scenarios.join(","));
    if let Some((name, lat)) = log.headline() {
        let mut secs = 0u64;
        let _ = lat.for_each_interval(|_, _| -> Result<(), ()> {
            secs += 1;
            Ok(())
        });
        r.text("headline", name).int("seconds_with_samples", secs);
    }
    for key in SUMMED {
        let vals: Vec<f64> = gens
            .iter()
            .filter_map(|g| g.get(key).and_then(|v| v.as_f64()))
            .collect();
        if !vals.is_empty() {
            r.float(key, vals.iter().sum(), 1);
        }
    }
    for (name, lat) in &log.series {
        r.lat(name, lat);
    }
    r
}

/// `loadtest report`: the HTML page (and `--svg`), and a line saying what was written.
pub fn report(o: &ReportOpts) -> Result<String, LabError> {
    let mut runs = Vec::new();
    for spec in &o.runs {
        let (label, path) = match spec.split_once('=') {
            Some((l, p)) if !l.is_empty() => (l.to_string(), PathBuf::from(p)),
            _ => {
                let p = PathBuf::from(spec);
                let l = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| spec.clone());
                (l, p)
            }
        };
        let log = Log::read(&path)?;
        runs.push(page::Run::new(label, path, log, o.latency.as_deref())?);
    }
    let html = page::html(&o.title, &runs);
    std::fs::write(&o.out, html).map_err(|source| LabError::Write {
        path: o.out.clone(),
        source,
    })?;
    let mut said = format!("wrote {}", o.out.display());
    if let Some(svg) = &o.svg {
        std::fs::write(svg, page::spectrum(&o.title, &runs).svg()).map_err(|source| {
            LabError::Write {
                path: svg.clone(),
                source,
            }
        })?;
        said.push_str(&format!(" and {}", svg.display()));
    }
    Ok(said)
}
