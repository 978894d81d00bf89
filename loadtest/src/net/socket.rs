//! Readiness, for the loop in `net`: a connect completing (the upgrade request queued, or
//! `on_open` for HTTP), reads into the loop's scratch buffer until the socket is drained
//! (over TLS, until it would block), writes of what connections queued (compressed first
//! with permessage-deflate, then through TLS), and the reaping of dead connections.
//!
//! It does not parse anything: what a read brings goes to `Io::process` (`frames`).

use std::io;
use std::mem;

use super::{
    CloseWhy, Conn, Handler, Io, IoStats, Key, Phase, Proto, KEEP_OUT_CAPACITY, READ_CHUNK,
};
use crate::{deflate, sys, tls};

impl Io {
    /// Remove dead connections and tell the handler; repeats while handlers cause more.
    pub(super) fn reap<H: Handler>(&mut self, h: &mut H) {
        while let Some((key, why)) = self.dead.pop() {
            if let Some(mut c) = self.conns.try_remove(key) {
                let _ = self.poll.registry().deregister(&mut c.stream);
                if c.rst {
                    sys::set_linger_zero(&c.stream);
                }
                drop(c.stream);
                let now = self.now_ns();
                h.on_closed(self, key, c.tag, &why, now);
            }
        }
    }

    /// Write what can be written on every connection with output.
    pub(super) fn flush(&mut self) {
        let mut dirty = mem::take(&mut self.dirty);
        for key in dirty.drain(..) {
            let Some(c) = self.conns.get_mut(key) else {
                continue;
            };
            c.dirty = false;
            if c.phase == Phase::Dead || c.phase == Phase::Connecting || !c.writable {
                continue;
            }
            if let (true, Some(codec)) = (c.deflate, self.codec.as_deref_mut()) {
                compress_queued(c, codec, &mut self.recode, &mut self.stats);
            }
            let mut failed = None;
            while c.out_pos < c.out.len() {
                let end = c.out.len().min(c.out_pos.saturating_add(self.max_write));
                match tls::write(&mut c.stream, c.tls.as_deref_mut(), &c.out[c.out_pos..end]) {
                    Ok(0) => {
                        failed = Some(CloseWhy::Io(io::ErrorKind::WriteZero));
                        break;
                    }
                    Ok(n) => {
                        c.out_pos += n;
                        self.stats.wire.bytes_out += n as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        c.writable = false;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        failed = Some(CloseWhy::Io(e.kind()));
                        break;
                    }
                }
            }
            if let (Some(t), None, true) = (c.tls.as_deref_mut(), &failed, c.writable) {
                // Ciphertext of what was written, still in `rustls`.
                match tls::send_pending(&mut c.stream, t) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.writable = false,
                    Err(e) => failed = Some(CloseWhy::Io(e.kind())),
                }
            }
            if c.out_pos == c.out.len() {
                c.out_pos = 0;
                if c.out.capacity() > KEEP_OUT_CAPACITY {
                    c.out = Vec::new();
                } else {
                    c.out.clear();
                }
            } else if c.out_pos > KEEP_OUT_CAPACITY && c.out_pos * 2 > c.out.len() {
                c.out.drain(..c.out_pos);
                c.out_pos = 0;
            }
            c.plain_from = c.out.len();
            if let Some(why) = failed {
                self.mark_dead(key, why);
            }
        }
        self.dirty = dirty;
    }

    pub(super) fn on_event<H: Handler>(
        &mut self,
        h: &mut H,
        key: Key,
        readable: bool,
        writable: bool,
    ) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.phase == Phase::Dead {
            return;
        }
        if c.phase == Phase::Connecting {
            match c.stream.take_error() {
                Ok(Some(e)) | Err(e) => {
                    self.mark_dead(key, CloseWhy::ConnectFailed(e.kind()));
                    return;
                }
                Ok(None) => {}
            }
            match c.stream.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => {
                    self.mark_dead(key, CloseWhy::ConnectFailed(e.kind()));
                    return;
                }
            }
            c.writable = true;
            match c.proto {
                Proto::Ws => {
                    c.phase = Phase::Upgrading;
                    match c.upgrade.take() {
                        Some(own) => c.out.extend_from_slice(&own),
                        None => c.out.extend_from_slice(&self.upgrade_req),
                    }
                    if !c.dirty {
                        c.dirty = true;
                        self.dirty.push(key);
                    }
                }
                Proto::Http => {
                    c.phase = Phase::Open;
                    let tag = c.tag;
                    let now = self.now_ns();
                    h.on_open(self, key, tag, now);
                }
            }
        } else if writable {
            c.writable = true;
            let tls_waits = c.tls.as_ref().is_some_and(|t| t.wants_write());
            if (c.out_pos < c.out.len() || tls_waits) && !c.dirty {
                c.dirty = true;
                self.dirty.push(key);
            }
        }
        if readable {
            self.read(h, key);
        }
    }

    fn read<H: Handler>(&mut self, h: &mut H, key: Key) {
        let mut scratch = mem::take(&mut self.scratch);
        while let Some(c) = self.conns.get_mut(key) {
            if c.phase == Phase::Dead || c.phase == Phase::Connecting {
                break;
            }
            let kept = c.pending.len();
            if scratch.len() < kept + READ_CHUNK {
                scratch.resize(kept + READ_CHUNK, 0);
            }
            let n = match tls::read(
                &mut c.stream,
                c.tls.as_deref_mut(),
                &mut scratch[kept..],
                &mut self.cipher,
            ) {
                Ok(0) => {
                    let why = if c.phase == Phase::Closing {
                        CloseWhy::Normal
                    } else {
                        CloseWhy::Eof
                    };
                    self.mark_dead(key, why);
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // From `tls::read`: the TLS layer refused what the server sent.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    self.mark_dead(key, CloseWhy::Protocol(format!("tls: {e}")));
                    break;
                }
                Err(e) => {
                    self.mark_dead(key, CloseWhy::Io(e.kind()));
                    break;
                }
            };
            let short_ends = c.tls.is_none();
            scratch[..kept].copy_from_slice(&c.pending);
            c.pending.clear();
            let room = scratch.len() - kept;
            self.stats.wire.bytes_in += n as u64;
            let end = kept + n;
            let now = self.now_ns();
            let used = self.process(h, key, &scratch[..end], now);
            if let Some(c) = self.conns.get_mut(key) {
                if c.phase != Phase::Dead && used < end {
                    c.pending.extend_from_slice(&scratch[used..end]);
                } else if c.pending.capacity() > READ_CHUNK {
                    c.pending = Vec::new();
                }
            }
            // A short read emptied the socket; edge-triggered epoll reports new data again.
            // (Not so over TLS: a read gives at most the records decrypted so far.)
            if n < room && short_ends {
                break;
            }
        }
        if scratch.len() > 16 * READ_CHUNK {
            scratch.truncate(4 * READ_CHUNK);
            scratch.shrink_to_fit();
        }
        self.scratch = scratch;
    }
}

/// Compresses the frames queued on `c` since the last write (`out[plain_from..]`).
fn compress_queued(
    c: &mut Conn,
    codec: &mut deflate::Codec,
    tmp: &mut Vec<u8>,
    stats: &mut IoStats,
) {
    if c.plain_from >= c.out.len() {
        return;
    }
    tmp.clear();
    tmp.extend_from_slice(&c.out[c.plain_from..]);
    c.out.truncate(c.plain_from);
    let before = (codec.sent_compressed, codec.sent_plain);
    codec.recode(tmp, &mut c.out);
    stats.wire.compressed_out += codec.sent_compressed - before.0;
    stats.wire.uncompressed_out += codec.sent_plain - before.1;
    c.plain_from = c.out.len();
    if tmp.capacity() > KEEP_OUT_CAPACITY {
        *tmp = Vec::new();
    }
}
