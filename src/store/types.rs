//! The words every part of the store shares: where a record lives ([`SegmentId`], [`Loc`]),
//! a range of log sequence numbers ([`Lsns`]) and the store's errors ([`StoreError`]).
//!
//! Owns these types only; a leaf under every other file of the store.

use std::io;
use std::path::PathBuf;

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
