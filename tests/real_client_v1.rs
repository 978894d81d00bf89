//! The real WalletConnect 1.0 client works unchanged with this server as its bridge
//! (DECISIONS §8): `@walletconnect/client` 1.8.0 from npm (the last 1.x release; pinned with
//! its whole tree in `tests/e2e-js-v1/package-lock.json`) creates a session on the dApp side,
//! the wallet connects with its URI and approves, a `personal_sign` request and its answer go
//! through, a request sent while the wallet is offline is kept pending by the bridge and reaches
//! the wallet when it comes back, and the dApp kills the session. The scenario is
//! `tests/e2e-js-v1/session.mjs`; this test installs its locked dependencies if needed (a failed
//! install fails the test with npm's output), starts the real binary and runs the script.
//!
//! The same scenario also runs across three nodes of a cluster on a real Redis (DECISIONS
//! §7): dApp on node 1, wallet on node 2, the returning wallet on node 3 (the request kept
//! pending while it was offline is kept in Redis).
//!
//! Needs Node.js (18 or later; CI uses 20) and npm on `PATH`; the cluster run also needs
//! `redis-server` (7.0 or later).

mod common;

use common::{node, Server};
use std::time::Duration;

/// Upper bound for one run of the script; it has its own 60 s timeout and normally takes ~1 s.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

fn run_session_script(threads: &str) {
    let server = Server::start(&["--threads", threads]);
    let bridge = format!("ws://{}", server.addr);
    run_session_script_at(&bridge, &format!("bridge {bridge} (--threads {threads})"));
    drop(server);
}

/// Runs `session.mjs` with `BRIDGE_URL` = `bridge` (a comma-separated list: dApp, wallet,
/// returning wallet).
fn run_session_script_at(bridge: &str, what: &str) {
    node::ensure_node_modules("e2e-js-v1", "@walletconnect/client");
    node::run_script(
        "e2e-js-v1",
        "session.mjs",
        &[("BRIDGE_URL", bridge)],
        SCRIPT_DEADLINE,
        what,
    );
}

#[test]
fn walletconnect_1_client_connects_signs_gets_pending_request_and_disconnects_threads_1() {
    run_session_script("1");
}

#[test]
fn walletconnect_1_client_connects_signs_gets_pending_request_and_disconnects_threads_4() {
    run_session_script("4");
}

#[test]
fn walletconnect_1_client_dapp_and_wallet_on_different_nodes_of_a_redis_cluster() {
    let redis = common::redis::RedisServer::start();
    let nodes = common::cluster::nodes(3, &[&redis], &[]);
    let bridge = common::cluster::ws_urls(&nodes);
    run_session_script_at(
        &bridge,
        "3 nodes on one Redis: dApp node 1, wallet node 2, returning wallet node 3",
    );
}
