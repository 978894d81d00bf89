//! The relay's identity and its watch registrations on every kind of Redis an operator
//! runs (DECISIONS 13, issue 47), with real processes: two nodes show one `/public-key`, a
//! registration taken by one node is in the other's table (its `walletrelay_watches`
//! gauge) and in a node started later, an unregistration likewise; on `rediss://` with an
//! ACL user and the password from `--redis-password-file`, on a Sentinel group (and across
//! its failover: the primary killed, the registrations still everywhere, the sync still
//! working both ways), on a Redis Cluster (clients spread over its primaries).

mod common;

use std::time::Duration;

use common::cluster::nodes_args;
use common::jwt::Signer;
use common::redis_topo::{key_slot, RedisKind, RedisSetup, RedisTlsAcl};
use common::wait::wait_until;
use common::watch::{public_key, register, unregister, watches};
use common::Server;

/// The Redis key of `c`'s watches (its client id the hash tag).
fn watch_key(c: &Signer) -> String {
    format!("walletrelay:watch:{{{}}}", c.did())
}

/// Waits until every node's gauge says `n` (10 s); false if one never did.
fn all_see(nodes: &[&Server], n: f64) -> bool {
    nodes
        .iter()
        .all(|s| wait_until(Duration::from_secs(10), || watches(s) == n))
}

fn gauges(nodes: &[&Server]) -> Vec<f64> {
    nodes.iter().map(|s| watches(s)).collect()
}

/// Registers watch `i` of `c` on `s`, asserting the answer.
fn registered(s: &Server, c: &Signer, i: usize) {
    let r = register(&mut s.ws(), c, i);
    assert!(r["result"]["relayId"].is_string(), "{r}");
}

/// Unregisters watch `i` of `c` on `s`, asserting the answer.
fn unregistered(s: &Server, c: &Signer, i: usize) {
    let r = unregister(&mut s.ws(), c, i);
    assert_eq!(r["result"], true, "{r}");
}

/// On two nodes of `args`: one key; `clients` clients with two watches each registered on
/// node A, seen by node B and by a node started afterwards; one unregistered on B, gone
/// from A. Returns the nodes (A, B) and the registrations left.
fn shared_key_and_watches(args: &[String], clients: usize) -> (Vec<Server>, Vec<Signer>, f64) {
    let n = nodes_args(2, args, &[]);
    let key = public_key(&n[0]);
    assert_eq!(public_key(&n[1]), key, "one key for the nodes");
    let cs: Vec<Signer> = (0..clients).map(|_| Signer::random()).collect();
    for c in &cs {
        registered(&n[0], c, 0);
        registered(&n[0], c, 1);
    }
    let all = (2 * clients) as f64;
    let both = [&n[0], &n[1]];
    assert!(all_see(&both, all), "registered on A: {:?}", gauges(&both));
    let late = nodes_args(1, args, &[]);
    assert_eq!(public_key(&late[0]), key);
    assert_eq!(watches(&late[0]), all, "a node started later reads them");
    unregistered(&n[1], &cs[0], 1);
    let three = [&n[0], &n[1], &late[0]];
    assert!(
        all_see(&three, all - 1.0),
        "unregistered on B: {:?}",
        gauges(&three)
    );
    (n, cs, all - 1.0)
}

#[test]
fn tls_with_an_acl_user_and_the_password_from_a_file() {
    let r = RedisTlsAcl::start();
    let args: Vec<String> = [
        "--redis",
        &r.url_without_password(),
        "--redis-tls-ca",
        &r.ca_path().display().to_string(),
        "--redis-password-file",
        r.password_file().to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    shared_key_and_watches(&args, 2);
}

#[test]
fn redis_cluster_with_clients_on_every_primary_and_a_primary_killed() {
    let mut setup = RedisSetup::start(RedisKind::Cluster);
    let args = setup.redis_args();
    // 12 clients: their hashes land on all three primaries (each client's key in its own
    // slot, by its hash tag) with overwhelming likelihood; the set of clients on one.
    let (n, cs, left) = shared_key_and_watches(&args, 12);
    let c = setup.cluster().unwrap();
    let holding: Vec<u16> = c
        .primaries()
        .into_iter()
        .filter(|p| {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("walletrelay:watch:{*")
                .query(&mut c.conn(*p))
                .unwrap();
            !keys.is_empty()
        })
        .collect();
    assert!(
        holding.len() >= 2,
        "watch keys on one primary only: {holding:?}"
    );
    // The primary with the most keys killed; its replica takes over. The changes after it
    // are of clients whose keys it held: the nodes' links to it are dead, their slot maps
    // stale.
    let c = setup.cluster_mut().unwrap();
    let map = c.slot_map();
    let owner = |s: &Signer| {
        let slot = key_slot(watch_key(s).as_bytes());
        map.iter()
            .find(|r| r.start <= slot && slot <= r.end)
            .map(|r| r.port)
    };
    let (killed, _) = c.kill_primary_with_most_keys();
    let fresh = std::iter::repeat_with(Signer::random)
        .find(|s| owner(s) == Some(killed))
        .unwrap();
    let gone = cs
        .iter()
        .find(|s| owner(s) == Some(killed))
        .expect("a client there");
    c.wait_ok();
    let both = [&n[0], &n[1]];
    registered(&n[1], &fresh, 0);
    unregistered(&n[0], gone, 0);
    assert!(
        all_see(&both, left),
        "after the failover, B's registration and A's unregistration: {:?}",
        gauges(&both)
    );
    // What was answered survived the failover: a node started now reads all of it.
    let late = nodes_args(1, &args, &[]);
    assert_eq!(public_key(&late[0]), public_key(&n[0]));
    assert_eq!(watches(&late[0]), left);
}

#[test]
fn sentinel_group_and_its_failover() {
    let mut setup = RedisSetup::start(RedisKind::Sentinel);
    let args = setup.redis_args();
    let (n, cs, left) = shared_key_and_watches(&args, 2);
    let g = setup.sentinel_mut().unwrap();
    let old = g.primary_port();
    g.kill_primary();
    g.wait_failover(old);
    // Both nodes follow the new primary: a registration on B reaches A, one on A reaches B.
    let c = Signer::random();
    registered(&n[1], &c, 0);
    let both = [&n[0], &n[1]];
    assert!(
        all_see(&both, left + 1.0),
        "after the failover, B's registration: {:?}",
        gauges(&both)
    );
    unregistered(&n[0], &cs[1], 0);
    assert!(
        all_see(&both, left),
        "after the failover, A's unregistration: {:?}",
        gauges(&both)
    );
    // What was answered before the failover survived it on the new primary: a node started
    // now reads every registration from it.
    let late = nodes_args(1, &args, &[]);
    assert_eq!(public_key(&late[0]), public_key(&n[0]));
    assert_eq!(watches(&late[0]), left);
}
