//! Unit tests of the outbound buffer: writev order, shared bodies, partial writes.

use super::*;

/// A writer that takes at most `cap` bytes per call and then blocks once.
struct Trickle {
    got: Vec<u8>,
    cap: usize,
    block_next: bool,
}

impl Sink for Trickle {}

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
    /// Takes up to `cap` bytes across the slices, as a socket's `writev` does.
    fn write_vectored(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.block_next {
            self.block_next = false;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.block_next = true;
        let mut n = 0;
        for s in iov {
            let take = s.len().min(self.cap - n);
            self.got.extend_from_slice(&s[..take]);
            n += take;
        }
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

/// A file of `len` bytes (`i % modulus`), already unlinked: its contents and its range.
fn file_of(name: &str, len: u32, modulus: u32) -> (Vec<u8>, FileRange) {
    let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let content: Vec<u8> = (0..len).map(|i| (i % modulus) as u8).collect();
    std::fs::write(&path, &content).unwrap();
    let file = Arc::new(File::open(&path).unwrap());
    let _ = std::fs::remove_file(&path);
    let whole = FileRange {
        file,
        offset: 0,
        len: content.len(),
    };
    (content, whole)
}

#[test]
fn keeps_order_across_memory_and_file_ranges() {
    let (content, whole) = file_of("outbuf", 20_000, 251);
    let mut o = OutBuf::default();
    o.extend(b"head");
    o.push_file(whole.slice(100, 9_000));
    o.extend(b",");
    o.push_file(whole.slice(15_000, 10_000)); // clamped to the 5,000 left
    o.push_file(whole.slice(0, 0)); // nothing
    o.extend(b"end");
    let mut want = b"head".to_vec();
    want.extend_from_slice(&content[100..9_100]);
    want.push(b',');
    want.extend_from_slice(&content[15_000..]);
    want.extend_from_slice(b"end");
    assert_eq!(o.len(), want.len());
    let mut w = Trickle {
        got: vec![],
        cap: 777,
        block_next: false,
    };
    while o.write_to(&mut w).unwrap() == Flush::Blocked {}
    assert!(w.got == want, "bytes differ");
    assert!(o.is_empty());
}

/// Random interleavings of copies, shared bodies (above and below their threshold),
/// file ranges and partial writes arrive byte for byte, and the queue ends empty.
#[test]
fn random_mixes_of_copies_shared_bodies_and_files_arrive_in_order() {
    let (content, whole) = file_of("outbuf-mix", 8_000, 241);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut rnd = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for round in 0..300 {
        let mut o = OutBuf::default();
        let mut want = Vec::new();
        let mut w = Trickle {
            got: vec![],
            cap: 1 + rnd(3_000),
            block_next: false,
        };
        for op in 0..rnd(400) {
            let len = rnd(900);
            let byte = (round * 7 + op) as u8;
            match rnd(5) {
                0 => {
                    let data = vec![byte; len];
                    o.extend(&data);
                    want.extend_from_slice(&data);
                }
                1 | 2 => {
                    let data = Bytes::from(vec![byte; len]);
                    o.push_shared(&data, PUSH_SHARE_MIN);
                    want.extend_from_slice(&data);
                }
                3 => {
                    // A body, sent whole or as its beta prefix.
                    let data = ArcBuf::copy_from_slice(&vec![byte.wrapping_add(1); len + 4]);
                    let n = len + rnd(5);
                    o.push_arc_prefix(&data, n, PUSH_SHARE_MIN);
                    want.extend_from_slice(&data[..n]);
                }
                _ => {
                    let r = whole.slice(rnd(content.len()), len);
                    want.extend_from_slice(&content[r.offset as usize..][..r.len]);
                    o.push_file(r);
                }
            }
            assert_eq!(o.len(), want.len() - w.got.len());
            if rnd(8) == 0 {
                let _ = o.write_to(&mut w).unwrap();
            }
        }
        while o.write_to(&mut w).unwrap() == Flush::Blocked {}
        assert!(w.got == want, "round {round}: bytes differ");
        assert!(o.is_empty());
        assert_eq!(o.covered, 0);
    }
}

#[test]
fn a_small_tail_grows_to_the_pooled_size_at_once_and_keeps_its_bytes() {
    let mut o = OutBuf::default();
    let first: Vec<u8> = (0..TAIL_SIZE).map(|i| i as u8).collect();
    o.extend(&first);
    assert!(o.tail.buf.capacity() < POOL_BUF_MAX);
    o.extend(b"more");
    assert!(
        o.tail.buf.capacity() >= POOL_BUF_MAX,
        "{}",
        o.tail.buf.capacity()
    );
    let mut w = Trickle {
        got: Vec::new(),
        cap: usize::MAX,
        block_next: false,
    };
    assert_eq!(o.write_to(&mut w).unwrap(), Flush::Done);
    let mut want = first;
    want.extend_from_slice(b"more");
    assert_eq!(w.got, want);
}

/// A connection whose last round needed a large buffer is given a large one from the pool,
/// not the small one another connection gave back since (which it would have to grow).
#[test]
fn a_connection_that_needed_a_large_buffer_takes_a_large_one_again() {
    let mut w = Trickle {
        got: Vec::new(),
        cap: usize::MAX,
        block_next: false,
    };
    let (mut big, mut small) = (OutBuf::default(), OutBuf::default());
    // A round of pushes: past a fresh buffer's size, the tail grows to the pooled size.
    big.extend(&[1; TAIL_SIZE]);
    big.extend(b"more");
    small.extend(b"answer");
    while big.write_to(&mut w).unwrap() == Flush::Blocked {}
    while small.write_to(&mut w).unwrap() == Flush::Blocked {}
    // The small buffer went back last; the big connection still gets the large one.
    big.extend(b"push");
    assert!(
        big.tail.buf.capacity() > 8 * TAIL_SIZE,
        "{}",
        big.tail.buf.capacity()
    );
    small.extend(b"answer");
    assert_eq!(small.tail.buf.capacity(), TAIL_SIZE);
    // A round that stayed small makes the next one small again.
    while big.write_to(&mut w).unwrap() == Flush::Blocked {}
    while small.write_to(&mut w).unwrap() == Flush::Blocked {}
    big.extend(b"push");
    assert_eq!(big.tail.buf.capacity(), TAIL_SIZE);
}
