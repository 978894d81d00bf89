//! The durable store's figures (docs/PERFORMANCE.md, "Durable store"): appends of 600-byte
//! records in batches of 1, 16 and 64 per flush with `--fsync off|everysec|always`, sync
//! latency, one sync thread for two logs against one each, and reading 1 GiB back.
//!
//! `cargo bench --bench store -- [appends|syncers|recovery] [--mode M] [--dir DIR]
//! [--secs S] [--gib G]`: each case runs for S seconds (default 2) or 1M records, in DIR (default a
//! fresh directory under the system temp dir, deleted after each case). `recovery` writes G
//! GiB (default 1), drops the page cache when it can (root), and reads it back twice (cold,
//! then warm). Without `--bench` (`cargo test --all-targets`) every case runs once, tiny.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use walletrelay::store::entry::{Entry, Ns};
use walletrelay::store::{self, FsyncMode, Log, LogConfig, SyncEvent, Syncer};

/// Bytes of the data field that make the whole record (header + entry) 600 bytes.
const DATA: usize = 600 - 12 - 3 - 24 - 2 - 64 - 4;
const TOPIC: &str = "7f6e5d4c3b2a19087f6e5d4c3b2a19087f6e5d4c3b2a19087f6e5d4c3b2a1908";

struct Opts {
    bench: bool,
    /// Only this mode (`--mode memory|off|everysec|always`).
    mode: Option<String>,
    secs: f64,
    max_records: u64,
    dir: PathBuf,
    gib: f64,
}

/// The highest synced LSN, and a way to wait for it.
#[derive(Default)]
struct Acks {
    synced: AtomicU64,
    m: Mutex<()>,
    cv: Condvar,
}

impl Acks {
    fn callback(self: &Arc<Self>) -> store::OnSync {
        let a = self.clone();
        Box::new(move |ev| {
            if let SyncEvent::Synced(n) = ev {
                a.synced.store(n, Ordering::Release);
                let _g = a.m.lock().unwrap();
                a.cv.notify_all();
            }
        })
    }
    fn wait_until(&self, lsn: u64) {
        let mut g = self.m.lock().unwrap();
        while self.synced.load(Ordering::Acquire) < lsn {
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }
}

fn message(seq: u64, data: &[u8]) -> Entry<'_> {
    Entry::Message {
        ns: Ns::V2,
        topic: TOPIC,
        epoch: 1,
        seq,
        expires_unix_ms: 1_900_000_000_000,
        prompt: true,
        body: true,
        data,
    }
}

/// One writer: batches of `batch` records, at most `window` records not yet synced
/// (`always`: clients waiting for their answer). Returns records/s.
fn writer(log: &mut Log, acks: &Acks, batch: u64, window: Option<u64>, o: &Opts) -> (f64, f64) {
    let data = vec![b'd'; DATA];
    let t0 = Instant::now();
    let c0 = thread_cpu_us();
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < o.secs && n < o.max_records {
        if let Some(w) = window {
            acks.wait_until((log.last_lsn() + batch).saturating_sub(w));
        }
        for _ in 0..batch {
            n += 1;
            log.append_entry(&message(n, &data)).unwrap();
        }
        log.flush().unwrap();
    }
    let cpu = (thread_cpu_us() - c0) as f64 / n as f64;
    if window.is_some() {
        acks.wait_until(log.last_lsn());
    }
    (n as f64 / t0.elapsed().as_secs_f64(), cpu)
}

/// CPU time of the calling thread, microseconds (what an event loop would pay, whatever
/// else runs on the machine).
fn thread_cpu_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec on this stack frame for the whole call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// An empty `dir`, after the previous case's files are gone and (when measuring) written
/// back with `sync`, so that one case's write-back does not slow the next one's syncs.
fn fresh(o: &Opts) {
    let _ = std::fs::remove_dir_all(&o.dir);
    if o.bench {
        let _ = std::process::Command::new("sync").status();
    }
    std::fs::create_dir_all(&o.dir).unwrap();
}

fn mode_name(m: Option<FsyncMode>) -> &'static str {
    match m {
        None => "memory",
        Some(FsyncMode::Off) => "off",
        Some(FsyncMode::Everysec) => "everysec",
        Some(FsyncMode::Always) => "always",
    }
}

/// The baseline: encoding the same entries into a buffer that is cleared per batch.
fn in_memory(batch: u64, o: &Opts) -> (f64, f64) {
    let data = vec![b'd'; DATA];
    let mut buf = Vec::with_capacity(64 * 600);
    let t0 = Instant::now();
    let c0 = thread_cpu_us();
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < o.secs && n < o.max_records {
        buf.clear();
        for _ in 0..batch {
            n += 1;
            message(n, &data).encode(&mut buf).unwrap();
        }
        std::hint::black_box(&buf);
    }
    let cpu = (thread_cpu_us() - c0) as f64 / n as f64;
    (n as f64 / t0.elapsed().as_secs_f64(), cpu)
}

fn appends(o: &Opts) {
    println!(
        "mode      batch  window  records/s   MB/s  cpu µs/rec  syncs  sync mean µs  p50<=µs  p99<=µs"
    );
    let modes = [
        (None, None),
        (Some(FsyncMode::Off), None),
        (Some(FsyncMode::Everysec), None),
        (Some(FsyncMode::Always), Some(64)),
        (Some(FsyncMode::Always), Some(1024)),
    ];
    for (mode, window) in modes {
        if o.mode.as_deref().is_some_and(|m| m != mode_name(mode)) {
            continue;
        }
        for batch in [1u64, 16, 64] {
            let ((rate, cpu), m) = match mode {
                None => (in_memory(batch, o), None),
                Some(mode) => {
                    fresh(o);
                    let s = Syncer::start(mode).unwrap();
                    let acks = Arc::new(Acks::default());
                    let mut log =
                        Log::open(&o.dir, "w0", LogConfig::default(), &s, acks.callback()).unwrap();
                    let rate = writer(&mut log, &acks, batch, window, o);
                    (rate, Some(log.metrics().clone()))
                }
            };
            let (syncs, mean, p50, p99) = m.map_or((0, 0, 0, 0), |m| {
                let h = &m.sync_latency;
                let mean = h.sum_us() / h.count().max(1);
                (h.count(), mean, h.quantile_us(0.5), h.quantile_us(0.99))
            });
            println!(
                "{:<9} {batch:>5}  {:>6}  {rate:>9.0}  {:>5.0}  {cpu:>10.3}  {syncs:>5}  {mean:>12}  {p50:>7}  {p99:>7}",
                mode_name(mode),
                window.map_or("-".to_string(), |w| w.to_string()),
                rate * 600.0 / 1e6
            );
        }
    }
    let _ = std::fs::remove_dir_all(&o.dir);
}

/// Two logs written by two threads, `always` with 64 records in flight each: one sync
/// thread for both against one each.
fn syncers(o: &Opts) {
    println!("sync threads  batch  records/s (2 writers)  syncs");
    for shared in [true, false] {
        for batch in [1u64, 16] {
            fresh(o);
            let a = Syncer::start(FsyncMode::Always).unwrap();
            let b = if shared {
                None
            } else {
                Some(Syncer::start(FsyncMode::Always).unwrap())
            };
            let rates: Vec<(f64, u64)> = std::thread::scope(|sc| {
                let hs: Vec<_> = ["w0", "w1"]
                    .iter()
                    .map(|w| {
                        let s = if *w == "w1" {
                            b.as_ref().unwrap_or(&a)
                        } else {
                            &a
                        };
                        let acks = Arc::new(Acks::default());
                        let mut log =
                            Log::open(&o.dir, w, LogConfig::default(), s, acks.callback()).unwrap();
                        sc.spawn(move || {
                            let r = writer(&mut log, &acks, batch, Some(64), o).0;
                            (r, log.metrics().syncs.get())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let total: f64 = rates.iter().map(|r| r.0).sum();
            let syncs: u64 = rates.iter().map(|r| r.1).sum();
            let name = if shared { "1 for both" } else { "1 per log" };
            println!("{name:<12}  {batch:>5}  {total:>21.0}  {syncs:>5}");
        }
    }
    let _ = std::fs::remove_dir_all(&o.dir);
}

fn drop_caches() -> bool {
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn recovery(o: &Opts) {
    fresh(o);
    let target = (o.gib * (1u64 << 30) as f64) as u64;
    let s = Syncer::start(FsyncMode::Off).unwrap();
    let acks = Arc::new(Acks::default());
    let mut log = Log::open(&o.dir, "w0", LogConfig::default(), &s, acks.callback()).unwrap();
    let data = vec![b'd'; DATA];
    let t0 = Instant::now();
    let mut n = 0;
    while log.metrics().bytes_written.get() < target {
        for _ in 0..64 {
            n += 1;
            log.append_entry(&message(n, &data)).unwrap();
        }
        log.flush().unwrap();
    }
    log.sync_now().unwrap();
    println!(
        "wrote {n} records, {} MB, in {:.2} s (synced)",
        log.metrics().bytes_written.get() / 1_000_000,
        t0.elapsed().as_secs_f64()
    );
    drop((log, s));
    for pass in ["cold", "warm"] {
        let cold = pass == "cold" && o.bench && drop_caches();
        let t0 = Instant::now();
        let mut seqs = 0u64;
        let stats = store::recover(&o.dir, |_, _, p| {
            if let Ok(Entry::Message { seq, .. }) = Entry::decode(p) {
                seqs = seqs.wrapping_add(seq);
            }
            Ok(())
        })
        .unwrap();
        let secs = t0.elapsed().as_secs_f64();
        assert_eq!(stats.records, n);
        println!(
            "recovery {pass}{}: {} records, {} MB in {secs:.2} s = {:.0} MB/s ({:.0} records/s)",
            if pass == "cold" && !cold {
                " (page cache NOT dropped)"
            } else {
                ""
            },
            stats.records,
            stats.bytes / 1_000_000,
            stats.bytes as f64 / 1e6 / secs,
            stats.records as f64 / secs
        );
    }
    let _ = std::fs::remove_dir_all(&o.dir);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let dir = args
        .iter()
        .position(|a| a == "--dir")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("wr-store-bench-{}", std::process::id()))
        });
    let mut o = Opts {
        bench,
        mode: args
            .iter()
            .position(|a| a == "--mode")
            .and_then(|i| args.get(i + 1))
            .cloned(),
        secs: get("--secs").unwrap_or(2.0),
        max_records: 1_000_000,
        dir,
        gib: get("--gib").unwrap_or(1.0),
    };
    if !bench {
        o.secs = 0.05;
        o.max_records = 2_000;
        o.gib = 0.002;
    }
    let which: Vec<&str> = ["appends", "syncers", "recovery"]
        .into_iter()
        .filter(|w| args.iter().any(|a| a == w))
        .collect();
    let all = which.is_empty();
    if all || which.contains(&"appends") {
        appends(&o);
    }
    if all || which.contains(&"syncers") {
        syncers(&o);
    }
    if all || which.contains(&"recovery") {
        recovery(&o);
    }
}
