//! Gzip for the tests that check compressed answers: [`gunzip`], the one decoder. It does
//! not depend on walletrelay, so the registry's unit tests include it too (`#[path]`, as
//! they do `tls_pki`).
#![allow(dead_code)]

use std::io::Read;

/// The bytes the gzip member `b` holds; a test failure when it is not valid gzip.
pub fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}
