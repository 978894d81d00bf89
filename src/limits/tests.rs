//! The limiter as a worker drives it: accept, upgrade, requests, removal.

use super::*;
use crate::config::Limits;

fn limits(args: &[&str]) -> Limits {
    use clap::Parser;
    let argv = ["walletrelay"].iter().chain(args);
    crate::config::Config::parse_from(argv).limits
}

fn limiter(args: &[&str], workers: usize) -> Limiter {
    Limiter::new(Policy::new(&limits(args), workers))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const PUBLISH: Cost = Cost {
    publishes: 1,
    bytes: 10,
    subscribes: 0,
};

#[test]
fn connections_per_address_are_capped_and_released() {
    let mut l = limiter(&["--max-connections-per-ip", "2"], 1);
    let mut a = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    let _b = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    assert_eq!(
        l.on_accept(ip("10.0.0.1"), 0).unwrap_err(),
        Kind::Connections
    );
    // Another address is not affected; IPv6 counts per /64.
    assert!(l.on_accept(ip("10.0.0.2"), 0).is_ok());
    let _c = l.on_accept(ip("2001:db8::1"), 0).unwrap();
    let _d = l.on_accept(ip("2001:db8::2"), 0).unwrap();
    assert!(l.on_accept(ip("2001:db8::3"), 0).is_err());
    l.release(&mut a);
    assert!(l.on_accept(ip("10.0.0.1"), 0).is_ok());
}

/// `workers` limiters of one process (one policy, so one table of per-address counts).
fn workers(args: &[&str], workers: usize) -> Vec<Limiter> {
    let p = Policy::new(&limits(args), workers);
    (0..workers).map(|_| Limiter::new(p.clone())).collect()
}

#[test]
fn the_cap_is_exact_across_the_workers() {
    for n in [2, 4] {
        let mut ws = workers(&["--max-connections-per-ip", "9"], n);
        // However the connections fall on the workers: 9 in, the 10th out, on any worker.
        let mut held: Vec<(usize, ConnLimit)> = (0..9)
            .map(|i| {
                let w = (i * i + i / 3) % n;
                (w, ws[w].on_accept(ip("10.0.0.1"), 0).unwrap())
            })
            .collect();
        for w in ws.iter_mut() {
            assert_eq!(
                w.on_accept(ip("10.0.0.1"), 0).unwrap_err(),
                Kind::Connections
            );
        }
        // A close on one worker is a place on any other.
        let (w, mut lim) = held.remove(4);
        ws[w].release(&mut lim);
        let other = (w + 1) % n;
        let lim = ws[other].on_accept(ip("10.0.0.1"), 0).unwrap();
        held.push((other, lim));
        assert!(ws[w].on_accept(ip("10.0.0.1"), 0).is_err());
        for (w, mut lim) in held {
            ws[w].release(&mut lim);
        }
        let counts = ws[0].policy.counts.clone().unwrap();
        assert_eq!(counts.conns(ip::ip_key(ip("10.0.0.1"))), 0);
        assert!(ws.iter().all(|w| w.split_accepts() == 0));
    }
}

#[test]
fn the_accept_burst_is_exact_across_the_workers() {
    let args = [
        "--accept-rate-per-ip",
        "0.001",
        "--accept-burst-per-ip",
        "6",
    ];
    let mut ws = workers(&args, 3);
    for i in 0..6 {
        let mut lim = ws[i % 3].on_accept(ip("10.0.0.1"), 0).unwrap();
        ws[i % 3].release(&mut lim);
    }
    for w in ws.iter_mut() {
        assert_eq!(
            w.on_accept(ip("10.0.0.1"), 0).unwrap_err(),
            Kind::AcceptRate
        );
    }
    assert!(ws[1].on_accept(ip("10.0.0.2"), 0).is_ok());
}

#[test]
fn an_address_the_shared_table_has_no_room_for_gets_the_workers_share() {
    use counts::WINDOW;
    let mut p = Policy::new(&limits(&["--max-connections-per-ip", "4"]), 2);
    // A table of one window, full of other addresses.
    let table = Arc::new(AddrCounts::with_slots(WINDOW, 4, Gcra::OFF));
    let others: Vec<u32> = (0..WINDOW)
        .map(
            |i| match table.admit(ip::ip_key(ip(&format!("10.9.0.{i}"))), 0) {
                Admit::In(s) => s,
                a => panic!("{a:?}"),
            },
        )
        .collect();
    p.counts = Some(table.clone());
    let mut l = Limiter::new(p);
    // Half the cap on this worker, counted here alone.
    let mut a = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    let _b = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    assert_eq!(
        l.on_accept(ip("10.0.0.1"), 0).unwrap_err(),
        Kind::Connections
    );
    assert_eq!(l.split_accepts(), 2);
    // Room again: the next one is counted in the table, and a close gives back a
    // connection counted here alone first.
    table.release(others[0]);
    table.sweep(1, WINDOW);
    l.release(&mut a);
    let key = ip::ip_key(ip("10.0.0.1"));
    let mut c = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    assert_eq!((table.conns(key), l.split_accepts()), (1, 2));
    l.release(&mut a);
    assert_eq!(table.conns(key), 1, "a no-op: `a` was released already");
    l.release(&mut c);
    assert_eq!(table.conns(key), 1, "`_b`, counted here alone, went first");
    drop(l);
    assert_eq!(table.conns(key), 0, "a limiter gives back what it holds");
}

#[test]
fn accept_rate_per_address() {
    let args = ["--accept-rate-per-ip", "10", "--accept-burst-per-ip", "3"];
    let mut l = limiter(&args, 1);
    for _ in 0..3 {
        l.on_accept(ip("10.0.0.1"), 1000).unwrap();
    }
    assert_eq!(
        l.on_accept(ip("10.0.0.1"), 1000).unwrap_err(),
        Kind::AcceptRate
    );
    assert!(l.on_accept(ip("10.0.0.2"), 1000).is_ok());
    assert!(
        l.on_accept(ip("10.0.0.1"), 1100).is_ok(),
        "refilled after 100 ms"
    );
}

/// A limiter blocking after `after` refusals at accept in a second, for `ms`; 10.0.0.1 has
/// had its one connection, so each of its next ones is refused.
fn storm_limiter(after: &str, ms: &str) -> Limiter {
    let args = [
        "--accept-rate-per-ip",
        "0.001",
        "--accept-burst-per-ip",
        "1",
        "--accept-block-after",
        after,
        "--accept-block-ms",
        ms,
    ];
    let mut l = limiter(&args, 1);
    l.on_accept(ip("10.0.0.1"), 0).unwrap();
    l
}

#[test]
fn a_storm_of_refusals_in_one_second_blocks_the_address_for_a_while() {
    let mut l = storm_limiter("5", "3000");
    // Refusals spread over more than a second each: never 5 in one second.
    for t in 0..8 {
        assert!(l.on_accept(ip("10.0.0.1"), 10 + t * 300).is_err());
        l.tick(10 + t * 300);
        assert!(l.take_block_change().is_none(), "at {t}");
    }
    // 5 in one second: blocked (one program with the address), counted once.
    let t0 = 5000;
    for i in 0..5 {
        assert_eq!(
            l.on_accept(ip("10.0.0.1"), t0 + i).unwrap_err(),
            Kind::AcceptRate
        );
    }
    assert!(l.take_block_change().is_some_and(|p| !p.is_empty()));
    assert_eq!(l.blocks(), (1, 1));
    // Still refused at accept (a connection made before the filter), not blocked twice.
    for i in 0..10 {
        assert!(l.on_accept(ip("10.0.0.1"), t0 + 10 + i).is_err());
    }
    assert!(l.take_block_change().is_none());
    assert_eq!(l.blocks(), (1, 1));
    // The block ends after 3 s: the filter comes off.
    l.tick(t0 + 4 + 2999);
    assert!(l.take_block_change().is_none());
    l.tick(t0 + 4 + 3000);
    assert!(l.take_block_change().is_some_and(|p| p.is_empty()));
    assert_eq!(l.blocks(), (1, 0));
}

#[test]
fn a_storm_that_goes_on_is_blocked_longer_each_time_then_forgiven() {
    let mut l = storm_limiter("2", "100");
    // Two refusals at `t` block the address; how long until the block ends.
    let block = |l: &mut Limiter, t: &mut u64| {
        let start = *t;
        for _ in 0..2 {
            assert!(l.on_accept(ip("10.0.0.1"), start).is_err());
        }
        assert_eq!(l.blocks().1, 1, "blocked at {start}");
        while l.blocks().1 == 1 {
            *t += 1;
            l.tick(*t);
        }
        *t - start
    };
    let mut t = 10;
    // Storming again as soon as each block ends: each one twice as long, up to 64 times.
    let lengths: Vec<u64> = (0..9).map(|_| block(&mut l, &mut t)).collect();
    assert_eq!(lengths, [100, 200, 400, 800, 1600, 3200, 6400, 6400, 6400]);
    // Quiet for less than the last block's length: still in the row.
    t += 6399;
    assert_eq!(block(&mut l, &mut t), 6400);
    // Quiet for as long as the last block: forgiven, back to the first length.
    t += 6400;
    assert_eq!(block(&mut l, &mut t), 100);
    assert_eq!(l.blocks().0, 11);
}

#[test]
fn blocks_are_split_over_the_workers_and_off_with_0() {
    // Blocks begun after `refusals` refusals at accept, all in the same millisecond.
    let over = |args: &[&str], workers, refusals: u32| {
        let mut l = limiter(args, workers);
        let mut refused = 0;
        for _ in 0..refusals + 100 {
            if refused == refusals {
                break;
            }
            refused += u32::from(l.on_accept(ip("10.0.0.1"), 0).is_err());
        }
        assert_eq!(refused, refusals);
        l.blocks().0
    };
    let rate = [
        "--accept-rate-per-ip",
        "0.001",
        "--accept-burst-per-ip",
        "4",
    ];
    let with = |extra: &[&'static str]| [&rate[..], extra].concat();
    let after8 = with(&["--accept-block-after", "8"]);
    // 8 a second over 2 workers: 4 each.
    assert_eq!(over(&after8, 2, 3), 0);
    assert_eq!(over(&after8, 2, 4), 1);
    assert_eq!(over(&after8, 1, 7), 0);
    assert_eq!(over(&after8, 1, 8), 1);
    assert_eq!(over(&with(&["--accept-block-after", "0"]), 1, 5000), 0);
    assert_eq!(over(&with(&["--accept-block-ms", "0"]), 1, 5000), 0);
    // The default: 1,000 a second.
    assert_eq!(over(&rate, 1, 999), 0);
    assert_eq!(over(&rate, 1, 1000), 1);
}

#[test]
fn publishes_per_connection_then_retry_after() {
    let mut l = limiter(&["--publish-rate", "10", "--publish-burst", "2"], 1);
    let lim = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    let mut own = l.conn_buckets(0);
    l.admit(&lim, &mut own, PUBLISH, 0).unwrap();
    l.admit(&lim, &mut own, PUBLISH, 0).unwrap();
    let e = l.admit(&lim, &mut own, PUBLISH, 0).unwrap_err();
    assert_eq!(e.kind, Kind::Publish);
    assert_eq!(e.retry_after_ms, 100);
    assert_eq!(own.refusals, 1);
    l.admit(&lim, &mut own, PUBLISH, 100).unwrap();
    assert_eq!(own.refusals, 0, "a request let through ends the run");
}

#[test]
fn the_address_bucket_is_shared_by_its_connections() {
    let mut l = limiter(&["--publish-rate", "0.001", "--publish-burst", "3"], 1);
    let a = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    let b = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    let c = l.on_accept(ip("10.0.0.2"), 0).unwrap();
    let (mut oa, mut ob, mut oc) = (l.conn_buckets(0), l.conn_buckets(0), l.conn_buckets(0));
    l.admit(&a, &mut oa, PUBLISH, 0).unwrap();
    l.admit(&a, &mut oa, PUBLISH, 0).unwrap();
    l.admit(&b, &mut ob, PUBLISH, 0).unwrap();
    // `b` has tokens of its own, its address has none left.
    assert_eq!(
        l.admit(&b, &mut ob, PUBLISH, 0).unwrap_err().kind,
        Kind::Publish
    );
    l.admit(&c, &mut oc, PUBLISH, 0).unwrap();
}

#[test]
fn the_client_bucket_is_shared_by_its_connections_from_any_address() {
    let mut l = limiter(&["--subscribe-rate", "0.001", "--subscribe-burst", "4"], 1);
    let mut a = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    let mut b = l.on_accept(ip("10.0.0.2"), 0).unwrap();
    let client = crate::auth::ClientKey([7; 32]);
    l.bind_client(&mut a, &client, 0);
    l.bind_client(&mut b, &client, 0);
    let (mut oa, mut ob) = (l.conn_buckets(0), l.conn_buckets(0));
    let three = Cost {
        subscribes: 3,
        ..Cost::default()
    };
    l.admit(&a, &mut oa, three, 0).unwrap();
    let e = l.admit(&b, &mut ob, three, 0).unwrap_err();
    assert_eq!(e.kind, Kind::Subscribe);
    assert_eq!(l.tracked().1, 1);
    l.release(&mut a);
    l.release(&mut b);
}

#[test]
fn a_refused_request_takes_nothing() {
    let args = [
        "--publish-rate",
        "0.001",
        "--publish-burst",
        "5",
        "--publish-bytes-rate",
        "0.001",
        "--publish-bytes-burst",
        "100",
    ];
    let mut l = limiter(&args, 1);
    let lim = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    let mut own = l.conn_buckets(0);
    let big = Cost {
        publishes: 1,
        bytes: 90,
        subscribes: 0,
    };
    l.admit(&lim, &mut own, big, 0).unwrap();
    // Over the bytes: refused, and its publish token is not spent.
    assert_eq!(
        l.admit(&lim, &mut own, big, 0).unwrap_err().kind,
        Kind::Bytes
    );
    let empty = Cost {
        publishes: 1,
        ..Cost::default()
    };
    for _ in 0..4 {
        l.admit(&lim, &mut own, empty, 0).unwrap();
    }
    assert_eq!(
        l.admit(&lim, &mut own, empty, 0).unwrap_err().kind,
        Kind::Publish
    );
}

#[test]
fn exempt_addresses_skip_every_limit() {
    let args = [
        "--max-connections-per-ip",
        "1",
        "--publish-rate",
        "0.001",
        "--publish-burst",
        "1",
        "--limit-exempt",
        "10.0.0.0/8,2001:db8::/32",
    ];
    let mut l = limiter(&args, 1);
    for _ in 0..5 {
        let lim = l.on_accept(ip("10.1.2.3"), 0).unwrap();
        let mut own = l.conn_buckets(0);
        for _ in 0..5 {
            l.admit(&lim, &mut own, PUBLISH, 0).unwrap();
        }
    }
    assert_eq!(l.tracked().0, 0, "exempt addresses take no table entry");
    l.on_accept(ip("11.0.0.1"), 0).unwrap();
    assert!(l.on_accept(ip("11.0.0.1"), 0).is_err());
}

#[test]
fn forwarded_addresses_count_only_behind_trusted_proxies() {
    let args = [
        "--max-connections-per-ip",
        "1",
        "--trusted-proxies",
        "10.0.0.0/8",
    ];
    let mut l = limiter(&args, 1);
    // The proxy itself is not capped.
    let mut p1 = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    let mut p2 = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    assert!(p1.proxied());
    l.forwarded(&mut p1, Some(b"1.2.3.4"), 0).unwrap();
    // The same client through another proxy connection: over its cap.
    let e = l.forwarded(&mut p2, Some(b"9.9.9.9, 1.2.3.4, 10.0.0.5"), 0);
    assert_eq!(e.unwrap_err(), Kind::Connections);
    // The same address again on the same connection is no new connection.
    l.forwarded(&mut p1, Some(b"1.2.3.4"), 0).unwrap();
    // Another client on the first connection frees the first one's place.
    l.forwarded(&mut p1, Some(b"5.6.7.8"), 0).unwrap();
    let mut p3 = l.on_accept(ip("10.0.0.2"), 0).unwrap();
    l.forwarded(&mut p3, Some(b"1.2.3.4"), 0).unwrap();
    // From an untrusted peer the header means nothing.
    let mut direct = l.on_accept(ip("1.2.3.5"), 0).unwrap();
    assert!(!direct.proxied());
    l.forwarded(&mut direct, Some(b"1.2.3.4"), 0).unwrap();
    l.release(&mut p1);
    l.release(&mut p2);
}

#[test]
fn off_limits_keep_no_state() {
    let args = [
        "--max-connections-per-ip",
        "0",
        "--accept-rate-per-ip",
        "0",
        "--publish-rate",
        "0",
        "--publish-bytes-rate",
        "0",
        "--subscribe-rate",
        "0",
    ];
    let mut l = limiter(&args, 4);
    for _ in 0..10_000 {
        let lim = l.on_accept(ip("10.0.0.1"), 0).unwrap();
        let mut own = l.conn_buckets(0);
        l.admit(&lim, &mut own, PUBLISH, 0).unwrap();
    }
    assert_eq!(l.tracked(), (0, 0));
}

#[test]
fn idle_addresses_are_forgotten() {
    let mut l = limiter(
        &["--accept-rate-per-ip", "10", "--accept-burst-per-ip", "10"],
        1,
    );
    let mut a = l.on_accept(ip("10.0.0.1"), 0).unwrap();
    l.on_accept(ip("10.0.0.2"), 0).unwrap();
    l.tick(5000);
    assert_eq!(l.tracked().0, 2, "both hold a connection");
    l.release(&mut a);
    l.tick(10_000);
    assert_eq!(l.tracked().0, 1);
}

#[test]
fn defaults_are_the_documented_ones() {
    let l = limits(&[]);
    assert_eq!(l.max_connections_per_ip, 1000);
    assert_eq!((l.accept_rate_per_ip, l.accept_burst_per_ip), (50.0, 500));
    assert_eq!((l.publish_rate, l.publish_burst), (100.0, 1000));
    assert_eq!(
        (l.publish_bytes_rate, l.publish_bytes_burst),
        (1048576.0, 16 << 20)
    );
    assert_eq!((l.subscribe_rate, l.subscribe_burst), (100.0, 1000));
    assert!(l.limit_exempt.is_empty() && l.trusted_proxies.is_empty());
}
