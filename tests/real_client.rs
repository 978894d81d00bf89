//! The real client works unchanged: the WalletConnect JavaScript client from npm
//! (`@walletconnect/client` 2.0.0-beta.19, the last generation that speaks `waku_*`) pairs a dApp
//! and a wallet through the relay, settles a session, exchanges `personal_sign` requests and
//! responses, and a wallet that was offline while the dApp sent a request gets it from the relay's
//! cache when it comes back. The scenario is `tests/e2e-js/pair.mjs`; this test installs its
//! locked dependencies if needed, starts the real binary and runs the script against it, over
//! `ws://` and over `wss://` (the TLS listener, with a test CA the client trusts through
//! `NODE_EXTRA_CA_CERTS`).
//!
//! Needs Node.js (18 or later; CI uses 20) and npm on `PATH`.

mod common;

use common::tls::TlsSetup;
use common::Server;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Upper bound for one run of the script; it has its own 60 s timeout and normally takes ~2 s.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("e2e-js")
}

fn tool_version(tool: &str) -> Result<String, String> {
    let out = Command::new(tool).arg("--version").output().map_err(|e| {
        format!(
            "`{tool}` is not available ({e}). This test runs the real WalletConnect client from \
             npm and needs Node.js 18+ and npm on PATH (CI installs Node.js 20)."
        )
    })?;
    if !out.status.success() {
        return Err(format!("`{tool} --version` failed: {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Installs `tests/e2e-js/node_modules` from the committed lockfile (`npm ci`) if it is missing.
/// Runs once per test binary; the other test waits for it.
fn ensure_node_modules() {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    let result = INSTALLED.get_or_init(|| {
        let node = tool_version("node")?;
        let dir = e2e_dir();
        if dir
            .join("node_modules/@walletconnect/client/package.json")
            .exists()
        {
            return Ok(());
        }
        let npm = tool_version("npm")?;
        eprintln!("real_client: node {node}, npm {npm}: running `npm ci --prefix tests/e2e-js`");
        let out = Command::new("npm")
            .args(["ci", "--prefix"])
            .arg(&dir)
            .args(["--no-audit", "--no-fund"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .map_err(|e| format!("could not run npm: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`npm ci --prefix tests/e2e-js` failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Runs `node tests/e2e-js/pair.mjs` against a fresh server started with `--threads threads`,
/// over `wss://` when `tls`, and asserts that it exits 0.
fn run_pair_script(threads: &str, tls: bool) {
    ensure_node_modules();
    let setup = tls.then(TlsSetup::new);
    let (server, relay_url) = match &setup {
        None => {
            let s = Server::start(&["--threads", threads]);
            let url = format!("ws://{}", s.addr);
            (s, url)
        }
        Some(t) => {
            let s = t.start(&["--threads", threads]);
            let url = format!("wss://{}", s.tls_addr());
            (s, url)
        }
    };

    let mut node = Command::new("node");
    if let Some(t) = &setup {
        node.env("NODE_EXTRA_CA_CERTS", &t.ca_file);
    }
    let mut child = node
        .arg(e2e_dir().join("pair.mjs"))
        .env("RELAY_URL", &relay_url)
        .current_dir(e2e_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn node");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));

    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for node") {
            break Some(status);
        }
        if started.elapsed() > SCRIPT_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let report = format!(
        "relay {relay_url} (--threads {threads})\n--- pair.mjs stdout ---\n{stdout}\
         --- pair.mjs stderr ---\n{stderr}"
    );
    match status {
        Some(status) if status.success() => println!("{report}"),
        Some(status) => {
            panic!("the real WalletConnect client failed against the relay: {status}\n{report}")
        }
        None => panic!("pair.mjs did not finish within {SCRIPT_DEADLINE:?}\n{report}"),
    }
    drop(server);
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
