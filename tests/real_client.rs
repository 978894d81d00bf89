//! The real client works unchanged: the WalletConnect JavaScript client from npm
//! (`@walletconnect/client` 2.0.0-beta.19, the last generation that speaks `waku_*`) pairs a dApp
//! and a wallet through the relay, settles a session, exchanges `personal_sign` requests and
//! responses, and a wallet that was offline while the dApp sent a request gets it from the relay's
//! cache when it comes back. The scenario is `tests/e2e-js/pair.mjs`; this test installs its
//! locked dependencies if needed, starts the real binary and runs the script against it: one
//! node over `ws://` and over `wss://` (the TLS listener, with a test CA the client trusts
//! through `NODE_EXTRA_CA_CERTS`), or three nodes of a cluster on a real Redis (DECISIONS §7)
//! with the dApp on node 1, the wallet on node 2 and the returning wallet on node 3.
//!
//! Needs Node.js (18 or later; CI uses 20) and npm on `PATH`; the cluster run also needs
//! `redis-server` (7.0 or later).

mod common;

use common::tls::TlsSetup;
use common::{node, Server};
use std::time::Duration;

/// Upper bound for one run of the script; it has its own 60 s timeout and normally takes ~2 s.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `node tests/e2e-js/pair.mjs` against a fresh server started with `--threads threads`,
/// over `wss://` when `tls`, and asserts that it exits 0.
fn run_pair_script(threads: &str, tls: bool) {
    match tls.then(TlsSetup::new) {
        None => {
            let server = Server::start(&["--threads", threads]);
            let url = format!("ws://{}", server.addr);
            run_pair_script_at(&url, &[], &format!("--threads {threads}"));
        }
        Some(t) => {
            let server = t.start(&["--threads", threads]);
            let url = format!("wss://{}", server.tls_addr());
            let ca = t.ca_file.to_string_lossy().into_owned();
            let env = [("NODE_EXTRA_CA_CERTS", ca.as_str())];
            run_pair_script_at(&url, &env, &format!("--threads {threads}, TLS"));
        }
    }
}

/// Runs `pair.mjs` with `RELAY_URL` = `relay_url` (a comma-separated list: dApp, wallet,
/// returning wallet) and `env`, and asserts that it exits 0.
fn run_pair_script_at(relay_url: &str, env: &[(&str, &str)], what: &str) {
    node::ensure_node_modules("e2e-js", "@walletconnect/client");
    let mut all = vec![("RELAY_URL", relay_url)];
    all.extend_from_slice(env);
    node::run_script(
        "e2e-js",
        "pair.mjs",
        &all,
        SCRIPT_DEADLINE,
        &format!("relay {relay_url} ({what})"),
    );
}

#[test]
fn real_walletconnect_client_pairs_requests_and_gets_cached_request_threads_1() {
    run_pair_script("1", false);
}

#[test]
fn real_walletconnect_client_pairs_requests_and_gets_cached_request_threads_2() {
    run_pair_script("2", false);
}

#[test]
fn real_walletconnect_client_over_wss_pairs_requests_and_gets_cached_request_threads_2() {
    run_pair_script("2", true);
}

#[test]
fn real_walletconnect_client_dapp_and_wallet_on_different_nodes_of_a_redis_cluster() {
    let redis = common::redis::RedisServer::start();
    let nodes = common::cluster::nodes(3, &[&redis], &[]);
    let relay_url = common::cluster::ws_urls(&nodes);
    run_pair_script_at(
        &relay_url,
        &[],
        "3 nodes on one Redis: dApp node 1, wallet node 2, then node 3",
    );
}
