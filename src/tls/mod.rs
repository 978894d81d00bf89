//! Native TLS for the worker loops (`--tls-listen`, DECISIONS §9): `rustls` driven sans-IO
//! from each worker's own poll loop, with no thread and no async runtime.
//!
//! - [`config`]: PEM loading and the shared [`rustls::ServerConfig`] (rebuilt on SIGHUP).
//! - [`session`]: [`TlsSession`], one connection's TLS state: ciphertext in, plaintext out
//!   (read path); plaintext in, ciphertext out (write path, through [`TlsSink`], an
//!   [`crate::outbuf::Sink`], so `OutBuf::write_to` works unchanged over TLS).
//!
//! This module owns TLS records, handshakes and the ciphertext buffers of a connection. It
//! must not touch HTTP, WebSocket or relay state, the slab, timers or the poll registry:
//! the worker reads and writes the socket's readiness and decides when to close.

pub mod config;
pub mod session;
mod sink;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use config::{TlsFiles, TlsLoader};
pub use session::{TlsScratch, TlsSession, MAX_CARRY, MAX_PENDING, PLAIN_MAX};
pub use sink::TlsSink;

/// What can go wrong with TLS: loading the certificate and key (at start-up or reload), or
/// one connection's session (which then costs that connection only).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not valid PEM.
    #[error("{path}: invalid PEM: {detail}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        detail: String,
    },
    /// The certificate file holds no `CERTIFICATE` block.
    #[error(
        "{path}: no certificate found (expected PEM \"BEGIN CERTIFICATE\" blocks, leaf first)"
    )]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no private key.
    #[error("{path}: no private key found (expected a PEM PKCS#8, RSA or EC private key)")]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// The key is unusable, or does not belong to the leaf certificate.
    #[error("certificate and key do not fit together: {0}")]
    KeyMismatch(rustls::Error),
    /// Building the configuration failed otherwise.
    #[error("TLS configuration: {0}")]
    Config(rustls::Error),
    /// The peer broke the protocol (a bad or failed handshake, plaintext on the TLS port, a
    /// bad or oversized record, a failed decryption): close the connection.
    #[error("TLS: {0}")]
    Protocol(rustls::Error),
    /// The peer sent more than [`MAX_CARRY`] bytes without completing a record or a
    /// handshake message.
    #[error("TLS: {0} bytes of input without a complete record")]
    TooMuchInput(usize),
    /// The peer made the session queue more than [`session::MAX_PENDING`] bytes for the
    /// socket without reading them (for instance by requesting key updates).
    #[error("TLS: {0} bytes of answers waiting while the peer keeps sending")]
    TooMuchOutput(usize),
    /// The session failed earlier: only its alert may still be sent.
    #[error("TLS: the session already failed")]
    Failed,
    /// Application data could not be encrypted (the connection's keys are used up) or came
    /// before the handshake finished.
    #[error("TLS: cannot encrypt: {0}")]
    Encrypt(String),
}

impl From<TlsError> for std::io::Error {
    fn from(e: TlsError) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}
