//! Configuration: every command-line flag (each also readable from an environment variable
//! and from the `--config` file, [`file`]), grouped under the headings of `--help`, and the
//! one [`Limits`] struct that bounds every buffer, queue and table in the server
//! ([`limits`]).
//!
//! This module only describes settings; it owns no state and does no I/O beyond reading
//! the command line and the configuration file (the TLS files are read by
//! `tls::TlsLoader`, which `server` hands the paths named here: nothing here knows `tls`).

use std::net::SocketAddr;
use std::path::PathBuf;

mod admin;
pub mod file;
mod limits;
mod notify;
mod print;
mod redis;
pub use admin::{AdminOptions, MAX_DRAIN_SECONDS};
pub use file::{load, LoadError, Loaded, Reloadable, Watch};
pub use limits::{Limits, DEFAULT_ROUND_HOLD_US};
pub use notify::NotifyOptions;
pub use print::example;
pub use redis::RedisOptions;

/// Command-line configuration of the `walletrelay` binary. A flag's `help_heading` is also
/// its table in the configuration file (lower case; none: the top level), see [`file`].
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "walletrelay",
    version = crate::version::text(),
    about = "Wallet registry and WalletConnect (waku) relay",
    after_help = SUBCOMMANDS
)]
pub struct Config {
    /// TOML file with settings (a key per flag, docs/walletrelay.toml); a flag or its
    /// environment variable wins over the file. SIGHUP re-reads its reloadable keys.
    #[arg(long, env = "WALLETRELAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print the effective configuration (flags, environment, file and defaults) as TOML,
    /// secrets masked, and exit.
    #[arg(long)]
    pub print_config: bool,

    /// Address to listen on (registry and relay share it); `none` turns the plain listener
    /// off (then `--tls-listen` is required).
    #[arg(
        long,
        env = "WALLETRELAY_LISTEN",
        default_value = "0.0.0.0:8080",
        value_parser = parse_listen
    )]
    // Spelled out so clap takes the parser's `Option` as the value (`none` -> `None`).
    pub listen: std::option::Option<SocketAddr>,

    /// Name used in the `/hello` greeting.
    #[arg(long, env = "WALLETRELAY_SERVICE_NAME", default_value = "WalletRelay")]
    pub service_name: String,

    /// Directory with `wallets.json` and `dapps.json` to serve instead of the embedded data.
    #[arg(long, env = "WALLETRELAY_REGISTRY_DIR")]
    pub registry_dir: Option<PathBuf>,

    /// Base address of logo images: logos are `{image_base}/{size}/{id}.jpeg`.
    #[arg(
        long,
        env = "WALLETRELAY_IMAGE_BASE",
        default_value = "https://registry.walletconnect.org/logo"
    )]
    pub image_base: String,

    /// Allow webhooks that resolve to loopback, private, link-local or multicast addresses.
    #[arg(long, env = "WALLETRELAY_WEBHOOK_ALLOW_PRIVATE")]
    pub webhook_allow_private: bool,

    /// Negotiate permessage-deflate (RFC 7692) with clients that offer it: less bandwidth for
    /// more CPU. Off: offers are declined.
    #[arg(long, env = "WALLETRELAY_PERMESSAGE_DEFLATE")]
    pub permessage_deflate: bool,

    /// Serve a test-only WebSocket echo route at `/echo` (for the Autobahn suite).
    #[arg(long, env = "WALLETRELAY_WS_ECHO")]
    pub ws_echo: bool,

    /// Format of the log on stderr: `text` (`[time LEVEL target] message key=value`) or
    /// `json` (one object per line: time, level, target, message, fields). The level comes
    /// from `RUST_LOG` (default `info`).
    #[arg(
        long,
        env = "WALLETRELAY_LOG_FORMAT",
        value_enum,
        default_value_t = crate::logging::LogFormat::Text
    )]
    pub log_format: crate::logging::LogFormat,

    /// Address of the TLS listener (`https://`, `wss://`): serves exactly what `--listen`
    /// serves. Needs `--tls-cert` and `--tls-key`.
    #[arg(
        long,
        help_heading = "TLS",
        env = "WALLETRELAY_TLS_LISTEN",
        requires_all = ["tls_cert", "tls_key"]
    )]
    pub tls_listen: Option<SocketAddr>,

    /// PEM file with the TLS certificate chain, leaf first (re-read on SIGHUP).
    #[arg(
        long,
        help_heading = "TLS",
        env = "WALLETRELAY_TLS_CERT",
        requires = "tls_listen"
    )]
    pub tls_cert: Option<PathBuf>,

    /// PEM file with the TLS private key: PKCS#8, RSA or EC (re-read on SIGHUP).
    #[arg(
        long,
        help_heading = "TLS",
        env = "WALLETRELAY_TLS_KEY",
        requires = "tls_listen"
    )]
    pub tls_key: Option<PathBuf>,

    /// Worker threads (one poll loop each); 0 means one per available core.
    #[arg(
        long,
        help_heading = "Workers",
        env = "WALLETRELAY_THREADS",
        default_value_t = 0
    )]
    pub threads: usize,

    /// Comma-separated core ids the workers pin to, in order (e.g. `2,3,4,5`); default: the
    /// first `threads` cores the OS reports.
    #[arg(
        long,
        help_heading = "Workers",
        env = "WALLETRELAY_CPUS",
        value_delimiter = ','
    )]
    pub cpus: Vec<usize>,

    /// Do not pin worker threads to cores.
    #[arg(long, help_heading = "Workers", env = "WALLETRELAY_NO_PIN")]
    pub no_pin: bool,

    /// Attach a classic BPF program to the `SO_REUSEPORT` group that hands each new
    /// connection to the worker pinned to the CPU that received its SYN (needs pinning; pair
    /// it with RSS/RPS/IRQ affinity so a flow's packets stay on one core).
    #[arg(long, help_heading = "Workers", env = "WALLETRELAY_CPU_STEERING")]
    pub cpu_steering: bool,

    /// Listen backlog of each worker's socket.
    #[arg(
        long,
        help_heading = "Workers",
        env = "WALLETRELAY_BACKLOG",
        default_value_t = 4096
    )]
    pub backlog: i32,

    /// `SO_SNDBUF` of accepted sockets, bytes (the kernel doubles it); 0 leaves the kernel's
    /// autotuning, which lets one client that stops reading hold up to `tcp_wmem`'s maximum
    /// (4 MiB by default) of kernel memory before `--max-outbound` even starts to count.
    #[arg(long, help_heading = "Workers", env = "WALLETRELAY_SNDBUF", default_value_t = 128 << 10)]
    pub sndbuf: usize,

    /// `TCP_NOTSENT_LOWAT` of accepted sockets, bytes (0 = off): a write to a socket with
    /// this much already waiting unsent returns `EAGAIN`, so a client that stops reading
    /// pins its receive window plus this much of kernel memory, and the server stops writing
    /// to it (its messages wait in `--max-outbound`) instead of filling `--sndbuf` first.
    #[arg(long, help_heading = "Workers", env = "WALLETRELAY_NOTSENT_LOWAT", default_value_t = 16 << 10)]
    pub notsent_lowat: u32,

    /// `SO_BUSY_POLL` in microseconds on accepted sockets (0 = off).
    #[arg(
        long,
        help_heading = "Workers",
        env = "WALLETRELAY_BUSY_POLL_US",
        default_value_t = 0
    )]
    pub busy_poll_us: u32,

    /// Let the kernel back this process's heap with transparent huge pages. Off by
    /// default: the first touch of a 2 MB page clears all of it at once, a stall of the
    /// worker that faults it (docs/TUNING.md, "Transparent huge pages").
    #[arg(long, help_heading = "Workers", env = "WALLETRELAY_HUGE_PAGES")]
    pub huge_pages: bool,

    /// Refuse WebSocket upgrades without a relay-auth JWT (`?auth=` or `Authorization:
    /// Bearer`); without it, clients with no token (beta and 1.0 clients) are served and a
    /// token given is still checked.
    #[arg(long, help_heading = "Auth", env = "WALLETRELAY_REQUIRE_AUTH")]
    pub require_auth: bool,

    /// Only these WalletConnect project ids may connect (`projectId` in the upgrade's
    /// query): `ID,ID,...` or `@FILE` (ids separated by commas or whitespace, `#` comments;
    /// re-read on SIGHUP). Unset: any.
    #[arg(long, help_heading = "Auth", env = "WALLETRELAY_PROJECT_IDS")]
    pub project_ids: Option<String>,

    /// Accepted `aud` values of relay-auth JWTs (comma-separated; the URL clients are
    /// given). Unset: `aud` is not checked (behind a load balancer the relay cannot know it).
    #[arg(
        long,
        help_heading = "Auth",
        env = "WALLETRELAY_AUTH_AUDIENCE",
        value_delimiter = ','
    )]
    pub auth_audience: Vec<String>,

    /// Directory where the relay keeps its state (cached messages, webhook registrations)
    /// across restarts; created at start, one process per directory. `none`: memory only.
    #[arg(
        long,
        help_heading = "Storage",
        env = "WALLETRELAY_DATA_DIR",
        default_value = "./walletrelay-data"
    )]
    pub data_dir: String,

    /// When a publish is answered relative to the disk: `always` (after `fdatasync`, group
    /// commit), `everysec` (synced at least once a second), `off` (the kernel decides). In
    /// every mode the record reaches the kernel before the answer (it survives `kill -9`).
    #[arg(long, help_heading = "Storage", env = "WALLETRELAY_FSYNC", value_enum, default_value_t = Fsync::Everysec)]
    pub fsync: Fsync,

    /// Size at which a worker's log file in `--data-dir` is sealed and the next one started,
    /// bytes (4 KiB to 4 GiB). Space is reclaimed a whole file at a time, so the disk holds
    /// about twice the live state plus one of these per worker (docs/TUNING.md).
    #[arg(
        long,
        help_heading = "Storage",
        env = "WALLETRELAY_SEGMENT_BYTES",
        default_value_t = 64 << 20,
        value_parser = clap::value_parser!(u64).range(4096..=(4u64 << 30))
    )]
    pub segment_bytes: u64,

    /// Redis shards that hold the cluster's shared state, comma-separated or repeated: each
    /// `redis://[user:password@]host:port/db` (`rediss://` for TLS), a Sentinel group
    /// `redis+sentinel://host:port/MASTER?addr=host:port&...`, or a Redis Cluster
    /// `redis+cluster://host:port?addr=host:port&...`. Every node must list the same
    /// shards in the same order. Without it the node is standalone.
    #[arg(
        long,
        help_heading = "Redis",
        env = "WALLETRELAY_REDIS",
        value_delimiter = ','
    )]
    pub redis: Vec<String>,

    /// TLS, password and replication settings of the Redis shards.
    #[command(flatten, next_help_heading = "Redis")]
    pub redis_opts: RedisOptions,

    /// Watch registrations and pushes to wallets.
    #[command(flatten, next_help_heading = "Notify")]
    pub notify: NotifyOptions,

    /// The admin address and the drain.
    #[command(flatten, next_help_heading = "Admin")]
    pub admin: AdminOptions,

    /// Resource limits.
    #[command(flatten, next_help_heading = "Limits")]
    pub limits: Limits,
}

/// The subcommands `main` dispatches before the flags are parsed (`--help` lists them).
pub const SUBCOMMANDS: &str = "\
Subcommands (no flags, no configuration file):
  walletrelay probe URL         one HTTP/1.1 GET of URL (http:// only, 2 s timeout); exit 0 on
                                a 2xx answer, 1 otherwise (health checks without curl)
  walletrelay drain ADMIN_ADDR  POST /drain to the admin address (--admin-listen), then wait
                                until the node's drain time has passed (a preStop hook)
  walletrelay switch-layout ADMIN_ADDR
                                POST /layout/switch: the Redis cluster writes this build's
                                newest data layout from now on (docs/UPGRADING.md)";

/// `--fsync` (DECISIONS §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fsync {
    /// Answer after the record is on stable storage.
    Always,
    /// Sync at least once a second.
    Everysec,
    /// Leave syncing to the kernel.
    Off,
}

/// `--listen`: an address, or `none`.
fn parse_listen(s: &str) -> Result<Option<SocketAddr>, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e| format!("{e} (expected ADDR:PORT or none)"))
}

/// A configuration that cannot run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `--listen none` without `--tls-listen`.
    #[error("no listener: --listen none needs --tls-listen (with --tls-cert and --tls-key)")]
    NoListener,
}

impl Config {
    /// The data directory, or `None` for `--data-dir none` (memory only).
    pub fn data_dir(&self) -> Option<PathBuf> {
        (self.data_dir != "none").then(|| PathBuf::from(&self.data_dir))
    }

    /// Checks what flag parsing alone cannot: at least one listener.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.listen.is_none() && self.tls_listen.is_none() {
            return Err(ConfigError::NoListener);
        }
        Ok(())
    }

    /// Number of workers to run: `--threads`, else one per `--cpus` entry, else one per
    /// available core.
    pub fn worker_count(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else if !self.cpus.is_empty() {
            self.cpus.len()
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::Path;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(["walletrelay"].iter().chain(args))
    }

    #[test]
    fn listen_none_needs_a_tls_listener() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.listen, Some("0.0.0.0:8080".parse().unwrap()));
        assert!(c.check().is_ok() && c.tls_listen.is_none());
        let c = parse(&["--listen", "none"]).unwrap();
        assert_eq!(c.listen, None);
        assert_eq!(c.check(), Err(ConfigError::NoListener));
        let c = parse(&[
            "--listen",
            "NONE",
            "--tls-listen",
            "127.0.0.1:8443",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
        ])
        .unwrap();
        assert!(c.check().is_ok());
        assert_eq!(
            (c.tls_cert.as_deref(), c.tls_key.as_deref()),
            (Some(Path::new("c.pem")), Some(Path::new("k.pem")))
        );
        assert!(parse(&["--listen", "nowhere"]).is_err());
    }

    #[test]
    fn tls_flags_come_together() {
        assert!(parse(&["--tls-listen", "127.0.0.1:8443"]).is_err());
        assert!(parse(&["--tls-listen", "127.0.0.1:8443", "--tls-cert", "c.pem"]).is_err());
        assert!(parse(&["--tls-cert", "c.pem", "--tls-key", "k.pem"]).is_err());
    }
}
