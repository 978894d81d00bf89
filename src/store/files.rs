//! The data directory's layout: the names of its files (segments `<owner>-<id>.log`, the
//! lock, the placement seeds), the magic every segment starts with, the listing of the
//! segments, and the `fsync` of the directory itself.
//!
//! Shared by `log` (writing), `recover` (reading back) and `sync`
//! (deleting); owns names and the directory only, never a record or a file's contents
//! beyond its magic.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::types::{SegmentId, StoreError};

/// The file in the data directory where the server keeps the seeds of its topic placement
/// (a topic's home must not change between runs); written whole through `<name>.tmp` and a
/// rename. The store does not read it, and does not count it as a stranger.
pub const PLACEMENT_FILE: &str = "placement";

/// Names in the data directory that are ours but not segments: the lock and the placement
/// seeds (with the temporary file of their atomic write).
pub(crate) fn known_file(name: &str) -> bool {
    matches!(
        name,
        "LOCK" | PLACEMENT_FILE | "placement.tmp"
        // The relay's key (`identity::KEY_FILE`) and the watch registrations
        // (`notify::store::FILE`), each with the temporary name it is written under.
        | "relay-key.hex" | "relay-key.hex.tmp" | "watches.jsonl" | "watches.jsonl.tmp"
    )
}

/// The file name of `owner`'s segment `id`: `<owner>-<16 hex digits>.log`.
pub fn segment_name(owner: &str, id: SegmentId) -> String {
    format!("{owner}-{id:016x}.log")
}

/// Parses a segment file name into `(owner, id)`; `None` for any other name.
pub fn parse_segment_name(name: &str) -> Option<(&str, SegmentId)> {
    let stem = name.strip_suffix(".log")?;
    let (owner, hex) = stem.rsplit_once('-')?;
    if hex.len() != 16 || !valid_owner(owner) {
        return None;
    }
    let id = u64::from_str_radix(hex, 16).ok()?;
    Some((owner, id))
}

/// Owner names: 1 to 32 ASCII letters, digits or `_` (e.g. `w0`).
pub fn valid_owner(owner: &str) -> bool {
    (1..=32).contains(&owner.len())
        && owner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The first bytes of every segment file: `walletrelay-log` and the journal's layout
/// version as one digit (`layout::JOURNAL`: `walletrelay-log1`).
pub const FILE_MAGIC: &[u8; 16] = &MAGIC;

const MAGIC: [u8; 16] = {
    assert!(crate::layout::JOURNAL < 10, "the magic holds one digit");
    let mut m = *b"walletrelay-log0";
    m[15] = b'0' + crate::layout::JOURNAL as u8;
    m
};

/// The size of a segment file, or `None` when it does not start with [`FILE_MAGIC`] (not
/// ours: never counted, so never deleted).
pub(crate) fn own_segment_size(path: &Path) -> Result<Option<u64>, StoreError> {
    let mut f = open_read(path).map_err(|e| StoreError::io("open", path, e))?;
    let size = f
        .metadata()
        .map_err(|e| StoreError::io("stat", path, e))?
        .len();
    let mut head = Vec::with_capacity(FILE_MAGIC.len());
    std::io::Read::by_ref(&mut f)
        .take(FILE_MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| StoreError::io("read", path, e))?;
    Ok((head[..] == FILE_MAGIC[..head.len()]).then_some(size))
}

/// Opens a file for reading without ever blocking in `open`: a FIFO given a segment's
/// name would otherwise wait for a writer forever, at start, before the server answers
/// anything. (`O_NONBLOCK` changes nothing for a regular file.)
pub(crate) fn open_read(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// Whether `path` is a regular file, following a symlink (a dangling one is not).
pub(crate) fn is_regular(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// Every entry of `dir` named like a segment, as (owner, id, path, is a regular file),
/// sorted by owner then id. A symlink counts as what it points to (nothing, when dangling).
pub fn segment_names(dir: &Path) -> Result<Vec<(String, SegmentId, PathBuf, bool)>, StoreError> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(StoreError::io("list", dir, e)),
    };
    for ent in rd {
        let ent = ent.map_err(|e| StoreError::io("list", dir, e))?;
        let name = ent.file_name();
        if let Some((owner, id)) = name.to_str().and_then(parse_segment_name) {
            let path = ent.path();
            let regular = is_regular(&path);
            out.push((owner.to_string(), id, path, regular));
        }
    }
    out.sort();
    Ok(out)
}

/// The segment files in `dir`, as (owner, id, path), sorted by owner then id: regular files
/// only. Other files, and entries with a segment's name that are no regular file (a
/// directory, a FIFO, a dangling link), are left out (`recover` warns about them; nothing
/// reads or deletes them, and new segments are numbered past them).
pub fn list_segments(dir: &Path) -> Result<Vec<(String, SegmentId, PathBuf)>, StoreError> {
    Ok(segment_names(dir)?
        .into_iter()
        .filter(|(.., regular)| *regular)
        .map(|(owner, id, path, _)| (owner, id, path))
        .collect())
}

/// `fsync` of a directory (new or deleted entries become durable).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), String> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("sync directory {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes on disk do not move with a refactor: layout 1 is `walletrelay-log1`.
    #[test]
    fn the_magic_names_the_journal_layout() {
        assert_eq!(FILE_MAGIC, b"walletrelay-log1");
        assert_eq!(FILE_MAGIC[15], b'0' + crate::layout::JOURNAL as u8);
    }

    #[test]
    fn segment_names_round_trip_and_strangers_are_refused() {
        let n = segment_name("w0", 7);
        assert_eq!(n, "w0-0000000000000007.log");
        assert_eq!(parse_segment_name(&n), Some(("w0", 7)));
        for bad in [
            "LOCK",
            "w0-7.log",
            "w-0-0000000000000007.log",
            "-0000000000000007.log",
            "w0-000000000000000g.log",
            "w0-0000000000000007.txt",
        ] {
            assert_eq!(parse_segment_name(bad), None, "{bad}");
        }
    }
}
