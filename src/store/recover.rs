//! Reading every owner's segments back at start, whatever number of workers wrote them.
//!
//! For each owner (in name order) its segments are read in id order, one whole file at a
//! time into one reused buffer (so memory is bounded by the largest segment), and every
//! valid record is handed to the caller with its owner and [`Loc`]. Damage is handled as
//! DECISIONS §6 says: bytes that fail to decode are followed by a scan for the next valid
//! record; if there is one, the damaged region is skipped, logged and counted; if there is
//! none (a crash mid-write, or a power loss that left zeros), the file is cut there (a torn
//! tail, logged with its byte count). Files that are not ours are ignored with a warning.
//!
//! Owns reading and cutting torn tails; must not decide what a record means or whether it
//! is still live (the caller does, with `Entry::decode` and its clock).

use std::fs::OpenOptions;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use super::files::{
    is_regular, known_file, list_segments, open_read, parse_segment_name, segment_name, sync_dir,
    FILE_MAGIC,
};
use super::record;
use super::types::{Loc, SegmentId, StoreError};

/// What recovery found (also rendered as metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryStats {
    /// Owners found, in the order they were read.
    pub owners: Vec<String>,
    /// Segment files read.
    pub segments: u64,
    /// Valid records handed to the caller.
    pub records: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Damaged regions skipped (each one or more records).
    pub skipped_regions: u64,
    /// Bytes in those regions.
    pub skipped_bytes: u64,
    /// Files cut at a torn tail.
    pub torn_tails: u64,
    /// Bytes cut off.
    pub truncated_bytes: u64,
    /// Files ignored as not ours.
    pub foreign_files: u64,
    /// Whole records (their checksum held) whose entry did not decode, so not replayed.
    /// Set by the caller, which decodes the entries; [`recover`] leaves it 0.
    pub undecodable_records: u64,
    /// The highest segment id seen.
    pub max_segment: SegmentId,
    /// Milliseconds the whole read took.
    pub millis: u64,
}

/// Reads every segment in `dir` and calls `each(owner, loc, payload)` for every valid
/// record, in order per owner. An error from `each` stops the read and is returned.
pub fn recover<F>(dir: &Path, mut each: F) -> Result<RecoveryStats, StoreError>
where
    F: FnMut(&str, Loc, &[u8]) -> Result<(), StoreError>,
{
    let t0 = Instant::now();
    let mut stats = RecoveryStats::default();
    warn_foreign(dir, &mut stats)?;
    let mut buf = Vec::new();
    let segments = list_segments(dir)?;
    for (owner, id, path) in &segments {
        let (owner, id) = (owner.as_str(), *id);
        buf.clear();
        let mut f = open_read(path).map_err(|e| StoreError::io("open", path, e))?;
        let size = f
            .metadata()
            .map_err(|e| StoreError::io("stat", path, e))?
            .len();
        // Larger than any segment we write (Loc offsets are u32): not ours.
        if size <= u64::from(u32::MAX) {
            buf.reserve(size as usize);
            f.read_to_end(&mut buf)
                .map_err(|e| StoreError::io("read", path, e))?;
        }
        let head = buf.len().min(FILE_MAGIC.len());
        if (buf.is_empty() && size > 0) || buf[..head] != FILE_MAGIC[..head] {
            log::warn!(path:% = path.display();
                "store: {} is not a walletrelay log; ignored",
                path.display()
            );
            stats.foreign_files += 1;
            continue;
        }
        if stats.owners.last().map(String::as_str) != Some(owner) {
            stats.owners.push(owner.to_string());
        }
        stats.max_segment = stats.max_segment.max(id);
        stats.segments += 1;
        stats.bytes += buf.len() as u64;
        let mut per_record = |offset: usize, payload: &[u8]| {
            let loc = Loc {
                segment: id,
                offset: offset as u32,
                len: (record::HEADER_LEN + payload.len()) as u32,
            };
            each(owner, loc, payload)
        };
        let end = scan(&buf, path, &mut stats, &mut per_record)?;
        if end < buf.len() {
            cut(path, end, buf.len() - end)?;
            stats.torn_tails += 1;
            stats.truncated_bytes += (buf.len() - end) as u64;
        }
    }
    stats.millis = t0.elapsed().as_millis() as u64;
    Ok(stats)
}

/// Decodes the records of one segment's bytes; returns where the valid data ends.
fn scan<F>(
    buf: &[u8],
    path: &Path,
    stats: &mut RecoveryStats,
    each: &mut F,
) -> Result<usize, StoreError>
where
    F: FnMut(usize, &[u8]) -> Result<(), StoreError>,
{
    let mut pos = FILE_MAGIC.len().min(buf.len());
    while pos < buf.len() {
        match record::decode(&buf[pos..]) {
            Ok(Some((n, payload))) => {
                stats.records += 1;
                each(pos, payload)?;
                pos += n;
            }
            Ok(None) | Err(_) => match record::resync(buf, pos + 1) {
                Some(next) => {
                    log::warn!(path:% = path.display(), offset = pos, bytes = next - pos;
                        "store: {}: {} damaged bytes at offset {pos} skipped",
                        path.display(),
                        next - pos
                    );
                    stats.skipped_regions += 1;
                    stats.skipped_bytes += (next - pos) as u64;
                    pos = next;
                }
                None => return Ok(pos),
            },
        }
    }
    Ok(pos)
}

/// Cuts a torn tail off `path` at `at`.
fn cut(path: &Path, at: usize, bytes: usize) -> Result<(), StoreError> {
    log::warn!(path:% = path.display(), offset = at, bytes;
        "store: {}: torn tail of {bytes} bytes at offset {at} cut off",
        path.display()
    );
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(at as u64))
        .map_err(|e| StoreError::io("truncate", path, e))
}

/// Counts and warns about the files of `dir` that are neither segments nor known files, and
/// about entries with a segment's name that are no regular file (ignored, never opened).
fn warn_foreign(dir: &Path, stats: &mut RecoveryStats) -> Result<(), StoreError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io("list", dir, e)),
    };
    for ent in rd.flatten() {
        let name = ent.file_name();
        let name = name.to_string_lossy();
        if parse_segment_name(&name).is_some() {
            if !is_regular(&ent.path()) {
                log::warn!(
                    "store: {} has a segment's name but is no regular file; ignored",
                    ent.path().display()
                );
                stats.foreign_files += 1;
            }
        } else if !known_file(&name) {
            log::warn!("store: {} is not ours; ignored", ent.path().display());
            stats.foreign_files += 1;
        }
    }
    Ok(())
}

/// Deletes the segments of every owner not in `keep` (start-up, after `--threads` changed
/// and the whole cache was re-appended and synced to the current owners' logs).
pub fn remove_owners_except(dir: &Path, keep: &[&str]) -> Result<u64, StoreError> {
    let mut n = 0;
    for (owner, id, path) in list_segments(dir)? {
        if !keep.contains(&owner.as_str()) {
            debug_assert_eq!(path.file_name(), Some(segment_name(&owner, id).as_ref()));
            std::fs::remove_file(&path).map_err(|e| StoreError::io("delete", &path, e))?;
            n += 1;
        }
    }
    if n > 0 {
        sync_dir(dir).map_err(|e| StoreError::io("sync", dir, std::io::Error::other(e)))?;
    }
    Ok(n)
}
