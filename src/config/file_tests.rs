//! Tests of the configuration file: the precedence flag > environment > file > default on
//! every kind of flag, faults reported with their line, `--print-config` (masking, round
//! trip) and the example `docs/walletrelay.toml` (up to date, loadable, complete).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::{Command, CommandFactory};

use super::super::print::{example, scalar};
use super::super::Config;
use super::*;
use crate::redact::mask_setting as mask;

/// A file removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(text: &str) -> TempFile {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("wr-config-{}-{n}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `Config`'s flags with environment variables of their own (`<prefix>WALLETRELAY_...`), so
/// a test sets variables no other test (nor any other parse in this process) reads. clap
/// reads a variable when its flag is defined: set them first.
fn renamed_env(prefix: &str) -> Command {
    let prefix = prefix.to_string();
    Config::command().mut_args(move |a| {
        let renamed = a
            .get_env()
            .map(|e| format!("{prefix}{}", e.to_string_lossy()));
        match renamed {
            Some(name) => a.env(Some(&*Box::leak(name.into_boxed_str()))),
            None => a,
        }
    })
}

/// Loads with `args` (after the program name), the variables `env` set (`THREADS` for
/// `WALLETRELAY_THREADS`) and, when given, `file` as `--config`.
fn load_env(
    args: &[&str],
    env: &[(&str, &str)],
    file: Option<&TempFile>,
) -> Result<Loaded, LoadError> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let prefix = format!("WRTEST{}_", N.fetch_add(1, Ordering::Relaxed));
    for (k, v) in env {
        std::env::set_var(format!("{prefix}WALLETRELAY_{k}"), v);
    }
    let cmd = renamed_env(&prefix);
    let mut argv: Vec<std::ffi::OsString> = vec!["walletrelay".into()];
    argv.extend(args.iter().map(Into::into));
    if let Some(f) = file {
        argv.extend(["--config".into(), f.path().into()]);
    }
    let out = load_with(&cmd, argv);
    for (k, _) in env {
        std::env::remove_var(format!("{prefix}WALLETRELAY_{k}"));
    }
    out
}

fn load_file(text: &str, args: &[&str]) -> Result<Loaded, LoadError> {
    let f = TempFile::new(text);
    load_env(args, &[], Some(&f))
}

/// The fault of a file that must not load: (line, message).
fn fault(text: &str) -> (Option<usize>, String) {
    match load_file(text, &[]) {
        Err(LoadError::File { line, msg, .. }) => (line, msg),
        Err(e) => panic!("not a file error: {e}"),
        Ok(_) => panic!("loaded: {text}"),
    }
}

const FILE: &str = r#"
[workers]
no-pin = true
threads = 3
cpus = [1, 2]

[redis]
redis-wait-replicas = 2
redis-tls-ca = "/etc/file-ca.pem"

[limits]
head-timeout = 2.5
ping-interval = 7
"#;

#[test]
fn the_file_beats_the_defaults() {
    let c = load_file(FILE, &[]).unwrap().config;
    assert!(c.no_pin);
    assert_eq!(c.threads, 3);
    assert_eq!(c.cpus, [1, 2]);
    assert_eq!(c.redis_opts.redis_wait_replicas, Some(2));
    assert_eq!(
        c.redis_opts.redis_tls_ca,
        Some(PathBuf::from("/etc/file-ca.pem"))
    );
    assert_eq!(c.limits.head_timeout, 2.5);
    assert_eq!(c.limits.ping_interval, 7.0);
    // Keys the file leaves out keep their defaults.
    let d = load_env(&[], &[], None).unwrap().config;
    assert!(!d.no_pin && d.threads == 0 && d.cpus.is_empty());
    assert_eq!(d.redis_opts.redis_wait_replicas, None);
    assert_eq!(c.limits.max_message, d.limits.max_message);
    assert_eq!(c.service_name, "WalletRelay");
}

#[test]
fn the_environment_beats_the_file() {
    let f = TempFile::new(FILE);
    let env = [
        ("NO_PIN", "false"),
        ("THREADS", "5"),
        ("CPUS", "4,5,6"),
        ("REDIS_WAIT_REPLICAS", "1"),
        ("REDIS_TLS_CA", "/etc/env-ca.pem"),
        ("HEAD_TIMEOUT", "4"),
    ];
    let c = load_env(&[], &env, Some(&f)).unwrap().config;
    assert!(!c.no_pin);
    assert_eq!(c.threads, 5);
    assert_eq!(c.cpus, [4, 5, 6]);
    assert_eq!(c.redis_opts.redis_wait_replicas, Some(1));
    assert_eq!(
        c.redis_opts.redis_tls_ca,
        Some(PathBuf::from("/etc/env-ca.pem"))
    );
    assert_eq!(c.limits.head_timeout, 4.0);
    // What the environment leaves to the file stays the file's.
    assert_eq!(c.limits.ping_interval, 7.0);
}

/// `[admin]`: `admin-listen` and `drain`, each from the file, its variable or its flag.
#[test]
fn the_admin_keys_come_from_each_source() {
    let text = "[admin]\nadmin-listen = \"127.0.0.1:9091\"\ndrain = 30\n";
    let c = load_file(text, &[]).unwrap().config;
    assert_eq!(
        c.admin.admin_listen,
        Some("127.0.0.1:9091".parse().unwrap())
    );
    assert_eq!(c.admin.drain, 30.0);
    let f = TempFile::new(text);
    let env = [("ADMIN_LISTEN", "127.0.0.1:9092"), ("DRAIN", "2.5")];
    let c = load_env(&[], &env, Some(&f)).unwrap().config;
    assert_eq!(
        c.admin.admin_listen,
        Some("127.0.0.1:9092".parse().unwrap())
    );
    assert_eq!(c.admin.drain, 2.5);
    let c = load_env(&["--drain", "0"], &env, Some(&f)).unwrap().config;
    assert_eq!(c.admin.drain, 0.0);
    let c = load_env(&[], &[], None).unwrap().config;
    assert_eq!((c.admin.admin_listen, c.admin.drain), (None, 0.0));
    assert_eq!(fault("[admin]\ndrain = -1\n").0, Some(2));
}

#[test]
fn a_flag_beats_the_environment_and_the_file() {
    let f = TempFile::new(FILE);
    let env = [
        ("NO_PIN", "false"),
        ("THREADS", "5"),
        ("CPUS", "4"),
        ("REDIS_WAIT_REPLICAS", "1"),
    ];
    let args = [
        "--no-pin",
        "--threads",
        "7",
        "--cpus",
        "9",
        "--redis-wait-replicas",
        "0",
        "--redis-tls-ca",
        "/etc/flag-ca.pem",
        "--ping-interval=8",
    ];
    let c = load_env(&args, &env, Some(&f)).unwrap().config;
    assert!(c.no_pin);
    assert_eq!(c.threads, 7);
    assert_eq!(c.cpus, [9]);
    assert_eq!(c.redis_opts.redis_wait_replicas, Some(0));
    assert_eq!(
        c.redis_opts.redis_tls_ca,
        Some(PathBuf::from("/etc/flag-ca.pem"))
    );
    assert_eq!(c.limits.ping_interval, 8.0);
    assert_eq!(c.limits.head_timeout, 2.5);
}

#[test]
fn the_config_file_itself_may_come_from_the_environment() {
    let f = TempFile::new("service-name = \"from-file\"\n");
    let c = load_env(&[], &[("CONFIG", f.path())], None).unwrap();
    assert_eq!(c.config.service_name, "from-file");
    assert_eq!(c.path(), Some(Path::new(f.path())));
}

#[test]
fn rules_between_flags_hold_across_sources() {
    // `--tls-listen` on the command line, its certificate and key in the file.
    let text = "[tls]\ntls-cert = \"c.pem\"\ntls-key = \"k.pem\"\n";
    let c = load_file(text, &["--tls-listen", "127.0.0.1:8443"])
        .unwrap()
        .config;
    assert_eq!(
        (c.tls_cert.as_deref(), c.tls_key.as_deref()),
        (Some(Path::new("c.pem")), Some(Path::new("k.pem")))
    );
    // A certificate without a TLS listener anywhere is refused, as on the command line.
    let (line, msg) = fault("[tls]\ntls-cert = \"c.pem\"\n");
    assert_eq!(line, None);
    assert!(msg.contains("--tls-listen"), "{msg}");
    // Still a plain error of the command line when the file cannot be at fault.
    assert!(matches!(
        load_file("", &["--threads", "x"]),
        Err(LoadError::Args(_))
    ));
}

#[test]
fn listen_none_and_false_booleans() {
    let c = load_file("listen = \"none\"\nws-echo = false\n", &[])
        .unwrap()
        .config;
    assert_eq!(c.listen, None);
    assert!(!c.ws_echo);
    let c = load_file("ws-echo = true\n", &[]).unwrap().config;
    assert!(c.ws_echo);
}

#[test]
fn an_unknown_key_is_named_with_its_line() {
    let text = "service-name = \"x\"\n\n[limits]\nmax-message = 5\nmax-conections-per-ip = 20\n";
    let (line, msg) = fault(text);
    assert_eq!(line, Some(5));
    assert!(
        msg.starts_with("unknown key \"max-conections-per-ip\" in [limits]"),
        "{msg}"
    );
    assert!(
        msg.contains("did you mean \"max-connections-per-ip\""),
        "{msg}"
    );
    let (line, msg) = fault("threads = 2\n");
    assert_eq!(line, Some(1));
    assert_eq!(msg, "unknown key \"threads\" (it belongs in [workers])");
    let (line, msg) = fault("[limits]\nlisten = \"none\"\n");
    assert_eq!(line, Some(2));
    assert!(msg.contains("it belongs at the top"), "{msg}");
    assert_eq!(
        fault("\n[nope]\nx = 1\n"),
        (Some(2), "unknown key \"nope\"".to_string())
    );
    assert_eq!(
        fault("config = \"other.toml\"\n").1,
        "unknown key \"config\""
    );
    assert_eq!(
        fault("print-config = true\n").1,
        "unknown key \"print-config\""
    );
}

#[test]
fn a_bad_value_is_named_with_its_line() {
    let text = "\n[limits]\nmax-message = 5\n\n\n\nmax-connections-per-ip = \"x\"\n";
    let (line, msg) = fault(text);
    assert_eq!(line, Some(7));
    assert_eq!(
        msg,
        "max-connections-per-ip: invalid value \"x\": invalid digit found in string"
    );
    let (line, msg) = fault("[storage]\nsegment-bytes = 5\n");
    assert_eq!(line, Some(2));
    assert!(
        msg.starts_with("segment-bytes: invalid value \"5\": 5 is not in 4096"),
        "{msg}"
    );
    let (_, msg) = fault("[storage]\nfsync = \"sometimes\"\n");
    assert_eq!(
        msg,
        "fsync: invalid value \"sometimes\": expected one of always, everysec, off"
    );
    assert_eq!(
        fault("[workers]\nno-pin = \"yes\"\n"),
        (Some(2), "no-pin: expected true or false".into())
    );
    assert_eq!(
        fault("[redis]\nredis = \"redis://h\"\n").1,
        "redis: expected a list, e.g. [\"...\"]"
    );
    assert_eq!(
        fault("listen = [\"a\"]\n").1,
        "listen: expected a string or a number"
    );
    assert_eq!(
        fault("limits = 5\n"),
        (Some(1), "limits: expected a table ([limits])".into())
    );
    let (line, msg) = fault("[limits]\nlimit-exempt = [\"10.0.0.0/8\", \"nope\"]\n");
    assert_eq!(line, Some(2));
    assert!(
        msg.starts_with("limit-exempt: invalid value \"nope\""),
        "{msg}"
    );
    // Not TOML at all: the parser's message and line.
    let (line, msg) = fault("listen = \"a\"\nthreads 3\n");
    assert_eq!(line, Some(2));
    assert!(!msg.is_empty());
    // A bad value stops the start even where a flag overrides it.
    let f = TempFile::new("[workers]\nthreads = \"x\"\n");
    assert!(matches!(
        load_env(&["--threads", "2"], &[], Some(&f)),
        Err(LoadError::File { .. })
    ));
}

#[test]
fn the_error_reads_as_the_file_line_and_the_key() {
    let e = LoadError::File {
        path: "relay.toml".into(),
        line: Some(12),
        msg: "unknown key \"x\"".into(),
    };
    assert_eq!(e.to_string(), "config relay.toml:12: unknown key \"x\"");
    assert!(matches!(
        load_env(&["--config", "/nonexistent/wr.toml"], &[], None),
        Err(LoadError::File { line: None, .. })
    ));
}

#[test]
fn secrets_are_masked() {
    let m = |v| mask("redis", v);
    assert_eq!(
        m("redis://user:pw@10.0.0.1:6379/0"),
        "redis://user:***@10.0.0.1:6379/0"
    );
    assert_eq!(m("rediss://:pw@h"), "rediss://:***@h");
    assert_eq!(m("redis://token@h"), "redis://***@h");
    assert_eq!(
        m("redis+sentinel://u:p@h:26379/m/4?addr=h2:1&sentinel_user=s&sentinel_password=sp"),
        "redis+sentinel://u:***@h:26379/m/4?addr=h2:1&sentinel_user=s&sentinel_password=***"
    );
    assert_eq!(m("redis://h:6379/0?x=1#frag"), "redis://h:6379/0?x=1#frag");
    assert_eq!(
        mask("image-base", "https://a:b@x/logo?api_key=k"),
        "https://a:***@x/logo?api_key=***"
    );
    assert_eq!(mask("tls-key", "/etc/k.pem"), "/etc/k.pem");
    assert_eq!(mask("redis-password-file", "/run/pw"), "/run/pw");
    assert_eq!(mask("some-token", "abc"), "***");

    let text = "[redis]\nredis = [\"redis://relay:hunter2@10.0.0.1:6379/0\", \
                \"redis+sentinel://h:26379/m?sentinel_password=s3cret\"]\n";
    let printed = load_file(text, &[]).unwrap().print();
    assert!(
        !printed.contains("hunter2") && !printed.contains("s3cret"),
        "{printed}"
    );
    assert!(printed.contains(
        "redis = [\"redis://relay:***@10.0.0.1:6379/0\", \"redis+sentinel://h:26379/m?sentinel_password=***\"]  # file"
    ), "{printed}");
}

#[test]
fn print_config_says_where_each_value_came_from_and_loads_back() {
    let f = TempFile::new(FILE);
    let loaded = load_env(&["--threads", "9"], &[("BACKLOG", "77")], Some(&f)).unwrap();
    let printed = loaded.print();
    for line in [
        "threads = 9  # flag",
        "backlog = 77  # env",
        "no-pin = true  # file",
        "cpus = [1, 2]  # file",
        "head-timeout = 2.5  # file",
        "max-message = 1048576",
        "# tls-cert =",
        "[limits]",
        "fsync = \"everysec\"",
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "{line:?} missing in\n{printed}"
        );
    }
    // Printed, it loads back to the same configuration.
    let strip = |s: &str| {
        s.lines()
            .map(|l| l.split("  # ").next().unwrap_or(l).to_string())
            .collect::<Vec<_>>()
    };
    let again = load_file(&printed, &[]).unwrap();
    assert_eq!(strip(&again.print()), strip(&printed));
    assert_eq!(
        format!("{:?}", again.config.limits),
        format!("{:?}", loaded.config.limits)
    );
}

#[test]
fn numbers_and_strings_print_as_they_read_back() {
    assert_eq!(scalar("1048576"), "1048576");
    assert_eq!(scalar("-3"), "-3");
    assert_eq!(scalar("2.5"), "2.5");
    assert_eq!(scalar("007"), "\"007\"");
    assert_eq!(scalar("1e3"), "\"1e3\"");
    assert_eq!(scalar("inf"), "\"inf\"");
    assert_eq!(scalar("0.0.0.0:8080"), "\"0.0.0.0:8080\"");
    assert_eq!(scalar("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
}

/// The example in the repository, and the example with every key uncommented.
fn example_texts() -> (String, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/walletrelay.toml");
    let made = example().unwrap();
    if std::env::var_os("UPDATE_EXAMPLE").is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    let kept = std::fs::read_to_string(&path).unwrap();
    assert!(
        kept == made,
        "docs/walletrelay.toml is out of date: `UPDATE_EXAMPLE=1 cargo test --lib config::` rewrites it"
    );
    let uncommented = kept
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(kv) if is_key_line(kv) => kv,
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    (kept, uncommented)
}

/// `name = value` with a key's name.
fn is_key_line(kv: &str) -> bool {
    kv.split_once(" = ").is_some_and(|(k, _)| {
        !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

#[test]
fn the_example_is_up_to_date_and_loads_as_the_defaults() {
    let (kept, uncommented) = example_texts();
    let defaults = load_env(&[], &[], None).unwrap();
    let as_is = load_file(&kept, &[]).unwrap();
    assert_eq!(
        format!("{:?}", as_is.config.limits),
        format!("{:?}", defaults.config.limits)
    );
    // Every key at its default, uncommented: still the defaults.
    let all = load_file(&uncommented, &[]).unwrap();
    let strip = |s: &str| {
        s.lines()
            .map(|l| l.split("  # ").next().unwrap_or(l).to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&all.print()), strip(&defaults.print()));
}

#[test]
fn every_flag_of_help_is_a_key_of_the_example() {
    let (kept, _) = example_texts();
    let help = Config::command().render_long_help().to_string();
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|l| l.split([' ', '=', ',']).next())
        .filter(|f| !["config", "print-config", "help", "version"].contains(f))
        .collect();
    assert!(flags.len() >= 60, "{flags:?}");
    let cmd = Config::command();
    for flag in flags {
        let key = keys(&cmd).into_iter().find(|k| k.name == flag).unwrap();
        let (header, line) = (format!("[{}]", key.table), format!("# {flag} ="));
        let at = kept
            .lines()
            .position(|l| l == line || l.starts_with(&format!("{line} ")));
        let at = at.unwrap_or_else(|| panic!("--{flag} has no key in docs/walletrelay.toml"));
        let table = kept
            .lines()
            .take(at)
            .filter(|l| l.starts_with('['))
            .last()
            .unwrap_or("[]");
        let want = if key.table.is_empty() {
            "[]".to_string()
        } else {
            header
        };
        assert_eq!(table, want, "--{flag} is in the wrong table");
    }
}

#[test]
fn every_flag_is_a_key_of_a_known_kind_and_table() {
    let cmd = Config::command();
    let keys = keys(&cmd);
    for a in cmd.get_arguments() {
        let setting = !["config", "print_config"].contains(&a.get_id().as_str());
        assert_eq!(
            keys.iter().any(|k| k.id == a.get_id().as_str()),
            setting,
            "{}",
            a.get_id()
        );
        let action = a.get_action();
        assert!(
            matches!(
                action,
                ArgAction::SetTrue | ArgAction::Append | ArgAction::Set
            ),
            "{action:?}"
        );
    }
    let tables: BTreeSet<&str> = keys.iter().map(|k| k.table.as_str()).collect();
    let want: BTreeSet<&str> = [
        "", "tls", "workers", "auth", "storage", "redis", "notify", "admin", "limits",
    ]
    .into();
    assert_eq!(tables, want);
    for id in RELOADABLE {
        assert!(keys.iter().any(|k| k.id == id), "{id}");
    }
}

#[test]
fn sighup_rereads_the_reloadable_keys_unless_a_flag_gives_them() {
    let f = TempFile::new(
        "[tls]\ntls-listen = \"127.0.0.1:0\"\ntls-cert = \"a.pem\"\ntls-key = \"a.key\"\n",
    );
    let args = [
        "walletrelay",
        "--config",
        f.path(),
        "--registry-dir",
        "/flag/dir",
    ];
    let loaded = load(args).unwrap();
    let watch = loaded.watch().unwrap();
    assert_eq!(watch.path(), Path::new(f.path()));
    let text = "[tls]\ntls-listen = \"127.0.0.1:0\"\ntls-cert = \"b.pem\"\ntls-key = \"b.key\"\n\
                [auth]\nproject-ids = \"p1,p2\"\n";
    std::fs::write(&f.0, text).unwrap();
    let now = watch.reread().unwrap();
    assert_eq!(now.tls_cert, Some(PathBuf::from("b.pem")));
    assert_eq!(now.tls_key, Some(PathBuf::from("b.key")));
    assert_eq!(now.project_ids.as_deref(), Some("p1,p2"));
    assert_eq!(now.registry_dir, Some(PathBuf::from("/flag/dir")));
    std::fs::write(&f.0, "[tls]\ntls-cert = \"b.pem\"\ntls-kee = \"b.key\"\n").unwrap();
    assert!(watch.reread().is_err());
    assert!(load(["walletrelay"]).unwrap().watch().is_none());
}
