//! The process's logger (`--log-format text|json`, level from `RUST_LOG`, default `info`):
//! env_logger's filter, its writer and, for `text`, its look; a JSON line encoder of our own
//! for `json`. Owns how a log record becomes bytes on stderr; what is logged, and that no
//! secret is (DECISIONS, "Logs"), is each call site's, with [`crate::redact`]'s wrappers.
//!
//! - `text`: env_logger's format as before, `[2026-12-02T06:13:01Z INFO  target] message`,
//!   with the record's fields (the `log` crate's key-values, `log::info!(worker = 3; "...")`)
//!   appended as ` key=value` (a value with a space, a quote, `=` or a control character
//!   quoted as a JSON string).
//! - `json`: one object per line, always, whatever the message holds:
//!   `{"time":"2026-12-02T06:13:01.123456Z","level":"info","target":"walletrelay::server",
//!   "message":"...","fields":{"worker":3}}`. `time` is RFC 3339 in UTC with microseconds,
//!   `level` one of `error`, `warn`, `info`, `debug`, `trace`; `fields` is always there (`{}`
//!   when the record has none); a field is a JSON number, `true`/`false` or a string as the
//!   `log` crate captured it (`addr:% = a`: a string of its `Display`). Strings are escaped as
//!   JSON requires (`"`, `\`, every control character); Rust strings are UTF-8, so no invalid
//!   UTF-8 can reach the line (a path's bad bytes are already U+FFFD in its `Display`). A
//!   panic is logged as one `error` record of target `walletrelay::panic` (fields `thread`,
//!   `location`, and `backtrace` when `RUST_BACKTRACE` asks for one) instead of the default
//!   hook's lines.
//!
//! Both formats: a record is formatted in a buffer of the logging thread and written to stderr
//! with one `write_all` under stderr's lock, as env_logger did before (no thread, no queue, so
//! nothing is lost at exit and a worker waits for stderr exactly as long as it did). Records of
//! other crates are printed down to `debug` only: at `trace`, `ureq` prints whole request
//! URIs (a push URL's query) and `ureq-proto` every byte it sends, and no `RUST_LOG` value
//! shows them.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use log::kv::{self, Key, Source, Value, VisitSource, VisitValue};
use log::{Level, Log, Metadata, Record};

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// `[time LEVEL target] message key=value ...` (env_logger's look).
    #[default]
    Text,
    /// One JSON object per line: `time`, `level`, `target`, `message`, `fields`.
    Json,
}

/// Set once [`init`] chose JSON: [`fatal`] then logs instead of printing.
static JSON: AtomicBool = AtomicBool::new(false);

/// Installs the logger for the whole process (once; a second call changes nothing): the
/// level from `RUST_LOG` (env_logger's syntax, default `info`), the format `format`.
pub fn init(format: LogFormat) {
    let env = env_logger::Env::default().default_filter_or("info");
    let mut builder = env_logger::Builder::from_env(env);
    match format {
        LogFormat::Text => {
            builder.format_key_values(write_text_fields);
        }
        LogFormat::Json => {
            builder
                .write_style(env_logger::WriteStyle::Never)
                .format(|buf, record| {
                    let mut line = Vec::with_capacity(256);
                    encode(&mut line, SystemTime::now(), record);
                    buf.write_all(&line)
                });
        }
    }
    let inner = builder.build();
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(Logger { inner })).is_err() {
        return;
    }
    log::set_max_level(max);
    if format == LogFormat::Json {
        JSON.store(true, Ordering::Relaxed);
        std::panic::set_hook(Box::new(log_panic));
    }
}

/// Reports an error that ends the process (the caller exits): `walletrelay: MSG` on stderr
/// as before in the text format, an `error` record of target `walletrelay` in JSON.
pub fn fatal(msg: &dyn std::fmt::Display) {
    if JSON.load(Ordering::Relaxed) {
        log::error!(target: "walletrelay", "{msg}");
    } else {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "walletrelay: {msg}");
    }
}

/// env_logger's logger, with other crates' `trace` records left out (see the module's header).
struct Logger {
    inner: env_logger::Logger,
}

/// Whether a record of this target and level may be printed at all.
fn shown(m: &Metadata<'_>) -> bool {
    let t = m.target();
    m.level() <= Level::Debug || t == "walletrelay" || t.starts_with("walletrelay::")
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        shown(m) && self.inner.enabled(m)
    }

    fn log(&self, record: &Record<'_>) {
        if shown(record.metadata()) {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// The panic hook of the JSON format: one record instead of the default hook's lines.
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let payload = info.payload();
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("Box<dyn Any>");
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("<unnamed>");
    let location = info
        .location()
        .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
        .unwrap_or_default();
    let bt = std::backtrace::Backtrace::capture();
    if bt.status() == std::backtrace::BacktraceStatus::Captured {
        let bt = bt.to_string();
        log::error!(target: "walletrelay::panic", thread, location, backtrace = bt.as_str(); "panicked: {msg}");
    } else {
        log::error!(target: "walletrelay::panic", thread, location; "panicked: {msg}");
    }
}

/// Appends `record` as one JSON line (newline included) logged at `time`.
pub fn encode(out: &mut Vec<u8>, time: SystemTime, record: &Record<'_>) {
    out.extend_from_slice(b"{\"time\":\"");
    write_time(out, time);
    out.extend_from_slice(b"\",\"level\":\"");
    out.extend_from_slice(level_name(record.level()).as_bytes());
    out.extend_from_slice(b"\",\"target\":");
    crate::json::write_str(out, record.target());
    out.extend_from_slice(b",\"message\":");
    match record.args().as_str() {
        Some(s) => crate::json::write_str(out, s),
        None => {
            let mut msg = String::with_capacity(128);
            let _ = write!(msg, "{}", record.args());
            crate::json::write_str(out, &msg);
        }
    }
    out.extend_from_slice(b",\"fields\":{");
    let mut fields = JsonFields { out, first: true };
    // A source fails only when its visitor does, and ours never does.
    let _ = record.key_values().visit(&mut fields);
    out.extend_from_slice(b"}}\n");
}

/// The `level` value: lower case.
fn level_name(l: Level) -> &'static str {
    match l {
        Level::Error => "error",
        Level::Warn => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// `2026-12-02T06:13:01.123456Z` (a time before 1970 is written as 1970's first instant).
fn write_time(out: &mut Vec<u8>, t: SystemTime) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, mo, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let (h, mi, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let micros = d.subsec_micros();
    let mut text = String::with_capacity(27);
    let _ = write!(
        text,
        "{y:04}-{mo:02}-{day:02}T{h:02}:{mi:02}:{s:02}.{micros:06}Z"
    );
    out.extend_from_slice(text.as_bytes());
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's civil-from-days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Writes a record's fields as the members of a JSON object.
struct JsonFields<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'kvs> VisitSource<'kvs> for JsonFields<'_> {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), kv::Error> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        crate::json::write_str(self.out, key.as_str());
        self.out.push(b':');
        value.visit(JsonValue(self.out))
    }
}

/// Writes one field's value as JSON.
struct JsonValue<'a>(&'a mut Vec<u8>);

impl JsonValue<'_> {
    fn number(&mut self, n: impl std::fmt::Display) -> Result<(), kv::Error> {
        let _ = write!(Bytes(self.0), "{n}");
        Ok(())
    }
}

impl<'v> VisitValue<'v> for JsonValue<'_> {
    fn visit_any(&mut self, value: Value<'_>) -> Result<(), kv::Error> {
        crate::json::write_str(self.0, &value.to_string());
        Ok(())
    }
    fn visit_null(&mut self) -> Result<(), kv::Error> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }
    fn visit_u64(&mut self, v: u64) -> Result<(), kv::Error> {
        self.number(v)
    }
    fn visit_i64(&mut self, v: i64) -> Result<(), kv::Error> {
        self.number(v)
    }
    fn visit_u128(&mut self, v: u128) -> Result<(), kv::Error> {
        self.number(v)
    }
    fn visit_i128(&mut self, v: i128) -> Result<(), kv::Error> {
        self.number(v)
    }
    fn visit_f64(&mut self, v: f64) -> Result<(), kv::Error> {
        if v.is_finite() {
            self.number(v)
        } else {
            // JSON has no NaN or infinity.
            crate::json::write_str(self.0, &v.to_string());
            Ok(())
        }
    }
    fn visit_bool(&mut self, v: bool) -> Result<(), kv::Error> {
        self.0
            .extend_from_slice(if v { b"true" as &[u8] } else { b"false" });
        Ok(())
    }
    fn visit_str(&mut self, v: &str) -> Result<(), kv::Error> {
        crate::json::write_str(self.0, v);
        Ok(())
    }
    fn visit_char(&mut self, v: char) -> Result<(), kv::Error> {
        crate::json::write_str(self.0, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
}

/// `fmt::Write` into a byte buffer.
struct Bytes<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// The text format's fields: ` key=value` each.
fn write_text_fields(
    buf: &mut env_logger::fmt::Formatter,
    fields: &dyn Source,
) -> std::io::Result<()> {
    let mut line = String::new();
    let _ = fields.visit(&mut TextFields(&mut line));
    buf.write_all(line.as_bytes())
}

/// Appends ` key=value` per field to a line of the text format.
struct TextFields<'a>(&'a mut String);

impl<'kvs> VisitSource<'kvs> for TextFields<'_> {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), kv::Error> {
        let v = value.to_string();
        let _ = write!(self.0, " {key}=");
        if v.is_empty()
            || v.contains(|c: char| c.is_whitespace() || c.is_control() || c == '"' || c == '=')
        {
            let mut quoted = Vec::with_capacity(v.len() + 2);
            crate::json::write_str(&mut quoted, &v);
            self.0.push_str(&String::from_utf8_lossy(&quoted));
        } else {
            self.0.push_str(&v);
        }
        Ok(())
    }
}

/// [`write_text_fields`] of a record, for tests.
#[cfg(test)]
fn text_fields(record: &Record<'_>) -> String {
    let mut line = String::new();
    let _ = record.key_values().visit(&mut TextFields(&mut line));
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `record` built with these fields, encoded at `t`.
    fn json_of(
        msg: std::fmt::Arguments<'_>,
        fields: &[(&str, Value<'_>)],
        t: SystemTime,
    ) -> String {
        let kvs: Vec<(Key<'_>, Value<'_>)> = fields
            .iter()
            .map(|(k, v)| (Key::from_str(k), v.clone()))
            .collect();
        let record = Record::builder()
            .args(msg)
            .level(Level::Warn)
            .target("walletrelay::engine::redis::cluster::shard")
            .key_values(&kvs)
            .build();
        let mut out = Vec::new();
        encode(&mut out, t, &record);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_record_is_one_json_line_with_the_five_keys() {
        let t = UNIX_EPOCH + Duration::new(1_796_191_981, 123_456_789);
        let addr = "127.0.0.1:6379/0";
        let line = json_of(
            format_args!("redis shard: {}; reconnecting", "down"),
            &[
                ("shard", Value::from(2u64)),
                ("addr", Value::from_display(&addr)),
                ("up", Value::from(false)),
                ("ratio", Value::from(0.5f64)),
                ("delta", Value::from(-3i64)),
                ("bad", Value::from(f64::NAN)),
            ],
            t,
        );
        assert_eq!(
            line,
            "{\"time\":\"2026-12-02T06:13:01.123456Z\",\"level\":\"warn\",\
             \"target\":\"walletrelay::engine::redis::cluster::shard\",\"message\":\"redis shard: down; \
             reconnecting\",\"fields\":{\"shard\":2,\"addr\":\"127.0.0.1:6379/0\",\"up\":false,\
             \"ratio\":0.5,\"delta\":-3,\"bad\":\"NaN\"}}\n"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["fields"]["shard"], 2);
        let none = json_of(format_args!("x"), &[], t);
        assert!(none.ends_with(",\"fields\":{}}\n"), "{none}");
    }

    #[test]
    fn quotes_newlines_and_control_characters_stay_on_one_valid_line() {
        let nasty = "a \"quoted\" line\nand\r\nmore\t\u{1}\u{1f}\u{7f} \\ \u{2028} é \u{fffd}";
        let line = json_of(
            format_args!("{nasty}"),
            &[
                ("path", Value::from(nasty)),
                ("we\"ird\nkey", Value::from('\n')),
            ],
            UNIX_EPOCH,
        );
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(line.ends_with('\n'));
        assert!(
            !line[..line.len() - 1].bytes().any(|b| b < 0x20),
            "{line:?}"
        );
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["message"], nasty);
        assert_eq!(v["fields"]["path"], nasty);
        assert_eq!(v["fields"]["we\"ird\nkey"], "\n");
        assert_eq!(v["time"], "1970-01-01T00:00:00.000000Z");
    }

    #[test]
    fn times_are_rfc3339_utc_with_microseconds() {
        for (secs, nanos, want) in [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, 999_999_999, "2000-02-29T00:00:00.999999Z"),
            (1_709_251_199, 1_000, "2024-02-29T23:59:59.000001Z"),
            (4_102_444_800, 0, "2100-01-01T00:00:00.000000Z"),
        ] {
            let mut out = Vec::new();
            write_time(&mut out, UNIX_EPOCH + Duration::new(secs, nanos));
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
        let mut out = Vec::new();
        write_time(&mut out, UNIX_EPOCH - Duration::from_secs(5));
        assert_eq!(out, b"1970-01-01T00:00:00.000000Z");
    }

    #[test]
    fn text_fields_are_appended_quoted_when_needed() {
        let kvs: [(Key<'_>, Value<'_>); 4] = [
            (Key::from_str("worker"), Value::from(3u64)),
            (Key::from_str("addr"), Value::from("127.0.0.1:80")),
            (
                Key::from_str("error"),
                Value::from("connection refused (os error 111)"),
            ),
            (Key::from_str("empty"), Value::from("")),
        ];
        let record = Record::builder()
            .args(format_args!("m"))
            .key_values(&kvs)
            .build();
        assert_eq!(
            text_fields(&record),
            " worker=3 addr=127.0.0.1:80 error=\"connection refused (os error 111)\" empty=\"\""
        );
    }

    #[test]
    fn other_crates_trace_records_are_never_shown() {
        let m = |target, level| Metadata::builder().target(target).level(level).build();
        assert!(shown(&m("walletrelay::server", Level::Trace)));
        assert!(shown(&m("walletrelay", Level::Trace)));
        assert!(shown(&m("ureq::run", Level::Debug)));
        assert!(!shown(&m("ureq_proto::util", Level::Trace)));
        assert!(!shown(&m("walletrelayx", Level::Trace)));
    }
}
