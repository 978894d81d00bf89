//! A Unix stream socket that carries lines of text, each of which may carry open file
//! descriptors (`SCM_RIGHTS`): what one walletrelay process hands the next one. The
//! handover of the listening sockets uses it; a handover of live connections can use the
//! same channel (a line naming what follows, the sockets attached to it).
//!
//! Owns the framing (a line is at most [`MAX_LINE`] bytes, ended by `\n`) and the
//! `sendmsg`/`recvmsg` calls; it knows nothing of what the lines mean.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Longest line, bytes (the newline included).
pub const MAX_LINE: usize = 1024;

/// Most descriptors one line may carry (the kernel's `SCM_MAX_FD`).
pub const MAX_FDS: usize = 253;

/// One end of the channel.
#[derive(Debug)]
pub struct Channel {
    stream: UnixStream,
    /// Bytes read past the last line returned.
    pending: Vec<u8>,
    /// Descriptors received with bytes not yet returned as a line.
    fds: Vec<OwnedFd>,
}

/// A line and the descriptors that came with it.
#[derive(Debug)]
pub struct Line {
    /// The text, without its newline.
    pub text: String,
    /// The descriptors, in the order the sender attached them.
    pub fds: Vec<OwnedFd>,
}

impl Channel {
    /// The channel over a connected stream.
    pub fn new(stream: UnixStream) -> Channel {
        Channel {
            stream,
            pending: Vec::new(),
            fds: Vec::new(),
        }
    }

    /// The stream (for its credentials, its timeouts).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Sets how long [`Channel::recv`] waits (`None`: for ever).
    pub fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(t)?;
        self.stream.set_write_timeout(t)
    }

    /// Sends `text` and a newline, with `fds` attached to its first byte.
    pub fn send(&mut self, text: &str, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let mut line = Vec::with_capacity(text.len() + 1);
        line.extend_from_slice(text.as_bytes());
        line.push(b'\n');
        if line.len() > MAX_LINE || text.contains('\n') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "line too long"));
        }
        if fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many descriptors for one line",
            ));
        }
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        let sent = send_with_fds(&self.stream, &line, &raw)?;
        // A stream may take fewer bytes: the descriptors went with the first one.
        self.stream.write_all(&line[sent..])
    }

    /// The next line and the descriptors that came with it; `None` at end of stream.
    /// Fails with `TimedOut` after the timeout, `InvalidData` on a line over
    /// [`MAX_LINE`] or not UTF-8.
    pub fn recv(&mut self) -> io::Result<Option<Line>> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let rest = self.pending.split_off(end + 1);
                let mut bytes = std::mem::replace(&mut self.pending, rest);
                bytes.pop();
                let text = String::from_utf8(bytes)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))?;
                return Ok(Some(Line {
                    text,
                    fds: std::mem::take(&mut self.fds),
                }));
            }
            if self.pending.len() >= MAX_LINE {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
            let mut buf = [0u8; MAX_LINE];
            let room = MAX_LINE - self.pending.len();
            let n = match recv_with_fds(&self.stream, &mut buf[..room], &mut self.fds) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"))
                }
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(None);
            }
            self.pending.extend_from_slice(&buf[..n]);
        }
    }
}

/// Room for `n` descriptors in a control buffer, in `u64`s (aligned for `cmsghdr`).
fn control_words(n: usize) -> usize {
    let payload = (n * std::mem::size_of::<RawFd>()) as u32;
    // SAFETY: CMSG_SPACE is arithmetic on its argument; it reads no memory.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    space.div_ceil(std::mem::size_of::<u64>())
}

/// One `sendmsg` of `bytes` (not empty) with `fds` as `SCM_RIGHTS`; the bytes it took.
fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let mut control = vec![0u64; control_words(fds.len())];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all zeroes is a valid value (null
    // pointers, zero lengths); its fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = std::mem::size_of_val(fds);
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = (control.len() * std::mem::size_of::<u64>()) as _;
        // SAFETY: `msg_control` points to `control`, alive for this scope and at least
        // CMSG_SPACE(payload) bytes (`control_words`), so CMSG_FIRSTHDR returns a header
        // inside it (checked non-null), and CMSG_DATA of that header has room for
        // `payload` bytes; `fds` is a live slice of exactly `payload` bytes.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            if cmsg.is_null() {
                return Err(io::Error::other("no room for the control message"));
            }
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                payload,
            );
        }
    }
    loop {
        // SAFETY: `msg` points to `iov` (over `bytes`) and `control`, all alive during the
        // call; sendmsg only reads them. The descriptors are borrowed by the caller for
        // at least this call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One `recvmsg` into `buf`; the descriptors that came with the bytes are pushed to
/// `fds` (close-on-exec). Returns the bytes read (0: end of stream).
fn recv_with_fds(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut control = vec![0u64; control_words(MAX_FDS)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as in `send_with_fds`: all zeroes is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = (control.len() * std::mem::size_of::<u64>()) as _;
    let n = loop {
        // SAFETY: `msg` points to `iov` (over `buf`, writable, `buf.len()` bytes) and to
        // `control` (writable, `msg_controllen` bytes), alive during the call; recvmsg
        // writes within those lengths only.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: recvmsg filled `control` with `msg_controllen` bytes of well-formed control
    // messages; CMSG_FIRSTHDR/CMSG_NXTHDR walk them within that length and return null
    // after the last. An SCM_RIGHTS message's data holds `(cmsg_len - CMSG_LEN(0)) / 4`
    // descriptors, read unaligned; the kernel installed each in this process's table for
    // us alone, so each is owned by exactly one `OwnedFd`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    let p = data.add(i * std::mem::size_of::<RawFd>()).cast::<RawFd>();
                    fds.push(OwnedFd::from_raw_fd(p.read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more descriptors than a line may carry",
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek};
    use std::os::fd::AsFd;

    #[test]
    fn lines_carry_descriptors_that_work_on_the_other_side() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut a, mut b) = (Channel::new(a), Channel::new(b));
        let path = std::env::temp_dir().join(format!("wr-chan-{}", std::process::id()));
        std::fs::write(&path, b"hello through a descriptor").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        a.send("first", &[file.as_fd(), file.as_fd()]).unwrap();
        a.send("second", &[]).unwrap();
        drop(a);
        let first = b.recv().unwrap().unwrap();
        assert_eq!(first.text, "first");
        assert_eq!(first.fds.len(), 2);
        let mut got = std::fs::File::from(first.fds.into_iter().next().unwrap());
        got.rewind().unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello through a descriptor");
        let second = b.recv().unwrap().unwrap();
        assert_eq!((second.text.as_str(), second.fds.len()), ("second", 0));
        assert!(b.recv().unwrap().is_none());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_line_too_long_or_a_silent_peer_is_an_error_not_a_hang() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = Channel::new(b);
        (&a).write_all(&[b'x'; MAX_LINE + 1]).unwrap();
        assert_eq!(b.recv().unwrap_err().kind(), io::ErrorKind::InvalidData);
        let (_a, c) = UnixStream::pair().unwrap();
        let mut c = Channel::new(c);
        c.set_timeout(Some(Duration::from_millis(20))).unwrap();
        assert_eq!(c.recv().unwrap_err().kind(), io::ErrorKind::TimedOut);
        drop(a);
    }
}
