//! The cache's unit tests (`cache.rs`).
use super::*;

fn b(s: &str) -> ArcBuf {
    ArcBuf::copy_from_slice(s.as_bytes())
}

/// Fills every expiry lane with a message that expires last of all and stays, so that what
/// is inserted after goes to the heap. Returns their keys.
fn pin_lanes(c: &mut Cache) -> Vec<usize> {
    (0..LANES as u64)
        .map(|i| c.insert(entry(0, i, b("pin"), u64::MAX - i)))
        .collect()
}

/// A message of the topic in slot `topic`, number 0, with no beta part and no publisher.
fn entry(topic: u32, hash: u64, data: ArcBuf, expires: u64) -> Entry {
    Entry {
        topic,
        topic_seq: 0,
        hash,
        data,
        beta_len: 0,
        expires,
        origin: Origin::NONE,
    }
}

#[test]
fn evicts_oldest_and_expires_by_time() {
    let mut c = Cache::default();
    let a = c.insert(entry(1, 10, b("a"), 500));
    let bb = c.insert(entry(1, 11, b("b"), 100));
    let cc = c.insert(entry(2, 12, b("c"), 300));
    assert_eq!(c.oldest(), Some(a));
    assert_eq!(c.next_expired(50), None);
    assert_eq!(c.next_expired(100), Some(bb));
    c.remove(bb);
    assert_eq!(c.next_expired(400), Some(cc));
    c.remove(cc);
    assert_eq!(c.oldest(), Some(a));
    c.remove(a);
    assert!(c.is_empty());
    assert_eq!(c.bytes(), 0);
    assert_eq!(c.oldest(), None);
    assert_eq!(c.next_expired(u64::MAX), None);
}

#[test]
fn heap_stays_bounded_under_churn() {
    let mut c = Cache::default();
    pin_lanes(&mut c);
    for i in 0..100_000u64 {
        let k = c.insert(entry(1, i, b("m"), 1_000_000 + i));
        c.remove(k);
    }
    let e = &c.expiry;
    assert!(
        e.heap.len() + e.old.len() <= 1024 + 2 && e.heap_live == 0,
        "heap {} + {}",
        e.heap.len(),
        e.old.len()
    );
}

/// A cache made with room for `n` messages holds `n` of them, and churns through many
/// more (removals leaving stale heap entries, heap rebuilds), without any of its tables
/// growing: a growth is a stall of the whole worker (see `with_capacity`).
#[test]
fn tables_never_grow_within_the_presized_count() {
    const N: usize = 20_000;
    let mut c = Cache::with_capacity(N);
    let caps = |c: &Cache| {
        let e = &c.expiry;
        (
            c.msgs.capacity(),
            e.heap.capacity().min(e.old.capacity()),
            e.heap.capacity().max(e.old.capacity()),
        )
    };
    let grew = |now: (usize, usize, usize), was: (usize, usize, usize)| {
        now.0 > was.0 || now.1 > was.1 || now.2 > was.2
    };
    let before = caps(&c);
    assert!(before.0 >= N && before.1 >= 2 * N, "{before:?}");
    let mut keys = std::collections::VecDeque::new();
    for i in 0..N as u64 {
        keys.push_back(c.insert(entry((i % 97) as u32, i, b("m"), 1_000_000 - i)));
    }
    assert!(!grew(caps(&c), before), "filling to N grew a table");
    // Steady state at the budget: each insert evicts the oldest (a stale heap entry).
    for i in 0..(10 * N) as u64 {
        let old = keys.pop_front().expect("full");
        c.remove(old);
        keys.push_back(c.insert(entry((i % 89) as u32, N as u64 + i, b("m"), 2_000_000 + i)));
        assert_eq!(c.len(), N);
    }
    assert!(
        c.compactions() >= 4,
        "only {} compactions ran",
        c.compactions()
    );
    assert!(
        !grew(caps(&c), before),
        "churning at N grew a table: {:?}",
        caps(&c)
    );
    let e = &c.expiry;
    assert!(e.heap.len() <= 2 * N + 1024 + 1, "heap {}", e.heap.len());
}

/// The expiry index against a model (a sorted map of every live message), through
/// random inserts, removals and expiry sweeps, with compactions running in between:
/// every sweep returns exactly the live messages due, earliest first, and never one
/// that is gone. Also: no single operation scans more than `COMPACT_STEP` slots.
/// Run with the lanes pinned (`pin`: every message in the heap) or free (lanes and heap
/// both, as random expiries fall); returns the compactions and the sweeps that ran during
/// one.
fn expiry_model_run(pin: bool) -> (u64, usize) {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut c = Cache::with_capacity(1024);
    let pinned = if pin { pin_lanes(&mut c) } else { Vec::new() };
    let mut model = std::collections::BTreeMap::new(); // (expires, seq) -> key
    let mut live: Vec<usize> = Vec::new();
    let mut now = 0u64;
    let mut during = 0; // sweeps that ran while a compaction was under way
    for step in 0..300_000u64 {
        let was = c.expiry.scan;
        let mut calls = 1; // cache calls made by this step, each allowed one scan step
        match next() % 10 {
            // Insert, expiring within the next 0..1000 s (so removed messages leave
            // stale entries that build up and force compactions).
            0..=4 if live.len() < 1000 => {
                let exp = now + next() % 1_000_000;
                let k = c.insert(entry(1, step, b("m"), exp));
                model.insert((exp, c.get(k).unwrap().seq), k);
                live.push(k);
            }
            // Remove a random live message (eviction, topic cap).
            0..=8 if !live.is_empty() => {
                let i = (next() as usize) % live.len();
                let k = live.swap_remove(i);
                let m = c.remove(k).expect("live");
                assert!(model.remove(&(m.expires, m.seq)).is_some());
            }
            // Time passes; sweep.
            _ => {
                during += usize::from(c.expiry.scan.is_some());
                now += next() % 2000;
                while let Some(k) = c.next_expired(now) {
                    let m = c.get(k).expect("returned key is live");
                    assert!(!pinned.contains(&k));
                    let first = model.first_key_value().map(|(&(e, s), &k)| (e, s, k));
                    assert_eq!(first, Some((m.expires, m.seq, k)), "not the earliest due");
                    assert!(m.expires <= now);
                    model.pop_first();
                    live.retain(|&x| x != k);
                    c.remove(k);
                    calls += 1;
                }
                if let Some((&(e, _), _)) = model.first_key_value() {
                    assert!(e > now, "a due message was not returned");
                }
            }
        }
        if let (Some((a, _)), Some((b, _))) = (was, c.expiry.scan) {
            assert!(
                b >= a && b - a <= calls * COMPACT_STEP,
                "{calls} calls scanned {a}..{b}"
            );
        }
        assert_eq!(c.len(), model.len() + pinned.len());
    }
    (c.compactions(), during)
}

#[test]
fn expiry_matches_a_model_through_incremental_compactions() {
    let (compactions, during) = expiry_model_run(true);
    assert!(compactions >= 10, "only {compactions} compactions ran");
    assert!(during >= 10, "only {during} sweeps ran during a compaction");
    // Lanes and heap together: the same answers.
    let (compactions, _) = expiry_model_run(false);
    assert!(compactions >= 1, "the heap never compacted");
}

/// The usual case: a few ttls, time moving on. Every message goes to a lane (the heap
/// stays empty: nothing to compact), and expiry still gives every due message, earliest
/// first, against a model, whatever is removed in between.
#[test]
fn messages_of_a_few_ttls_each_keep_to_a_lane() {
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut c = Cache::with_capacity(4096);
    let mut model = std::collections::BTreeMap::new();
    let mut live = Vec::new();
    let mut now = 1_000u64;
    for step in 0..200_000u64 {
        match next() % 8 {
            0..=3 if live.len() < 3000 => {
                let ttl = [300_000, 3_600_000, 86_400_000, 30_000][(next() % 4) as usize];
                let k = c.insert(entry(1, step, b("m"), now + ttl));
                model.insert((now + ttl, c.get(k).unwrap().seq), k);
                live.push(k);
            }
            4..=5 if !live.is_empty() => {
                let k = live.swap_remove((next() as usize) % live.len());
                let m = c.remove(k).expect("live");
                assert!(model.remove(&(m.expires, m.seq)).is_some());
            }
            _ => {
                now += next() % 50_000;
                while let Some(k) = c.next_expired(now) {
                    let first = model.pop_first().map(|(_, k)| k);
                    assert_eq!(first, Some(k), "not the earliest due");
                    live.retain(|&x| x != k);
                    c.remove(k);
                }
                assert!(model.first_key_value().is_none_or(|(&(e, _), _)| e > now));
            }
        }
        assert_eq!(
            c.expiry.heap_live, 0,
            "step {step}: a message went to the heap"
        );
        assert!(c.expiry.heap.is_empty() && c.expiry.old.is_empty());
    }
    assert_eq!(c.len(), model.len());
}

#[test]
fn the_cache_is_presized_for_its_budget_unless_overcommit_is_strict() {
    let gib = 1 << 30;
    // Room for the most messages a GiB can hold: each costs at least 144 bytes.
    assert_eq!(cache_presize(gib, false), gib / 144);
    assert!(cache_presize(gib, false) * (ENTRY_OVERHEAD + 26) > gib);
    // Under strict overcommit: one per KiB, at most a million.
    assert_eq!(cache_presize(gib, true), 1 << 20);
    assert_eq!(cache_presize(64 << 20, true), 64 << 10);
}

/// An entry keeps to two cache lines with its lane links (the 32-bit links, see `MAX_LEN`):
/// a third line would be one more miss for every eviction.
#[test]
fn an_entry_stays_in_two_cache_lines() {
    assert!(std::mem::size_of::<Cached>() <= 128);
    assert!(cache_presize(usize::MAX, false) <= MAX_LEN);
}
