//! The example dApp page (`examples/dapp/`, `@walletconnect/sign-client` 2.25.0 bundled with
//! esbuild) in a real browser, Debian's `chromium` headless driven by `puppeteer-core`, against
//! the real binary: the page shows the pairing URI (text and QR code, both read back), a wallet
//! made with sign-client in Node pairs with it and approves, the test clicks the page's "sign"
//! button, the wallet answers `personal_sign`, and the page must show exactly that answer. The
//! driver is `tests/e2e-browser/browser.mjs`; this file installs what it needs (the example's
//! and the driver's locked npm packages, the example's build, Chromium), starts the relay, runs
//! it and checks what it reports. Three ways:
//! - plain `ws://` (the browser offers permessage-deflate; the relay without the flag declines);
//! - `wss://` on the TLS listener, the browser trusting the test CA through an NSS database;
//! - `ws://` with `--permessage-deflate`: the browser's connection must have negotiated it
//!   (the browser's own record of the 101, and the relay's `ws_deflate_upgrades_total`).
//!
//! Every request the page makes outside loopback is aborted and listed (`BLOCKED <url>`); the
//! page's relay connection must be the browser's own WebSocket. A screenshot of the page with
//! the answer goes to `target/browser-<way>.png` (and the QR stage to `...-pairing.png`).
//!
//! Needs Node.js 18+ with npm, and `chromium` (installed with apt-get when missing and running
//! as root; otherwise the test is skipped, see `common::skip`). The `wss://` run also needs
//! NSS's `certutil` (Debian: `libnss3-tools`, installed the same way).

mod common;

use common::apt::tool;
use common::tls::TlsSetup;
use common::{node, skip, Server, TempDir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Upper bound for one run of the driver (it has its own timeout of 60 s).
const DEADLINE: Duration = Duration::from_secs(90);

/// The example, relative to `tests/` (how `node::ensure_node_modules` names directories).
const EXAMPLE: &str = "../examples/dapp";

/// Chromium, looked for (and installed) once per test binary.
fn chromium() -> Result<PathBuf, String> {
    static C: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    C.get_or_init(|| tool("chromium", "chromium")).clone()
}

/// Whether Chromium is there (or could be installed); if not, records `test` as skipped.
fn have_chromium(test: &str) -> bool {
    match chromium() {
        Ok(_) => true,
        Err(reason) => {
            skip::skip(test, &reason);
            false
        }
    }
}

/// NSS's `certutil`, looked for (and installed) once per test binary.
fn certutil() -> Result<PathBuf, String> {
    static C: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    C.get_or_init(|| tool("certutil", "libnss3-tools")).clone()
}

/// `examples/dapp`: its locked packages (`npm ci`) and `npm run build` (esbuild), once per
/// test binary. Panics with npm's output when either fails.
fn build_example() -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let dir = node::script_dir(EXAMPLE);
    let built = BUILT.get_or_init(|| {
        node::ensure_node_modules(EXAMPLE, "esbuild");
        let out = Command::new("npm")
            .args(["run", "build", "--prefix"])
            .arg(&dir)
            .output()
            .map_err(|e| format!("could not run npm: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`npm run build` of examples/dapp failed ({})\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    });
    if let Err(e) = built {
        panic!("{e}");
    }
    assert!(
        dir.join("dist/app.js").is_file(),
        "the build wrote dist/app.js"
    );
    dir
}

/// `target/` (or `CARGO_TARGET_DIR`), where the screenshots go.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// The value after `prefix ` on every stdout line that starts with it.
fn lines_after<'a>(stdout: &'a str, prefix: &str) -> Vec<&'a str> {
    let p = format!("{prefix} ");
    stdout.lines().filter_map(|l| l.strip_prefix(&p)).collect()
}

/// Runs the driver against `relay` on `server`: the page must show what the wallet sent, and
/// the page's WebSocket(s) to the relay must have negotiated permessage-deflate exactly when
/// `deflate`. The test has made sure of Chromium ([`have_chromium`]) before.
fn run_page(
    test: &str,
    way: &str,
    server: &Server,
    relay: &str,
    env: &[(&str, &str)],
    deflate: bool,
) {
    let chromium = chromium().expect("checked by the test (have_chromium)");
    let page_dir = build_example();
    node::ensure_node_modules("e2e-browser", "puppeteer-core");
    let shot = target_dir().join(format!("browser-{way}.png"));
    let _ = std::fs::remove_file(&shot);
    let chromium = chromium.to_string_lossy().into_owned();
    let page_dir = page_dir.to_string_lossy().into_owned();
    let shot_arg = shot.to_string_lossy().into_owned();
    let mut all = vec![
        ("RELAY_URL", relay),
        ("CHROMIUM", chromium.as_str()),
        ("PAGE_DIR", page_dir.as_str()),
        ("SCREENSHOT", shot_arg.as_str()),
        ("EXPECT_DEFLATE", if deflate { "1" } else { "0" }),
    ];
    all.extend_from_slice(env);
    let stdout = node::run_script(
        "e2e-browser",
        "browser.mjs",
        &all,
        DEADLINE,
        &format!("{test}: the example dApp in {chromium}, relay {relay}"),
    );

    // The page showed exactly what the wallet sent (a fresh random 65-byte signature).
    let sent = lines_after(&stdout, "WALLET_SENT");
    let shown = lines_after(&stdout, "PAGE_SHOWS");
    assert_eq!(sent.len(), 1, "one answer sent by the wallet:\n{stdout}");
    assert!(
        sent[0].len() == 132 && sent[0].starts_with("0x"),
        "a 65-byte hex signature: {}",
        sent[0]
    );
    assert_eq!(shown, sent, "the page shows the wallet's answer");

    // The page's relay socket(s): upgraded, with or without permessage-deflate.
    let sockets = lines_after(&stdout, "WS");
    let to_relay: Vec<&str> = sockets
        .iter()
        .copied()
        .filter(|l| l.starts_with(relay))
        .collect();
    assert!(
        !to_relay.is_empty(),
        "the browser's WebSocket to {relay}:\n{stdout}"
    );
    for s in &to_relay {
        assert!(s.contains(" status=101 "), "upgraded: {s}");
        let negotiated = s
            .split(" extensions=")
            .nth(1)
            .is_some_and(|e| e.contains("permessage-deflate"));
        assert_eq!(negotiated, deflate, "permessage-deflate negotiated: {s}");
    }

    // The relay itself says so: its count of upgrades that agreed on permessage-deflate
    // holds the browser's socket(s) (and the Node wallet's, which offers it too), or none.
    let agreed = server.metric("walletrelay_ws_deflate_upgrades_total");
    if deflate {
        assert!(
            agreed >= to_relay.len() as f64,
            "the relay counts {agreed} deflate upgrades for {} browser socket(s)",
            to_relay.len()
        );
    } else {
        assert_eq!(agreed, 0.0, "no deflate without --permessage-deflate");
    }

    // The relay accepted the browser's JWT (and the wallet's).
    assert_eq!(server.metric("walletrelay_auth_refused_total"), 0.0);

    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "a PNG screenshot"
    );
    let blocked = lines_after(&stdout, "BLOCKED");
    eprintln!(
        "{test}: page answer {} shown; screenshot {}; {} request(s) outside loopback blocked:",
        shown[0],
        shot.display(),
        blocked.len()
    );
    for b in blocked {
        eprintln!("  {b}");
    }
}

#[test]
fn browser_example_dapp_pairs_and_signs_over_ws() {
    let test = "browser_example_dapp_pairs_and_signs_over_ws";
    if !have_chromium(test) {
        return;
    }
    let server = Server::start(&["--threads", "2"]);
    let relay = format!("ws://{}", server.addr);
    run_page(test, "ws", &server, &relay, &[], false);
}

#[test]
fn browser_example_dapp_pairs_and_signs_with_permessage_deflate() {
    let test = "browser_example_dapp_pairs_and_signs_with_permessage_deflate";
    if !have_chromium(test) {
        return;
    }
    let server = Server::start(&["--threads", "2", "--permessage-deflate"]);
    let relay = format!("ws://{}", server.addr);
    run_page(test, "deflate", &server, &relay, &[], true);
}

/// Trust for `wss://`: Chromium on Linux verifies server certificates against the NSS
/// database in `$HOME/.pki/nssdb` as well as its built-in roots, so the test makes one in a
/// temporary HOME that trusts the test CA as an issuer of server certificates (`-t C,,`), and
/// starts Chromium with that HOME. No certificate error is ignored: the browser verifies the
/// chain and the name (`127.0.0.1`, in the leaf's SANs) as for any site. The driver checks it:
/// a second Chromium with an empty HOME must refuse the same listener with
/// `ERR_CERT_AUTHORITY_INVALID`.
#[test]
fn browser_example_dapp_pairs_and_signs_over_wss_trusting_the_test_ca() {
    let test = "browser_example_dapp_pairs_and_signs_over_wss_trusting_the_test_ca";
    if !have_chromium(test) {
        return;
    }
    let certutil = match certutil() {
        Ok(p) => p,
        Err(reason) => return skip::skip(test, &reason),
    };
    let t = TlsSetup::new();
    let home = TempDir::new("chrome-home");
    let db = home.join(".pki/nssdb");
    std::fs::create_dir_all(&db).unwrap();
    let db_arg = format!("sql:{}", db.display());
    let ca = t.ca_file.to_string_lossy().into_owned();
    for args in [
        vec!["-N", "-d", &db_arg, "--empty-password"],
        vec![
            "-A",
            "-d",
            &db_arg,
            "-n",
            "walletrelay test CA",
            "-t",
            "C,,",
            "-i",
            &ca,
        ],
    ] {
        let out = Command::new(&certutil)
            .args(&args)
            .output()
            .expect("run certutil");
        assert!(
            out.status.success(),
            "certutil {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let server = t.start(&["--threads", "2"]);
    let port = server.tls_addr().port();
    let relay = format!("wss://127.0.0.1:{port}");
    let hello = format!("https://127.0.0.1:{port}/hello");
    let home_arg = home.0.to_string_lossy().into_owned();
    run_page(
        test,
        "wss",
        &server,
        &relay,
        &[
            ("CHROME_HOME", home_arg.as_str()),
            ("TRUST_CHECK_URL", hello.as_str()),
            // The Node wallet: the SDK turns verification off for loopback URLs itself, but
            // should it not, it trusts the same CA.
            ("NODE_EXTRA_CA_CERTS", ca.as_str()),
        ],
        false,
    );
}
