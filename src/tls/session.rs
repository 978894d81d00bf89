//! One connection's TLS state, sans-IO: [`TlsSession`] wraps `rustls`'s unbuffered server
//! connection, so every buffer is either the caller's (the worker's read scratch, its
//! plaintext vector, the [`TlsScratch`] the write path encrypts into) or one of three small
//! vectors the session owns only while they hold bytes: `carry` (the start of a record
//! that has not fully arrived), `pending` (ciphertext the socket has not taken yet) and
//! `held` (TLS 1.3 session tickets waiting for the first answer, see below). An idle
//! session owns none of them, only `rustls`'s connection state.
//!
//! TLS 1.3 session tickets (and any other message `rustls` sends after the handshake) are
//! not sent as soon as the client's `Finished` is read, but held and sent in the same
//! write as the connection's next application data (or its `close_notify`), just ahead of
//! it. A ticket sent at once reaches the client while it writes its first request, and
//! clients that read and write one OpenSSL connection from two threads (Python's
//! `websockets` sync client among them: OpenSSL does not support it, but it is common)
//! then lose that request about one time in a hundred and hang in their opening handshake.
//! Held until the answer, the ticket arrives while the client waits for it, reading only.
//! RFC 8446 §4.6.1 lets the server send a ticket at any time after the client's `Finished`.
//!
//! It owns records, handshake progress and those three buffers; it must not touch the
//! socket's readiness, HTTP/WebSocket state or the connection's lifetime (the worker
//! decides when to close, using [`TlsSession::handshake_done`] for the head timeout).

use std::io::{self, Write};
use std::sync::Arc;

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, InsufficientSizeError, UnbufferedStatus,
};
use rustls::{HandshakeKind, ProtocolVersion, ServerConfig};

use super::TlsError;
use crate::outbuf::Flush;

/// Largest TLS record on the wire (a TLS 1.2 ciphertext record: 5-byte header, 16 KiB of
/// data, up to 2 KiB of expansion).
const RECORD_MAX: usize = 5 + 16384 + 2048;

/// Most ciphertext a session carries from one read to the next: a handshake message up to the 64 KiB
/// `rustls` accepts, spread over records, plus one more record. More than that is an
/// attack (or garbage), and costs the connection.
pub const MAX_CARRY: usize = 0x1_0000 + 2 * RECORD_MAX;

/// Most ciphertext a session holds for the socket: a write's worth and room for handshake
/// messages. A peer that makes the session answer (key updates) without reading its
/// answers reaches it, and its session fails on the next read.
pub const MAX_PENDING: usize = 2 * PLAIN_MAX;

/// Most plaintext encrypted per write (four full records): a socket that takes less keeps
/// the rest of their ciphertext in the session's `pending`, so this bounds it.
pub const PLAIN_MAX: usize = 4 * 16384;

/// Room for record overhead (per record at most 5 header + 8 nonce + 16 tag + 1 type) and
/// for a queued key update ahead of the data.
const CIPHER_SLACK: usize = 1024;

/// A worker's buffers for the TLS write path, shared by all its connections: plaintext is
/// gathered in `staging` and encrypted into `cipher`, and only what the socket does not
/// take moves into the session. Allocated on first use (about 130 KiB).
#[derive(Debug, Default)]
pub struct TlsScratch {
    pub(super) staging: Vec<u8>,
    pub(super) cipher: Vec<u8>,
}

/// What `pump` is asked to do once the connection can send application data.
enum Want<'a> {
    /// Read: append decrypted application data to the vector; stop when input runs out.
    Read(&'a mut Vec<u8>),
    /// Encrypt this plaintext into the vector (from its start); stop once done.
    Encrypt(&'a [u8], &'a mut Vec<u8>),
    /// Queue a `close_notify` alert into `pending`.
    CloseNotify,
}

/// How a `pump` ended.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// More input is needed (handshake or next record).
    NeedInput,
    /// The `Encrypt` or `CloseNotify` asked for was done; for `Encrypt`, the ciphertext's
    /// length.
    Wrote(usize),
    /// Both sides sent `close_notify`: nothing more can be read or written.
    Closed,
}

/// One TLS connection (server side).
pub struct TlsSession {
    conn: UnbufferedServerConnection,
    /// Received ciphertext not yet consumed: the start of a record, or of a handshake
    /// message spanning records. Holds no allocation when empty.
    carry: Vec<u8>,
    /// Ciphertext waiting for the socket, from `sent` on. Holds no allocation when empty.
    pending: Vec<u8>,
    /// Bytes of `pending` already written.
    sent: usize,
    /// TLS 1.3 records made after the handshake (the session tickets), held until the
    /// next application data or `close_notify` and moved into `pending` just ahead of it
    /// (see the module's doc). Holds no allocation when empty.
    held: Vec<u8>,
    /// The peer sent `close_notify`: further input is ignored.
    peer_closed: bool,
    /// `close_notify` has been queued.
    close_queued: bool,
    /// A protocol error happened: the session only flushes its alert now.
    failed: bool,
}

impl std::fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSession")
            .field("handshake_done", &self.handshake_done())
            .field("carry", &self.carry.len())
            .field("pending", &self.pending_len())
            .field("peer_closed", &self.peer_closed)
            .finish_non_exhaustive()
    }
}

impl TlsSession {
    /// A new server session for an accepted connection, with the config current at accept
    /// (a reload later does not change it).
    pub fn new(config: Arc<ServerConfig>) -> Result<TlsSession, TlsError> {
        Ok(TlsSession {
            conn: UnbufferedServerConnection::new(config).map_err(TlsError::Protocol)?,
            carry: Vec::new(),
            pending: Vec::new(),
            sent: 0,
            held: Vec::new(),
            peer_closed: false,
            close_queued: false,
            failed: false,
        })
    }

    /// Feeds ciphertext just read from the socket (it may be modified: records are worked
    /// on in place) and appends the application data it completes to `plain`; returns how
    /// many plaintext bytes were appended (0 during the handshake, or when only part of a
    /// record came). Bytes not forming a whole record are kept for the next call.
    ///
    /// Afterwards, [`TlsSession::wants_write`] says whether handshake messages (or an
    /// alert) wait to be sent: flush the connection then, even with no plaintext queued.
    /// On `Err` the connection is finished: send what is pending once, best effort (the
    /// alert), and close. Plaintext appended before an error was authenticated, but the
    /// connection is closing anyway.
    pub fn read_tls(
        &mut self,
        ciphertext: &mut [u8],
        plain: &mut Vec<u8>,
    ) -> Result<usize, TlsError> {
        if self.failed {
            return Err(TlsError::Failed);
        }
        let before = plain.len();
        if self.peer_closed || ciphertext.is_empty() {
            return Ok(0);
        }
        if self.carry.is_empty() {
            let used = self.pump_checked(ciphertext, Want::Read(plain))?.0;
            let rest = &ciphertext[used..];
            if rest.len() > MAX_CARRY {
                return Err(self.fail_input(rest.len()));
            }
            if !rest.is_empty() && !self.peer_closed {
                self.carry.extend_from_slice(rest);
            }
        } else {
            // The carry grows by one read at most (the caller's buffer) before it is
            // worked down again.
            let mut carry = std::mem::take(&mut self.carry);
            carry.extend_from_slice(ciphertext);
            let used = self.pump_checked(&mut carry, Want::Read(plain))?.0;
            if used >= carry.len() || self.peer_closed {
                carry = Vec::new();
            } else if carry.len() - used > MAX_CARRY {
                return Err(self.fail_input(carry.len() - used));
            } else {
                carry.drain(..used);
            }
            self.carry = carry;
        }
        if self.pending_len() > MAX_PENDING {
            self.failed = true;
            return Err(TlsError::TooMuchOutput(self.pending_len()));
        }
        Ok(plain.len() - before)
    }

    /// The handshake finished: application data flows. Until then the connection is in
    /// its head phase (apply the head timeout: a client stalling mid-handshake is closed
    /// like one stalling mid-head).
    pub fn handshake_done(&self) -> bool {
        !self.conn.is_handshaking()
    }

    /// Ciphertext waits for the socket (handshake messages, an alert, `close_notify`, or
    /// the part of a write the socket did not take): call [`TlsSession::send_pending`]
    /// (or flush through a [`super::TlsSink`]) when the socket is writable. Held session
    /// tickets do not count: they go out with the next write of application data.
    pub fn wants_write(&self) -> bool {
        self.sent < self.pending.len()
    }

    /// Bytes of ciphertext waiting for the socket, held session tickets included (count
    /// them with the connection's outbound bytes).
    pub fn pending_len(&self) -> usize {
        self.pending.len() - self.sent + self.held.len()
    }

    /// Heap bytes the session's own buffers hold now (`carry`, `pending` and `held`;
    /// `rustls`'s connection state is not counted). Zero when idle.
    pub fn buffered_capacity(&self) -> usize {
        self.carry.capacity() + self.pending.capacity() + self.held.capacity()
    }

    /// The peer sent `close_notify`: it sends nothing more (treat like end of input).
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// The negotiated application protocol (`http/1.1`, or `None` if the client offered
    /// no ALPN).
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// The negotiated TLS version, once known.
    pub fn protocol_version(&self) -> Option<ProtocolVersion> {
        self.conn.protocol_version()
    }

    /// Full or resumed handshake, once done.
    pub fn handshake_kind(&self) -> Option<HandshakeKind> {
        self.conn.handshake_kind()
    }

    /// Writes pending ciphertext to `sock` until it is all written (`Done`, and the buffer
    /// is freed) or the socket would block (`Blocked`).
    pub fn send_pending<W: Write>(&mut self, sock: &mut W) -> io::Result<Flush> {
        while self.sent < self.pending.len() {
            match sock.write(&self.pending[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flush::Blocked),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        self.pending = Vec::new();
        self.sent = 0;
        Ok(Flush::Done)
    }

    /// Queues a `close_notify` alert (once) after everything already queued; send it with
    /// [`TlsSession::send_pending`] before half-closing the socket. Does nothing before
    /// the handshake is done or after an error.
    pub fn queue_close_notify(&mut self) {
        if self.close_queued || self.failed || !self.handshake_done() {
            return;
        }
        self.close_queued = true;
        self.release_held();
        let mut carry = std::mem::take(&mut self.carry);
        // An error here leaves the session failed; the caller is closing anyway.
        let _ = self.pump_checked(&mut carry, Want::CloseNotify);
        self.carry = carry;
    }

    /// Encrypts `plain` into `cipher` (from its start, growing it as needed); returns the
    /// ciphertext's length, or `None` when the handshake is not done yet. Handshake
    /// messages that must go first are queued in `pending`.
    pub(super) fn encrypt(
        &mut self,
        plain: &[u8],
        cipher: &mut Vec<u8>,
    ) -> Result<Option<usize>, TlsError> {
        if self.failed || self.close_queued {
            return Err(TlsError::Encrypt("connection is closing".into()));
        }
        // Held tickets go first: the caller sends `pending` ahead of this ciphertext.
        self.release_held();
        let mut carry = std::mem::take(&mut self.carry);
        let res = self.pump_checked(&mut carry, Want::Encrypt(plain, cipher));
        self.carry = carry;
        match res?.1 {
            Stop::Wrote(n) => Ok(Some(n)),
            Stop::NeedInput => Ok(None),
            Stop::Closed => Err(TlsError::Encrypt("connection closed".into())),
        }
    }

    /// Appends ciphertext to `pending` (after what is there).
    pub(super) fn push_pending(&mut self, cipher: &[u8]) {
        self.pending.extend_from_slice(cipher);
    }

    /// Moves the held records to the end of `pending`: they were encrypted after
    /// everything already there and before anything encrypted from now on, and the peer
    /// decrypts records in that order (each one's sequence number is in its nonce).
    fn release_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let held = std::mem::take(&mut self.held);
        if self.pending.is_empty() {
            self.pending = held;
        } else {
            self.pending.extend_from_slice(&held);
        }
    }

    fn fail_input(&mut self, len: usize) -> TlsError {
        self.failed = true;
        self.carry = Vec::new();
        TlsError::TooMuchInput(len)
    }

    /// `pump`, and on a protocol error: mark the session failed, drop its input and
    /// queue the alert `rustls` prepared, so the caller can send it before closing.
    fn pump_checked(&mut self, buf: &mut [u8], want: Want<'_>) -> Result<(usize, Stop), TlsError> {
        match self.pump(buf, want) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.failed = true;
                self.carry = Vec::new();
                self.queue_alert();
                Err(TlsError::Protocol(e))
            }
        }
    }

    /// After an error, moves the alert `rustls` queued (if any) into `pending`, behind
    /// the held records (encrypted before it: record sequence numbers keep the order).
    fn queue_alert(&mut self) {
        self.release_held();
        // An alert takes one encode and one transmit; a few more rounds are harmless.
        for _ in 0..4 {
            let UnbufferedStatus { state, .. } = self.conn.process_tls_records(&mut []);
            match state {
                Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                    if encode_into(&mut self.pending, |b| enc.encode(b)).is_err() {
                        return;
                    }
                }
                Ok(ConnectionState::TransmitTlsData(t)) => t.done(),
                _ => return,
            }
        }
    }

    /// Messages `rustls` makes now are held (see the module's doc): TLS 1.3, after the
    /// handshake. A TLS 1.2 server's last flight is made as its handshake ends, and the
    /// client needs it to finish: it is never held.
    fn holds_post_handshake(&self) -> bool {
        !self.conn.is_handshaking()
            && self.conn.protocol_version() == Some(ProtocolVersion::TLSv1_3)
    }

    /// Runs the state machine over `buf` (the incoming ciphertext: all of it is the
    /// stream's unconsumed input) until it needs more input or has done `want`; returns
    /// the bytes of `buf` consumed and why it stopped.
    fn pump(&mut self, buf: &mut [u8], mut want: Want<'_>) -> Result<(usize, Stop), rustls::Error> {
        let mut start = 0;
        let reading = matches!(want, Want::Read(_));
        loop {
            let UnbufferedStatus { discard, state } =
                self.conn.process_tls_records(&mut buf[start..]);
            let mut extra = 0;
            let mut encoded = None;
            let stop = match state? {
                ConnectionState::ReadTraffic(mut rt) => {
                    let Want::Read(plain) = &mut want else {
                        // Complete records are always consumed by the read path before
                        // anything else runs, so only new input brings application data.
                        return Err(rustls::Error::General(
                            "application data outside a read".into(),
                        ));
                    };
                    while let Some(rec) = rt.next_record() {
                        let rec = rec?;
                        extra += rec.discard;
                        plain.extend_from_slice(rec.payload);
                    }
                    None
                }
                ConnectionState::EncodeTlsData(mut enc) => {
                    encoded = Some(self.pending.len());
                    encode_into(&mut self.pending, |b| enc.encode(b))?;
                    None
                }
                // `pending` is the transmit queue: bytes in it go out before anything
                // queued later, so they count as transmitted in order.
                ConnectionState::TransmitTlsData(t) => {
                    t.done();
                    None
                }
                ConnectionState::BlockedHandshake => Some(Stop::NeedInput),
                ConnectionState::WriteTraffic(mut wt) => Some(match &mut want {
                    Want::Read(_) => Stop::NeedInput,
                    Want::Encrypt(plain, cipher) => {
                        Stop::Wrote(encrypt_into(cipher, |b| wt.encrypt(plain, b))?)
                    }
                    Want::CloseNotify => {
                        let at = self.pending.len();
                        let n =
                            encrypt_into_at(&mut self.pending, at, |b| wt.queue_close_notify(b))?;
                        self.pending.truncate(at + n);
                        Stop::Wrote(0)
                    }
                }),
                ConnectionState::PeerClosed => {
                    self.peer_closed = true;
                    None
                }
                ConnectionState::Closed => {
                    self.peer_closed = true;
                    Some(Stop::Closed)
                }
                // Early data is disabled (`max_early_data_size` 0), so `rustls` rejects it
                // before this; anything newer is refused too.
                _ => return Err(rustls::Error::General("unexpected TLS state".into())),
            };
            if let Some(at) = encoded.filter(|_| reading && self.holds_post_handshake()) {
                // Only a read holds: a write or close sends what it made right away.
                self.held.extend_from_slice(&self.pending[at..]);
                if at == 0 {
                    self.pending = Vec::new();
                } else {
                    self.pending.truncate(at);
                }
            }
            start += discard + extra;
            if let Some(stop) = stop {
                // After `close_notify` the rest of the input means nothing.
                let used = if self.peer_closed { buf.len() } else { start };
                return Ok((used, stop));
            }
        }
    }
}

/// Appends one encoded handshake record to `out`.
fn encode_into(
    out: &mut Vec<u8>,
    mut encode: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>,
) -> Result<(), rustls::Error> {
    let at = out.len();
    let need = match encode(&mut []) {
        Ok(_) | Err(EncodeError::AlreadyEncoded) => return Ok(()),
        Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
            required_size
        }
    };
    out.resize(at + need, 0);
    match encode(&mut out[at..]) {
        Ok(n) => {
            out.truncate(at + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(at);
            Err(rustls::Error::General(format!(
                "encoding a handshake record: {e}"
            )))
        }
    }
}

/// Encrypts into `out` from its start (growing it when too short); returns the length.
fn encrypt_into(
    out: &mut Vec<u8>,
    encrypt: impl FnMut(&mut [u8]) -> Result<usize, EncryptError>,
) -> Result<usize, rustls::Error> {
    encrypt_into_at(out, 0, encrypt)
}

/// Encrypts into `out[at..]` (growing `out` when too short); returns the length written
/// there. `out` keeps its (possibly larger) length: the caller truncates when it owns it.
fn encrypt_into_at(
    out: &mut Vec<u8>,
    at: usize,
    mut encrypt: impl FnMut(&mut [u8]) -> Result<usize, EncryptError>,
) -> Result<usize, rustls::Error> {
    for _ in 0..2 {
        if out.len() < at + CIPHER_SLACK {
            out.resize(at + CIPHER_SLACK, 0);
        }
        match encrypt(&mut out[at..]) {
            Ok(n) => return Ok(n),
            Err(EncryptError::InsufficientSize(InsufficientSizeError { required_size })) => {
                out.resize(at + required_size, 0);
            }
            Err(e) => return Err(rustls::Error::General(e.to_string())),
        }
    }
    Err(rustls::Error::General("ciphertext buffer too small".into()))
}

/// Size of the ciphertext buffer for up to `plain` bytes of plaintext.
pub(super) fn cipher_room(plain: usize) -> usize {
    plain + CIPHER_SLACK
}
