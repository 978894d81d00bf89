//! Per-connection outbound byte queue: small writes are coalesced into one contiguous tail,
//! large shared payloads (a pre-encoded frame body fanned out to many subscribers: see
//! [`fanout_share_min`]) are queued by reference without copying (a message body's
//! [`ArcBuf`], or any [`Bytes`]), ranges
//! of an immutable file (the registry's precomputed bodies, [`FileRange`]) are queued by
//! reference and sent with `sendfile`, so the kernel takes their pages instead of copying
//! them; memory is flushed with one `writev` per readiness.
//!
//! It owns no socket: [`OutBuf::write_to`] takes any [`Sink`]. An empty `OutBuf` owns no
//! heap memory, so an idle connection costs nothing here.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::{Buf, Bytes};

use crate::arcbuf::ArcBuf;

/// Payloads at least this large are queued by reference instead of copied.
pub const SHARE_THRESHOLD: usize = 4096;

/// Pushed message bodies (the same bytes for every subscriber of a topic) at least this
/// large are queued by reference when the topic is big (see [`fanout_share_min`]).
pub const PUSH_SHARE_MIN: usize = 256;

/// A fan-out whose copies would add up to at least this many bytes shares the body instead
/// (about the size of a core's L2 cache).
pub const FANOUT_SHARE_BYTES: usize = 1 << 20;

/// The `min` for [`OutBuf::push_shared`] when one body goes to `subscribers` connections of
/// a worker. A copy into each connection's buffer is cheaper while all the copies stay in
/// cache (no reference count touched per connection, one contiguous buffer per write);
/// beyond that, copying writes (and the kernel then reads back) megabytes of cold memory per
/// publish, and the shared body wins (docs/PERFORMANCE.md, "Big fan-outs").
pub fn fanout_share_min(subscribers: usize, len: usize) -> usize {
    if subscribers.saturating_mul(len) >= FANOUT_SHARE_BYTES {
        PUSH_SHARE_MIN
    } else {
        SHARE_THRESHOLD
    }
}

/// Whether a body going to `subscribers` connections of a worker is queued by reference
/// there (what [`fanout_share_min`] decides for a body of `len` bytes).
pub fn fanout_shares_body(subscribers: usize, len: usize) -> bool {
    len >= fanout_share_min(subscribers, len)
}

/// Most slices handed to one `writev` call (a big fan-out queues two per message: the
/// copied head and the shared body).
const MAX_IOV: usize = 256;

/// Up to this many slices are gathered on the stack.
const SMALL_IOV: usize = 16;

/// Size of a fresh tail buffer.
const TAIL_SIZE: usize = 2048;

/// Most tail buffers a thread keeps for reuse of each size class (8.5 MiB per worker at
/// most, see below).
const POOL_MAX: usize = 256;

/// Largest tail buffer worth keeping: 32 KiB, a round of 32 pushes of a 512-character
/// message and more, so that a connection given a round of pushes takes a buffer that
/// already fits it, instead of growing a small one by doubling (a `realloc` copy at each
/// step) every round.
const POOL_BUF_MAX: usize = 16 * TAIL_SIZE;

thread_local! {
    /// Each worker thread's empty tail buffers: a connection takes one when it has bytes to
    /// send and gives it back once flushed, so an idle connection owns none and a busy one
    /// does not allocate per message. Two stacks: buffers of [`TAIL_SIZE`] (`[0]`) and
    /// larger ones (`[1]`), so that a connection that needs a large one (a subscriber given
    /// a round of pushes) is not handed the small one a publisher's answers just gave back,
    /// only to grow it by `realloc`.
    static POOL: std::cell::RefCell<[Vec<Vec<u8>>; 2]> =
        const { std::cell::RefCell::new([Vec::new(), Vec::new()]) };
}

/// An empty buffer from this thread's pool, of the large class first when `large` (or a
/// new, unallocated one).
fn pool_take(large: bool) -> Vec<u8> {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let [first, second] = &mut *p;
        let (a, b) = if large {
            (second, first)
        } else {
            (first, second)
        };
        a.pop().or_else(|| b.pop())
    })
    .unwrap_or_default()
}

/// Keeps `buf` for reuse when it is of a reasonable size.
fn pool_give(mut buf: Vec<u8>) {
    buf.clear();
    if buf.capacity() > POOL_BUF_MAX {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if let Some(p) = p.get_mut(usize::from(buf.capacity() > TAIL_SIZE)) {
            if p.len() < POOL_MAX {
                p.push(buf);
            }
        }
    });
}

/// A byte range of a file whose contents never change while it is referenced (the
/// registry's sealed memfd), queued without copying and sent with `sendfile`.
#[derive(Debug, Clone)]
pub struct FileRange {
    /// The file.
    pub file: Arc<File>,
    /// Offset of the first byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: usize,
}

impl FileRange {
    /// The sub-range `start..start + len` (relative to this range; clamped to it).
    pub fn slice(&self, start: usize, len: usize) -> FileRange {
        let start = start.min(self.len);
        FileRange {
            file: Arc::clone(&self.file),
            offset: self.offset + start as u64,
            len: len.min(self.len - start),
        }
    }

    /// Reads the range into memory (tests, and writers without `sendfile`).
    pub fn read(&self) -> io::Result<Vec<u8>> {
        let mut v = vec![0; self.len];
        self.file.read_exact_at(&mut v, self.offset)?;
        Ok(v)
    }
}

/// Where an [`OutBuf`] is flushed: a `Write`, plus the two calls a socket does better than
/// `write_vectored` (the defaults fall back to it, for tests and other writers).
pub trait Sink: Write {
    /// Writes `iov` like `write_vectored`; `more` says that more bytes (a file range) follow
    /// at once, so a socket may hold a short segment back for them (`MSG_MORE`).
    fn write_parts(&mut self, iov: &[IoSlice<'_>], more: bool) -> io::Result<usize> {
        let _ = more;
        self.write_vectored(iov)
    }

    /// Writes up to `len` bytes of `file` from `offset`; returns how many were taken.
    fn send_file(&mut self, file: &File, offset: u64, len: usize) -> io::Result<usize> {
        let mut buf = [0u8; 16 << 10];
        let n = len.min(buf.len());
        let got = file.read_at(&mut buf[..n], offset)?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.write(&buf[..got])
    }
}

impl Sink for Vec<u8> {}

impl Sink for mio::net::TcpStream {
    fn write_parts(&mut self, iov: &[IoSlice<'_>], more: bool) -> io::Result<usize> {
        if !more {
            return self.write_vectored(iov);
        }
        // SAFETY: an all-zero `msghdr` is valid (no name, no control data); `msg_iov`
        // points to `iov`, whose `IoSlice`s are ABI-compatible with `iovec` on Unix (as std
        // documents) and stay borrowed, with the buffers they point to, for the whole call;
        // the fd is owned by `self`.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = iov.len() as _;
            libc::sendmsg(self.as_raw_fd(), &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL)
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn send_file(&mut self, file: &File, offset: u64, len: usize) -> io::Result<usize> {
        let mut off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: both fds are owned by live objects borrowed for the call; `off` is a local
        // the kernel reads and updates; `sendfile` writes no user memory besides it.
        let n = unsafe { libc::sendfile(self.as_raw_fd(), file.as_raw_fd(), &mut off, len) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < len {
            // Stopped early (the socket is full): the kernel sent the last piece with
            // MSG_MORE, so it is held back waiting for more. Nothing more comes until the
            // socket is writable, which with TCP_NOTSENT_LOWAT needs that piece sent: push it
            // (setting TCP_NODELAY pushes pending frames).
            self.set_nodelay(true)?;
        }
        Ok(n)
    }
}

/// One queued piece.
#[derive(Debug)]
enum Chunk {
    /// Shared memory, queued by reference.
    Mem(Bytes),
    /// A shared body or compressed push, queued by reference.
    Arc(ArcBuf),
    /// A file range, sent with `sendfile`.
    File(FileRange),
    /// The next this many bytes of the copy buffer (`OutBuf::tail`).
    Tail(usize),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Mem(b) => b.len(),
            Chunk::Arc(b) => b.len(),
            Chunk::File(f) => f.len,
            Chunk::Tail(n) => *n,
        }
    }
}

/// Outcome of a flush attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Flush {
    /// Everything queued was written.
    Done,
    /// The socket would block with bytes still queued: wait for writable readiness.
    Blocked,
}

/// The copy buffer: `buf[head..]` are the copied bytes still to send. Sent bytes are dropped
/// by moving `head`, and once all are sent the buffer starts over from its beginning, so a
/// buffer keeps its whole capacity from round to round. (Not a `BytesMut`: it keeps the
/// offset of its sent bytes even when empty, so a pooled buffer's room would shrink round
/// after round until a round made it grow by `realloc`.)
///
/// It also remembers whether its bytes outgrew a fresh buffer (`large`, for the pool; kept
/// here, beside a 32-bit `head`, so that a connection's state keeps its size class).
#[derive(Debug, Default)]
struct Tail {
    buf: Vec<u8>,
    head: u32,
    /// This buffer held more than [`TAIL_SIZE`] bytes at once since it was taken.
    large: bool,
    /// The last buffer did: the next is taken from the large class first.
    want_large: bool,
}

impl Tail {
    /// Bytes still to send.
    fn len(&self) -> usize {
        self.buf.len() - self.head as usize
    }

    /// Bytes that fit without growing.
    fn room(&self) -> usize {
        self.buf.capacity() - self.buf.len()
    }

    /// The bytes still to send.
    fn bytes(&self) -> &[u8] {
        self.buf.get(self.head as usize..).unwrap_or_default()
    }

    /// `n` bytes (at most all of them) were sent.
    fn advance(&mut self, n: usize) {
        let head = self.head as usize + n;
        if head >= self.buf.len() {
            self.buf.clear();
            self.head = 0;
        } else if let Ok(h) = u32::try_from(head) {
            self.head = h;
        } else {
            // Past 4 GiB of sent bytes in one buffer (never with the outbound limits).
            self.buf.drain(..head);
            self.head = 0;
        }
    }

    /// Room for `n` more bytes: the unsent ones moved to the front first, if that makes it.
    fn reserve(&mut self, n: usize) {
        if self.room() < n && self.head > 0 {
            self.buf.drain(..self.head as usize);
            self.head = 0;
        }
        self.buf.reserve(n);
    }
}

/// A queue of bytes waiting for a socket.
///
/// Copied bytes all live in one buffer, `tail`. `chunks` lists the queued pieces in order,
/// and refers to copied bytes by length only (`Chunk::Tail`), so a shared payload between
/// two copies costs one queue entry, not a split of the buffer, and the buffer may grow
/// (move) freely. The `Tail` chunks cover the first `covered` bytes of `tail`; the copied
/// bytes after them come last, after every chunk, and need no entry: a connection that
/// only ever receives copies never allocates `chunks` at all.
#[derive(Debug, Default)]
pub struct OutBuf {
    /// Queued pieces, oldest first.
    chunks: VecDeque<Chunk>,
    /// The copied bytes: those of the `Tail` chunks, in order, then the last ones.
    tail: Tail,
    /// Bytes of `tail` that `Tail` chunks cover.
    covered: usize,
    /// Total queued bytes.
    len: usize,
}

impl OutBuf {
    /// Queued bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` to the end of the queue.
    pub fn extend(&mut self, data: &[u8]) {
        self.extend_parts(&[data]);
    }

    /// Copies `parts`, one after the other, to the end of the queue: one check of the room
    /// for all of them (a push is four: frame header, prefix, body, suffix).
    #[inline]
    pub fn extend_parts(&mut self, parts: &[&[u8]]) {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        if n == 0 {
            return;
        }
        self.room_for(n);
        for p in parts {
            self.tail.buf.extend_from_slice(p);
        }
        self.len += n;
        self.tail.large |= self.tail.len() > TAIL_SIZE;
    }

    /// Makes room in the tail for `n` more copied bytes.
    #[inline]
    fn room_for(&mut self, n: usize) {
        if self.tail.buf.capacity() == 0 {
            // A connection whose last tail grew is given room for as much at once (when
            // the pool has no large buffer left: a saturated worker has more busy
            // subscribers than the pool keeps buffers).
            let size = if self.tail.want_large {
                POOL_BUF_MAX
            } else {
                TAIL_SIZE
            };
            self.tail.buf = pool_take(self.tail.want_large);
            self.tail.reserve(n.max(size));
        } else if self.tail.room() < n {
            self.grow(n);
        }
    }

    /// Room for `n` more copied bytes. A tail smaller than [`POOL_BUF_MAX`] grows to it at
    /// once: a subscriber given a round of pushes (22 KiB for 32 of a 512-character
    /// message) grew its buffer by doubling from 2 KiB, copying at each step, in most
    /// rounds (the pool holds far fewer buffers than a saturated worker has busy
    /// connections); now it copies its first 2 KiB once. Past that size, by doubling.
    fn grow(&mut self, n: usize) {
        let len = self.tail.len();
        self.tail.reserve(n.max(POOL_BUF_MAX.saturating_sub(len)));
    }

    /// Gives the copied bytes not yet covered by a chunk their `Tail` chunk, so that a
    /// chunk can follow them.
    fn cover_tail(&mut self) {
        let open = self.tail.len() - self.covered;
        if open > 0 {
            self.covered += open;
            self.chunks.push_back(Chunk::Tail(open));
        }
    }

    /// Queues `data`, by reference when it is large, by copy otherwise.
    pub fn push(&mut self, data: Bytes) {
        self.push_ref(&data);
    }

    /// Queues `data` like [`OutBuf::push`], cloning the handle only when it is shared.
    pub fn push_ref(&mut self, data: &Bytes) {
        self.push_shared(data, SHARE_THRESHOLD);
    }

    /// Queues `data` by reference when it holds at least `min` bytes, by copy otherwise.
    /// A payload fanned out to many connections is worth sharing from a few hundred bytes
    /// on: the kernel then copies it from one cache-hot place instead of from each
    /// connection's own copy.
    pub fn push_shared(&mut self, data: &Bytes, min: usize) {
        if data.len() < min {
            self.extend(data);
            return;
        }
        self.cover_tail();
        self.len += data.len();
        self.chunks.push_back(Chunk::Mem(data.clone()));
    }

    /// [`OutBuf::push_shared`] of `data[..len]`, for an [`ArcBuf`].
    pub fn push_arc_prefix(&mut self, data: &ArcBuf, len: usize, min: usize) {
        let len = len.min(data.len());
        if len < min {
            self.extend(data.get(..len).unwrap_or(&[]));
            return;
        }
        self.cover_tail();
        self.len += len;
        self.chunks.push_back(Chunk::Arc(data.prefix(len)));
    }

    /// [`OutBuf::push_arc_prefix`] of `data[..len]` between copied bytes: `before` (a push's
    /// frame header and prefix) and `after` (its suffix). When the body is copied, all of it
    /// is one copy with one check of the room.
    pub fn push_arc_between(
        &mut self,
        before: [&[u8]; 2],
        data: &ArcBuf,
        len: usize,
        min: usize,
        after: &[u8],
    ) {
        let len = len.min(data.len());
        match data.get(..len) {
            Some(body) if len < min => self.extend_parts(&[before[0], before[1], body, after]),
            _ => {
                self.extend_parts(&before);
                self.push_arc_prefix(data, len, min);
                self.extend(after);
            }
        }
    }

    /// Queues a file range by reference; it is sent with [`Sink::send_file`].
    pub fn push_file(&mut self, range: FileRange) {
        if range.len == 0 {
            return;
        }
        self.cover_tail();
        self.len += range.len;
        self.chunks.push_back(Chunk::File(range));
    }

    /// Writes as much as the writer takes. Returns `Done` when the queue is empty afterwards,
    /// `Blocked` on `WouldBlock`; other errors are returned as they are. Memory goes out
    /// with one `writev` per call up to the next file range, which goes out with `sendfile`.
    pub fn write_to<W: Sink>(&mut self, w: &mut W) -> io::Result<Flush> {
        while self.len > 0 {
            let res = if let Some(Chunk::File(f)) = self.chunks.front() {
                w.send_file(&f.file, f.offset, f.len)
            } else if self.chunks.len() < SMALL_IOV {
                // The common case (a few messages) on the stack; the array is initialised
                // whole, so it is kept small.
                let mut iov = [IoSlice::new(&[]); SMALL_IOV];
                let (k, file_next) = self.gather(&mut iov);
                w.write_parts(&iov[..k], file_next)
            } else {
                let mut iov = vec![IoSlice::new(&[]); (self.chunks.len() + 1).min(MAX_IOV)];
                let (k, file_next) = self.gather(&mut iov);
                w.write_parts(&iov[..k], file_next)
            };
            let n = {
                match res {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flush::Blocked),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            self.consume(n);
        }
        self.release();
        Ok(Flush::Done)
    }

    /// Fills `iov` with the memory chunks at the front, up to the first file range or as
    /// many as fit, and then the last copied bytes if everything before them fit; returns
    /// how many slices it filled and whether a file range stopped it.
    fn gather<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> (usize, bool) {
        let mut k = 0;
        let mut at = 0;
        for c in self.chunks.iter().take(iov.len()) {
            iov[k] = match c {
                Chunk::Mem(b) => IoSlice::new(b),
                Chunk::Arc(b) => IoSlice::new(b),
                Chunk::Tail(n) => {
                    at += n;
                    IoSlice::new(self.tail.bytes().get(at - n..at).unwrap_or_default())
                }
                Chunk::File(_) => return (k, true),
            };
            k += 1;
        }
        if k == self.chunks.len() && k < iov.len() && self.tail.len() > self.covered {
            iov[k] = IoSlice::new(self.tail.bytes().get(self.covered..).unwrap_or_default());
            k += 1;
        }
        (k, false)
    }

    fn consume(&mut self, mut n: usize) {
        self.len -= n;
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                // The last copied bytes.
                self.tail.advance(n);
                return;
            };
            let take = n.min(front.len());
            match front {
                Chunk::Mem(b) => b.advance(take),
                Chunk::Arc(b) => b.advance(take),
                Chunk::File(f) => {
                    f.offset += take as u64;
                    f.len -= take;
                }
                Chunk::Tail(t) => {
                    self.tail.advance(take);
                    self.covered -= take;
                    *t -= take;
                }
            }
            if front.len() == 0 {
                self.chunks.pop_front();
            }
            n -= take;
        }
    }

    /// Gives back the memory of an empty queue so that an idle connection holds none (the
    /// next burst allocates again; with a thread-caching allocator that is cheap, and it
    /// keeps an idle subscribed connection near 1 KiB instead of 3).
    fn release(&mut self) {
        if self.len == 0 {
            if self.tail.buf.capacity() > 0 {
                pool_give(std::mem::take(&mut self.tail.buf));
                self.tail.head = 0;
                self.tail.want_large = std::mem::take(&mut self.tail.large);
            }
            self.covered = 0;
            if self.chunks.capacity() > 0 {
                self.chunks = VecDeque::new();
            }
        }
    }

    /// Drops everything queued and frees its memory.
    pub fn clear(&mut self) {
        *self = OutBuf::default();
    }
}

#[cfg(test)]
mod tests;
