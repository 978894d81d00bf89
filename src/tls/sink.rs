//! [`TlsSink`]: "TLS session + socket" as an [`outbuf::Sink`](crate::outbuf::Sink), so a
//! connection's `OutBuf` is flushed over TLS by the same `OutBuf::write_to` as over TCP.
//!
//! A write gathers up to [`PLAIN_MAX`] bytes of plaintext (file ranges are read with
//! `pread`), encrypts them into the worker's [`TlsScratch`], and writes the ciphertext to
//! the socket. It reports all that plaintext as taken: the ciphertext the socket did not
//! take moves into the session's `pending` and goes out first on the next write. A write
//! that finds `pending` not empty and cannot send it all answers `WouldBlock` and takes no
//! plaintext. So every plaintext byte is encrypted exactly once, in order: none lost, none
//! doubled. This module owns no state; it must not touch the `OutBuf`'s queue.

use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::os::unix::fs::FileExt;

use super::session::{cipher_room, TlsScratch, TlsSession, PLAIN_MAX};
use crate::outbuf::{Flush, Sink};

/// A TLS session and its socket, borrowed for one flush.
#[derive(Debug)]
pub struct TlsSink<'a, S: Write> {
    tls: &'a mut TlsSession,
    sock: &'a mut S,
    scratch: &'a mut TlsScratch,
}

impl<'a, S: Write> TlsSink<'a, S> {
    /// Borrows a connection's session and socket, and the worker's write buffers.
    pub fn new(tls: &'a mut TlsSession, sock: &'a mut S, scratch: &'a mut TlsScratch) -> Self {
        TlsSink { tls, sock, scratch }
    }

    /// Sends the ciphertext still pending (handshake messages, alerts, the tail of the
    /// last write). Call it after `OutBuf::write_to` returned `Done`, since that only
    /// means every plaintext byte was encrypted: `Blocked` means wait for writable.
    pub fn finish(&mut self) -> io::Result<Flush> {
        self.tls.send_pending(self.sock)
    }

    /// Encrypts `plain` (at most [`PLAIN_MAX`] bytes) and sends what the socket takes;
    /// the rest waits in the session. `pending` must be empty.
    fn seal(
        tls: &mut TlsSession,
        sock: &mut S,
        cipher: &mut Vec<u8>,
        plain: &[u8],
    ) -> io::Result<usize> {
        if cipher.len() < cipher_room(plain.len()) {
            cipher.resize(cipher_room(plain.len()), 0);
        }
        let Some(n) = tls.encrypt(plain, cipher)? else {
            // Handshake still running: nothing can be encrypted before it is done; the
            // read path asks for a flush once it is.
            return Err(io::ErrorKind::WouldBlock.into());
        };
        if tls.wants_write() {
            // Handshake messages (a key update) were queued ahead of this data.
            tls.push_pending(&cipher[..n]);
            tls.send_pending(sock)?;
            return Ok(plain.len());
        }
        let mut at = 0;
        while at < n {
            match sock.write(&cipher[at..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => at += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if at < n {
            tls.push_pending(&cipher[at..n]);
        }
        Ok(plain.len())
    }

    /// Sends pending ciphertext first: plaintext is taken only once it is all out.
    fn ready(&mut self) -> io::Result<()> {
        match self.tls.send_pending(self.sock)? {
            Flush::Done => Ok(()),
            Flush::Blocked => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl<S: Write> Write for TlsSink<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_parts(&[IoSlice::new(buf)], false)
    }

    fn write_vectored(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        self.write_parts(iov, false)
    }

    /// Sends all pending ciphertext, or fails with `WouldBlock`.
    fn flush(&mut self) -> io::Result<()> {
        self.ready()
    }
}

impl<S: Write> Sink for TlsSink<'_, S> {
    fn write_parts(&mut self, iov: &[IoSlice<'_>], _more: bool) -> io::Result<usize> {
        self.ready()?;
        let TlsScratch { staging, cipher } = &mut *self.scratch;
        let first = iov.iter().find(|s| !s.is_empty()).map_or(0, |s| s.len());
        if first >= 16384 || iov.len() == 1 {
            // A large or lone slice is encrypted where it is (up to the limit).
            let Some(s) = iov.iter().find(|s| !s.is_empty()) else {
                return Ok(0);
            };
            let plain = &s[..s.len().min(PLAIN_MAX)];
            return Self::seal(self.tls, self.sock, cipher, plain);
        }
        // Small pieces are gathered, so they share records instead of each paying for one.
        staging.clear();
        for s in iov {
            let take = s.len().min(PLAIN_MAX - staging.len());
            staging.extend_from_slice(&s[..take]);
            if staging.len() == PLAIN_MAX {
                break;
            }
        }
        Self::seal(self.tls, self.sock, cipher, staging)
    }

    fn send_file(&mut self, file: &File, offset: u64, len: usize) -> io::Result<usize> {
        self.ready()?;
        let TlsScratch { staging, cipher } = &mut *self.scratch;
        let want = len.min(PLAIN_MAX);
        if staging.len() < want {
            staging.resize(want, 0);
        }
        let got = file.read_at(&mut staging[..want], offset)?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Self::seal(self.tls, self.sock, cipher, &staging[..got])
    }
}
