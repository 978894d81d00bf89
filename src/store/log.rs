//! One writer's log: its segment files `<owner>-<id>.log` in the data directory, the
//! in-memory batch of records not yet written, and the live bytes of every segment.
//!
//! [`Log::append`] only copies into the bounded batch (it writes the batch first when the
//! batch is full, and creates the next segment when one fills); [`Log::flush`] hands the
//! batch to the kernel with one `write`. Syncing and deleting happen on the sync thread
//! (`sync`). A write failure cuts the file back to its last whole record, drops the
//! batch (the error names the lost LSNs) and seals the segment, so the log stays a sequence
//! of whole records and the lost records' `Loc`s point past the end of a sealed segment,
//! where releasing them is ignored; the next append starts a new segment (which is how the
//! log recovers once the disk has room again).
//!
//! Owns its segment files and the accounting of live bytes; must not decide what is live
//! (the owner says so through [`Log::keep`] and [`Log::release`]) nor read records back
//! (that is `recover`, at start).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::entry::Entry;
use super::files::{self, own_segment_size, segment_name, valid_owner, FILE_MAGIC};
use super::metrics::StoreMetrics;
use super::record::{self, HEADER_LEN};
use super::sync::{OnSync, SyncHandle, Syncer};
use super::types::{is_full, Loc, Lsns, SegmentId, StoreError};

/// A log's settings.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// A segment is sealed and a new one started when a record would take it past this
    /// size (a single larger record still gets a segment of its own). At most 4 GiB.
    pub segment_bytes: u64,
    /// Bound of the in-memory batch: an append that would pass it writes the batch first.
    /// Small enough that the batch is still in the core's cache when the kernel copies it
    /// into the page cache: at saturation a round appends megabytes, which one `write` per
    /// round would copy from cold memory (docs/PERFORMANCE.md, "The durable log").
    pub batch_bytes: usize,
    /// A sealed segment is a compaction candidate when its live bytes are below this
    /// fraction of its size.
    pub compact_below: f64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 64 << 20,
            batch_bytes: 256 << 10,
            compact_below: 0.5,
        }
    }
}

/// What [`Log::append`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Where the record lives (keep it to release the record later).
    pub loc: Loc,
    /// Its log sequence number: durable once a `SyncEvent::Synced(n)` has `n >= lsn`.
    pub lsn: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct SegInfo {
    /// Bytes in the file, plus the batch's for the active segment.
    size: u64,
    /// Bytes of live records.
    live: u64,
}

struct Active {
    id: SegmentId,
    file: Arc<File>,
    /// Bytes in the file (the batch goes after them).
    written: u64,
    /// Not yet announced to the sync thread as a new directory entry.
    created: bool,
}

/// One writer's log. Not shared: the owning worker calls it from its event loop.
pub struct Log {
    dir: PathBuf,
    owner: String,
    cfg: LogConfig,
    segments: BTreeMap<SegmentId, SegInfo>,
    active: Option<Active>,
    /// The first segment this process created (everything below is from earlier runs).
    run_start: SegmentId,
    next_id: SegmentId,
    batch: Vec<u8>,
    /// LSN of the next append (LSNs start at 1 in every process).
    next_lsn: u64,
    /// Highest LSN handed to the kernel (or dropped by a failed write).
    written_lsn: u64,
    write_error: Option<String>,
    sync: SyncHandle,
    metrics: Arc<StoreMetrics>,
    /// Tests: make the next writes fail with this OS error (an injected disk fault).
    #[cfg(test)]
    pub(crate) fail_writes: Option<i32>,
}

impl Log {
    /// Opens `owner`'s log in `dir` (created if missing). Existing segments of `owner` are
    /// taken as sealed with no live bytes (call [`Log::keep`] for the records recovery
    /// found and the cache keeps); new records go to a new segment numbered after every
    /// existing one of any owner. `on_sync` receives this log's [`SyncEvent`](super::sync::SyncEvent)s.
    pub fn open(
        dir: &Path,
        owner: &str,
        cfg: LogConfig,
        syncer: &Syncer,
        on_sync: OnSync,
    ) -> Result<Log, StoreError> {
        if !valid_owner(owner) {
            return Err(StoreError::Encode(format!("bad owner name {owner:?}")));
        }
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create", dir, e))?;
        let mut segments = BTreeMap::new();
        let mut max_id = 0;
        for (o, id, path, regular) in files::segment_names(dir)? {
            // Past every name, a regular file or not: `create_new` must never meet one.
            max_id = max_id.max(id);
            if o == owner && regular {
                if let Some(size) = own_segment_size(&path)? {
                    segments.insert(id, SegInfo { size, live: 0 });
                }
            }
        }
        let metrics = Arc::new(StoreMetrics::default());
        let sync = syncer.register(dir, metrics.clone(), on_sync);
        let batch_cap = cfg.batch_bytes.min(64 << 20);
        Ok(Log {
            dir: dir.to_path_buf(),
            owner: owner.to_string(),
            cfg,
            segments,
            active: None,
            run_start: max_id + 1,
            next_id: max_id + 1,
            batch: Vec::with_capacity(batch_cap),
            next_lsn: 1,
            written_lsn: 0,
            write_error: None,
            sync,
            metrics,
            #[cfg(test)]
            fail_writes: None,
        })
    }

    /// The owner's name (`w0`, ...).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// This log's figures.
    pub fn metrics(&self) -> &Arc<StoreMetrics> {
        &self.metrics
    }

    /// Appends one record (its payload framed and checksummed) to the batch.
    ///
    /// Writes the batch first when it is full or the segment fills (and then starts the
    /// next segment); if that write fails, the error is the one [`Log::flush`] would give
    /// (naming the earlier records lost) and this record is not appended.
    pub fn append(&mut self, payload: &[u8]) -> Result<Appended, StoreError> {
        self.append_with(payload.len(), |out| {
            out.extend_from_slice(payload);
            Ok(())
        })
    }

    /// Appends an entry, encoded straight into the batch.
    pub fn append_entry(&mut self, e: &Entry<'_>) -> Result<Appended, StoreError> {
        self.append_with(e.encoded_len(), |out| {
            e.encode(out).map_err(|e| StoreError::Encode(e.to_string()))
        })
    }

    fn append_with(
        &mut self,
        hint: usize,
        put: impl FnOnce(&mut Vec<u8>) -> Result<(), StoreError>,
    ) -> Result<Appended, StoreError> {
        let need = (HEADER_LEN + hint) as u64;
        if !self.batch.is_empty() && self.batch.len() + need as usize > self.cfg.batch_bytes {
            self.flush()?;
        }
        if let Some(a) = &self.active {
            let used = a.written + self.batch.len() as u64;
            if used > FILE_MAGIC.len() as u64 && used + need > self.cfg.segment_bytes {
                self.flush()?;
                self.active = None;
            }
        }
        if self.active.is_none() {
            self.start_segment()?;
        }
        let Some(a) = &self.active else {
            return Err(StoreError::Segment {
                id: self.next_id,
                why: "no active segment",
            });
        };
        let (id, base) = (a.id, a.written);
        let start = self.batch.len();
        self.batch.extend_from_slice(&[0; HEADER_LEN]);
        let sealed = put(&mut self.batch).and_then(|()| {
            record::seal(&mut self.batch, start).map_err(|e| StoreError::Encode(e.to_string()))
        });
        if let Err(e) = sealed {
            self.batch.truncate(start);
            return Err(e);
        }
        let len = (self.batch.len() - start) as u64;
        let offset = base + start as u64;
        if offset + len > u32::MAX as u64 {
            self.batch.truncate(start);
            return Err(StoreError::Encode("segment over 4 GiB".into()));
        }
        let seg = self.segments.entry(id).or_default();
        seg.size += len;
        seg.live += len;
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        Ok(Appended {
            loc: Loc {
                segment: id,
                offset: offset as u32,
                len: len as u32,
            },
            lsn,
        })
    }

    fn start_segment(&mut self) -> Result<(), StoreError> {
        let id = self.next_id;
        let path = self.dir.join(segment_name(&self.owner, id));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| {
                self.write_error = Some(format!("create {}: {e}", path.display()));
                self.metrics.write_errors.add(1);
                StoreError::io("create", &path, e)
            })?;
        self.next_id += 1;
        self.active = Some(Active {
            id,
            file: Arc::new(file),
            written: 0,
            created: true,
        });
        self.batch.clear();
        self.batch.extend_from_slice(FILE_MAGIC);
        self.segments.insert(
            id,
            SegInfo {
                size: FILE_MAGIC.len() as u64,
                live: 0,
            },
        );
        Ok(())
    }

    /// Writes the batch to the active segment (page cache) with one `write`, and tells the
    /// sync thread. Returns the highest LSN handed to the kernel.
    pub fn flush(&mut self) -> Result<u64, StoreError> {
        let last = self.next_lsn - 1;
        // LSNs count this process's appends from 1: the count is published here, once a
        // batch, by a plain store, not by an atomic add per record (a locked instruction,
        // which waits for the record's stores to drain).
        self.metrics.records_appended.set(last);
        let Some(a) = &mut self.active else {
            return Ok(self.written_lsn);
        };
        if self.batch.is_empty() {
            return Ok(self.written_lsn);
        }
        #[cfg(test)]
        if let Some(errno) = self.fail_writes {
            return Err(self.write_failed(std::io::Error::from_raw_os_error(errno)));
        }
        match a.file.write_all_at(&self.batch, a.written) {
            Ok(()) => {
                a.written += self.batch.len() as u64;
                self.metrics.bytes_written.add(self.batch.len() as u64);
                self.metrics.writes.add(1);
                self.batch.clear();
                self.written_lsn = last;
                self.write_error = None;
                self.sync.written(last, a.id, &a.file, a.created);
                a.created = false;
                Ok(last)
            }
            Err(e) => Err(self.write_failed(e)),
        }
    }

    /// A failed write: cut the file back (a segment that got nothing is removed), drop the
    /// batch, seal the segment, and keep every segment whose retirement waited for the lost
    /// records (their copies were among them).
    fn write_failed(&mut self, e: std::io::Error) -> StoreError {
        let lost = Lsns {
            first: self.written_lsn + 1,
            last: self.next_lsn - 1,
        };
        self.written_lsn = lost.last;
        self.metrics.write_errors.add(1);
        let path = match self.active.take() {
            Some(a) => {
                let path = self.dir.join(segment_name(&self.owner, a.id));
                if a.written == 0 {
                    if let Err(t) = std::fs::remove_file(&path) {
                        log::error!(
                            path:% = path.display(), error:% = t;
                            "store: cannot remove {}: {t}", path.display()
                        );
                    }
                    self.segments.remove(&a.id);
                } else if let Err(t) = a.file.set_len(a.written) {
                    log::error!(
                        path:% = path.display(), error:% = t;
                        "store: cannot cut {} back: {t}", path.display()
                    );
                }
                if let Some(s) = self.segments.get_mut(&a.id) {
                    let dropped = s.size - a.written;
                    s.size = a.written;
                    s.live = s.live.saturating_sub(dropped);
                }
                path
            }
            None => self.dir.clone(),
        };
        self.batch.clear();
        self.keep_retiring(lost.first);
        let msg = format!("write {}: {e}", path.display());
        // Logged when the log starts failing; later failures are counted.
        if self.write_error.is_none() {
            log::error!(
                path:% = path.display(), first = lost.first, last = lost.last;
                "store: {msg}; records {} to {} lost", lost.first, lost.last
            );
        }
        self.write_error = Some(msg);
        if is_full(&e) {
            StoreError::DiskFull { path, lost }
        } else {
            StoreError::WriteFailed {
                path,
                lost,
                source: e,
            }
        }
    }

    /// Segments retired at or after LSN `from` stay (their copies were lost): they come
    /// back sealed with no live bytes, so they are compacted again.
    fn keep_retiring(&mut self, from: u64) {
        for (id, path) in self.sync.cancel_retire(from) {
            match std::fs::metadata(&path) {
                Ok(m) => {
                    let info = SegInfo {
                        size: m.len(),
                        live: 0,
                    };
                    self.segments.insert(id, info);
                }
                Err(e) => {
                    log::error!(
                        path:% = path.display(), error:% = e;
                        "store: {}: {e}", path.display()
                    )
                }
            }
        }
    }

    /// Tries the disk again after a failure: writes the batch, or the header of a new
    /// segment when there is none, and asks the sync thread for a sync round (which clears
    /// a sync failure once it succeeds). [`Log::health`] says what still fails.
    pub fn probe(&mut self) -> Result<(), StoreError> {
        if self.active.is_none() {
            self.start_segment()?;
        }
        self.flush()?;
        self.sync.request();
        Ok(())
    }

    /// The record at `loc` is in the log: written, or in the batch (not lost by a failed
    /// write).
    pub fn holds(&self, loc: Loc) -> bool {
        self.segments
            .get(&loc.segment)
            .is_some_and(|s| loc.offset as u64 + loc.len as u64 <= s.size)
    }

    /// Publishes the live and on-disk bytes (see [`Log::usage`]) to the metrics.
    pub fn report_usage(&self) {
        let (live, disk) = self.usage();
        self.metrics.live_bytes.set(live);
        self.metrics.disk_bytes.set(disk);
    }

    /// `Ok` when the last write and the last sync succeeded; otherwise why not (for
    /// `/health`'s 503). Cleared by the next successful write or sync.
    pub fn health(&self) -> Result<(), String> {
        match (&self.write_error, self.sync.error()) {
            (Some(w), _) => Err(w.clone()),
            (None, Some(s)) => Err(s),
            (None, None) => Ok(()),
        }
    }

    /// Counts a record recovered at start as live (the cache keeps it).
    pub fn keep(&mut self, loc: Loc) {
        if let Some(s) = self.segments.get_mut(&loc.segment) {
            s.live = (s.live + loc.len as u64).min(s.size);
        }
    }

    /// The owner dropped the record at `loc` (expired, evicted, forgotten, removed).
    /// Releasing a stale `Loc` (segment retired, or lost by a failed write) is ignored.
    pub fn release(&mut self, loc: Loc) {
        if let Some(s) = self.segments.get_mut(&loc.segment) {
            if loc.offset as u64 + loc.len as u64 <= s.size {
                s.live = s.live.saturating_sub(loc.len as u64);
            }
        }
    }

    /// Sealed segments worth compacting (live bytes under `compact_below` of their size),
    /// most garbage first. Keeping every sealed segment at least half live keeps the disk
    /// within about twice the live bytes plus the active segment.
    pub fn candidates(&self) -> Vec<SegmentId> {
        let active = self.active.as_ref().map(|a| a.id);
        let mut c: Vec<(f64, SegmentId)> = self
            .segments
            .iter()
            .filter(|(id, _)| Some(**id) != active)
            .map(|(id, s)| (s.live as f64 / s.size.max(1) as f64, *id))
            .filter(|(ratio, _)| *ratio < self.cfg.compact_below)
            .collect();
        c.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        c.into_iter().map(|(_, id)| id).collect()
    }

    /// Live and total bytes of a segment, if it exists.
    pub fn segment_usage(&self, id: SegmentId) -> Option<(u64, u64)> {
        self.segments.get(&id).map(|s| (s.live, s.size))
    }

    /// Live bytes and bytes on disk (segments not yet deleted) over all segments.
    pub fn usage(&self) -> (u64, u64) {
        self.segments
            .values()
            .fold((0, 0), |(l, s), i| (l + i.live, s + i.size))
    }

    /// Retires a sealed segment whose live records the owner has re-appended: the file is
    /// deleted on the sync thread once every record appended so far is synced, then
    /// `SyncEvent::Retired(id)` is reported. Its `Loc`s are stale from now on.
    pub fn retire(&mut self, id: SegmentId) -> Result<(), StoreError> {
        if self.active.as_ref().is_some_and(|a| a.id == id) {
            return Err(StoreError::Segment {
                id,
                why: "is being written",
            });
        }
        if self.segments.remove(&id).is_none() {
            return Err(StoreError::Segment { id, why: "unknown" });
        }
        let path = self.dir.join(segment_name(&self.owner, id));
        self.sync.retire(self.next_lsn - 1, id, path);
        Ok(())
    }

    /// Seals the active segment (the next append starts a new one).
    pub fn seal(&mut self) -> Result<(), StoreError> {
        self.flush()?;
        self.active = None;
        Ok(())
    }

    /// A full sync of what was written, on the caller's thread (start-up and tests; the
    /// event loop uses the sync thread).
    pub fn sync_now(&mut self) -> Result<(), StoreError> {
        self.sync.sync_now()
    }

    /// Deletes this owner's segments from earlier runs, at once (start-up only, after the
    /// whole cache was re-appended, flushed and [`Log::sync_now`]).
    pub fn discard_previous(&mut self) -> Result<u64, StoreError> {
        let old: Vec<SegmentId> = self
            .segments
            .range(..self.run_start)
            .map(|(id, _)| *id)
            .collect();
        for id in &old {
            let path = self.dir.join(segment_name(&self.owner, *id));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("delete", path, e)),
            }
            self.segments.remove(id);
        }
        files::sync_dir(&self.dir)
            .map_err(|e| StoreError::io("sync", &self.dir, std::io::Error::other(e)))?;
        Ok(old.len() as u64)
    }

    /// Records appended and not yet written.
    pub fn pending(&self) -> usize {
        self.batch.len()
    }

    /// LSN of the last record appended (0 before any).
    pub fn last_lsn(&self) -> u64 {
        self.next_lsn - 1
    }
}
