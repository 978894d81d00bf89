//! permessage-deflate payloads checked against an independent implementation (CPython's
//! `zlib`, in a real `python3` process: those tests are skipped, saying so, when there is
//! none), and the inflater's bound against a DEFLATE bomb built bit by bit here.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::hex;
use common::skip::skip;
use walletrelay::rpc;
use walletrelay::ws::deflate::{self, DeflateError, Deflater, Inflater};

/// Runs `script` under python3 with `input` on stdin; the error says why python3 could not
/// be run.
fn python(script: &str, input: &[u8]) -> Result<Vec<u8>, String> {
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("python3 is not available ({e})"))?;
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3 failed");
    Ok(out.stdout)
}

/// Length-prefixed records (4 bytes big-endian, then the bytes).
fn records(items: &[Vec<u8>]) -> Vec<u8> {
    let mut v = Vec::new();
    for it in items {
        v.extend_from_slice(&(it.len() as u32).to_be_bytes());
        v.extend_from_slice(it);
    }
    v
}

fn unrecords(mut b: &[u8]) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    while !b.is_empty() {
        let n = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        v.push(b[4..4 + n].to_vec());
        b = &b[4 + n..];
    }
    v
}

/// Python's side of RFC 7692: inflate each record as a receiver does (fresh raw inflater,
/// the 4-byte tail appended), or compress each as a sender does (sync flush, tail removed).
const PY: &str = r#"
import sys, struct, zlib
mode, data, out = sys.argv[1], sys.stdin.buffer.read(), []
while data:
    (n,) = struct.unpack(">I", data[:4]); rec, data = data[4:4 + n], data[4 + n:]
    if mode == "inflate":
        d = zlib.decompressobj(-15)
        r = d.decompress(rec + b"\x00\x00\xff\xff")
        assert not d.unconsumed_tail
    else:
        c = zlib.compressobj(6, zlib.DEFLATED, -15)
        r = c.compress(rec) + c.flush(zlib.Z_SYNC_FLUSH)
        assert r.endswith(b"\x00\x00\xff\xff"); r = r[:-4]
    out.append(struct.pack(">I", len(r)) + r)
sys.stdout.buffer.write(b"".join(out))
"#;

fn py_mode(mode: &str) -> String {
    format!("import sys; sys.argv[1:] = ['{mode}']\n{PY}")
}

/// A real push's parts: per-subscriber prefix, shared data, suffix.
fn push(i: u64) -> (Vec<u8>, Vec<u8>) {
    let mut prefix = Vec::new();
    rpc::write_push_prefix(
        &mut prefix,
        rpc::Dialect::Waku,
        1_637_012_345_678_901 + i,
        hex(64, 100 + i).as_bytes(),
    );
    let data = rpc::encode_data(&hex(64, 1), &hex(512, 2));
    (prefix, data)
}

#[test]
fn python_zlib_inflates_what_we_send() {
    let mut d = Deflater::new();
    let mut sent = Vec::new();
    let mut expect = Vec::new();
    // Pushes composed from one shared compression, three subscribers.
    let (_, data) = push(0);
    let shared = deflate::compress_shared(&mut d, &data, rpc::PUSH_SUFFIX).unwrap();
    for i in 0..3 {
        let (prefix, _) = push(i);
        let mut payload = Vec::new();
        deflate::push_payload(&prefix, &shared, &mut payload);
        sent.push(payload);
        expect.push([&prefix[..], &data, rpc::PUSH_SUFFIX].concat());
    }
    // Whole messages, at every window size.
    for (k, bits) in (9..=15u8).enumerate() {
        let msg = format!(
            r#"{{"id":{k},"jsonrpc":"2.0","result":[{}]}}"#,
            (0..300)
                .map(|i| format!("\"{}\"", hex(40, i % 17)))
                .collect::<Vec<_>>()
                .join(",")
        )
        .into_bytes();
        let mut z = Vec::new();
        assert!(d.compress(&msg, bits, &mut z));
        sent.push(z);
        expect.push(msg);
    }
    let out = match python(&py_mode("inflate"), &records(&sent)) {
        Ok(out) => out,
        Err(why) => return skip("python_zlib_inflates_what_we_send", &why),
    };
    assert_eq!(unrecords(&out), expect);
}

#[test]
fn we_inflate_what_python_zlib_sends() {
    let (prefix, data) = push(9);
    let msgs: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"Hello".to_vec(),
        [&prefix[..], &data, rpc::PUSH_SUFFIX].concat(),
        hex(100_000, 5).into_bytes(),
    ];
    let out = match python(&py_mode("deflate"), &records(&msgs)) {
        Ok(out) => out,
        Err(why) => return skip("we_inflate_what_python_zlib_sends", &why),
    };
    let mut inf = Inflater::new();
    let mut got = Vec::new();
    for (z, msg) in unrecords(&out).iter().zip(&msgs) {
        inf.inflate(z, 1 << 20, &mut got).unwrap();
        assert_eq!(&got, msg);
    }
}

/// LSB-first DEFLATE bit writer.
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn put(&mut self, v: u64, n: u32) {
        self.acc |= v << self.n;
        self.n += n;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// A Huffman code, most significant bit first.
    fn code(&mut self, code: u64, len: u32) {
        let rev = (0..len).fold(0, |r, i| (r << 1) | ((code >> i) & 1));
        self.put(rev, len);
    }
}

/// A payload that inflates to `1 + 258 * pairs` zero bytes at 13 bits per 258 bytes: one
/// fixed-Huffman block, a literal 0, then `pairs` copies of (length 258, distance 1), ended
/// as RFC 7692 ends a message.
fn bomb(pairs: usize) -> Vec<u8> {
    let mut b = Bits {
        out: Vec::with_capacity(pairs * 13 / 8 + 16),
        acc: 0,
        n: 0,
    };
    b.put(0b010, 3); // BFINAL 0, BTYPE 01 (fixed Huffman)
    b.code(0x30, 8); // literal 0
    for _ in 0..pairs {
        b.code(0xC5, 8); // length symbol 285 (258)
        b.code(0, 5); // distance code 0 (1)
    }
    b.code(0, 7); // end of block
    b.put(0, 3); // empty stored block, BFINAL 0; its LEN/NLEN are the removed tail
    if b.n > 0 {
        b.put(0, 8 - b.n);
    }
    b.out
}

#[test]
fn a_deflate_bomb_stops_at_the_bound() {
    let mut inf = Inflater::new();
    let mut out = Vec::new();
    // The construction is a valid message (and python agrees when it is there).
    let small = bomb(1000);
    inf.inflate(&small, 1 << 20, &mut out).unwrap();
    assert_eq!(out.len(), 1 + 258 * 1000);
    assert!(out.iter().all(|&b| b == 0));
    match python(&py_mode("inflate"), &records(&[small])) {
        Ok(py) => assert_eq!(unrecords(&py), vec![out.clone()]),
        Err(why) => eprintln!("not checked against zlib: {why}"),
    }
    // 6.5 MB that would inflate to 1 GiB: refused after the first MiB, and the buffer
    // never holds more than the bound plus one byte.
    let max = 1 << 20;
    let big = bomb((1 << 30) / 258);
    assert!(big.len() < 7_000_000);
    let mut out = Vec::new();
    assert_eq!(inf.inflate(&big, max, &mut out), Err(DeflateError::TooBig));
    assert!(out.capacity() <= max + 1, "capacity {}", out.capacity());
    assert_eq!(DeflateError::TooBig.close_code(), 1009);
    // A buffer left large by an earlier, larger bound is shrunk to this one.
    let mut out = Vec::with_capacity(64 << 20);
    assert_eq!(inf.inflate(&big, max, &mut out), Err(DeflateError::TooBig));
    assert!(out.capacity() <= max + 1, "capacity {}", out.capacity());
    // And the inflater carries on with the next message.
    inf.inflate(&bomb(3), max, &mut out).unwrap();
    assert_eq!(out.len(), 1 + 258 * 3);
}
