//! The registry's precomputed bodies in one sealed in-memory file (`memfd`), so that
//! answers send them with `sendfile`: the kernel then attaches the file's pages to the
//! socket instead of copying every byte out of our memory (that copy would be the biggest
//! part of answering `/api/v1/all`: docs/PERFORMANCE.md, "The registry"). Sealing
//! (`F_SEAL_WRITE`, `SHRINK`, `GROW`) makes the file immutable for its whole life, so a range
//! queued on a connection always sends the bytes it named.
//!
//! Where `memfd_create` is unavailable (old kernel, seccomp), [`Blob::build`] fails and the
//! registry answers from memory, as before.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

use crate::outbuf::FileRange;

/// Builds sealed memory files.
pub struct Blob;

impl Blob {
    /// Writes `parts` one after the other into a new sealed memory file and returns the
    /// range of each.
    pub fn build(parts: &[&[u8]]) -> io::Result<Vec<FileRange>> {
        let mut file = memfd(c"walletrelay-registry")?;
        let mut ranges = Vec::with_capacity(parts.len());
        let mut offset = 0u64;
        for p in parts {
            file.write_all(p)?;
            ranges.push((offset, p.len()));
            offset += p.len() as u64;
        }
        seal(
            &file,
            libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )?;
        let file = Arc::new(file);
        Ok(ranges
            .into_iter()
            .map(|(offset, len)| FileRange {
                file: Arc::clone(&file),
                offset,
                len,
            })
            .collect())
    }
}

/// A new, empty in-memory file that accepts seals, closed on exec.
pub(super) fn memfd(name: &CStr) -> io::Result<File> {
    // SAFETY: `name` is a NUL-terminated string that outlives the call; memfd_create only
    // reads it.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create, is open, and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Adds `seals` (`F_SEAL_*`) to a memfd.
pub(super) fn seal(file: &File, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl on an fd owned by `file`, with an integer argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn ranges_read_back_and_the_file_cannot_change() {
        let r = Blob::build(&[b"hello", b"", b"world!"]).unwrap();
        assert_eq!(r[0].read().unwrap(), b"hello");
        assert_eq!(r[1].len, 0);
        assert_eq!(r[2].read().unwrap(), b"world!");
        assert_eq!(r[2].slice(1, 3).read().unwrap(), b"orl");
        // Sealed: neither a write nor growth is allowed.
        assert!(r[0].file.write_at(b"J", 0).is_err());
        assert!(r[0].file.set_len(100).is_err());
        assert_eq!(r[0].read().unwrap(), b"hello");
    }
}
