//! The configuration as TOML in the layout of the `--config` file ([`super::file`]): the
//! effective one for `--print-config` (secrets masked, each value's source said), and the
//! commented example of every key at its default, `docs/walletrelay.toml`.
//!
//! A value is printed as the flag's parser read it (clap's raw value): a whole or decimal
//! number that reads back as the same text is printed as a TOML number, anything else as a
//! string, so printed output loads back to the same configuration (masked secrets aside).

use std::collections::BTreeSet;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command, CommandFactory};

use super::file::{keys, without_env, Kind, Loaded, RELOADABLE};
use super::Config;

/// Width of the example's comment lines.
const WIDTH: usize = 96;

/// What is printed.
enum Mode<'a> {
    /// `--print-config`: `from_file` names the flags the file set.
    Effective { from_file: &'a BTreeSet<String> },
    /// The example: every key commented out, with its help.
    Example,
}

impl Loaded {
    /// The effective configuration as TOML in the file's layout, secrets masked
    /// (`--print-config`).
    pub fn print(&self) -> String {
        let from_file = &self.from_file;
        write(
            &Config::command(),
            &self.matches,
            Mode::Effective { from_file },
        )
    }
}

/// `docs/walletrelay.toml`: every key, its help as a comment, at its default (whatever the
/// environment says).
pub fn example() -> Result<String, clap::Error> {
    let cmd = without_env(&Config::command());
    let defaults = cmd.clone().try_get_matches_from(["walletrelay"])?;
    Ok(write(&cmd, &defaults, Mode::Example))
}

const EFFECTIVE_HEADER: &str = "\
# walletrelay --print-config: the effective configuration (flag > environment > file > default),
# secrets masked. A commented-out key is unset; a comment after a value says where it came from
# (flag, env, file); none: the default.
";

fn example_header() -> String {
    let reloadable: Vec<String> = RELOADABLE.iter().map(|id| id.replace('_', "-")).collect();
    let text = format!(
        "walletrelay: an example configuration file with every key, each commented out at its \
         default.\n\n\
         `walletrelay --config FILE` (or WALLETRELAY_CONFIG=FILE) reads such a file. Each key is \
         a flag's name, in the table of the flag's heading in `walletrelay --help` (none: the \
         top level). A flag or its environment variable wins over the file, and the file over \
         the default. An unknown key or a bad value stops the start, naming the key and its \
         line. SIGHUP re-reads {} from the file; other changes take effect at the next start. \
         `walletrelay --print-config` shows the effective configuration in this layout.\n\n\
         Generated from the flags (src/config/print.rs): `UPDATE_EXAMPLE=1 cargo test --lib \
         config::` rewrites it, and the tests fail when it is out of date.",
        reloadable.join(", ")
    );
    let mut out = String::new();
    comment(&mut out, &text);
    out
}

fn write(cmd: &Command, m: &ArgMatches, mode: Mode<'_>) -> String {
    let mut out = match mode {
        Mode::Effective { .. } => EFFECTIVE_HEADER.to_string(),
        Mode::Example => example_header(),
    };
    let keys = keys(cmd);
    let mut tables: Vec<&str> = Vec::new();
    for k in &keys {
        if !tables.contains(&k.table.as_str()) {
            tables.push(&k.table);
        }
    }
    // Top-level keys must come before the first table.
    tables.sort_by_key(|t| !t.is_empty());
    for table in tables {
        if !out.ends_with("\n\n") {
            out.push('\n');
        }
        if !table.is_empty() {
            out.push_str(&format!("[{table}]\n"));
        }
        for key in keys.iter().filter(|k| k.table == table) {
            let arg = cmd.get_arguments().find(|a| a.get_id() == key.id.as_str());
            let raw = m.try_get_raw(&key.id).ok().flatten();
            let raw: Option<Vec<String>> = raw.map(|v| {
                v.map(|s| crate::redact::mask_setting(&key.name, &s.to_string_lossy()))
                    .collect()
            });
            let value = match (key.kind, raw) {
                (Kind::List, None) => Some("[]".to_string()),
                (Kind::List, Some(v)) => Some(format!(
                    "[{}]",
                    v.iter().map(|s| scalar(s)).collect::<Vec<_>>().join(", ")
                )),
                (Kind::Bool, v) => Some(
                    v.and_then(|v| v.into_iter().next())
                        .unwrap_or("false".into()),
                ),
                (Kind::Scalar, v) => v.and_then(|v| v.first().map(|s| scalar(s))),
            };
            match (&mode, value) {
                (Mode::Effective { from_file }, Some(value)) => {
                    let source = match m.value_source(&key.id) {
                        Some(ValueSource::CommandLine) if from_file.contains(&key.id) => "  # file",
                        Some(ValueSource::CommandLine) => "  # flag",
                        Some(ValueSource::EnvVariable) => "  # env",
                        _ => "",
                    };
                    out.push_str(&format!("{} = {value}{source}\n", key.name));
                }
                (Mode::Effective { .. }, None) => out.push_str(&format!("# {} =\n", key.name)),
                (Mode::Example, value) => {
                    let help = arg.and_then(|a| a.get_long_help().or(a.get_help()));
                    if let Some(help) = help {
                        comment(&mut out, &help.to_string());
                    }
                    match value {
                        Some(value) => out.push_str(&format!("# {} = {value}\n\n", key.name)),
                        None => out.push_str(&format!("# {} =\n\n", key.name)),
                    }
                }
            }
        }
    }
    if out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// `text` as `# ` comment lines of at most [`WIDTH`] characters (a blank line between two
/// paragraphs stays, as `#`).
fn comment(out: &mut String, text: &str) {
    for (i, paragraph) in text.split("\n\n").enumerate() {
        if i > 0 {
            out.push_str("#\n");
        }
        let mut line = String::from("#");
        for word in paragraph.split_whitespace() {
            if line.len() > 1 && line.len() + 1 + word.len() > WIDTH {
                out.push_str(&line);
                out.push('\n');
                line = String::from("#");
            }
            line.push(' ');
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
}

/// A raw value as TOML: a number when it reads back as the same text, else a string.
pub(super) fn scalar(raw: &str) -> String {
    let int = raw.parse::<i64>().is_ok_and(|i| i.to_string() == raw);
    let float = raw.contains('.')
        && raw
            .parse::<f64>()
            .is_ok_and(|f| f.is_finite() && f.to_string() == raw);
    if int || float {
        raw.to_string()
    } else {
        quote(raw)
    }
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
