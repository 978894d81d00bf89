//! Registry benches: substring search and answer assembly at 245 (the real data), 10,000
//! and 100,000 entries (synthetic, `registry::synth`), an answer from a worker's answer
//! cache, plus the cost of sharing one registry between two cores (`Arc`) against a
//! per-core clone. A search is timed as the answer of its first match (`entries=1`), so
//! the scan dominates and the body is a few hundred bytes.
//!
//! `cargo bench --bench registry` (add `-- --measurement-time 2` for a quick run;
//! `REGISTRY_BENCH_SIZES=245` limits the sizes, e.g. with a filter: `-- 'respond/245/.*gzip'`).
//! Besides criterion's lines it prints, per size, the distribution of single-query search
//! times over 200 realistic queries (substrings of real names), since one criterion line per
//! query would hide the spread.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use walletrelay::config::Limits;
use walletrelay::http::response::Response;
use walletrelay::http::{parse, Request};
use walletrelay::registry::answers::AnswerCache;
use walletrelay::registry::{synth, Registry};

const BASE: &str = "https://registry.walletconnect.org/logo";
const SIZES: [usize; 3] = [245, 10_000, 100_000];

/// The sizes to run: all of them under `cargo bench`; only the real data's size when the
/// bench binary runs as a test (`cargo test --all-targets`, a debug build, where building a
/// 100,000-entry registry alone takes minutes).
/// `REGISTRY_BENCH_SIZES` (comma-separated) picks among them.
fn sizes() -> Vec<usize> {
    if !std::env::args().any(|a| a == "--bench") {
        return SIZES[..1].to_vec();
    }
    match std::env::var("REGISTRY_BENCH_SIZES") {
        Ok(v) => v.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
        Err(_) => SIZES.to_vec(),
    }
}

fn registry(n: usize) -> Registry {
    if n == 245 {
        return Registry::load(None, BASE).expect("embedded registry");
    }
    let s = synth::generate(n, 1);
    Registry::from_json(("wallets", &s.wallets), ("dapps", &s.dapps), BASE).expect("synthetic")
}

/// A raw GET request; parse it with [`req`] inside the bench closure's scope.
fn raw(target: &str, gzip: bool) -> Vec<u8> {
    let enc = if gzip {
        "Accept-Encoding: gzip\r\n"
    } else {
        ""
    };
    format!("GET {target} HTTP/1.1\r\nHost: b\r\n{enc}\r\n").into_bytes()
}

fn req<'a>(raw: &'a [u8], limits: &Limits) -> Request<'a> {
    match parse(raw, limits) {
        Ok(Some((_, r))) => r,
        _ => panic!("bad bench request"),
    }
}

/// Realistic queries: lowercase substrings (3 to 8 characters) of names in the list,
/// picked deterministically, plus whole words.
fn queries(r: &Registry, n: usize) -> Vec<String> {
    let all = r.respond(&req(&raw("/api/v1/all", false), &Limits::default()));
    let v: serde_json::Value =
        serde_json::from_slice(&all.body.to_vec().expect("body")).expect("json");
    let names: Vec<String> = v["listings"]
        .as_object()
        .expect("listings")
        .values()
        .filter_map(|e| e["name"].as_str().map(str::to_lowercase))
        .collect();
    let mut x: u64 = 0x1234_5678;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as usize
    };
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let name: Vec<char> = names[next() % names.len()].chars().collect();
        if name.len() < 3 {
            continue;
        }
        let len = 3 + next() % 6;
        let len = len.min(name.len());
        let start = next() % (name.len() - len + 1);
        out.push(name[start..start + len].iter().collect());
    }
    out
}

const NAMED: [&str; 7] = [
    "a",
    "eth",
    "swap",
    "wallet",
    "rainbow",
    "trust wallet",
    "zzqx",
];

/// The number of matches of `q` in `/api/v1/all`, from the answer of its first match.
fn find(r: &Registry, q: &str, limits: &Limits) -> usize {
    let mut target = String::from("/api/v1/all?entries=1&page=1&search=");
    for b in q.bytes() {
        match b {
            b' ' => target.push('+'),
            b if b.is_ascii_alphanumeric() => target.push(char::from(b)),
            b => target.push_str(&format!("%{b:02X}")),
        }
    }
    let raw = raw(&target, false);
    let body = r.respond(&req(&raw, limits)).body;
    body.len()
}

fn search(c: &mut Criterion) {
    let limits = Limits::default();
    for n in sizes() {
        let r = registry(n);
        let idx = |q: &str| find(&r, q, &limits);
        let mut g = c.benchmark_group(format!("search/{n}"));
        for q in NAMED {
            g.bench_with_input(BenchmarkId::from_parameter(q), q, |b, q| {
                b.iter(|| black_box(idx(black_box(q))))
            });
        }
        let qs = queries(&r, 64);
        g.bench_function("mixed64", |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % qs.len();
                black_box(idx(&qs[i]))
            })
        });
        g.finish();
        distribution(&r, n);
    }
}

/// Median, 90th percentile and maximum of the mean time of each of 200 realistic queries
/// (with the size of the answer's body).
fn distribution(r: &Registry, n: usize) {
    let limits = Limits::default();
    let qs = queries(r, 200);
    let mut times: Vec<(Duration, usize, &str)> = qs
        .iter()
        .map(|q| {
            let reps = 50;
            let t = Instant::now();
            let mut hits = 0;
            for _ in 0..reps {
                hits = black_box(find(r, black_box(q), &limits));
            }
            (t.elapsed() / reps, hits, q.as_str())
        })
        .collect();
    times.sort();
    let at = |p: usize| times[(times.len() - 1) * p / 100];
    let (med, p90, max) = (at(50), at(90), at(100));
    println!(
        "search/{n}/200 realistic queries: median {:?} ({} B), p90 {:?}, max {:?} ({:?}, {} B)",
        med.0, med.1, p90.0, max.0, max.2, max.1
    );
}

fn assemble(c: &mut Criterion) {
    let limits = Limits::default();
    for n in sizes() {
        let r = registry(n);
        let mut g = c.benchmark_group(format!("respond/{n}"));
        let page = if n > 300 { 37 } else { 2 };
        let targets = [
            (
                "page100",
                format!("/api/v1/all?entries=100&page={page}"),
                false,
            ),
            (
                "page100_gzip",
                format!("/api/v1/all?entries=100&page={page}"),
                true,
            ),
            (
                "search_wallet_page100",
                "/api/v1/all?search=wallet&entries=100&page=1".to_string(),
                false,
            ),
            (
                "search_wallet_gzip",
                "/api/v1/all?search=wallet".to_string(),
                true,
            ),
            (
                "search_rainbow",
                "/api/v1/all?search=rainbow".to_string(),
                false,
            ),
            ("full_all_precomputed", "/api/v1/all".to_string(), true),
            (
                "logo",
                "/api/v1/logo/sm/1ae92b26df02f0abca6304df07debccd18262fdf5fe82daa81593582dac9a369"
                    .to_string(),
                false,
            ),
        ];
        for (name, target, gz) in &targets {
            let raw = raw(target, *gz);
            let rq = req(&raw, &limits);
            g.bench_function(*name, |b| b.iter(|| black_box(r.respond(black_box(&rq)))));
        }
        g.finish();
        // The same answers from a worker's answer cache, as a repeated query is served.
        let mut g = c.benchmark_group(format!("cached/{n}"));
        let mut cache = AnswerCache::new(64 << 20);
        for (name, target, gz) in &targets {
            let raw = raw(target, *gz);
            let rq = req(&raw, &limits);
            g.bench_function(*name, |b| {
                b.iter(|| black_box(cache.respond(&r, black_box(&rq))))
            });
        }
        g.finish();
    }
}

/// Two threads answering `/api/v1/all` (a precomputed, shared body) as fast as they can:
/// one `Arc<Registry>` for both, or a clone each.
fn sharing(c: &mut Criterion) {
    let limits = Limits::default();
    let shared = Arc::new(registry(245));
    let mut g = c.benchmark_group("two_threads_all");
    let run = |iters: u64, regs: [Arc<Registry>; 2]| {
        let t = Instant::now();
        std::thread::scope(|s| {
            for reg in regs {
                let limits = &limits;
                s.spawn(move || {
                    let raw = raw("/api/v1/all", true);
                    let rq = req(&raw, limits);
                    let mut keep: Vec<Response> = Vec::with_capacity(16);
                    for i in 0..iters {
                        // Hold a few answers like queued connections do, then drop them.
                        keep.push(reg.respond(&rq));
                        if i % 16 == 15 {
                            keep.clear();
                        }
                    }
                });
            }
        });
        t.elapsed()
    };
    g.bench_function("arc_shared", |b| {
        b.iter_custom(|iters| run(iters, [shared.clone(), shared.clone()]))
    });
    let clones = [Arc::new((*shared).clone()), Arc::new((*shared).clone())];
    g.bench_function("clone_per_core", |b| {
        b.iter_custom(|iters| run(iters, clones.clone()))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = search, assemble, sharing
}
criterion_main!(benches);
