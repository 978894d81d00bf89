//! The configuration file (`--config FILE`, TOML) and the precedence of a setting's four
//! sources: **flag > environment variable > file > default**.
//!
//! Every flag of [`Config`] is a key named as the flag (`max-connections-per-ip = 20`), in
//! the table named by its `--help` heading in lower case (`[limits]`, `[redis]`, ...; no
//! heading: the top level). A flag without a value is a boolean (`no-pin = true`), a repeatable
//! one a list (`redis = ["redis://..."]`; an element is split at commas where the flag's own
//! value is), any other a string or a number. `--config` and `--print-config` are not keys.
//!
//! How the file slots in between the environment and the defaults, exactly for every flag:
//! 1. the command line is parsed once as it is (clap: flags, then environment, then
//!    defaults), which says for every flag whether its value came from the command line or
//!    its environment variable ([`ArgMatches::value_source`]);
//! 2. each key of the file is checked on its own (its name, its TOML type, and its value by
//!    the flag's own parser), so a bad one is reported with its line;
//! 3. each key whose flag got no value from the command line nor the environment is turned
//!    into that flag (`--key=value`, once per list element, a `true` boolean as the bare
//!    flag; `false` is the default) and appended to the command line;
//! 4. that command line is parsed again: clap's own rules (`requires`, ranges, ...) see the
//!    file's values as if they were typed, and whatever is still unset takes its default.
//!
//! A file value therefore never beats a flag or an environment variable, and always beats a
//! default; a key absent from the file leaves the flag as flags and environment make it.
//!
//! This module owns reading and checking the file and building the [`Config`] from all four
//! sources ([`load`]), and re-reading it on SIGHUP ([`Watch`]); what a reload changes in the
//! server is `reload`'s, and printing the result is `print`'s ([`Loaded::print`] is there).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};
use toml_edit::{Document, Item, TableLike, Value};

use super::Config;

/// Largest configuration file read, in bytes.
pub const MAX_FILE_LEN: u64 = 1 << 20;

/// Flags that are not settings (never keys of the file).
const NOT_KEYS: [&str; 4] = ["config", "print_config", "help", "version"];

/// The flags SIGHUP applies from the file (clap ids); every other key takes effect at the
/// next start.
pub const RELOADABLE: [&str; 4] = ["tls_cert", "tls_key", "registry_dir", "project_ids"];

/// What a key's TOML value must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A flag without a value: `true` or `false`.
    Bool,
    /// A repeatable flag: a list of strings or numbers.
    List,
    /// A string or a number.
    Scalar,
}

/// One flag seen as a key of the file.
#[derive(Debug, Clone)]
pub(super) struct Key {
    /// Its table (`""`: the top level).
    pub table: String,
    /// The key: the flag's long name.
    pub name: String,
    /// The flag's clap id (the field's name).
    pub id: String,
    /// What its value must be.
    pub kind: Kind,
}

/// Every setting of `cmd` as a key, in `--help` order.
pub(super) fn keys(cmd: &Command) -> Vec<Key> {
    cmd.get_arguments()
        .filter(|a| !NOT_KEYS.contains(&a.get_id().as_str()))
        .filter_map(|a| {
            Some(Key {
                table: table_of(a),
                name: a.get_long()?.to_string(),
                id: a.get_id().to_string(),
                kind: match a.get_action() {
                    ArgAction::SetTrue => Kind::Bool,
                    ArgAction::Append => Kind::List,
                    _ => Kind::Scalar,
                },
            })
        })
        .collect()
}

/// The table of a flag: its `--help` heading in lower case.
fn table_of(arg: &Arg) -> String {
    arg.get_help_heading()
        .map(str::to_ascii_lowercase)
        .unwrap_or_default()
}

/// `cmd` without environment variables: a key's value is checked alone, and the example
/// shows the defaults whatever the environment says.
pub(super) fn without_env(cmd: &Command) -> Command {
    cmd.clone().mut_args(|a| a.env(None::<&'static str>))
}

/// Why the configuration cannot be built.
#[derive(Debug)]
pub enum LoadError {
    /// What clap refuses on the command line or in the environment, and `--help` and
    /// `--version`: [`clap::Error::exit`] prints it and exits as clap does.
    Args(clap::Error),
    /// The file: unreadable, not TOML, an unknown key, a bad value, or a rule between flags
    /// (`--tls-listen` needs `--tls-cert`, ...) its values break.
    File {
        /// The file.
        path: PathBuf,
        /// The line of the key, when there is one.
        line: Option<usize>,
        /// What is wrong.
        msg: String,
    },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Args(e) => write!(f, "{}", clap_message(e)),
            LoadError::File { path, line, msg } => {
                write!(f, "config {}", path.display())?;
                if let Some(line) = line {
                    write!(f, ":{line}")?;
                }
                write!(f, ": {msg}")
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// The configuration built from the command line, the environment, the file and the
/// defaults, with what `--print-config` and SIGHUP need to know of how.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration the server runs with.
    pub config: Config,
    /// The final parse: every flag's raw value and its source.
    pub(super) matches: ArgMatches,
    /// The command line as given (program name first), to load again on SIGHUP.
    args: Vec<OsString>,
    /// The file, when `--config` (or its variable) named one.
    path: Option<PathBuf>,
    /// Flags whose value came from the file.
    pub(super) from_file: BTreeSet<String>,
}

/// Builds the configuration from `args` (program name first), the environment, the file
/// `--config` names and the defaults (see the module's documentation).
pub fn load<I, T>(args: I) -> Result<Loaded, LoadError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    load_with(
        &Config::command(),
        args.into_iter().map(Into::into).collect(),
    )
}

/// [`load`] with the flags of `cmd` (tests rename the environment variables).
pub(super) fn load_with(cmd: &Command, args: Vec<OsString>) -> Result<Loaded, LoadError> {
    // Only a missing flag can be made good by the file (`--tls-listen` on the command line,
    // `tls-cert` in the file); any other error is the command line's or the environment's.
    let first = match cmd.clone().try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => cmd
            .clone()
            .ignore_errors(true)
            .try_get_matches_from(&args)
            .map_err(LoadError::Args)?,
        Err(e) => return Err(LoadError::Args(e)),
    };
    let path = match first.try_get_one::<PathBuf>("config") {
        Ok(p) => p.cloned(),
        Err(e) => {
            let msg = format!("--config: {e}");
            let err = cmd.clone().error(clap::error::ErrorKind::InvalidValue, msg);
            return Err(LoadError::Args(err));
        }
    };
    let Some(path) = path else {
        let matches = cmd
            .clone()
            .try_get_matches_from(&args)
            .map_err(LoadError::Args)?;
        return finish(matches, args, None, BTreeSet::new());
    };
    let file_err = |line, msg| LoadError::File {
        path: path.clone(),
        line,
        msg,
    };
    let text = read(&path).map_err(|msg| file_err(None, msg))?;
    let settings = settings(cmd, &text).map_err(|(line, msg)| file_err(line, msg))?;
    let mut all = args.clone();
    let mut from_file = BTreeSet::new();
    for s in settings {
        let pinned = matches!(
            first.value_source(&s.id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if !pinned {
            all.extend(s.args);
            from_file.insert(s.id);
        }
    }
    let matches = cmd
        .clone()
        .try_get_matches_from(&all)
        .map_err(|e| file_err(None, clap_message(&e)))?;
    finish(matches, args, Some(path), from_file)
}

fn finish(
    matches: ArgMatches,
    args: Vec<OsString>,
    path: Option<PathBuf>,
    from_file: BTreeSet<String>,
) -> Result<Loaded, LoadError> {
    let config = Config::from_arg_matches(&matches).map_err(LoadError::Args)?;
    Ok(Loaded {
        config,
        matches,
        args,
        path,
        from_file,
    })
}

impl Loaded {
    /// The file in use, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// What SIGHUP needs to re-read the file, when there is one.
    pub fn watch(&self) -> Option<Watch> {
        Some(Watch {
            path: self.path.clone()?,
            args: self.args.clone(),
            started: snapshot(&self.matches),
        })
    }
}

/// Every flag's raw values (`None`: unset), by clap id.
type Snapshot = BTreeMap<String, Option<Vec<OsString>>>;

fn snapshot(m: &ArgMatches) -> Snapshot {
    m.ids()
        .filter(|id| !NOT_KEYS.contains(&id.as_str()))
        .map(|id| {
            let raw = m.try_get_raw(id.as_str()).ok().flatten();
            let raw = raw.map(|v| v.map(|s| s.to_os_string()).collect());
            (id.to_string(), raw)
        })
        .collect()
}

/// The values of the keys SIGHUP applies, as flags, environment, file and defaults make
/// them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloadable {
    /// `tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// `tls-key`.
    pub tls_key: Option<PathBuf>,
    /// `registry-dir`.
    pub registry_dir: Option<PathBuf>,
    /// `project-ids`.
    pub project_ids: Option<String>,
}

impl Reloadable {
    /// The reloadable values of `config`.
    pub fn of(config: &Config) -> Reloadable {
        Reloadable {
            tls_cert: config.tls_cert.clone(),
            tls_key: config.tls_key.clone(),
            registry_dir: config.registry_dir.clone(),
            project_ids: config.project_ids.clone(),
        }
    }
}

/// The configuration file as SIGHUP re-reads it: the same command line and environment,
/// the file as it is now.
#[derive(Debug, Clone)]
pub struct Watch {
    path: PathBuf,
    args: Vec<OsString>,
    /// The raw values the server started with, to name what changed but needs a restart.
    started: Snapshot,
}

impl Watch {
    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the configuration again and returns the reloadable values; logs (warning) each
    /// other key whose value now differs from the one the server runs with. A file that
    /// does not load is an error, and nothing changes.
    pub fn reread(&self) -> Result<Reloadable, LoadError> {
        let loaded = load(self.args.iter().cloned())?;
        if let Err(e) = loaded.config.check() {
            return Err(LoadError::File {
                path: self.path.clone(),
                line: None,
                msg: e.to_string(),
            });
        }
        let now = snapshot(&loaded.matches);
        let cmd = Config::command();
        for key in keys(&cmd) {
            let changed = now.get(&key.id) != self.started.get(&key.id);
            if changed && !RELOADABLE.contains(&key.id.as_str()) {
                log::warn!(
                    "config {}: {} changed; it takes effect at the next start",
                    self.path.display(),
                    key.name
                );
            }
        }
        Ok(Reloadable::of(&loaded.config))
    }
}

/// Reads the file (at most [`MAX_FILE_LEN`] bytes, UTF-8).
fn read(path: &Path) -> Result<String, String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_LEN + 1).read_to_string(&mut text))
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_FILE_LEN {
        return Err(format!("larger than {MAX_FILE_LEN} bytes"));
    }
    Ok(text)
}

/// One key of the file as the flags it stands for.
#[derive(Debug)]
struct Setting {
    /// The flag's clap id.
    id: String,
    /// `--name=value` for each value (none for `false`).
    args: Vec<OsString>,
}

/// A line (when known) and what is wrong there.
type Fault = (Option<usize>, String);

/// Checks every key of the file and turns each into its flags, in the file's order; the
/// first fault stops.
fn settings(cmd: &Command, text: &str) -> Result<Vec<Setting>, Fault> {
    let doc = Document::parse(text).map_err(|e| {
        (
            e.span().map(|s| line_of(text, s.start)),
            e.message().to_string(),
        )
    })?;
    let keys = keys(cmd);
    let tables: BTreeSet<&str> = keys
        .iter()
        .map(|k| k.table.as_str())
        .filter(|t| !t.is_empty())
        .collect();
    let probe = without_env(cmd);
    let mut out = Vec::new();
    let root = doc.as_table();
    for (name, item) in root.iter() {
        let line = key_line(text, root, name, item);
        if tables.contains(name) {
            let table = item
                .as_table_like()
                .ok_or_else(|| (line, format!("{name}: expected a table ([{name}])")))?;
            for (inner, item) in table.iter() {
                let line = key_line(text, table, inner, item);
                let key =
                    find(&keys, name, inner).ok_or_else(|| (line, unknown(&keys, name, inner)))?;
                out.push(setting(&probe, key, item).map_err(|msg| (line, msg))?);
            }
        } else {
            let key = find(&keys, "", name).ok_or_else(|| (line, unknown(&keys, "", name)))?;
            out.push(setting(&probe, key, item).map_err(|msg| (line, msg))?);
        }
    }
    Ok(out)
}

fn find<'k>(keys: &'k [Key], table: &str, name: &str) -> Option<&'k Key> {
    keys.iter().find(|k| k.table == table && k.name == name)
}

/// The 1-based line of a key (of its value when the key has no position).
fn key_line(text: &str, table: &dyn TableLike, name: &str, item: &Item) -> Option<usize> {
    let span = table
        .key(name)
        .and_then(|k| k.span())
        .or_else(|| item.span())?;
    Some(line_of(text, span.start))
}

fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// `unknown key "x"`, with where it belongs or what was probably meant.
fn unknown(keys: &[Key], table: &str, name: &str) -> String {
    let place = if table.is_empty() {
        String::new()
    } else {
        format!(" in [{table}]")
    };
    let hint = if let Some(k) = keys.iter().find(|k| k.name == name) {
        match k.table.as_str() {
            "" => " (it belongs at the top, before any table)".to_string(),
            t => format!(" (it belongs in [{t}])"),
        }
    } else if let Some(k) = keys
        .iter()
        .find(|k| k.table == table && close(&k.name, name))
    {
        format!(" (did you mean \"{}\"?)", k.name)
    } else {
        String::new()
    };
    format!("unknown key \"{name}\"{place}{hint}")
}

/// Whether `a` and `b` are at most two edits apart (a typo).
fn close(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len().abs_diff(b.len()) > 2 {
        return false;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()] <= 2
}

/// The flags a key's value stands for, its value checked by the flag's own parser.
fn setting(probe: &Command, key: &Key, item: &Item) -> Result<Setting, String> {
    let name = &key.name;
    let value = item
        .as_value()
        .ok_or_else(|| format!("{name}: expected a value, not a table"))?;
    let values = match (key.kind, value) {
        (Kind::Bool, Value::Boolean(b)) => {
            let args = if *b.value() {
                vec![OsString::from(format!("--{name}"))]
            } else {
                Vec::new()
            };
            return Ok(Setting {
                id: key.id.clone(),
                args,
            });
        }
        (Kind::Bool, _) => return Err(format!("{name}: expected true or false")),
        (Kind::List, Value::Array(a)) => a
            .iter()
            .map(scalar)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("{name}: expected a list of strings or numbers"))?,
        (Kind::List, _) => return Err(format!("{name}: expected a list, e.g. [\"...\"]")),
        (Kind::Scalar, v) => {
            vec![scalar(v).ok_or_else(|| format!("{name}: expected a string or a number"))?]
        }
    };
    let args: Vec<OsString> = values
        .iter()
        .map(|v| OsString::from(format!("--{name}={v}")))
        .collect();
    let argv = std::iter::once(OsString::from("walletrelay")).chain(args.iter().cloned());
    match probe.clone().try_get_matches_from(argv) {
        Ok(_) => {}
        // The value is fine; another flag it needs may come from elsewhere.
        Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => {}
        Err(e) => return Err(bad_value(name, &values, &e)),
    }
    Ok(Setting {
        id: key.id.clone(),
        args,
    })
}

/// A string or a number as the text a flag would be given (a number as Rust prints it,
/// which its parser reads back as the same number).
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.value().clone()),
        Value::Integer(i) => Some(i.value().to_string()),
        Value::Float(f) => Some(f.value().to_string()),
        _ => None,
    }
}

/// `name: invalid value "x": why`.
fn bad_value(name: &str, values: &[String], e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let value = match e.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(s)) => s.clone(),
        _ => values.join(","),
    };
    // The message goes to stderr at start and to the log on SIGHUP: masked as
    // `--print-config` masks it.
    let value = crate::redact::mask_setting(name, &value);
    let why = if let Some(source) = std::error::Error::source(e) {
        source.to_string()
    } else if let Some(ContextValue::Strings(valid)) = e.get(ContextKind::ValidValue) {
        format!("expected one of {}", valid.join(", "))
    } else {
        clap_message(e)
    };
    format!("{name}: invalid value {value:?}: {why}")
}

/// clap's message on one line, without its `error:` prefix and usage.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let text = text.split("\n\nUsage:").next().unwrap_or(text);
    let text = text
        .split("\n\nFor more information")
        .next()
        .unwrap_or(text);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
