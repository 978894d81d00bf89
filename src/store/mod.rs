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
//! listing and syncing the directory), [`lock`] (one process per directory), [`metrics`],
//! and the words they share ([`Loc`], [`Lsns`], [`SegmentId`], [`StoreError`]).
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
//!     Box::new(|ev| { /* to the engine's mailbox, which rings the worker's doorbell */ }))?;
//! // for every record recovered from "w0" that the cache keeps: log.keep(loc);
//! let msg = Entry::Message { ns: Ns::V1, topic: "t", epoch: 1, seq: 1,
//!     expires_unix_ms: 1_900_000_000_000, prompt: true, body: false, data: b"payload" };
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
mod types;

#[cfg(test)]
mod log_tests;

pub use files::PLACEMENT_FILE;
pub use lock::DirLock;
pub use log::{Appended, Log, LogConfig};
pub use metrics::StoreMetrics;
pub use recover::{recover, remove_owners_except, RecoveryStats};
pub use sync::{FsyncMode, OnSync, SyncEvent, Syncer};
pub use types::{Loc, Lsns, SegmentId, StoreError};
