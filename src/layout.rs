//! The versions of the data this build lays out outside the process: the cluster's layout
//! in Redis and the durable engine's journal files. A leaf, so that the code that writes
//! each layout (`cluster::ring`, `store::files`), `--version` and `/metrics`
//! (`walletrelay_build_info`) all name the same numbers.
//!
//! Owns the numbers and what this build reads and writes of each; nothing else. Changing a
//! layout's bytes means a new number here (and, while old data must still load, a wider
//! `reads` range).

use std::fmt;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// One data layout: the version this build writes and the versions it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// What the layout is, as `--version` names it (`redis`, `journal`).
    pub name: &'static str,
    /// The newest version, written wherever nothing older is in use.
    pub newest: u32,
    /// The versions read (the newest among them).
    pub reads: RangeInclusive<u32>,
    /// The versions written: the newest, and for Redis the older ones a cluster may still
    /// be on (until `walletrelay layout switch`).
    pub writes: RangeInclusive<u32>,
}

/// The layout of a cluster's state in Redis: key names, the scripts' arguments and
/// replies, the channel payload, and the placement of topics on shards
/// (`cluster::ring::RING_VERSION`). The version a cluster writes is the one in every
/// shard's fingerprint (`wr:ring`): a node joins shards of any version it reads and writes
/// that version, until `walletrelay layout switch` moves the fingerprint to this one
/// (docs/UPGRADING.md).
pub const REDIS: u32 = 5;

/// The oldest Redis layout this build reads and can write: a cluster of
/// [`PREVIOUS_REDIS_COMMIT`]'s nodes takes this build's nodes side by side (a rolling
/// upgrade). The policy: build N reads N-1 and N.
pub const REDIS_OLDEST: u32 = 4;

/// The last commit whose build writes [`REDIS_OLDEST`] (layout 4: before the client ids'
/// keys of layout 5). `scripts/previous-build` builds it for the rolling-upgrade test, and
/// the fixtures under `tests/fixtures/layout-4/` were written by it. Moves with
/// `REDIS_OLDEST` (and the fixtures with it) when a layout is added.
pub const PREVIOUS_REDIS_COMMIT: &str = "5582f0a01ea56d4893d8c608ef0ce6d1d4f9ac0a";

/// The layout of the durable engine's journal files in `--data-dir` (the last byte of their
/// magic, `store::files::FILE_MAGIC`, and the record format behind it).
pub const JOURNAL: u32 = 1;

/// Every layout this build knows, in the order `--version` prints them.
pub fn all() -> [Layout; 2] {
    [
        Layout {
            name: "redis",
            newest: REDIS,
            reads: REDIS_OLDEST..=REDIS,
            writes: REDIS_OLDEST..=REDIS,
        },
        Layout {
            name: "journal",
            newest: JOURNAL,
            reads: JOURNAL..=JOURNAL,
            writes: JOURNAL..=JOURNAL,
        },
    ]
}

/// `4-5`, or `5` for a range of one.
fn range(r: &RangeInclusive<u32>) -> String {
    match (*r.start(), *r.end()) {
        (lo, hi) if lo == hi => lo.to_string(),
        (lo, hi) => format!("{lo}-{hi}"),
    }
}

impl fmt::Display for Layout {
    /// `redis 5 (reads 4-5, writes 4-5)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (reads {}, writes {})",
            self.name,
            self.newest,
            range(&self.reads),
            range(&self.writes)
        )
    }
}

/// What this process writes now where the build does not fix it: the Redis layout is the
/// cluster's, the lowest version named by its shards' fingerprints (`wr:ring`), read at
/// connect and with every heartbeat. Shared by `Arc`: the shard threads note what they
/// read, the publish packing, `/health` and `/metrics` read one atomic.
#[derive(Debug, Default)]
pub struct Current {
    /// Per shard, the version its fingerprint names (0: not read yet).
    shards: Mutex<Vec<u32>>,
    /// The lowest of them; 0 while no shard was read (or without Redis).
    redis: AtomicU32,
}

impl Current {
    /// Shard `shard` holds a fingerprint of layout `version`.
    pub fn note_shard(&self, shard: usize, version: u32) {
        let mut v = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() <= shard {
            v.resize(shard + 1, 0);
        }
        if let Some(slot) = v.get_mut(shard) {
            *slot = version;
        }
        let lowest = v.iter().copied().filter(|&x| x > 0).min().unwrap_or(0);
        self.redis.store(lowest, Ordering::Release);
    }

    /// The Redis layout the cluster writes now (`None`: no Redis, or not connected yet).
    pub fn redis_writes(&self) -> Option<u32> {
        Some(self.redis.load(Ordering::Acquire)).filter(|&v| v > 0)
    }

    /// Whether the cluster is still on an older layout than this build's newest (its
    /// nodes of that layout may be running: the writes stay readable for them).
    pub fn redis_mixed(&self) -> bool {
        self.redis_writes().is_some_and(|v| v < REDIS)
    }

    /// What `/health` says in its `Walletrelay-Layouts` header:
    /// `redis reads 4-5 writes 4; journal reads 1 writes 1` (`writes none` for Redis on
    /// a node without it).
    pub fn describe(&self) -> String {
        let [redis, journal] = all();
        let writes = self
            .redis_writes()
            .map_or_else(|| "none".to_string(), |v| v.to_string());
        format!(
            "redis reads {} writes {writes}; journal reads {} writes {}",
            range(&redis.reads),
            range(&journal.reads),
            journal.newest
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_print_as_version_says() {
        let text: Vec<String> = all().iter().map(ToString::to_string).collect();
        assert_eq!(
            text.join(", "),
            "redis 5 (reads 4-5, writes 4-5), journal 1 (reads 1, writes 1)"
        );
    }

    /// The policy: build N reads (and can still write) N-1 and N, so a cluster of N-1
    /// nodes takes N nodes side by side. A layout change that forgets it fails here.
    #[test]
    fn each_build_reads_the_previous_redis_layout() {
        assert_eq!(REDIS_OLDEST + 1, REDIS);
        assert_eq!(PREVIOUS_REDIS_COMMIT.len(), 40);
        assert!(PREVIOUS_REDIS_COMMIT.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn the_cluster_writes_its_lowest_shard_layout() {
        let c = Current::default();
        assert_eq!(c.redis_writes(), None);
        assert_eq!(
            c.describe(),
            "redis reads 4-5 writes none; journal reads 1 writes 1"
        );
        c.note_shard(1, 4);
        assert_eq!(c.redis_writes(), Some(4));
        c.note_shard(0, 5);
        assert_eq!(c.redis_writes(), Some(4));
        assert!(c.redis_mixed());
        c.note_shard(1, 5);
        assert_eq!(c.redis_writes(), Some(5));
        assert!(!c.redis_mixed());
        assert_eq!(
            c.describe(),
            "redis reads 4-5 writes 5; journal reads 1 writes 1"
        );
    }
}
