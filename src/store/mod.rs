//! The durable local store (DECISIONS §6): each worker's own append-only log of segment
//! files in `--data-dir`, synced off the event loop, read back at start.
//!
//! Owns the files of the data directory and nothing else: it never decides what is live
//! (the engine does, from its in-memory cache), never touches sockets, the cache or other
//! workers' state, and never blocks its caller beyond a `write` to the page cache (or a file
//! create when a segment fills).
//!
//! Parts: [`record`] (framing: marker, length, CRC), [`entry`] (typed entries), [`log`]
//! (one writer's segments, the batch, live bytes per segment), [`sync`] (the sync thread:
//! `--fsync always|everysec|off`, group commit, deferred deletes), [`recover`] (reading every
//! owner's segments at start), [`files`] (the directory's file names, the segments' magic,
//! listing and syncing the directory), [`lock`] (one process per directory), [`metrics`].
//!
//! # How the engine uses it
//! ```no_run
//! use walletrelay::store::{self, entry::{Entry, Ns}, FsyncMode, Log, LogConfig, Syncer};
//! # fn main() -> Result<(), store::StoreError> {
//! let dir = std::path::Path::new("walletrelay-data");
//! let _lock = store::DirLock::acquire(dir)?;            // held for the process lifetime
//! let recovered = store::recover(dir, |owner, loc, payload| {
//!     let _entry = Entry::decode(payload); // rebuild the cache; remember (owner, loc)
//!     Ok(())
//! })?;
//! let syncer = Syncer::start(FsyncMode::Always)?;
//! let mut log = Log::open(dir, "w0", LogConfig::default(), &syncer,
//!     Box::new(|ev| { /* to the worker's mailbox, then wake its mio::Waker */ }))?;
//! // for every record recovered from "w0" that the cache keeps: log.keep(loc);
//! let msg = Entry::Message { ns: Ns::V2, topic: "t", epoch: 1, seq: 1,
//!     expires_unix_ms: 1_900_000_000_000, prompt: true, data: b"payload" };
//! let appended = log.append_entry(&msg)?;      // many per event-loop iteration
//! let written = log.flush()?;                  // once, at the end of the iteration
//! // everysec/off: answer `true` now; always: when SyncEvent::Synced(n) with n >= appended.lsn
//! # let _ = (recovered, written); Ok(()) }
//! ```
//!
//! # Liveness rules the engine follows
//! - A record is live while the cache holds what it says; [`Log::release`] it when the
//!   message expires, is evicted or forgotten, or the webhook is removed.
//! - Tombstones (`Forget`, `WebhookRemove`) stay live until the record they cancel is gone
//!   from disk, i.e. until [`SyncEvent::Retired`] names that record's segment (or, for a
//!   `Forget`, until the forgotten message would have expired). A `Forget` names one message
//!   and may be re-appended anywhere; a `WebhookRemove` must be released, not re-appended,
//!   once the same (topic, url) is registered again (a copy after the new `WebhookAdd`
//!   would cancel it on replay).
//! - Compaction: for each segment of [`Log::candidates`], re-append its live records from
//!   memory, then [`Log::retire`] it; the file is deleted once the copies are synced.
//! - `--threads` changed (a record's owner is not its home now, or an owner has no worker):
//!   re-append the whole cache to the new logs, [`Log::flush`] + [`Log::sync_now`] each,
//!   then [`Log::discard_previous`] and [`remove_owners_except`].
//! - The home of a topic must not depend on a per-process random hash seed.

pub mod entry;
pub mod files;
pub mod lock;
pub mod log;
pub mod metrics;
pub mod record;
pub mod recover;
pub mod sync;

#[cfg(test)]
mod log_tests;

use std::io;
use std::path::PathBuf;

pub use files::PLACEMENT_FILE;
pub use lock::DirLock;
pub use log::{Appended, Log, LogConfig};
pub use metrics::StoreMetrics;
pub use recover::{recover, remove_owners_except, RecoveryStats};
pub use sync::{FsyncMode, OnSync, SyncEvent, Syncer};

/// A segment's number, unique per owner and increasing (also across restarts).
pub type SegmentId = u64;

/// Where a record lives: enough to release it and to know which segment holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loc {
    /// The segment file.
    pub segment: SegmentId,
    /// Byte offset of the record (its header) in the file.
    pub offset: u32,
    /// Bytes of the whole record, header included.
    pub len: u32,
}

/// Log sequence numbers `first..=last` of one log (empty when `first > last`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lsns {
    /// The first.
    pub first: u64,
    /// The last.
    pub last: u64,
}

/// Errors of the store. Every variant names the file or directory it is about.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The disk is full (ENOSPC or EDQUOT) while writing: the batch was not stored and the
    /// file was cut back to its last whole record.
    #[error("disk full writing {path}: records {} to {} not stored", lost.first, lost.last)]
    DiskFull {
        /// The segment being written.
        path: PathBuf,
        /// The records lost (their `Loc`s are stale; releasing them is harmless).
        lost: Lsns,
    },
    /// Another write failure: as `DiskFull`, the batch was not stored.
    #[error("write to {path} failed: {source}; records {} to {} not stored", lost.first, lost.last)]
    WriteFailed {
        /// The segment being written.
        path: PathBuf,
        /// The records lost.
        lost: Lsns,
        /// The OS error.
        source: io::Error,
    },
    /// Any other I/O failure (open, create, read, sync, delete).
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Another process holds the directory's lock.
    #[error("data directory {dir} is in use by another walletrelay process{}", pid.map_or(String::new(), |p| format!(" (pid {p})")))]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// The holder's pid, as it recorded it.
        pid: Option<u32>,
    },
    /// A record or entry that cannot be encoded (over a length limit).
    #[error("cannot encode the record: {0}")]
    Encode(String),
    /// A segment that cannot be retired (unknown, or the one being written).
    #[error("segment {id}: {why}")]
    Segment {
        /// The segment.
        id: SegmentId,
        /// Why.
        why: &'static str,
    },
}

impl StoreError {
    /// True for a full disk (ENOSPC, EDQUOT), in whatever operation it happened.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::DiskFull { .. } => true,
            StoreError::Io { source, .. } | StoreError::WriteFailed { source, .. } => {
                is_full(source)
            }
            _ => false,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

pub(crate) fn is_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}
