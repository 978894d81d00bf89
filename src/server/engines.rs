//! Which engine keeps the topics' state, picked once at start from the flags: Redis when
//! `--redis` is given (DECISIONS §7), else the home workers' in-memory engine, durable in
//! `--data-dir` (DECISIONS §6) unless that is `none`. Each engine builds itself (its
//! mailboxes, helper threads, recovery, webhook pool, `/health` and `/metrics` parts); a new
//! engine is one more line here.

use crate::config::Config;
use crate::engine::memory::local;
use crate::engine::{redis, BuildError, Built, Setup};

/// The engine the flags pick, as the `engine` label of `/metrics` names it.
pub fn label(config: &Config) -> &'static str {
    if !config.redis.is_empty() {
        "redis"
    } else if config.data_dir().is_some() {
        "journal"
    } else {
        "memory"
    }
}

/// Builds one engine per worker, of the kind the flags ask for.
pub fn build(setup: &Setup) -> Result<Built, BuildError> {
    if !setup.config.redis.is_empty() {
        return redis::build(setup);
    }
    local::build(setup)
}
