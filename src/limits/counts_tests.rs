//! The shared per-address table under one thread and under many: counts exact at the cap
//! and the burst, one slot per address however many threads see it first, a full window,
//! removal racing accepts.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;

fn key(s: &str) -> u128 {
    ip::ip_key(s.parse().expect("an address"))
}

/// Slots established (counting, or being removed) for `key`.
fn slots_of(t: &AddrCounts, key: u128) -> usize {
    let (home, ident) = t.place(key);
    (0..WINDOW)
        .map(|i| t.ids[t.at(home, i)].load(SeqCst))
        .filter(|w| w >> STATE_BITS == ident)
        .filter(|w| w & STATE_MASK <= u64::from(MAX_CONNS) || w & STATE_MASK == MARK)
        .count()
}

fn slot(a: Admit) -> u32 {
    match a {
        Admit::In(s) => s,
        other => panic!("not let in: {other:?}"),
    }
}

#[test]
fn gcra_lets_the_burst_through_then_the_rate() {
    let g = Gcra::new(10.0, 3);
    let mut tat = 0;
    for _ in 0..3 {
        tat = g.next(tat, 1_000_000).expect("within the burst");
    }
    assert_eq!(g.next(tat, 1_000_000), None);
    // One every 100 ms.
    assert_eq!(g.next(tat, 1_099_999), None);
    assert!(g.next(tat, 1_100_000).is_some());
    for off in [Gcra::new(0.0, 5), Gcra::new(5.0, 0), Gcra::new(f64::NAN, 5)] {
        assert!(off.is_off());
    }
    // A rate too low for the interval to fit: one now, then not for ages.
    let slow = Gcra::new(1e-30, 1);
    let tat = slow.next(0, 5).expect("a fresh burst");
    assert_eq!(slow.next(tat, u64::MAX / 2), None);
}

#[test]
fn counts_up_to_the_cap_and_a_close_gives_a_place_back() {
    let t = AddrCounts::with_slots(1024, 3, Gcra::OFF);
    let a = key("10.0.0.1");
    let s = slot(t.admit(a, 0));
    assert_eq!(t.admit_at(s, a, 0), Admit::In(s));
    assert_eq!(t.admit(a, 0), Admit::In(s));
    assert_eq!(t.admit(a, 0), Admit::Refused(Kind::Connections));
    assert_eq!(t.admit_at(s, a, 0), Admit::Refused(Kind::Connections));
    assert_eq!(t.conns(a), 3);
    // Another address, and another /64, are counted apart; one /64 is one address.
    assert!(matches!(t.admit(key("10.0.0.2"), 0), Admit::In(_)));
    let v6 = slot(t.admit(key("2001:db8:0:1::1"), 0));
    assert_eq!(t.admit(key("2001:db8:0:1::2"), 0), Admit::In(v6));
    assert!(matches!(t.admit(key("2001:db8:0:2::1"), 0), Admit::In(x) if x != v6));
    t.release(s);
    assert_eq!(t.conns(a), 2);
    assert_eq!(t.admit(a, 0), Admit::In(s));
    assert_eq!(t.admit(a, 0), Admit::Refused(Kind::Connections));
    for _ in 0..3 {
        t.release(s);
    }
    assert_eq!(t.conns(a), 0);
    // A release with nothing counted changes nothing.
    t.release(s);
    assert_eq!(t.conns(a), 0);
}

#[test]
fn the_accept_burst_is_counted_and_refills_at_the_rate() {
    let t = AddrCounts::with_slots(1024, 0, Gcra::new(10.0, 3));
    let a = key("10.0.0.1");
    for _ in 0..3 {
        let s = slot(t.admit(a, 1000));
        t.release(s);
    }
    assert_eq!(t.admit(a, 1000), Admit::Refused(Kind::AcceptRate));
    assert_eq!(t.conns(a), 0, "a refusal counts nothing");
    assert!(
        matches!(t.admit(a, 1100), Admit::In(_)),
        "one more after 100 ms"
    );
    assert_eq!(t.admit(a, 1100), Admit::Refused(Kind::AcceptRate));
}

#[test]
fn the_sweep_frees_idle_addresses_only_once_their_rate_is_full_again() {
    let t = AddrCounts::with_slots(64, 5, Gcra::new(1.0, 2));
    let (a, b) = (key("10.0.0.1"), key("10.0.0.2"));
    let sa = slot(t.admit(a, 1000));
    let sb = slot(t.admit(b, 1000));
    t.release(sb);
    assert_eq!(t.sweep(1000, 64), 0, "b's rate is not full again");
    // One a second, a burst of 2: b's one accept is paid back after a second.
    assert_eq!(t.sweep(2000, 64), 1);
    assert_eq!((t.len(), slots_of(&t, b)), (1, 0));
    assert_eq!(t.sweep(1_000_000, 64), 0, "a holds a connection");
    assert_eq!(t.conns(a), 1);
    // A freed address comes back with a full burst.
    for _ in 0..2 {
        slot(t.admit(b, 2000));
    }
    assert_eq!(t.admit(b, 2000), Admit::Refused(Kind::AcceptRate));
    t.release(sa);
    assert_eq!(t.sweep(10_000, 64), 1);
}

#[test]
fn an_accept_takes_back_an_address_the_sweep_is_removing() {
    let t = AddrCounts::with_slots(64, 5, Gcra::new(1.0, 2));
    let a = key("10.0.0.1");
    let s = slot(t.admit(a, 1000));
    t.release(s);
    // The sweep has marked the slot: an accept takes the mark off and is counted there.
    let (_, ident) = t.place(a);
    t.ids[s as usize].store(ident << STATE_BITS | MARK, SeqCst);
    assert_eq!(t.admit(a, 1500), Admit::In(s));
    assert_eq!((t.conns(a), slots_of(&t, a)), (1, 1));
    // What it spent before the mark is not forgotten: a burst of 2, both taken.
    t.release(s);
    assert_eq!(t.admit(a, 1500), Admit::Refused(Kind::AcceptRate));
}

#[test]
fn a_full_window_has_no_room_until_an_address_leaves() {
    // One window: the whole table.
    let t = AddrCounts::with_slots(WINDOW, 1, Gcra::OFF);
    let held: Vec<u32> = (0..WINDOW)
        .map(|i| slot(t.admit(key(&format!("10.0.1.{i}")), 0)))
        .collect();
    assert_eq!(t.len(), WINDOW);
    let late = key("10.0.2.1");
    assert_eq!(t.admit(late, 0), Admit::NoRoom);
    assert_eq!(
        t.admit(key("10.0.1.0"), 0),
        Admit::Refused(Kind::Connections)
    );
    t.release(held[3]);
    assert_eq!(t.admit(late, 0), Admit::NoRoom, "not swept yet");
    assert_eq!(t.sweep(1, WINDOW), 1);
    assert!(matches!(t.admit(late, 0), Admit::In(_)));
    assert_eq!(t.len(), WINDOW);
}

#[test]
fn a_new_address_seen_first_by_many_threads_at_once_gets_one_slot() {
    const THREADS: usize = 8;
    let t = AddrCounts::with_slots(4096, 0, Gcra::OFF);
    let go = Barrier::new(THREADS);
    for round in 0..200u32 {
        let a = key(&format!("2001:db8:{round:x}::1"));
        let slots: Vec<u32> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..THREADS)
                .map(|_| {
                    sc.spawn(|| {
                        go.wait();
                        slot(t.admit(a, 0))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        assert!(
            slots.iter().all(|&s| s == slots[0]),
            "round {round}: {slots:?}"
        );
        assert_eq!(slots_of(&t, a), 1);
        assert_eq!(t.conns(a), THREADS as u32);
    }
}

#[test]
fn concurrent_accepts_and_closes_never_pass_the_cap_and_end_at_zero() {
    const THREADS: usize = 8;
    const CAP: u32 = 5;
    let keys: Vec<u128> = (0..4).map(|i| key(&format!("10.0.3.{i}"))).collect();
    let t = AddrCounts::with_slots(256, CAP, Gcra::OFF);
    // Connections each thread holds per address, as the test sees them.
    let held: Vec<AtomicUsize> = keys.iter().map(|_| AtomicUsize::new(0)).collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        // The sweep races the accepts all along (its marks must be taken back).
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                t.sweep(u64::MAX / 2000, 256);
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|n| {
                let (t, keys, held) = (&t, &keys, &held);
                sc.spawn(move || {
                    let mut mine: Vec<(usize, u32)> = Vec::new();
                    for i in 0..20_000usize {
                        let k = (i + n) % keys.len();
                        // Hold up to 3, then close the oldest.
                        if mine.len() == 3 || (i % 7 == 0 && !mine.is_empty()) {
                            let (k, s) = mine.remove(0);
                            held[k].fetch_sub(1, SeqCst);
                            t.release(s);
                        }
                        if let Admit::In(s) = t.admit(keys[k], 0) {
                            let now = held[k].fetch_add(1, SeqCst) + 1;
                            assert!(now <= CAP as usize, "{now} held under a cap of {CAP}");
                            mine.push((k, s));
                        }
                    }
                    for (k, s) in mine {
                        held[k].fetch_sub(1, SeqCst);
                        t.release(s);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        stop.store(true, Ordering::Relaxed);
    });
    for &k in &keys {
        assert_eq!(t.conns(k), 0);
        assert!(slots_of(&t, k) <= 1);
    }
    t.sweep(u64::MAX / 2000, 256);
    assert!(t.is_empty(), "every address left");
}

#[test]
fn the_cap_and_the_burst_are_exact_over_threads() {
    const THREADS: usize = 4;
    let run = |t: &AddrCounts, a: u128, close: bool| -> usize {
        let go = Barrier::new(THREADS);
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            // The sweep marks the address whenever it has no connection, and must give it
            // back (its rate is spent) whether or not an accept took the mark off first.
            sc.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    t.sweep(0, 1024);
                }
            });
            let hs: Vec<_> = (0..THREADS)
                .map(|_| {
                    sc.spawn(|| {
                        go.wait();
                        let mut n = 0;
                        // Each thread takes what it can; the table says when it is over.
                        loop {
                            match t.admit(a, 0) {
                                Admit::In(s) => {
                                    n += 1;
                                    if close {
                                        t.release(s);
                                    }
                                }
                                Admit::Refused(_) => return n,
                                Admit::NoRoom => panic!("no room"),
                            }
                        }
                    })
                })
                .collect();
            let n = hs.into_iter().map(|h| h.join().expect("thread")).sum();
            stop.store(true, Ordering::Relaxed);
            n
        })
    };
    for cap in [1, 20, 1000] {
        let t = AddrCounts::with_slots(1024, cap, Gcra::OFF);
        let a = key("10.0.4.1");
        assert_eq!(run(&t, a, false), cap as usize);
        assert_eq!(t.conns(a), cap);
    }
    for burst in [1, 20, 500] {
        let t = AddrCounts::with_slots(1024, 0, Gcra::new(0.001, burst));
        let a = key("10.0.4.2");
        assert_eq!(run(&t, a, true), burst as usize);
        assert_eq!(t.conns(a), 0);
    }
}
