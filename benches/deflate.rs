//! permessage-deflate costs for what real clients send: `waku_subscription` pushes carrying
//! 512-character hex messages, delivered to a core's subscribers three ways (uncompressed,
//! compressed once and shared, compressed per subscriber); the zlib level and the backend
//! (flate2 over zlib-rs, as used, against miniz_oxide); the size below which compressing
//! is not worth it; and inflating a compressed publish.
//!
//! Bytes on the wire are deterministic and printed once to stderr (`wire:` lines). Time is
//! the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time, so that other
//! work on a shared machine does not count. Run: `cargo bench --bench deflate`.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flate2::{Compress, Compression, FlushCompress};
use walletrelay::rpc;
use walletrelay::ws::{self, deflate};

/// Subscribers of one message on one core.
const SUBS: usize = 64;

/// CPU time of the calling thread, in nanoseconds.
struct ThreadCpu;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is supported by Linux; the call writes nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns() - start
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

/// Nanoseconds of CPU, scaled like criterion's wall-time figures.
struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (div, unit) = match typical {
            t if t < 1e3 => (1.0, "ns cpu"),
            t if t < 1e6 => (1e3, "µs cpu"),
            _ => (1e6, "ms cpu"),
        };
        values.iter_mut().for_each(|v| *v /= div);
        unit
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let (n, unit) = match t {
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) => {
                (*n as f64 / 1_048_576.0, "MiB/s cpu")
            }
            Throughput::Elements(n) => (*n as f64, "elem/s cpu"),
        };
        values.iter_mut().for_each(|v| *v = n * 1e9 / *v);
        unit
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

/// `n` hex characters of pseudo-random bytes (encrypted payloads look random).
fn hex(n: usize, mut seed: u64) -> String {
    let mut s = String::with_capacity(n);
    while s.len() < n {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        s.push_str(&format!("{:016x}", seed));
    }
    s.truncate(n);
    s
}

/// The shared `data` of a push: a 64-hex topic and a 512-hex message.
fn push_data() -> Vec<u8> {
    rpc::encode_data(&hex(64, 1), &hex(512, 2))
}

/// Subscriber `i`'s push prefix (its own rpc id and 64-hex subscription id).
fn prefix(i: usize, out: &mut Vec<u8>) {
    out.clear();
    let sub = hex(64, 1000 + i as u64);
    rpc::write_push_prefix(
        out,
        rpc::Dialect::Waku,
        1_637_012_345_678_901 + i as u64,
        sub.as_bytes(),
    );
}

fn frame_into(sink: &mut Vec<u8>, payload_parts: &[&[u8]]) {
    let len = payload_parts.iter().map(|p| p.len()).sum();
    let mut h = [0u8; 10];
    let n = ws::write_head(&mut h, true, ws::Opcode::Text, len);
    sink.extend_from_slice(&h[..n]);
    for p in payload_parts {
        sink.extend_from_slice(p);
    }
}

/// One delivery of `data` to each subscriber, the three ways; appends the frames to `sink`.
fn deliver_plain(prefixes: &[Vec<u8>], data: &[u8], sink: &mut Vec<u8>) {
    for p in prefixes {
        frame_into(sink, &[p, data, rpc::PUSH_SUFFIX]);
    }
}

fn deliver_shared(
    d: &mut deflate::Deflater,
    prefixes: &[Vec<u8>],
    data: &[u8],
    sink: &mut Vec<u8>,
) {
    let mut shared = deflate::Shared::new(
        walletrelay::arcbuf::ArcBuf::copy_from_slice(data),
        bytes::Bytes::from_static(rpc::PUSH_SUFFIX),
    );
    for p in prefixes {
        let z = shared.get(d, 15).expect("compressible");
        deflate::push_head(p, z, sink);
        sink.extend_from_slice(z);
    }
}

fn deliver_per_subscriber(
    d: &mut deflate::Deflater,
    prefixes: &[Vec<u8>],
    data: &[u8],
    msg: &mut Vec<u8>,
    z: &mut Vec<u8>,
    sink: &mut Vec<u8>,
) {
    for p in prefixes {
        msg.clear();
        msg.extend_from_slice(p);
        msg.extend_from_slice(data);
        msg.extend_from_slice(rpc::PUSH_SUFFIX);
        assert!(d.compress(msg, 15, z));
        let mut h = [0u8; 10];
        let n = deflate::write_head(&mut h, ws::Opcode::Text, z.len());
        sink.extend_from_slice(&h[..n]);
        sink.extend_from_slice(z);
    }
}

fn delivery(c: &mut Criterion<ThreadCpu>) {
    let data = push_data();
    let prefixes: Vec<Vec<u8>> = (0..SUBS)
        .map(|i| {
            let mut v = Vec::new();
            prefix(i, &mut v);
            v
        })
        .collect();
    let mut d = deflate::Deflater::new();
    let (mut msg, mut z, mut sink) = (Vec::new(), Vec::new(), Vec::new());
    // Bytes on the wire per delivery.
    deliver_plain(&prefixes, &data, &mut sink);
    let plain = sink.len() / SUBS;
    sink.clear();
    deliver_shared(&mut d, &prefixes, &data, &mut sink);
    let shared = sink.len() / SUBS;
    sink.clear();
    deliver_per_subscriber(&mut d, &prefixes, &data, &mut msg, &mut z, &mut sink);
    let per_sub = sink.len() / SUBS;
    eprintln!(
        "wire: push of {} data bytes (prefix {} bytes), per delivery incl. frame header: \
         uncompressed {plain} B, shared {shared} B, per-subscriber {per_sub} B",
        data.len(),
        prefixes[0].len()
    );

    let mut g = c.benchmark_group("deflate_delivery_512hex");
    g.throughput(Throughput::Elements(SUBS as u64));
    g.bench_function("uncompressed", |b| {
        b.iter(|| {
            sink.clear();
            deliver_plain(&prefixes, black_box(&data), &mut sink);
            black_box(&sink);
        })
    });
    g.bench_function("shared", |b| {
        b.iter(|| {
            sink.clear();
            deliver_shared(&mut d, &prefixes, black_box(&data), &mut sink);
            black_box(&sink);
        })
    });
    g.bench_function("per_subscriber", |b| {
        b.iter(|| {
            sink.clear();
            deliver_per_subscriber(
                &mut d,
                &prefixes,
                black_box(&data),
                &mut msg,
                &mut z,
                &mut sink,
            );
            black_box(&sink);
        })
    });
    g.finish();
}

/// One message through flate2 (zlib-rs) at `level`, reset first; returns the payload length.
fn flate2_once(c: &mut Compress, msg: &[u8], out: &mut Vec<u8>) -> usize {
    c.reset();
    out.clear();
    c.compress_vec(msg, out, FlushCompress::Sync)
        .expect("deflate");
    out.len() - 4
}

/// The same through miniz_oxide.
fn miniz_once(
    c: &mut miniz_oxide::deflate::core::CompressorOxide,
    msg: &[u8],
    out: &mut [u8],
) -> usize {
    c.reset();
    let r = miniz_oxide::deflate::stream::deflate(c, msg, out, miniz_oxide::MZFlush::Sync);
    assert_eq!(r.bytes_consumed, msg.len());
    r.bytes_written - 4
}

fn miniz(level: u8) -> Box<miniz_oxide::deflate::core::CompressorOxide> {
    let flags = miniz_oxide::deflate::core::create_comp_flags_from_zip_params(level.into(), -15, 0);
    Box::new(miniz_oxide::deflate::core::CompressorOxide::new(flags))
}

fn levels(c: &mut Criterion<ThreadCpu>) {
    let mut msg = push_data();
    msg.extend_from_slice(rpc::PUSH_SUFFIX);
    let mut out = Vec::with_capacity(msg.len() * 2);
    let mut g = c.benchmark_group("deflate_level_512hex");
    for level in [1u8, 2, 3, 4, 6, 9] {
        let mut z = Compress::new(Compression::new(level.into()), false);
        let mut m = miniz(level);
        let mut buf = vec![0u8; msg.len() * 2];
        eprintln!(
            "wire: level {level}: {} -> zlib-rs {} B, miniz_oxide {} B",
            msg.len(),
            flate2_once(&mut z, &msg, &mut out),
            miniz_once(&mut m, &msg, &mut buf)
        );
        g.bench_with_input(BenchmarkId::new("zlib-rs", level), &msg, |b, msg| {
            b.iter(|| black_box(flate2_once(&mut z, msg, &mut out)))
        });
        g.bench_with_input(BenchmarkId::new("miniz_oxide", level), &msg, |b, msg| {
            b.iter(|| black_box(miniz_once(&mut m, msg, &mut buf)))
        });
    }
    g.finish();
}

/// JSON-RPC answers and pushes of growing size: what compressing saves and costs.
fn small(c: &mut Criterion<ThreadCpu>) {
    let mut d = deflate::Deflater::new();
    let mut out = Vec::with_capacity(1024);
    let mut g = c.benchmark_group("deflate_small_message");
    let sub_result = format!(
        r#"{{"id":1637012345678901,"jsonrpc":"2.0","result":"{}"}}"#,
        hex(64, 7)
    );
    let mut push = Vec::new();
    prefix(0, &mut push);
    push.extend_from_slice(&rpc::encode_data(&hex(64, 1), &hex(64, 3)));
    push.extend_from_slice(rpc::PUSH_SUFFIX);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "ack",
            br#"{"id":1637012345678901,"jsonrpc":"2.0","result":true}"#.to_vec(),
        ),
        ("subscribe_result", sub_result.into_bytes()),
        ("push_64hex", push),
    ];
    for (name, msg) in &cases {
        let mut z = Compress::new(Compression::new(deflate::LEVEL), false);
        eprintln!(
            "wire: {name}: {} -> {} B",
            msg.len(),
            flate2_once(&mut z, msg, &mut out)
        );
        g.bench_with_input(BenchmarkId::new(*name, msg.len()), msg, |b, msg| {
            b.iter(|| black_box(flate2_once(&mut z, msg, &mut out)))
        });
    }
    // What `compress` does with a message under the threshold: nothing.
    g.bench_function("under_threshold", |b| {
        b.iter(|| black_box(d.compress(black_box(&cases[0].1), 15, &mut out)))
    });
    g.finish();
}

fn inflate(c: &mut Criterion<ThreadCpu>) {
    let publish = format!(
        r#"{{"id":1637012345678901,"jsonrpc":"2.0","method":"waku_publish","params":{{"topic":"{}","message":"{}","ttl":86400}}}}"#,
        hex(64, 1),
        hex(512, 2)
    );
    let mut d = deflate::Deflater::new();
    let mut z = Vec::new();
    assert!(d.compress(publish.as_bytes(), 15, &mut z));
    eprintln!("wire: publish {} -> {} B", publish.len(), z.len());
    let mut inf = deflate::Inflater::new();
    let mut out = Vec::new();
    let mut g = c.benchmark_group("inflate_publish_512hex");
    g.throughput(Throughput::Bytes(publish.len() as u64));
    g.bench_function("inflate", |b| {
        b.iter(|| {
            inf.inflate(black_box(&z), 1 << 20, &mut out)
                .expect("inflate");
            black_box(&out);
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .with_measurement(ThreadCpu)
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = delivery, levels, small, inflate
}
criterion_main!(benches);
