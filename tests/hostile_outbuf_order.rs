//! A reader that falls behind while large shared payloads keep arriving (a slow subscriber,
//! or a replay of many large cached messages on subscribe) must still get its bytes in the
//! order they were queued: the outbound queue may then hold more chunks than one `writev`
//! takes.

mod common;

use std::io::{self, IoSlice, Write};

use bytes::Bytes;
use walletrelay::outbuf::{Flush, OutBuf, Sink, SHARE_THRESHOLD};

/// A socket that takes whatever `writev` offers, up to `cap` bytes per call.
struct Sock {
    got: Vec<u8>,
    cap: usize,
}

impl Sink for Sock {}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(self.cap - n);
            self.got.extend_from_slice(&b[..take]);
            n += take;
            if n == self.cap {
                break;
            }
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Queues `frames` pushes shaped like `Conn::push_message` (copied head, shared body,
/// copied suffix) and returns the queue and the bytes it must produce.
fn queued(frames: usize) -> (OutBuf, Vec<u8>) {
    let mut o = OutBuf::default();
    let mut want = Vec::new();
    for i in 0..frames {
        let head = format!("<head {i}>");
        let body = Bytes::from(vec![b'a' + (i % 26) as u8; SHARE_THRESHOLD + i]);
        o.extend(head.as_bytes());
        o.push(body.clone());
        o.extend(b"}}");
        want.extend_from_slice(head.as_bytes());
        want.extend_from_slice(&body);
        want.extend_from_slice(b"}}");
    }
    assert_eq!(o.len(), want.len());
    (o, want)
}

fn drain(o: &mut OutBuf, cap: usize) -> Vec<u8> {
    let mut s = Sock {
        got: Vec::new(),
        cap,
    };
    for _ in 0..1_000_000 {
        match o.write_to(&mut s) {
            Ok(Flush::Done) => return s.got,
            Ok(Flush::Blocked) => {}
            Err(e) => panic!("write_to: {e}"),
        }
    }
    panic!("write_to never finished");
}

#[test]
fn many_shared_chunks_keep_their_order_in_one_writev() {
    for frames in [1, 31, 32, 33, 64, 200] {
        let (mut o, want) = queued(frames);
        let got = drain(&mut o, usize::MAX);
        assert_eq!(got.len(), want.len(), "{frames} frames: length");
        assert!(got == want, "{frames} frames: bytes out of order");
        assert!(o.is_empty());
    }
}

#[test]
fn many_shared_chunks_keep_their_order_in_partial_writes() {
    for cap in [1000, 65536, 300_000] {
        let (mut o, want) = queued(150);
        let got = drain(&mut o, cap);
        assert!(got == want, "cap {cap}: bytes out of order");
    }
}

/// End to end: a subscriber joining a topic with 40 large cached messages gets them replayed
/// in one delivery round (80 queued chunks, more than one `writev` takes), intact and in order.
#[test]
fn replay_of_many_large_cached_messages_arrives_intact() {
    let s = common::Server::start(&["--threads", "1"]);
    let tp = common::topic();
    let mut publ = s.ws();
    let sent: Vec<String> = (0..40)
        .map(|i| format!("{i:04}{}", "m".repeat(SHARE_THRESHOLD + 100)))
        .collect();
    for m in &sent {
        publ.publish(&tp, m);
    }
    let mut sub = s.ws();
    let id = sub.subscribe(&tp);
    for (i, m) in sent.iter().enumerate() {
        let (got_id, got_topic, got) = sub.next_push();
        assert_eq!((&got_id, &got_topic), (&id, &tp), "push {i}");
        assert!(
            got == *m,
            "push {i}: wrong message (starts {:?})",
            &got[..8.min(got.len())]
        );
    }
}
