//! HdrHistogram interval logs, in the standard text format that HdrHistogram's own tools
//! (`HistogramLogProcessor`, the plotters) read: what `--hlog` writes, what `merge` and
//! `report` read.
//!
//! A log of loadtest's holds, after its header (`#[StartTime: ..]`, `#[BaseTime: ..]`, the
//! legend line), one line per latency per whole Unix second in which values were recorded,
//! `Tag=NAME,start,length,max,base64` (V2 deflate encoding; values in µs, `Interval_Max` in
//! ms as the Java writer's default divisor gives): the headline latency untagged (what the
//! Java tools read by default), the others tagged with their names. Comment lines carry what
//! the histograms cannot: the headline's name (`#[Loadtest-Headline: NAME]`) and each
//! generator's JSON line (`#loadtest-report {...}`). Owns the format; it decides nothing
//! about what is measured.

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use hdrhistogram::serialization::interval_log::{
    IntervalLogIterator, IntervalLogWriterBuilder, LogEntry, Tag,
};
use hdrhistogram::serialization::{Deserializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use thiserror::Error;

use crate::stats::{Lat, Report, INTERVAL_NS};

/// The comment that carries one generator's JSON line.
pub const REPORT_PREFIX: &str = "#loadtest-report ";

/// The comment that names the untagged series.
const HEADLINE_PREFIX: &str = "#[Loadtest-Headline: ";

/// The legend line of HdrHistogram's format (the Java writer's, byte for byte).
pub const LEGEND: &str =
    "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"";

/// Values are µs; `Interval_Max` is written in ms, as jHiccup's logs.
const MAX_VALUE_DIVISOR: f64 = 1000.0;

/// Most bytes of a log read (a day of one-second intervals of a few series is far less).
const MAX_LOG_BYTES: u64 = 512 << 20;

/// Why a log could not be read or written.
#[derive(Debug, Error)]
pub enum LogError {
    /// The file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The text is not an interval log.
    #[error("{path}: not an HdrHistogram interval log (cannot parse at byte {offset})")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where parsing stopped.
        offset: usize,
    },
    /// A histogram's base64 or encoding is broken.
    #[error("{path}: interval at {start:.3} s: histogram cannot be decoded: {why}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The interval's timestamp, as written.
        start: f64,
        /// The decoder's word.
        why: String,
    },
    /// A histogram holds values beyond loadtest's range (1 µs to 1 h).
    #[error("{path}: holds values beyond 1 h (or not in µs): not a loadtest log")]
    Range {
        /// The file.
        path: PathBuf,
    },
    /// A histogram could not be encoded (counts beyond the format's range).
    #[error("{path}: histogram {name} cannot be encoded: {why}")]
    Encode {
        /// The file.
        path: PathBuf,
        /// The series.
        name: String,
        /// The encoder's word.
        why: String,
    },
    /// A series name that the format cannot carry as a tag.
    #[error("latency name {0:?} cannot be an interval log tag (no ',', ' ' or newline)")]
    BadName(String),
    /// Nothing to merge or show.
    #[error("{0}: holds no interval histogram")]
    Empty(PathBuf),
}

/// The latencies of one or more generators, as a log holds them.
#[derive(Debug, Default, Clone)]
pub struct Log {
    /// Named series in order, the headline first: totals and per-second timelines.
    pub series: Vec<(String, Lat)>,
    /// The generators' JSON lines, one per generator (or phase).
    pub reports: Vec<String>,
}

impl Log {
    /// What a generator writes: every latency of `reports` (the first report's first one is
    /// the headline; a run of several reports, `abuse`'s phases, names them `pN.NAME`).
    pub fn of_reports(reports: &[&Report]) -> Log {
        let mut log = Log::default();
        let many = reports.len() > 1;
        for (i, r) in reports.iter().enumerate() {
            for (name, lat) in r.hists() {
                let name = if many {
                    format!("p{i}.{name}")
                } else {
                    name.clone()
                };
                log.series.push((name, lat.clone()));
            }
            log.reports.push(r.json());
        }
        log
    }

    /// The series called `name`.
    pub fn get(&self, name: &str) -> Option<&Lat> {
        self.series.iter().find(|(n, _)| n == name).map(|(_, l)| l)
    }

    /// The headline series (the first), if any.
    pub fn headline(&self) -> Option<(&str, &Lat)> {
        self.series.first().map(|(n, l)| (n.as_str(), l))
    }

    /// Add `other`'s histograms, series by series and second by second: the log of all
    /// their samples together. A series `other` has and this log has not is appended.
    pub fn absorb(&mut self, other: Log) {
        for (name, lat) in other.series {
            match self.series.iter_mut().find(|(n, _)| *n == name) {
                Some((_, mine)) => mine.merge(&lat),
                None => self.series.push((name, lat)),
            }
        }
        self.reports.extend(other.reports);
    }

    /// The log's text.
    pub fn render(&self, path: &Path) -> Result<Vec<u8>, LogError> {
        let first = self
            .series
            .iter()
            .filter_map(|(_, l)| first_second(l))
            .min()
            .ok_or_else(|| LogError::Empty(path.to_path_buf()))?;
        let base = UNIX_EPOCH + Duration::from_secs(first);
        let mut buf = Vec::new();
        let mut ser = V2DeflateSerializer::new();
        let io = |source| LogError::Io {
            path: path.to_path_buf(),
            source,
        };
        {
            let mut b = IntervalLogWriterBuilder::new();
            b.add_comment("loadtest interval log: values in µs, Interval_Max in ms")
                .with_start_time(base)
                .with_base_time(base)
                .with_max_value_divisor(MAX_VALUE_DIVISOR);
            b.begin_log_with(&mut buf, &mut ser).map_err(io)?;
        }
        if let Some((name, _)) = self.series.first() {
            buf.extend_from_slice(format!("{HEADLINE_PREFIX}{name}]\n").as_bytes());
        }
        buf.extend_from_slice(LEGEND.as_bytes());
        buf.push(b'\n');
        // Intervals in time order, the series of one second together.
        let mut lines: Vec<(u64, usize, Vec<u8>)> = Vec::new();
        for (i, (name, lat)) in self.series.iter().enumerate() {
            let tag = match i {
                0 => None,
                _ => Some(Tag::new(name).ok_or_else(|| LogError::BadName(name.clone()))?),
            };
            let mut one = Vec::new();
            lat.for_each_interval(|sec, h| {
                one.clear();
                let mut w = IntervalLogWriterBuilder::new()
                    .with_max_value_divisor(MAX_VALUE_DIVISOR)
                    .begin_log_with(&mut one, &mut ser)
                    .map_err(io)?;
                let start = Duration::from_secs(sec - first);
                w.write_histogram(h, start, Duration::from_nanos(INTERVAL_NS), tag)
                    .map_err(|e| LogError::Encode {
                        path: path.to_path_buf(),
                        name: name.clone(),
                        why: e.to_string(),
                    })?;
                lines.push((sec, i, one.clone()));
                Ok(())
            })?;
        }
        lines.sort_by_key(|(sec, i, _)| (*sec, *i));
        for (_, _, l) in lines {
            // Each holds a `#[MaxValueDivisor..]` comment line, then the interval.
            let body = l
                .iter()
                .position(|&c| c == b'\n')
                .map_or(&l[..], |p| &l[p + 1..]);
            buf.extend_from_slice(body);
        }
        for r in &self.reports {
            buf.extend_from_slice(REPORT_PREFIX.as_bytes());
            buf.extend_from_slice(r.replace('\n', " ").as_bytes());
            buf.push(b'\n');
        }
        Ok(buf)
    }

    /// Write the log to `path`.
    pub fn write(&self, path: &Path) -> Result<(), LogError> {
        let text = self.render(path)?;
        std::fs::write(path, text).map_err(|source| LogError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Read a log (loadtest's, or any interval log of µs values up to 1 h).
    pub fn read(path: &Path) -> Result<Log, LogError> {
        let io = |source| LogError::Io {
            path: path.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_LOG_BYTES {
            return Err(io(std::io::Error::other(format!(
                "{len} bytes: larger than the {MAX_LOG_BYTES} bytes read"
            ))));
        }
        let text = std::fs::read(path).map_err(io)?;
        Log::parse(&text, path)
    }

    /// Parse a log's text (`path` only names it in errors).
    pub fn parse(text: &[u8], path: &Path) -> Result<Log, LogError> {
        let mut log = Log::default();
        let mut headline = String::from("latency");
        for line in text.split(|&c| c == b'\n') {
            let line = String::from_utf8_lossy(line);
            if let Some(r) = line.strip_prefix(REPORT_PREFIX) {
                log.reports.push(r.trim().to_string());
            } else if let Some(h) = line.strip_prefix(HEADLINE_PREFIX) {
                headline = h.trim_end().trim_end_matches(']').to_string();
            }
        }
        let mut base = 0.0f64;
        let mut dec = Deserializer::new();
        for entry in IntervalLogIterator::new(text) {
            let entry = entry.map_err(|e| match e {
                hdrhistogram::serialization::interval_log::LogIteratorError::ParseError {
                    offset,
                } => LogError::Parse {
                    path: path.to_path_buf(),
                    offset,
                },
            })?;
            match entry {
                LogEntry::BaseTime(t) => base = t.as_secs_f64(),
                LogEntry::StartTime(_) => {}
                LogEntry::Interval(iv) => {
                    let start = iv.start_timestamp().as_secs_f64();
                    let decode_err = |why: String| LogError::Decode {
                        path: path.to_path_buf(),
                        start,
                        why,
                    };
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(iv.encoded_histogram())
                        .map_err(|e| decode_err(e.to_string()))?;
                    let h: Histogram<u64> = dec
                        .deserialize(&mut &bytes[..])
                        .map_err(|e| decode_err(format!("{e:?}")))?;
                    let name = iv.tag().map_or(headline.as_str(), |t| t.as_str());
                    let sec = (base + start + 1e-4).floor() as u64;
                    let lat = match log.series.iter_mut().find(|(n, _)| n == name) {
                        Some((_, l)) => l,
                        None => {
                            log.series.push((name.to_string(), Lat::new()));
                            let last = log.series.len() - 1;
                            &mut log.series[last].1
                        }
                    };
                    if !lat.add_interval(sec, &h, bytes) {
                        return Err(LogError::Range {
                            path: path.to_path_buf(),
                        });
                    }
                }
            }
        }
        if log.series.is_empty() {
            return Err(LogError::Empty(path.to_path_buf()));
        }
        // The headline first, whatever order the lines came in.
        if let Some(i) = log.series.iter().position(|(n, _)| *n == headline) {
            let h = log.series.remove(i);
            log.series.insert(0, h);
        }
        Ok(log)
    }
}

/// The first Unix second a timeline holds.
fn first_second(l: &Lat) -> Option<u64> {
    let mut first = None;
    let _ = l.for_each_interval(|sec, _| -> Result<(), ()> {
        first = Some(sec);
        Err(())
    });
    first
}

/// The JSON line of a generator's report, parsed (`None` if it is not a JSON object).
pub fn report_fields(line: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str(line) {
        Ok(serde_json::Value::Object(m)) => Some(m),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
