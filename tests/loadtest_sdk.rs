//! `loadtest --protocol sdk` (issue 57), the real binary against the real server on
//! loopback: the dApps' session requests and the wallets' answers are all delivered and
//! acknowledged, every connection authenticates (the server here refuses any that does
//! not), `idle` holds two subscriptions per connection, and the scenarios that have no SDK
//! shape refuse it with exit 2.
//!
//! Every load is small (10 pairs, 100 requests) and goes to loopback. No figure of time
//! decides a pass.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::loadtest_bin::{json, loadtest, run, stderr};
use common::Server;

#[test]
fn sdk_pairs_deliver_every_request_and_every_answer() {
    let server = Server::start(&["--data-dir", "none", "--require-auth"]);
    let url = format!("ws://{}/", server.addr);
    let o = run(&[
        "pairs",
        "--url",
        &url,
        "--protocol",
        "sdk",
        "--pairs",
        "10",
        "--rate",
        "100",
        "--count",
        "100",
        "--duration",
        "2s",
        "--warmup",
        "200ms",
        "--drain",
        "1s",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["protocol"], "sdk", "{j}");
    assert!(j["auth"].as_str().unwrap_or("").starts_with("jwt"), "{j}");
    assert_eq!(j["ttl"], 900, "{j}");
    assert_eq!(j["lost"], 0, "{j}");
    assert_eq!(j["unacked"], 0, "{j}");
    assert_eq!(j["errors"], 0, "{j}");
    // --count bounds the requests; each one was answered.
    assert_eq!(j["requests_sent"], 100, "{j}");
    assert_eq!(j["answers_sent"], 100, "{j}");
    assert_eq!(j["publishes_sent"], 200, "{j}");
    assert_eq!(j["publish_delivery_us"]["count"], 200, "{j}");
}

#[test]
fn sdk_idle_holds_two_subscriptions_per_connection() {
    let server = Server::start(&["--data-dir", "none", "--require-auth"]);
    let url = format!("ws://{}/", server.addr);
    let child = Command::new(loadtest())
        .args([
            "idle",
            "--url",
            &url,
            "--protocol",
            "sdk",
            "--connections",
            "20",
            "--duration",
            "6s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loadtest");
    // While held: the pairing and the session topic of each of the 20.
    let held = server.wait_metric("walletrelay_subscriptions", Duration::from_secs(5), |v| {
        v >= 40.0
    });
    let o = child.wait_with_output().expect("loadtest");
    assert!(o.status.success(), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(held, 40.0, "walletrelay_subscriptions while held; {j}");
    assert_eq!(j["protocol"], "sdk", "{j}");
    assert!(j["auth"].as_str().unwrap_or("").starts_with("jwt"), "{j}");
    assert_eq!(j["subscribed"], 20, "{j}");
    assert_eq!(j["alive_at_end"], 20, "{j}");
}

#[test]
fn scenarios_without_an_sdk_shape_refuse_it() {
    let url = "ws://127.0.0.1:9/";
    for args in [
        vec!["fanout", "--url", url, "--protocol", "sdk"],
        vec!["churn", "--url", url, "--protocol", "sdk"],
        vec!["pairs", "--url", url, "--protocol", "sdk", "--stalled", "2"],
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("sdk"), "{args:?}: {}", stderr(&o));
    }
}
