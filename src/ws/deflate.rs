//! permessage-deflate (RFC 7692) for the WebSocket codec, behind `--permessage-deflate`:
//! negotiation ([`negotiate`]), inbound RSV1 rules and bounded inflation ([`Inflater`]),
//! outbound compression of single messages and of relay pushes compressed once per core for
//! all subscribers ([`Deflater`], [`Shared`], [`push_head`]).
//!
//! Always with `server_no_context_takeover` and `client_no_context_takeover`: every message
//! is (de)compressed by a per-core (de)compressor reset for it, so an idle connection keeps
//! only its two-byte [`Agreement`]. Sans-IO like the rest of `ws`: nothing here touches a
//! socket, a connection or the relay; `conn` and `worker` call in with bytes.
//!
//! DEFLATE itself is flate2 over zlib-rs, which the registry already uses: raw streams, sync
//! flush and window sizes 9 to 15 all work through it. miniz_oxide (also in the tree, under
//! flate2) is not used: in `benches/deflate.rs` it is as fast and a little longer
//! (docs/PERFORMANCE.md, "Smaller choices"), and below a 15-bit window it does not shrink
//! its window but falls back to fast or RLE-only modes.

mod compress;
mod inflate;
mod negotiate;

pub use compress::{
    compress_shared, push_head, push_payload, write_head, Deflater, Shared, LEVEL, MIN_COMPRESS,
};
pub use inflate::{parse_head, Inflater, RSV1};
pub use negotiate::{accept_offer, negotiate, Agreement, MAX_WINDOW_BITS, MIN_SERVER_WINDOW_BITS};

use thiserror::Error;

use super::close;

/// Why a compressed message was refused, and the close code that answers it.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum DeflateError {
    /// The message inflates past `--max-message` (1009).
    #[error("message too big")]
    TooBig,
    /// The payload is not a DEFLATE stream (1007: the data does not match the message's
    /// declared encoding, as for text that is not UTF-8; node's `ws` answers the same).
    #[error("invalid compressed data")]
    Invalid,
}

impl DeflateError {
    /// The close code answering this error.
    pub fn close_code(&self) -> u16 {
        match self {
            DeflateError::TooBig => close::TOO_BIG,
            DeflateError::Invalid => close::INVALID_DATA,
        }
    }

    /// A short close reason.
    pub fn reason(&self) -> &'static str {
        match self {
            DeflateError::TooBig => "message too big",
            DeflateError::Invalid => "invalid compressed data",
        }
    }
}
