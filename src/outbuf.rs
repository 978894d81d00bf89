//! Per-connection outbound byte queue: small writes are coalesced into one contiguous tail,
//! large shared payloads (a pre-encoded frame body fanned out to many subscribers, a
//! precomputed registry body) are queued as reference-counted [`Bytes`] without copying, and
//! everything is flushed with one `writev` per readiness.
//!
//! It owns no socket: [`OutBuf::write_to`] takes any `Write`. An empty `OutBuf` owns no heap
//! memory, so an idle connection costs nothing here.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

use bytes::{Buf, Bytes, BytesMut};

/// Payloads at least this large are queued by reference instead of copied.
pub const SHARE_THRESHOLD: usize = 4096;

/// Most slices handed to one `writev` call.
const MAX_IOV: usize = 64;

/// Size of a fresh tail buffer.
const TAIL_SIZE: usize = 2048;

/// Most tail buffers a thread keeps for reuse (about 1 MiB per worker at most).
const POOL_MAX: usize = 256;

/// Largest tail buffer worth keeping.
const POOL_BUF_MAX: usize = 4 * TAIL_SIZE;

thread_local! {
    /// Each worker thread's empty tail buffers: a connection takes one when it has bytes to
    /// send and gives it back once flushed, so an idle connection owns none and a busy one
    /// does not allocate per message.
    static POOL: std::cell::RefCell<Vec<BytesMut>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty buffer from this thread's pool (or a new, unallocated one).
fn pool_take() -> BytesMut {
    POOL.with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

/// Keeps `buf` for reuse when it is the sole owner of a reasonably sized allocation.
fn pool_give(mut buf: BytesMut) {
    buf.clear();
    // Moves the (empty) view back to the start of its allocation when nothing else shares
    // it; otherwise it would allocate, and the buffer is simply dropped.
    if !buf.try_reclaim(TAIL_SIZE) || buf.capacity() > POOL_BUF_MAX {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < POOL_MAX {
            p.push(buf);
        }
    });
}

/// Outcome of a flush attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Flush {
    /// Everything queued was written.
    Done,
    /// The socket would block with bytes still queued: wait for writable readiness.
    Blocked,
}

/// A queue of bytes waiting for a socket.
#[derive(Debug, Default)]
pub struct OutBuf {
    /// Chunks that are complete, oldest first (shared payloads, or sealed copies of `tail`).
    chunks: VecDeque<Bytes>,
    /// Bytes copied in since the last shared chunk; sealed into `chunks` when a shared chunk
    /// is pushed behind it.
    tail: BytesMut,
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
        if data.is_empty() {
            return;
        }
        if self.tail.capacity() == 0 {
            self.tail = pool_take();
            self.tail.reserve(data.len().max(TAIL_SIZE));
        }
        self.tail.extend_from_slice(data);
        self.len += data.len();
    }

    /// Queues `data`, by reference when it is large, by copy otherwise.
    pub fn push(&mut self, data: Bytes) {
        self.push_ref(&data);
    }

    /// Queues `data` like [`OutBuf::push`], cloning the handle only when it is shared.
    pub fn push_ref(&mut self, data: &Bytes) {
        if data.len() < SHARE_THRESHOLD {
            self.extend(data);
            return;
        }
        self.seal_tail();
        self.len += data.len();
        self.chunks.push_back(data.clone());
    }

    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            let t = self.tail.split().freeze();
            self.chunks.push_back(t);
        }
    }

    /// Writes as much as the writer takes. Returns `Done` when the queue is empty afterwards,
    /// `Blocked` on `WouldBlock`; other errors are returned as they are.
    pub fn write_to<W: Write>(&mut self, w: &mut W) -> io::Result<Flush> {
        while self.len > 0 {
            let n = {
                let mut iov: [IoSlice<'_>; MAX_IOV] = [IoSlice::new(&[]); MAX_IOV];
                let mut k = 0;
                for c in self.chunks.iter().take(MAX_IOV - 1) {
                    iov[k] = IoSlice::new(c);
                    k += 1;
                }
                // The tail follows every chunk: it may only join when all chunks did.
                if k == self.chunks.len() && k < MAX_IOV && !self.tail.is_empty() {
                    iov[k] = IoSlice::new(&self.tail);
                    k += 1;
                }
                match w.write_vectored(&iov[..k]) {
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

    fn consume(&mut self, mut n: usize) {
        self.len -= n;
        while n > 0 {
            if let Some(front) = self.chunks.front_mut() {
                if n >= front.len() {
                    n -= front.len();
                    self.chunks.pop_front();
                } else {
                    front.advance(n);
                    n = 0;
                }
            } else {
                self.tail.advance(n);
                n = 0;
            }
        }
    }

    /// Gives back the memory of an empty queue so that an idle connection holds none (the
    /// next burst allocates again; with a thread-caching allocator that is cheap, and it
    /// keeps an idle subscribed connection near 1 KiB instead of 3).
    fn release(&mut self) {
        if self.len == 0 {
            pool_give(std::mem::take(&mut self.tail));
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
mod tests {
    use super::*;

    /// A writer that takes at most `cap` bytes per call and then blocks once.
    struct Trickle {
        got: Vec<u8>,
        cap: usize,
        block_next: bool,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.block_next {
                self.block_next = false;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.block_next = true;
            let n = buf.len().min(self.cap);
            self.got.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn keeps_order_with_more_chunks_than_one_writev_takes() {
        let mut o = OutBuf::default();
        let mut want = Vec::new();
        for i in 0..200u32 {
            let head = format!("h{i};");
            o.extend(head.as_bytes());
            want.extend_from_slice(head.as_bytes());
            let big = Bytes::from(vec![(i % 251) as u8; SHARE_THRESHOLD]);
            want.extend_from_slice(&big);
            o.push(big);
        }
        o.extend(b"end");
        want.extend_from_slice(b"end");
        let mut got = Vec::new();
        assert_eq!(o.write_to(&mut got).unwrap(), Flush::Done);
        assert_eq!(got.len(), want.len());
        assert!(got == want, "bytes reordered");
    }

    #[test]
    fn keeps_order_across_copied_and_shared_chunks() {
        let mut o = OutBuf::default();
        let big = Bytes::from(vec![b'x'; SHARE_THRESHOLD + 10]);
        o.extend(b"head1");
        o.push(big.clone());
        o.extend(b"head2");
        o.push(Bytes::from_static(b"small"));
        let total = 5 + big.len() + 5 + 5;
        assert_eq!(o.len(), total);
        let mut w = Trickle {
            got: vec![],
            cap: 7,
            block_next: false,
        };
        loop {
            match o.write_to(&mut w).unwrap() {
                Flush::Done => break,
                Flush::Blocked => continue,
            }
        }
        let mut want = b"head1".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"head2small");
        assert_eq!(w.got, want);
        assert!(o.is_empty());
    }
}
