//! The real client works unchanged: the WalletConnect JavaScript client from npm
//! (`@walletconnect/client` 2.0.0-beta.19, the last generation that speaks `waku_*`) pairs a dApp
//! and a wallet through the relay, settles a session, exchanges `personal_sign` requests and
//! responses, and a wallet that was offline while the dApp sent a request gets it from the relay's
//! cache when it comes back. The scenario is `tests/e2e-js/pair.mjs`; this test installs its
//! locked dependencies if needed, starts the real binary and runs the script against it.
//!
//! Needs Node.js (18 or later; CI uses 20) and npm on `PATH`.

mod common;

use common::{node, Server};
use std::time::Duration;

/// Upper bound for one run of the script; it has its own 60 s timeout and normally takes ~2 s.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `node tests/e2e-js/pair.mjs` against a fresh server started with `--threads threads`,
/// and asserts that it exits 0.
fn run_pair_script(threads: &str) {
    node::ensure_node_modules("e2e-js", "@walletconnect/client");
    let server = Server::start(&["--threads", threads]);
    let relay_url = format!("ws://{}", server.addr);
    node::run_script(
        "e2e-js",
        "pair.mjs",
        &[("RELAY_URL", &relay_url)],
        SCRIPT_DEADLINE,
        &format!("relay {relay_url} (--threads {threads})"),
    );
    drop(server);
}

#[test]
fn real_walletconnect_client_pairs_requests_and_gets_cached_request_threads_1() {
    run_pair_script("1");
}

#[test]
fn real_walletconnect_client_pairs_requests_and_gets_cached_request_threads_2() {
    run_pair_script("2");
}
