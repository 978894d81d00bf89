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

/// One data layout: the version this build writes and the versions it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// What the layout is, as `--version` names it (`redis`, `journal`).
    pub name: &'static str,
    /// The version written.
    pub writes: u32,
    /// The versions read (the written one among them).
    pub reads: RangeInclusive<u32>,
}

/// The layout of a cluster's state in Redis: key names, the scripts' arguments and
/// replies, the channel payload, and the placement of topics on shards
/// (`cluster::ring::RING_VERSION`, part of every node's fingerprint in every shard). Nodes
/// of another version refuse to share the shards, so this build reads only its own.
pub const REDIS: u32 = 5;

/// The layout of the durable engine's journal files in `--data-dir` (the last byte of their
/// magic, `store::files::FILE_MAGIC`, and the record format behind it).
pub const JOURNAL: u32 = 1;

/// Every layout this build knows, in the order `--version` prints them.
pub fn all() -> [Layout; 2] {
    [
        Layout {
            name: "redis",
            writes: REDIS,
            reads: REDIS..=REDIS,
        },
        Layout {
            name: "journal",
            writes: JOURNAL,
            reads: JOURNAL..=JOURNAL,
        },
    ]
}

impl fmt::Display for Layout {
    /// `redis 5 (reads 5, writes 5)`; a range read is `reads 4-5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (lo, hi) = (*self.reads.start(), *self.reads.end());
        write!(f, "{} {} (reads ", self.name, self.writes)?;
        if lo == hi {
            write!(f, "{lo}")?;
        } else {
            write!(f, "{lo}-{hi}")?;
        }
        write!(f, ", writes {})", self.writes)
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
            "redis 5 (reads 5, writes 5), journal 1 (reads 1, writes 1)"
        );
        let wider = Layout {
            name: "x",
            writes: 3,
            reads: 2..=3,
        };
        assert_eq!(wider.to_string(), "x 3 (reads 2-3, writes 3)");
    }
}
