//! The flags of the Redis side besides `--redis` itself (DECISIONS §12): TLS files, the
//! password file, and how many replicas must hold a publish before it is acknowledged.

use std::path::PathBuf;

/// Redis connection and durability settings.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisOptions {
    /// PEM bundle of the CAs that `rediss://` servers' certificates must chain to (default:
    /// the system's bundle).
    #[arg(long, env = "WALLETRELAY_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,

    /// PEM certificate chain presented to Redis when it asks for a client certificate.
    #[arg(long, env = "WALLETRELAY_REDIS_TLS_CERT", requires = "redis_tls_key")]
    pub redis_tls_cert: Option<PathBuf>,

    /// The private key of `--redis-tls-cert` (PEM).
    #[arg(long, env = "WALLETRELAY_REDIS_TLS_KEY", requires = "redis_tls_cert")]
    pub redis_tls_key: Option<PathBuf>,

    /// File holding the Redis password (its first line), used by every `--redis` URL that
    /// has none of its own. Keeps the password out of the command line and `ps`.
    #[arg(long, env = "WALLETRELAY_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,

    /// Replicas that must confirm (`WAIT`) a pipelined round's writes before its publishes
    /// are answered `true`. Default: 1 on Sentinel and Cluster shards whose primary has a
    /// replica (0, with a warning, where it has none), 0 on standalone shards.
    #[arg(long, env = "WALLETRELAY_REDIS_WAIT_REPLICAS")]
    pub redis_wait_replicas: Option<u32>,

    /// How long a `WAIT` may take, in ms; short of the replicas by then, the round's
    /// publishes are answered -32000 `storage unavailable` (the client retries).
    #[arg(
        long,
        env = "WALLETRELAY_REDIS_WAIT_TIMEOUT_MS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(1..=60_000)
    )]
    pub redis_wait_timeout_ms: u64,
}

impl RedisOptions {
    /// The password from `--redis-password-file` (its first line, without the line end).
    pub fn password(&self) -> Result<Option<String>, String> {
        let Some(p) = &self.redis_password_file else {
            return Ok(None);
        };
        let s = std::fs::read_to_string(p)
            .map_err(|e| format!("--redis-password-file {}: {e}", p.display()))?;
        let line = s.lines().next().unwrap_or("").trim_end_matches('\r');
        if line.is_empty() {
            return Err(format!("--redis-password-file {}: empty", p.display()));
        }
        Ok(Some(line.to_string()))
    }
}
