//! A TLS connection's detours on the worker's I/O paths (the session itself is
//! `tls::TlsSession`; this is only where the worker calls it):
//! - read: ciphertext into the worker's scratch buffer, decrypted into its plaintext
//!   buffer, which is then processed exactly like a plain connection's input (what is left
//!   over goes to the connection's buffer, whose cap applies to plaintext); handshake
//!   messages the session queued make the connection dirty; a `close_notify` is EOF; a
//!   protocol error sends the session's alert once and closes that connection only;
//! - write: the `OutBuf` is flushed through a `TlsSink`, then the session's pending
//!   ciphertext is sent;
//! - close: a `close_notify` goes out before the write side is shut.
//!
//! It must not decide anything about phases or deadlines: `worker::io` does, the same way
//! for both kinds of connection.

use std::io::{self, Read};
use std::sync::Arc;

use mio::net::TcpStream;

use super::{SocketRead, Worker};
use crate::outbuf::{Flush, OutBuf};
use crate::tls::{TlsScratch, TlsSession, TlsSink};

impl Worker {
    /// A session for a connection accepted on the TLS listener, with the configuration
    /// current now; `None` (the connection is dropped) if there is none or it fails.
    pub(super) fn new_session(&self) -> Option<Box<TlsSession>> {
        let config = Arc::clone(self.listeners.tls_config.as_ref()?);
        match TlsSession::new(config) {
            Ok(s) => Some(Box::new(s)),
            Err(e) => {
                log::warn!(worker = self.id, error:% = e; "worker {}: TLS session: {e}", self.id);
                None
            }
        }
    }

    /// One read of ciphertext, decrypted into `self.bufs.plain` (emptied first); a TLS
    /// error is [`SocketRead::Failed`] once the session's alert was sent (best effort).
    pub(super) fn read_tls(&mut self, key: usize) -> SocketRead {
        if self.conns[key].rbuf.len() >= self.rbuf_cap(key) {
            // As in `read_some`: the parsers refuse oversized input before this.
            self.fail_oversize(key);
            return SocketRead::Nothing;
        }
        let asked = self.bufs.scratch.len();
        let c = &mut self.conns[key];
        let Some(tls) = c.tls.as_deref_mut() else {
            return SocketRead::Failed;
        };
        let n = match SocketRead::of(c.sock.read(&mut self.bufs.scratch), asked) {
            SocketRead::Bytes { n, .. } => n,
            other => return other,
        };
        let was_done = tls.handshake_done();
        self.bufs.plain.clear();
        if let Err(e) = tls.read_tls(&mut self.bufs.scratch[..n], &mut self.bufs.plain) {
            let _ = tls.send_pending(&mut c.sock);
            self.bufs.plain.clear();
            self.shared.metrics.cores[self.id].tls_failures.inc();
            log::debug!(
                worker = self.id, error:% = e;
                "worker {}: TLS connection closed: {e}", self.id
            );
            return SocketRead::Failed;
        }
        if !was_done && tls.handshake_done() {
            self.shared.metrics.cores[self.id].tls_handshakes.inc();
        }
        if tls.wants_write() {
            // Handshake messages or an alert wait for the socket (TLS 1.3 session tickets
            // are held by the session until the first answer, and go out with it).
            self.mark_dirty(key);
        }
        SocketRead::of(Ok(n), asked)
    }

    /// Processes the plaintext of the last [`Worker::read_tls`]; `false` when the peer
    /// sent `close_notify` (no more input: treat as EOF).
    pub(super) fn process_plain(&mut self, key: usize) -> bool {
        if !self.bufs.plain.is_empty() {
            let mut buf = std::mem::take(&mut self.bufs.plain);
            if self.conns[key].rbuf.is_empty() {
                self.process_front(key, &mut buf);
            } else {
                self.conns[key].rbuf.extend_from_slice(&buf);
                self.process_buffered(key);
            }
            buf.clear();
            self.bufs.plain = buf;
        }
        let c = &self.conns[key];
        c.marks.closed || !c.tls.as_ref().is_some_and(|t| t.peer_closed())
    }
}

/// Flushes `out` through the session, then the ciphertext it left pending: `Done` only
/// when the socket took everything.
pub(super) fn write(
    out: &mut OutBuf,
    tls: &mut TlsSession,
    sock: &mut TcpStream,
    bufs: &mut TlsScratch,
) -> io::Result<Flush> {
    let mut sink = TlsSink::new(tls, sock, bufs);
    match out.write_to(&mut sink)? {
        Flush::Done => sink.finish(),
        Flush::Blocked => Ok(Flush::Blocked),
    }
}

/// Queues `close_notify` (once; not before the handshake is done) and sends what is
/// pending: `Done` when it is all out and the write side may be shut.
pub(super) fn close_notify(tls: &mut TlsSession, sock: &mut TcpStream) -> io::Result<Flush> {
    tls.queue_close_notify();
    tls.send_pending(sock)
}
