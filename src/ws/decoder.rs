//! The WebSocket *message* decoder, sans-IO: turns a client byte stream into messages,
//! fragments absorbed, pings, pongs and closes, and owns every RFC 6455 rule above a single
//! frame header: a continuation needs a message in progress, a new data message cannot
//! start inside a fragmented one, control frames may come between fragments, a close
//! payload must be valid, text (whole or fragmented) must be UTF-8 and fails as soon as it
//! cannot become UTF-8, and a message may not exceed `max_message` bytes across fragments.
//!
//! It owns the reassembly buffer of a fragmented message and nothing else: it never reads
//! or writes a socket, never queues an answer, and keeps no connection state besides the
//! message in progress. The frame header rules themselves (masking, reserved bits, opcodes,
//! control-frame length) are [`super::parse_head`]'s.

use super::{check_close_payload, unmask, FrameHead, Opcode, WsError};

/// Reassembly state of a fragmented message: empty (no heap) when no fragmented message is
/// in flight. [`Decoder`] holds one; `conn` still drives one directly until it moves to the
/// decoder.
#[derive(Debug, Default)]
pub struct Reassembly {
    /// Opcode of the message being reassembled, when one is.
    pub opcode: Option<Opcode>,
    /// Of a text message: how many bytes at the end of `buf` are not yet known to be valid
    /// UTF-8 (an incomplete sequence waiting for the next fragment: at most 3, so a byte
    /// holds it where a `usize` offset would cost 8).
    unchecked: u8,
    /// The payload so far.
    pub buf: Vec<u8>,
}

impl Reassembly {
    /// Starts a fragmented message; a text message whose first fragment already holds
    /// invalid UTF-8 is refused at once (RFC 6455 §8.1: fail fast).
    pub fn start(&mut self, opcode: Opcode, first: &[u8]) -> Result<(), WsError> {
        self.opcode = Some(opcode);
        self.buf.clear();
        self.unchecked = 0;
        self.buf.extend_from_slice(first);
        self.check_utf8(0)
    }

    /// Appends a continuation, refusing a message that grows past `max` or, for text, one
    /// that is no longer valid UTF-8 whatever follows.
    pub fn push(&mut self, more: &[u8], max: usize) -> Result<(), WsError> {
        if self.buf.len() + more.len() > max {
            return Err(WsError::TooBig);
        }
        let from = self.buf.len().saturating_sub(usize::from(self.unchecked));
        self.buf.extend_from_slice(more);
        self.check_utf8(from)
    }

    /// Validates the text from `from` on (what was not yet known valid).
    fn check_utf8(&mut self, from: usize) -> Result<(), WsError> {
        if self.opcode != Some(Opcode::Text) {
            return Ok(());
        }
        let new = self.buf.get(from..).unwrap_or_default();
        match simdutf8::compat::from_utf8(new) {
            Ok(_) => self.unchecked = 0,
            // Only an incomplete sequence at the very end (at most 3 bytes): the next
            // fragment may finish it.
            Err(e) if e.error_len().is_none() => {
                self.unchecked = u8::try_from(new.len() - e.valid_up_to()).unwrap_or(u8::MAX);
            }
            Err(_) => return Err(WsError::InvalidUtf8),
        }
        Ok(())
    }

    /// Ends the message, returning its opcode and payload and freeing the buffer.
    pub fn finish(&mut self) -> (Opcode, Vec<u8>) {
        self.unchecked = 0;
        let op = self.opcode.take().unwrap_or(Opcode::Binary);
        (op, std::mem::take(&mut self.buf))
    }

    /// [`Reassembly::finish`], refusing a text message that ends inside a UTF-8 sequence
    /// (the only invalid text the fragment checks let through).
    pub fn finish_valid(&mut self) -> Result<(Opcode, Vec<u8>), WsError> {
        let op = self.end_valid();
        let done = std::mem::take(&mut self.buf);
        Ok((op?, done))
    }

    /// Ends the message as [`Reassembly::finish_valid`] does but leaves its payload in
    /// `buf` (the decoder lends it from there and frees it on its next call).
    fn end_valid(&mut self) -> Result<Opcode, WsError> {
        let cut = self.opcode == Some(Opcode::Text) && self.unchecked != 0;
        self.unchecked = 0;
        let op = self.opcode.take().unwrap_or(Opcode::Binary);
        if cut {
            return Err(WsError::InvalidUtf8);
        }
        Ok(op)
    }
}

/// What a decoded frame made.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A whole data message: an unfragmented frame's payload unmasked in place in the
    /// caller's buffer, or the reassembled message. Text is already checked to be UTF-8.
    Message {
        /// Binary (opcode 2) rather than text (opcode 1).
        binary: bool,
        /// The payload; the caller may parse it in place (it is not looked at again).
        payload: &'a mut [u8],
    },
    /// A whole permessage-deflate message (RFC 7692; only once [`Decoder::set_deflate`]
    /// allowed it): its compressed payload, to inflate (and, for text, check for UTF-8).
    Compressed {
        /// Binary rather than text.
        binary: bool,
        /// The compressed bytes (the empty stored block's tail removed, as sent).
        payload: &'a mut [u8],
    },
    /// A non-final fragment was absorbed: nothing to do.
    Fragment,
    /// A ping: answer with a pong carrying this payload (at most 125 bytes).
    Ping(&'a [u8]),
    /// A pong: nothing to do besides noting the peer is alive.
    Pong,
    /// A valid close: echo `code` (1000 for an empty close payload) and close. Frames after
    /// it are not the decoder's concern: the caller stops reading.
    Close {
        /// The code to echo back.
        code: u16,
    },
}

/// What [`Decoder::step`] found, without borrowing anything, so that `decode` can reset the
/// decoder on an error and still lend buffers on success.
enum Step {
    /// A whole unfragmented message at `start..end` of the caller's buffer.
    Whole {
        binary: bool,
        compressed: bool,
        start: usize,
        end: usize,
    },
    /// The reassembled message, in `Decoder::done`.
    Reassembled {
        binary: bool,
        compressed: bool,
    },
    Fragment,
    Ping {
        start: usize,
        end: usize,
    },
    Pong,
    Close {
        code: u16,
    },
}

/// A client message decoder for one connection: the message limit and the fragmented
/// message in progress. Empty (no heap) when idle, 40 bytes in all (it lives in every
/// WebSocket's state: see `conn::websocket::WsState`).
///
/// ```
/// use walletrelay::ws::{Decoder, Event};
/// let mut dec = Decoder::new(1 << 20);
/// // A masked text frame "hi" (mask 0), then half of the next frame's header.
/// let mut input = vec![0x81, 0x82, 0, 0, 0, 0, b'h', b'i', 0x81];
/// let mut pos = 0;
/// while let Some((n, ev)) = dec.decode(&mut input[pos..]).unwrap() {
///     pos += n;
///     assert_eq!(ev, Event::Message { binary: false, payload: &mut b"hi".to_vec()[..] });
/// }
/// assert_eq!(pos, 8); // the last byte stays pending for the next read
/// ```
#[derive(Debug)]
pub struct Decoder {
    /// Largest message in bytes, whole or reassembled (`Limits::max_message`, at most
    /// `u32::MAX`: a message is held whole in memory, so a larger limit means nothing); also
    /// bounds one frame, so what a caller keeps pending stays under `max_message + 14`.
    max_message: u32,
    /// The fragmented message in progress, if any. Once it is whole, its payload stays in
    /// `frag.buf` (with no opcode) while its `Event::Message` lends it out, and is freed by
    /// the next `decode` call (which a caller's loop always makes, the one that answers
    /// `Ok(None)`).
    frag: Reassembly,
    /// permessage-deflate was negotiated: RSV1 marks a compressed message.
    deflate: bool,
    /// The real opcode of the compressed message being reassembled (reassembled as binary,
    /// so that compressed bytes are not checked as UTF-8).
    compressed: Option<Opcode>,
}

impl Decoder {
    /// A decoder refusing messages over `max_message` bytes (taken as `u32::MAX` when
    /// larger).
    pub fn new(max_message: usize) -> Decoder {
        Decoder {
            max_message: u32::try_from(max_message).unwrap_or(u32::MAX),
            frag: Reassembly::default(),
            deflate: false,
            compressed: None,
        }
    }

    /// Allows compressed messages (permessage-deflate was negotiated).
    pub fn set_deflate(&mut self, on: bool) {
        self.deflate = on;
    }

    /// Decodes the first frame of `buf`, unmasking it in place.
    ///
    /// `Ok(None)`: `buf` holds no whole frame yet; nothing is consumed or changed (keep the
    /// bytes, call again with more). `Ok(Some((n, ev)))`: the first `n` bytes are consumed
    /// and made `ev`. `Err(e)`: the connection must be closed with `e.close_code()` (1002,
    /// 1007 or 1009); the decoder is reset. A frame that breaks a rule from its header
    /// alone (too big, out of sequence) is refused before its payload arrives.
    pub fn decode<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> Result<Option<(usize, Event<'a>)>, WsError> {
        if self.frag.opcode.is_none() && self.frag.buf.capacity() != 0 {
            // The message the last call lent out.
            self.frag.buf = Vec::new();
        }
        let (n, step) = match self.step(buf) {
            Ok(Some(found)) => found,
            Ok(None) => return Ok(None),
            Err(e) => {
                let deflate = self.deflate;
                *self = Decoder::new(self.max_message());
                self.deflate = deflate;
                return Err(e);
            }
        };
        let ev = match step {
            Step::Whole {
                binary,
                compressed,
                start,
                end,
            } => {
                let payload = buf.get_mut(start..end).unwrap_or_default();
                if compressed {
                    Event::Compressed { binary, payload }
                } else {
                    Event::Message { binary, payload }
                }
            }
            Step::Reassembled { binary, compressed } => {
                let payload = &mut self.frag.buf[..];
                if compressed {
                    Event::Compressed { binary, payload }
                } else {
                    Event::Message { binary, payload }
                }
            }
            Step::Fragment => Event::Fragment,
            Step::Ping { start, end } => Event::Ping(buf.get(start..end).unwrap_or_default()),
            Step::Pong => Event::Pong,
            Step::Close { code } => Event::Close { code },
        };
        Ok(Some((n, ev)))
    }

    /// No fragmented message is in progress.
    pub fn is_idle(&self) -> bool {
        self.frag.opcode.is_none()
    }

    /// The message limit this decoder enforces.
    pub fn max_message(&self) -> usize {
        self.max_message as usize
    }

    /// Parses, checks and unmasks the first frame of `buf` and applies it to the state.
    #[inline]
    fn step(&mut self, buf: &mut [u8]) -> Result<Option<(usize, Step)>, WsError> {
        let Some((head, rsv1)) = super::deflate::parse_head(buf, self.max_message(), self.deflate)?
        else {
            return Ok(None);
        };
        self.check_sequence(&head)?;
        let (start, end) = (head.header_len, head.frame_len());
        let Some(payload) = buf.get_mut(start..end) else {
            return Ok(None);
        };
        let ascii = unmask(payload, head.mask, 0);
        let step = match head.opcode {
            Opcode::Text | Opcode::Binary if head.fin => {
                let binary = head.opcode == Opcode::Binary;
                // ASCII is valid UTF-8: the full check only for the rest.
                if !binary && !rsv1 && !ascii && simdutf8::basic::from_utf8(payload).is_err() {
                    return Err(WsError::InvalidUtf8);
                }
                Step::Whole {
                    binary,
                    compressed: rsv1,
                    start,
                    end,
                }
            }
            Opcode::Text | Opcode::Binary => {
                if rsv1 {
                    self.compressed = Some(head.opcode);
                    self.frag.start(Opcode::Binary, payload)?;
                } else {
                    self.frag.start(head.opcode, payload)?;
                }
                Step::Fragment
            }
            Opcode::Continuation => {
                self.frag.push(payload, self.max_message())?;
                if !head.fin {
                    return Ok(Some((end, Step::Fragment)));
                }
                let op = self.frag.end_valid()?;
                let real = self.compressed.take();
                Step::Reassembled {
                    binary: real.unwrap_or(op) == Opcode::Binary,
                    compressed: real.is_some(),
                }
            }
            Opcode::Ping => Step::Ping { start, end },
            Opcode::Pong => Step::Pong,
            Opcode::Close => Step::Close {
                code: check_close_payload(payload)?,
            },
        };
        Ok(Some((end, step)))
    }

    /// The rules a frame's header alone decides against the message in progress.
    fn check_sequence(&self, head: &FrameHead) -> Result<(), WsError> {
        match (head.opcode, self.frag.opcode) {
            (Opcode::Text | Opcode::Binary, Some(_)) => {
                Err(WsError::Protocol("new message inside a fragmented one"))
            }
            (Opcode::Continuation, None) => {
                Err(WsError::Protocol("continuation without a message"))
            }
            (Opcode::Continuation, Some(_))
                if head.payload_len > self.max_message().saturating_sub(self.frag.buf.len()) =>
            {
                Err(WsError::TooBig)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
#[path = "decoder_tests.rs"]
mod tests;
