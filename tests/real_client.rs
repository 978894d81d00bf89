//! The real client works unchanged: the WalletConnect JavaScript client from npm
//! (`@walletconnect/client` 2.0.0-beta.19, the last generation that speaks `waku_*`) pairs a dApp
//! and a wallet through the relay, settles a session, exchanges `personal_sign` requests and
//! responses, and a wallet that was offline while the dApp sent a request gets it from the relay's
//! cache when it comes back. The scenario is `tests/e2e-js/pair.mjs`; this test installs its
//! locked dependencies if needed, starts the real binary and runs the script against it: one
//! node, or three nodes of a cluster on a real Redis (DECISIONS §7) with the dApp on node 1,
//! the wallet on node 2 and the returning wallet on node 3.
//!
//! Needs Node.js (18 or later; CI uses 20) and npm on `PATH`; the cluster run also needs
//! `redis-server` (7.0 or later).

mod common;
#[path = "common/redis.rs"]
mod redis_server;

use common::{node, Server};
use std::time::Duration;

/// Upper bound for one run of the script; it has its own 60 s timeout and normally takes ~2 s.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `node tests/e2e-js/pair.mjs` against a fresh server started with `--threads threads`,
/// and asserts that it exits 0.
fn run_pair_script(threads: &str) {
    let server = Server::start(&["--threads", threads]);
    run_pair_script_on(&[&server], &format!("--threads {threads}"));
}

/// Runs `pair.mjs` with `RELAY_URL` listing `servers` in order (dApp, wallet, returning
/// wallet) and asserts that it exits 0.
fn run_pair_script_on(servers: &[&Server], what: &str) {
    node::ensure_node_modules("e2e-js", "@walletconnect/client");
    let relay_url = servers
        .iter()
        .map(|s| format!("ws://{}", s.addr))
        .collect::<Vec<_>>()
        .join(",");
    node::run_script(
        "e2e-js",
        "pair.mjs",
        &[("RELAY_URL", &relay_url)],
        SCRIPT_DEADLINE,
        &format!("relay {relay_url} ({what})"),
    );
}

#[test]
fn real_walletconnect_client_pairs_requests_and_gets_cached_request_threads_1() {
    run_pair_script("1");
}

#[test]
fn real_walletconnect_client_pairs_requests_and_gets_cached_request_threads_2() {
    run_pair_script("2");
}

#[test]
fn real_walletconnect_client_dapp_and_wallet_on_different_nodes_of_a_redis_cluster() {
    let redis = redis_server::RedisServer::start();
    let url = redis.url();
    let nodes: Vec<Server> = (0..3)
        .map(|_| Server::start(&["--threads", "2", "--redis", &url]))
        .collect();
    let refs: Vec<&Server> = nodes.iter().collect();
    run_pair_script_on(
        &refs,
        "3 nodes on one Redis: dApp node 1, wallet node 2, then node 3",
    );
}
