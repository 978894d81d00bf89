//! Micro-benchmarks of the per-message work: WebSocket frame decode (with unmasking),
//! message decode (`ws::Decoder` against the frame functions driven by hand, as `conn` did),
//! and encode, HTTP head parsing, JSON-RPC request decoding (simd-json, as used, against
//! serde_json), and `waku_subscription` push encoding.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use walletrelay::config::Limits;
use walletrelay::{http, rpc, ws};

fn masked_frame(payload: &[u8]) -> Vec<u8> {
    masked(0x81, payload)
}

/// A masked client frame with first byte `b0` (FIN and opcode).
fn masked(b0: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut v = vec![b0];
    let n = payload.len();
    if n < 126 {
        v.push(0x80 | n as u8);
    } else if n < 65536 {
        v.push(0x80 | 126);
        v.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        v.push(0x80 | 127);
        v.extend_from_slice(&(n as u64).to_be_bytes());
    }
    v.extend_from_slice(&mask);
    v.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    v
}

/// Parses the whole frame at the front of `buf` and unmasks its payload in place.
fn unmask_frame(buf: &mut [u8]) -> &[u8] {
    let h = ws::parse_head(buf, 1 << 20).unwrap().unwrap();
    let (s, e) = (h.header_len, h.frame_len());
    ws::unmask(&mut buf[s..e], h.mask, 0);
    &buf[s..e]
}

fn frames(c: &mut Criterion) {
    let mut g = c.benchmark_group("ws_frame_decode");
    for size in [64usize, 512, 4096, 65536] {
        let frame = masked_frame(&vec![b'a'; size]);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &frame, |b, f| {
            let mut buf = f.clone();
            b.iter(|| {
                buf.copy_from_slice(f);
                black_box(unmask_frame(&mut buf));
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("ws_frame_encode");
    for size in [64usize, 512, 4096, 65536] {
        let payload = vec![b'a'; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &payload, |b, p| {
            let mut out = walletrelay::outbuf::OutBuf::default();
            let mut sink = Vec::with_capacity(size + 16);
            b.iter(|| {
                let mut h = [0u8; 10];
                let n = ws::write_head(&mut h, true, ws::Opcode::Text, p.len());
                out.extend(&h[..n]);
                out.extend(p);
                sink.clear();
                out.write_to(&mut sink).unwrap();
                black_box(&sink);
            })
        });
    }
    g.finish();
}

/// A text message of `size` bytes, whole or in four fragments, decoded to its payload: by
/// `ws::Decoder`, and by `parse_head` + `unmask` + UTF-8 check (+ `Reassembly`) by hand,
/// the path `conn` took before the decoder.
fn messages(c: &mut Criterion) {
    let mut g = c.benchmark_group("ws_message_decode");
    for size in [64usize, 512, 4096, 65536] {
        let frame = masked_frame(&vec![b'a'; size]);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("by_hand", size), &frame, |b, f| {
            let mut buf = f.clone();
            b.iter(|| {
                buf.copy_from_slice(f);
                let payload = unmask_frame(&mut buf);
                assert!(simdutf8::basic::from_utf8(payload).is_ok());
                black_box(payload);
            })
        });
        g.bench_with_input(BenchmarkId::new("decoder", size), &frame, |b, f| {
            let mut buf = f.clone();
            let mut dec = ws::Decoder::new(1 << 20);
            b.iter(|| {
                buf.copy_from_slice(f);
                match dec.decode(&mut buf).unwrap() {
                    Some((_, ws::Event::Message { payload, .. })) => black_box(payload),
                    _ => unreachable!(),
                };
            })
        });
    }
    let size = 4096;
    let quarter = vec![b'a'; size / 4];
    let stream = [
        masked(0x01, &quarter),
        masked(0x00, &quarter),
        masked(0x00, &quarter),
        masked(0x80, &quarter),
    ]
    .concat();
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_with_input(
        BenchmarkId::new("by_hand_4_fragments", size),
        &stream,
        |b, f| {
            let mut buf = f.clone();
            let mut frag = ws::Reassembly::default();
            b.iter(|| {
                buf.copy_from_slice(f);
                let mut pos = 0;
                while pos < buf.len() {
                    let h = ws::parse_head(&buf[pos..], 1 << 20).unwrap().unwrap();
                    let (s, e) = (pos + h.header_len, pos + h.frame_len());
                    ws::unmask(&mut buf[s..e], h.mask, 0);
                    match h.opcode {
                        ws::Opcode::Text => frag.start(h.opcode, &buf[s..e]).unwrap(),
                        _ => frag.push(&buf[s..e], 1 << 20).unwrap(),
                    }
                    if h.fin {
                        let (_, m) = frag.finish();
                        assert!(simdutf8::basic::from_utf8(&m).is_ok());
                        black_box(m);
                    }
                    pos = e;
                }
            })
        },
    );
    g.bench_with_input(
        BenchmarkId::new("decoder_4_fragments", size),
        &stream,
        |b, f| {
            let mut buf = f.clone();
            let mut dec = ws::Decoder::new(1 << 20);
            b.iter(|| {
                buf.copy_from_slice(f);
                let mut pos = 0;
                while let Some((n, ev)) = dec.decode(&mut buf[pos..]).unwrap() {
                    pos += n;
                    black_box(ev);
                }
            })
        },
    );
    g.finish();
}

fn http_head(c: &mut Criterion) {
    let limits = Limits::default();
    let req =
        b"GET /api/v1/all?entries=10&page=2&search=wallet HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64)\r\nAccept: application/json\r\n\
Accept-Encoding: gzip, deflate, br\r\nConnection: keep-alive\r\nIf-None-Match: \"abc\"\r\n\r\n";
    c.bench_function("http_head_parse", |b| {
        b.iter(|| black_box(http::parse(black_box(req), &limits).unwrap().unwrap().0))
    });
}

fn jsonrpc(c: &mut Criterion) {
    let msg = "a".repeat(512);
    let publish = format!(
        r#"{{"id":1637012345678901,"jsonrpc":"2.0","method":"waku_publish","params":{{"topic":"{}","message":"{}","ttl":21600,"prompt":true}}}}"#,
        "f".repeat(64),
        msg
    );
    let mut g = c.benchmark_group("jsonrpc_publish_decode");
    g.bench_function("simd_json", |b| {
        let mut buf = publish.clone().into_bytes();
        let mut scratch = simd_json::Buffers::new(1024);
        b.iter(|| {
            buf.copy_from_slice(publish.as_bytes());
            match rpc::decode(&mut buf, &mut scratch).unwrap() {
                rpc::Incoming::Single(rpc::Item::Call(mut call)) => {
                    black_box(walletrelay::conn::methods::parse(&mut call, 256).unwrap());
                }
                _ => unreachable!(),
            }
        })
    });
    g.bench_function("serde_json", |b| {
        b.iter(
            || match rpc::decode_serde_json(black_box(publish.as_bytes())).unwrap() {
                rpc::Incoming::Single(rpc::Item::Call(mut call)) => {
                    black_box(walletrelay::conn::methods::parse(&mut call, 256).unwrap());
                }
                _ => unreachable!(),
            },
        )
    });
    let ack = br#"{"id":1637012345678901,"jsonrpc":"2.0","result":true}"#;
    g.bench_function("ack_simd_json", |b| {
        let mut buf = ack.to_vec();
        let mut scratch = simd_json::Buffers::new(1024);
        b.iter(|| {
            buf.copy_from_slice(ack);
            black_box(rpc::decode(&mut buf, &mut scratch).is_ok());
        })
    });
    g.bench_function("ack_serde_json", |b| {
        b.iter(|| black_box(rpc::decode_serde_json(black_box(ack)).is_ok()))
    });
    g.finish();
    c.bench_function("push_encode_512", |b| {
        let data = bytes::Bytes::from(rpc::encode_data(&"f".repeat(64), &msg));
        let id = [b'0'; 64];
        let mut out = Vec::with_capacity(1024);
        b.iter(|| {
            out.clear();
            rpc::write_push_prefix(&mut out, rpc::Dialect::Waku, 1637012345678901, &id);
            out.extend_from_slice(&data);
            out.extend_from_slice(rpc::PUSH_SUFFIX);
            black_box(&out);
        })
    });
}

criterion_group!(benches, frames, messages, http_head, jsonrpc);
criterion_main!(benches);
