//! Today's WalletConnect SDK works unchanged (DECISIONS §10): `@walletconnect/sign-client`
//! 2.25.0 from npm (the `irn_*` relay protocol, `wc_proposeSession` / `wc_approveSession`, JWT
//! relay auth) runs a dApp client and a wallet client against the real binary on loopback. The
//! scenarios are in `tests/e2e-sdk/sdk.mjs` (SCENARIO=...); this test installs its locked
//! dependencies if needed (`npm ci`), starts the relay and runs the script:
//! - `session`: pairing and approval, a `personal_sign` request and its answer, `emit`,
//!   `update`, `extend`, `ping` and `disconnect`, each seen by the other side; over `ws://` at
//!   `--threads 1` and `2`, and over `wss://` (a test CA trusted through `NODE_EXTRA_CA_CERTS`);
//! - `offline`: the wallet's transport is closed while the dApp sends a request; it gets the
//!   request from the relay's store when it comes back;
//! - `restart`: the same, with the relay killed (`SIGKILL`) while the wallet is away and
//!   restarted on the same port and `--data-dir`;
//! - `cluster`: the dApp on node 1 and the wallet on node 2 of a cluster on a real Redis;
//! - `idle`: 70 s without app traffic, no transport drop (the SDK terminates a socket that has
//!   seen no frame for 35 s), then a request still works;
//! - `unsubscribe`: after `disconnect` both clients `irn_unsubscribe` the session topic with
//!   the id the SDK computes itself (`sha256_hex(topic ‖ client id)`); a message published
//!   there afterwards reaches neither.
//!
//! In every scenario the script replaces `fetch` with a recorder that throws and fails if the
//! SDK fetched anything outside loopback.
//!
//! Needs Node.js (18 or later; CI uses 20) and npm on `PATH`; the cluster run also needs
//! `redis-server` (7.0 or later).

mod common;

use common::tls::TlsSetup;
use common::wait::wait_until;
use common::TempDir;
use common::{node, Server};
use std::time::Duration;

/// Upper bound for one run of the script (it has its own timeout of 120 s, plus the idle time).
const SCRIPT_DEADLINE: Duration = Duration::from_secs(180);

/// The SDK package whose presence means `npm ci` has run.
const MARKER: &str = "@walletconnect/sign-client";

/// Runs `node tests/e2e-sdk/sdk.mjs` with `SCENARIO=scenario`, `RELAY_URL=relay_url` and `env`,
/// and asserts that it exits 0.
fn run_sdk(scenario: &str, relay_url: &str, env: &[(&str, &str)], deadline: Duration, what: &str) {
    node::ensure_node_modules("e2e-sdk", MARKER);
    let mut all = vec![("SCENARIO", scenario), ("RELAY_URL", relay_url)];
    all.extend_from_slice(env);
    node::run_script(
        "e2e-sdk",
        "sdk.mjs",
        &all,
        deadline,
        &format!("SCENARIO={scenario}, relay {relay_url} ({what})"),
    );
}

/// `scenario` against one fresh server at `--threads threads` over `ws://`.
fn run_plain(scenario: &str, threads: &str, env: &[(&str, &str)], deadline: Duration) {
    let server = Server::start(&["--threads", threads]);
    let url = format!("ws://{}", server.addr);
    run_sdk(
        scenario,
        &url,
        env,
        deadline,
        &format!("--threads {threads}"),
    );
}

#[test]
fn sdk_session_lifecycle_threads_1() {
    run_plain("session", "1", &[], SCRIPT_DEADLINE);
}

#[test]
fn sdk_session_lifecycle_threads_2() {
    run_plain("session", "2", &[], SCRIPT_DEADLINE);
}

#[test]
fn sdk_session_lifecycle_over_wss_threads_2() {
    let t = TlsSetup::new();
    let server = t.start(&["--threads", "2"]);
    let url = format!("wss://{}", server.tls_addr());
    let ca = t.ca_file.to_string_lossy().into_owned();
    run_sdk(
        "session",
        &url,
        &[("NODE_EXTRA_CA_CERTS", ca.as_str())],
        SCRIPT_DEADLINE,
        "--threads 2, TLS",
    );
}

#[test]
fn sdk_unsubscribe_after_disconnect_stops_the_session_topic_for_both_clients() {
    run_plain("unsubscribe", "2", &[], SCRIPT_DEADLINE);
}

#[test]
fn sdk_wallet_offline_gets_the_request_from_the_store_when_it_comes_back() {
    run_plain("offline", "2", &[], SCRIPT_DEADLINE);
}

/// A free loopback port (bound, then let go) for a server that must come back on the same
/// address.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("addr").port()
}

/// Waits (up to 30 s) until `port` can be bound again after the process that held it died.
fn wait_port_free(port: u16) {
    let free = || std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    assert!(
        wait_until(Duration::from_secs(30), free),
        "port {port} still taken 30 s after the kill"
    );
}

#[test]
fn sdk_wallet_gets_the_request_after_the_relay_was_killed_and_restarted_on_its_data_dir() {
    node::ensure_node_modules("e2e-sdk", MARKER);
    let dir = TempDir::new("sdk-restart");
    let listen = format!("127.0.0.1:{}", free_port());
    let args = [
        "--listen",
        listen.as_str(),
        "--data-dir",
        dir.arg(),
        "--threads",
        "2",
    ];
    let mut server = Some(Server::start(&args));
    let url = format!("ws://{listen}");
    let mut restarted = false;
    node::run_script_interactive(
        "e2e-sdk",
        "sdk.mjs",
        &[("SCENARIO", "restart"), ("RELAY_URL", url.as_str())],
        SCRIPT_DEADLINE,
        &format!("SCENARIO=restart, relay {url} (--threads 2, --data-dir, SIGKILL + restart)"),
        |line| {
            if line.trim() != "READY_FOR_RESTART" || restarted {
                return None;
            }
            let mut old = server.take().expect("the first server");
            old.child.kill().expect("SIGKILL the relay");
            old.child.wait().expect("reap the relay");
            drop(old);
            eprintln!("sdk_client: relay killed (SIGKILL); restarting on {listen}");
            wait_port_free(listen.rsplit(':').next().unwrap().parse().unwrap());
            server = Some(Server::start(&args));
            restarted = true;
            Some("RESTARTED".to_string())
        },
    );
    assert!(restarted, "the script never asked for the restart");
}

#[test]
fn sdk_dapp_and_wallet_on_different_nodes_of_a_redis_cluster() {
    let redis = common::redis::RedisServer::start();
    let nodes = common::cluster::nodes(2, &[&redis], &[]);
    let relay_url = common::cluster::ws_urls(&nodes);
    run_sdk(
        "cluster",
        &relay_url,
        &[],
        SCRIPT_DEADLINE,
        "2 nodes on one Redis: dApp node 1, wallet node 2",
    );
}

/// Today's SDK across two nodes on each Redis layout of DECISIONS §12 (the standalone case is
/// the test above): TLS with an ACL user, a Sentinel group, a Redis Cluster.
fn sdk_across_two_nodes_on(kind: common::redis_topo::RedisKind, what: &str) {
    let setup = common::redis_topo::RedisSetup::start(kind);
    let nodes = common::cluster::nodes_args(2, &setup.redis_args(), &[]);
    let relay_url = common::cluster::ws_urls(&nodes);
    run_sdk("cluster", &relay_url, &[], SCRIPT_DEADLINE, what);
}

#[test]
fn sdk_dapp_and_wallet_on_two_nodes_over_tls_with_an_acl_user() {
    sdk_across_two_nodes_on(
        common::redis_topo::RedisKind::TlsAcl,
        "2 nodes on rediss:// with an ACL user: dApp node 1, wallet node 2",
    );
}

#[test]
fn sdk_dapp_and_wallet_on_two_nodes_of_a_sentinel_group() {
    sdk_across_two_nodes_on(
        common::redis_topo::RedisKind::Sentinel,
        "2 nodes on a Sentinel group: dApp node 1, wallet node 2",
    );
}

#[test]
fn sdk_dapp_and_wallet_on_two_nodes_of_a_redis_cluster_shard() {
    sdk_across_two_nodes_on(
        common::redis_topo::RedisKind::Cluster,
        "2 nodes on a Redis Cluster: dApp node 1, wallet node 2",
    );
}

#[test]
fn sdk_idle_session_keeps_its_connections_for_70_s() {
    run_plain(
        "idle",
        "2",
        &[("IDLE_SECONDS", "70")],
        SCRIPT_DEADLINE + Duration::from_secs(70),
    );
}
