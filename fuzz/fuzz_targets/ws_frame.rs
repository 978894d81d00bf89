//! The real WebSocket message decoder, `ws::Decoder`, over an arbitrary client byte stream
//! with a small message limit, driven as a connection drives it: decode from the front of
//! the pending bytes until `Ok(None)`, stop at a close or an error.
//!
//! Checks, besides "no panic": messages stay within the limit and text messages are UTF-8
//! (by `std`, independently of the decoder's `simdutf8`); pings carry at most 125 bytes;
//! close codes are ones that may be echoed; errors carry a close code of 1002, 1007 or 1009
//! and leave the decoder idle; the bytes left pending never reach the worker's read-buffer
//! cap (`max_message + 14`, which `worker::fail_oversize` assumes unreachable); feeding the
//! stream in chunks (as reads deliver it) gives exactly the events of feeding it whole; and
//! unmasking in two pieces with a phase offset equals XOR with the key.
//!
//! Input layout: byte 0 chooses the chunk sizes (and, its top bit, whether permessage-deflate
//! was negotiated: RSV1 then marks compressed messages), the rest is the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walletrelay::ws::{self, Decoder, Event};

/// Message limit for the run (small, so that limits are hit often).
const MAX: usize = 4096;

/// An event with its payload copied out, to compare runs.
#[derive(Debug, PartialEq, Eq)]
enum Ev {
    Message(bool, Vec<u8>),
    Compressed(bool, Vec<u8>),
    Fragment,
    Ping(Vec<u8>),
    Pong,
    Close(u16),
    Fail(u16),
}

/// One connection's decoder and what it produced.
struct Conn {
    dec: Decoder,
    closed: bool,
    events: Vec<Ev>,
}

impl Conn {
    /// `deflate`: permessage-deflate negotiated (RSV1 marks compressed messages).
    fn new(deflate: bool) -> Conn {
        let mut dec = Decoder::new(MAX);
        dec.set_deflate(deflate);
        Conn {
            dec,
            closed: false,
            events: Vec::new(),
        }
    }

    /// Decodes complete frames at the front of `input`; returns bytes consumed.
    fn step(&mut self, input: &mut [u8]) -> usize {
        let mut pos = 0;
        while !self.closed {
            let left = input.len() - pos;
            match self.dec.decode(&mut input[pos..]) {
                Ok(None) => break,
                Ok(Some((n, ev))) => {
                    assert!(n >= 6 && n <= left, "consumed {n} of {left}");
                    pos += n;
                    let ev = check(ev);
                    self.closed = matches!(ev, Ev::Close(_));
                    self.events.push(ev);
                }
                Err(e) => {
                    let code = e.close_code();
                    assert!(matches!(code, 1002 | 1007 | 1009), "close code {code}");
                    assert!(ws::close_frame(code, &e.to_string()).len() <= 127);
                    assert!(self.dec.is_idle(), "an error resets the decoder");
                    self.events.push(Ev::Fail(code));
                    self.closed = true;
                    return input.len();
                }
            }
        }
        pos
    }
}

/// Checks an event against the rules and copies it out.
fn check(ev: Event<'_>) -> Ev {
    match ev {
        Event::Message { binary, payload } => {
            assert!(payload.len() <= MAX);
            assert!(
                binary || std::str::from_utf8(payload).is_ok(),
                "text not UTF-8"
            );
            Ev::Message(binary, payload.to_vec())
        }
        Event::Compressed { binary, payload } => {
            assert!(payload.len() <= MAX);
            Ev::Compressed(binary, payload.to_vec())
        }
        Event::Fragment => Ev::Fragment,
        Event::Ping(p) => {
            assert!(p.len() <= 125);
            Ev::Ping(p.to_vec())
        }
        Event::Pong => Ev::Pong,
        Event::Close { code } => {
            assert!(matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999));
            assert_eq!(ws::close_frame(code, "").len(), 4);
            Ev::Close(code)
        }
    }
}

/// `ws::unmask` in two pieces, the second with a phase offset, equals XOR with the key.
fn check_unmask(seed: u8, data: &[u8]) {
    let mask = [seed, seed ^ 0x5a, seed.wrapping_add(7), !seed];
    let expect: Vec<u8> = data
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ mask[i % 4])
        .collect();
    let mut got = data.to_vec();
    let split = usize::from(seed) % (got.len() + 1);
    let (a, b) = got.split_at_mut(split);
    ws::unmask(a, mask, 0);
    ws::unmask(b, mask, split);
    assert_eq!(got, expect, "unmask");
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    check_unmask(seed, stream);

    // The seed's top bit: permessage-deflate negotiated.
    let deflate = seed & 0x80 != 0;
    // Whole stream at once.
    let mut whole = Conn::new(deflate);
    let mut buf = stream.to_vec();
    let used = whole.step(&mut buf);
    assert!(used <= stream.len());

    // The same stream in chunks, with a pending buffer as `worker` keeps one.
    let mut chunked = Conn::new(deflate);
    let mut rbuf: Vec<u8> = Vec::new();
    let mut rest = stream;
    let mut i = 0usize;
    while !rest.is_empty() && !chunked.closed {
        i += 1;
        let size = 1 + (usize::from(seed).wrapping_mul(i * 7 + 3) % 97);
        let (chunk, r) = rest.split_at(size.min(rest.len()));
        rest = r;
        rbuf.extend_from_slice(chunk);
        let used = chunked.step(&mut rbuf);
        if chunked.closed {
            break;
        }
        rbuf.drain(..used);
        assert!(
            rbuf.len() < MAX + 14,
            "pending bytes reached the read-buffer cap"
        );
    }
    assert_eq!(whole.events, chunked.events, "chunking changed the outcome");
});
