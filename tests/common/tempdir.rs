//! Directories and file systems of a test's own: [`TempDir`], the one temporary-directory
//! helper (a fresh directory, removed with its contents on drop), and [`Tmpfs`], a small
//! tmpfs mounted on one (needs root) for the full-disk tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh directory under the system's temp dir (or a given parent), removed (with its
/// contents) on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new, empty directory whose name starts with `tag`, in the system's temp dir.
    pub fn new(tag: &str) -> TempDir {
        TempDir::under(&std::env::temp_dir(), tag)
    }

    /// A new, empty directory whose name starts with `tag`, in `parent`.
    pub fn under(parent: &Path, tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let d = parent.join(format!("walletrelay-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create a temp dir");
        TempDir(d)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Its path as a flag value (`--data-dir`, `--registry-dir`).
    pub fn arg(&self) -> &str {
        self.0.to_str().expect("UTF-8 temp path")
    }

    /// A path inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The files in it whose name ends in `.<ext>`, sorted by name (the store's segments
    /// are `w<i>-<16 hex>.log`).
    pub fn files_with_ext(&self, ext: &str) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.0)
            .expect("list the temp dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect();
        v.sort();
        v
    }

    /// Bytes of all files in it (not in subdirectories).
    pub fn bytes(&self) -> u64 {
        std::fs::read_dir(&self.0)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tmpfs of a given size mounted on a [`TempDir`] (needs root), unmounted on drop, and
/// the directory then removed (whichever of the two is dropped first: a directory that is
/// a mount point cannot be removed before the unmount).
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`1m`, `2g`) on `dir`; the error says why it could not be
    /// (a test then calls [`super::skip::skip`] with it and returns).
    pub fn mount(dir: &TempDir, size: &str) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        let why = match out {
            Ok(o) if o.status.success() => return Ok(Tmpfs(dir.path().to_path_buf())),
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => format!("cannot run mount: {e}"),
        };
        Err(format!(
            "cannot mount a {size} tmpfs on {} ({why})",
            dir.0.display()
        ))
    }

    /// Its mount point.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Fills the file system with a file `filler` until it is full; returns its path.
    pub fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).expect("create the filler");
        let chunk = vec![0x5a; 16 << 10];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
