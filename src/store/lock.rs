//! One process per data directory: an exclusive `flock` on `<dir>/LOCK`, held as long as
//! the [`DirLock`] lives (the kernel drops it when the process dies, even on `kill -9`).
//!
//! Owns only the `LOCK` file; it records the holder's pid there so that a refused second
//! process can name it. Must not touch the segments.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::types::StoreError;

/// The held lock of a data directory.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    dir: PathBuf,
}

impl DirLock {
    /// Creates `dir` if needed and takes its lock, or fails with [`StoreError::Locked`]
    /// naming the directory and the holder's pid.
    pub fn acquire(dir: &Path) -> Result<DirLock, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create", dir, e))?;
        let path = dir.join("LOCK");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io("open", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut s = String::new();
                let _ = file.read_to_string(&mut s);
                return Err(StoreError::Locked {
                    dir: dir.to_path_buf(),
                    pid: s.trim().parse().ok(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(StoreError::io("lock", &path, e)),
        }
        let pid = format!("{}\n", std::process::id());
        file.set_len(0)
            .and_then(|()| file.write_all(pid.as_bytes()))
            .map_err(|e| StoreError::io("write", &path, e))?;
        Ok(DirLock {
            _file: file,
            dir: dir.to_path_buf(),
        })
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_until_the_first_is_dropped() {
        let dir = std::env::temp_dir().join(format!("wr-lock-{}", std::process::id()));
        let first = DirLock::acquire(&dir).unwrap();
        let err = DirLock::acquire(&dir).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Locked { pid: Some(p), .. } if p == std::process::id()));
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        drop(first);
        let again = DirLock::acquire(&dir).unwrap();
        assert_eq!(again.dir(), dir);
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
