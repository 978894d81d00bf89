//! The WebSocket codec driven the way `conn::ws_step`/`on_frame` drive it: `parse_head`,
//! `unmask`, `Reassembly` and `check_close_payload` over an arbitrary client byte stream,
//! with a small message limit.
//!
//! Checks, besides "no panic": header fields are within the rules (control frames final
//! and short, payload within the limit); unmasking in two pieces with a phase offset equals
//! XOR with the key; reassembled messages stay within the limit; errors carry a close code
//! of 1002, 1007 or 1009; the bytes left pending never reach the worker's read-buffer cap
//! (`max_message + 14`, which `worker::fail_oversize` assumes unreachable); and feeding the
//! stream in chunks (as reads deliver it) gives exactly the events of feeding it whole.
//!
//! Input layout: byte 0 chooses the chunk sizes, the rest is the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walletrelay::ws::{self, Opcode, Reassembly, WsError};

/// Message limit for the run (small, so that limits are hit often).
const MAX: usize = 4096;

#[derive(Debug, PartialEq, Eq)]
enum Event {
    Message(Opcode, Vec<u8>),
    Pong(Vec<u8>),
    Close(u16),
    Fail(u16),
}

#[derive(Default)]
struct Conn {
    frag: Reassembly,
    closed: bool,
    events: Vec<Event>,
}

impl Conn {
    /// `conn::ws_step`: complete frames at the front of `input`; returns bytes consumed.
    fn step(&mut self, input: &mut [u8]) -> usize {
        let mut pos = 0;
        while !self.closed {
            let head = match ws::parse_head(&input[pos..], MAX) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    self.fail(&e);
                    return input.len();
                }
            };
            assert!(matches!(head.header_len, 6 | 8 | 14));
            assert!(head.payload_len <= MAX);
            if head.opcode.is_control() {
                assert!(head.fin && head.payload_len <= 125);
            }
            if input.len() - pos < head.frame_len() {
                break;
            }
            let start = pos + head.header_len;
            let end = pos + head.frame_len();
            pos = end;
            let payload = &mut input[start..end];
            let expect: Vec<u8> = payload
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ head.mask[i % 4])
                .collect();
            let split = payload
                .first()
                .map_or(0, |&b| usize::from(b) % (payload.len() + 1));
            let (a, b) = payload.split_at_mut(split);
            ws::unmask(a, head.mask, 0);
            ws::unmask(b, head.mask, split);
            assert_eq!(&payload[..], &expect[..], "unmask");
            if let Err(e) = self.on_frame(head.fin, head.opcode, payload) {
                self.fail(&e);
                return input.len();
            }
        }
        pos
    }

    fn fail(&mut self, e: &WsError) {
        let code = e.close_code();
        assert!(matches!(code, 1002 | 1007 | 1009), "close code {code}");
        let f = ws::close_frame(code, &e.to_string());
        assert!(f.len() <= 127);
        self.events.push(Event::Fail(code));
        self.closed = true;
    }

    /// `conn::on_frame`.
    fn on_frame(&mut self, fin: bool, op: Opcode, payload: &mut [u8]) -> Result<(), WsError> {
        match op {
            Opcode::Text | Opcode::Binary => {
                if self.frag.opcode.is_some() {
                    return Err(WsError::Protocol("new message inside a fragmented one"));
                }
                if fin {
                    self.on_message(op, payload)?;
                } else {
                    self.frag.start(op, payload)?;
                }
            }
            Opcode::Continuation => {
                if self.frag.opcode.is_none() {
                    return Err(WsError::Protocol("continuation without a message"));
                }
                self.frag.push(payload, MAX)?;
                assert!(self.frag.buf.len() <= MAX);
                if fin {
                    let (op, mut buf) = self.frag.finish();
                    assert!(self.frag.opcode.is_none() && self.frag.buf.capacity() == 0);
                    self.on_message(op, &mut buf)?;
                }
            }
            Opcode::Ping => {
                let f = ws::frame(Opcode::Pong, payload);
                assert_eq!(f.len(), 2 + payload.len());
                self.events.push(Event::Pong(payload.to_vec()));
            }
            Opcode::Pong => {}
            Opcode::Close => {
                let code = ws::check_close_payload(payload)?;
                assert!(matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999));
                let f = ws::close_frame(code, "");
                assert_eq!(f.len(), 4);
                self.events.push(Event::Close(code));
                self.closed = true;
            }
        }
        Ok(())
    }

    /// `conn::on_message` (the `/echo` route).
    fn on_message(&mut self, op: Opcode, payload: &mut [u8]) -> Result<(), WsError> {
        assert!(matches!(op, Opcode::Text | Opcode::Binary));
        assert!(payload.len() <= MAX);
        if op == Opcode::Text && std::str::from_utf8(payload).is_err() {
            return Err(WsError::InvalidUtf8);
        }
        let mut h = [0u8; 10];
        let n = ws::write_head(&mut h, true, op, payload.len());
        assert_eq!(n, if payload.len() < 126 { 2 } else { 4 });
        self.events.push(Event::Message(op, payload.to_vec()));
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };

    // Whole stream at once.
    let mut whole = Conn::default();
    let mut buf = stream.to_vec();
    let used = whole.step(&mut buf);
    assert!(used <= stream.len());

    // The same stream in chunks, with a pending buffer as `worker` keeps one.
    let mut chunked = Conn::default();
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
