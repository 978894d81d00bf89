//! [`ArcBuf`]: immutable bytes shared by reference count, the count and the bytes in one
//! allocation, written in place once ([`Writer`]).
//!
//! A leaf. It exists for the relay's message bodies (`message::Body`), which every publish
//! makes once and the cache, the pushes and the log share. A `bytes::Bytes` made from a
//! `Vec` keeps its count in a header of its own, allocated apart: at saturation that header
//! is cold by the time the cache evicts the body, and dropping it is a wait of its own, its
//! allocation a second one per body. Here the count sits in
//! the allocation's first line, which the eviction asks for ahead anyway.
//!
//! At the edges where another type is wanted: a v1 frame taken from the cache leaves as a
//! `Bytes` by [`ArcBuf::to_bytes`] (wrapped, not copied); a body read back from Redis or
//! from disk is copied in once.

use std::mem::MaybeUninit;
use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;

/// Immutable shared bytes: `buf[start..end]`. Cloning counts a reference; a slice of it
/// shares the same allocation.
#[derive(Clone)]
pub struct ArcBuf {
    buf: Arc<[u8]>,
    start: u32,
    end: u32,
}

impl ArcBuf {
    /// A copy of `b` (at most `u32::MAX` bytes are kept; no caller comes near: frames and
    /// bodies are bounded far below).
    pub fn copy_from_slice(b: &[u8]) -> ArcBuf {
        let b = b.get(..u32::MAX as usize).unwrap_or(b);
        ArcBuf {
            buf: Arc::from(b),
            start: 0,
            end: b.len() as u32,
        }
    }

    /// The first `len` bytes (all of them when `len` is past the end).
    pub fn prefix(&self, len: usize) -> ArcBuf {
        let mut s = self.clone();
        s.end = self.start + (len.min(self.len()) as u32);
        s
    }

    /// Drops the first `n` bytes (all of them when `n` is past the end).
    pub fn advance(&mut self, n: usize) {
        self.start += n.min(self.len()) as u32;
    }

    /// Whether `other` is these very bytes (the same allocation, the same range).
    pub fn same(&self, other: &ArcBuf) -> bool {
        Arc::ptr_eq(&self.buf, &other.buf) && self.start == other.start && self.end == other.end
    }

    /// These bytes as a `Bytes`, sharing this allocation.
    pub fn to_bytes(&self) -> Bytes {
        Bytes::from_owner(self.clone())
    }

    /// Bytes of the allocation these bytes are part of.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// The whole allocation, to be written again by [`ArcBuf::build`], when this handle is
    /// its only reference (no other `ArcBuf`, no slice of it): `None` otherwise, and then
    /// this handle is dropped as usual.
    pub fn into_spare(self) -> Option<Arc<[MaybeUninit<u8>]>> {
        let mut buf = self.buf;
        // Unique: no other `Arc` and no `Weak` (none is ever made) shares the bytes.
        Arc::get_mut(&mut buf)?;
        let raw = Arc::into_raw(buf) as *const [MaybeUninit<u8>];
        // SAFETY: `raw` comes from `Arc::<[u8]>::into_raw` and is given back to
        // `Arc::from_raw` once, as `[MaybeUninit<u8>]` of the same length (the cast keeps the
        // slice's length). `MaybeUninit<u8>` has the size, alignment and ABI of `u8`, so the
        // two slices, and the `Arc` allocations that hold them, have the same layout: this
        // is the inverse of `Arc::<[MaybeUninit<u8>]>::assume_init`, which `build` uses and
        // which the standard library implements by the same cast. Every `u8` is a valid
        // `MaybeUninit<u8>`. The handle was the only one (checked above), so nothing can
        // read these bytes while the next `build` overwrites them.
        Some(unsafe { Arc::from_raw(raw) })
    }

    /// `f` writes into a fresh allocation of `capacity` bytes (or `ready`'s, when it has that
    /// many: see `message`'s next body buffer); `None` when `f` wrote more than that. Bytes
    /// of the allocation past what `f` wrote are zeroed and not part of the result.
    pub fn build(
        ready: Option<Arc<[MaybeUninit<u8>]>>,
        capacity: usize,
        f: impl FnOnce(&mut Writer<'_>),
    ) -> Option<ArcBuf> {
        let capacity = capacity.min(u32::MAX as usize);
        let mut buf = ready
            .filter(|b| b.len() == capacity)
            .unwrap_or_else(|| Arc::new_uninit_slice(capacity));
        let len = {
            // A fresh allocation, or one that `ready` held alone: unique.
            let slot = Arc::get_mut(&mut buf)?;
            let mut w = Writer {
                slot,
                len: 0,
                overflow: false,
            };
            f(&mut w);
            if w.overflow {
                return None;
            }
            let len = w.len;
            for b in w.slot.get_mut(len..).unwrap_or_default() {
                b.write(0);
            }
            len
        };
        // SAFETY: every byte of `buf` is initialised: `Writer` writes its bytes in order from
        // the start, so bytes `..len` were written (`len` is how far it got, and writes past
        // the end are refused, not made), and the loop above wrote each byte from `len` on.
        // `MaybeUninit<u8>` and `u8` have the same layout, so the slice is a valid `[u8]`.
        let buf = unsafe { buf.assume_init() };
        Some(ArcBuf {
            buf,
            start: 0,
            end: len as u32,
        })
    }
}

impl Deref for ArcBuf {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        self.buf
            .get(self.start as usize..self.end as usize)
            .unwrap_or_default()
    }
}

impl AsRef<[u8]> for ArcBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for ArcBuf {
    /// A copy of `v` (its count needs a place before the bytes).
    fn from(v: Vec<u8>) -> ArcBuf {
        ArcBuf::copy_from_slice(&v)
    }
}

impl PartialEq for ArcBuf {
    fn eq(&self, other: &ArcBuf) -> bool {
        **self == **other
    }
}

impl Eq for ArcBuf {}

impl std::fmt::Debug for ArcBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&Bytes::copy_from_slice(self), f)
    }
}

/// Writes an [`ArcBuf`] in place, in order, up to its capacity ([`ArcBuf::build`]).
pub struct Writer<'a> {
    slot: &'a mut [MaybeUninit<u8>],
    len: usize,
    overflow: bool,
}

impl Writer<'_> {
    /// Appends `b`; past the capacity, appends nothing more (the build fails).
    #[inline]
    pub fn extend(&mut self, b: &[u8]) {
        match self.slot.get_mut(self.len..self.len + b.len()) {
            Some(dst) if !self.overflow => {
                dst.write_copy_of_slice(b);
                self.len += b.len();
            }
            _ => self.overflow = true,
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_what_was_written_and_refuses_more_than_fits() {
        let b = ArcBuf::build(None, 8, |w| {
            w.extend(b"abc");
            w.extend(b"de");
        })
        .unwrap();
        assert_eq!(&b[..], b"abcde");
        assert!(ArcBuf::build(None, 4, |w| w.extend(b"abcde")).is_none());
        // A refused write ends the build: nothing after it is kept either.
        assert!(ArcBuf::build(None, 4, |w| {
            w.extend(b"abcde");
            w.extend(b"a");
        })
        .is_none());
        let ready: Arc<[MaybeUninit<u8>]> = Arc::new_uninit_slice(3);
        assert_eq!(
            &ArcBuf::build(Some(ready), 3, |w| w.extend(b"xyz")).unwrap()[..],
            b"xyz"
        );
    }

    #[test]
    fn only_a_sole_handle_gives_its_allocation_back_for_the_next_build() {
        let a = ArcBuf::copy_from_slice(b"hello world");
        let b = a.clone();
        assert!(a.into_spare().is_none(), "shared with b");
        let spare = b.into_spare().expect("the last handle");
        assert_eq!(spare.len(), 11);
        let c = ArcBuf::build(Some(spare), 11, |w| w.extend(b"bye")).unwrap();
        assert_eq!(&c[..], b"bye");
        assert!(c.prefix(1).into_spare().is_none(), "c still holds it");
    }

    #[test]
    fn slices_share_and_compare_by_content() {
        let a = ArcBuf::copy_from_slice(b"hello world");
        let p = a.prefix(5);
        assert_eq!(&p[..], b"hello");
        let mut w = a.clone();
        w.advance(6);
        assert_eq!(&w[..], b"world");
        assert_eq!(&a.prefix(100)[..], b"hello world");
        assert!(a.prefix(100).same(&a));
        assert!(!p.same(&a));
        assert_eq!(p, ArcBuf::copy_from_slice(b"hello"));
        let mut q = p.clone();
        q.advance(10);
        assert!(q.is_empty());
        assert_eq!(&a.to_bytes()[..], b"hello world");
        assert_eq!(ArcBuf::from(b"xy".to_vec()), ArcBuf::copy_from_slice(b"xy"));
    }
}
