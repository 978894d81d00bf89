//! WalletConnect 1.0 frames across nodes on a Redis Cluster shard (DECISIONS §8 and §12):
//! the v1 keys carry the topic as a hash tag, live frames go by `SPUBLISH`, and each node
//! keeps its liveness key in every slot where it has v1 subscribers (a script on a cluster
//! reads only its topic's slot). A `pub` reaches the subscribers on the other nodes; a `pub`
//! nobody listens to is pending for the next `sub`; a killed subscriber's node stops
//! counting once its liveness lapses, so frames are kept pending again.

mod common;

use std::time::Duration;

use common::cluster::nodes_args;
use common::redis_topo::{key_slot, RedisCluster, RedisKind, RedisSetup};
use common::v1::sent_pub;
use common::wait::wait_for;
use common::{topic, RawWs};

/// A command on the node serving `tp`'s slot.
fn on_owner<T: redis::FromRedisValue>(c: &RedisCluster, tp: &str, cmd: &mut redis::Cmd) -> T {
    let port = c.slot_owner(key_slot(tp.as_bytes()));
    cmd.query(&mut c.conn(port))
        .expect("query the slot's owner")
}

fn counted(c: &RedisCluster, tp: &str) -> i64 {
    let v: Vec<i64> = on_owner(c, tp, redis::cmd("HVALS").arg(format!("wr:1:v:{{{tp}}}")));
    v.iter().sum()
}

fn pending(c: &RedisCluster, tp: &str) -> i64 {
    on_owner(c, tp, redis::cmd("LLEN").arg(format!("wr:1:p:{{{tp}}}")))
}

#[test]
fn v1_frames_go_live_and_pending_across_nodes_of_a_redis_cluster() {
    let setup = RedisSetup::start(RedisKind::Cluster);
    let mut n = nodes_args(3, &setup.redis_args(), &[]);
    let c = setup.cluster().expect("a cluster");
    let tp = topic();

    // Pending for the next sub on any node, oldest first.
    let mut a = RawWs::open(&n[0]);
    for p in ["p1", "p2"] {
        a.v1_pub(&tp, p, Some(true));
    }
    wait_for("two frames pending", || pending(c, &tp) == 2);
    let mut b = RawWs::open(&n[1]);
    b.v1_sub(&tp);
    for p in ["p1", "p2"] {
        b.expect_text(&sent_pub(&tp, p, true), "first subscriber");
    }
    wait_for("B counted", || counted(c, &tp) == 1);

    // Live to the subscriber on another node, not back to the publisher.
    a.v1_pub(&tp, "live", None);
    b.expect_text(&sent_pub(&tp, "live", false), "B");
    assert_eq!(pending(c, &tp), 0, "went live");

    // B's node killed: its count stays, but once its liveness key in the topic's slot
    // lapses, pubs are kept pending again for the next subscriber.
    n[1].child.kill().expect("kill node 1");
    n[1].child.wait().expect("reap node 1");
    drop(b);
    let mut sent = Vec::new();
    wait_for("a pub kept pending", || {
        let p = format!("k{}", sent.len());
        a.v1_pub(&tp, &p, None);
        sent.push(p);
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            if pending(c, &tp) > 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    });
    let last = sent.last().cloned().unwrap_or_default();
    let mut d = RawWs::open(&n[2]);
    d.v1_sub(&tp);
    d.expect_text(&sent_pub(&tp, &last, false), "a later subscriber");
    d.settled("a later subscriber");
}
