//! The real `loadtest` binary for the tests that drive it: `target/debug/loadtest`, built
//! (`cargo build -p loadtest`, the test profile's dependencies already built) when missing
//! or out of date. Modest loads (hundreds of messages a second) need no release build.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The binary's path, built once per test process.
pub fn loadtest() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(build).clone()
}

fn build() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    // Without the variables cargo set for this test (some reach build scripts' fingerprints:
    // with them, ring would be rebuilt here and again by the next `cargo test`).
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let keep = ["CARGO_HOME", "CARGO_TARGET_DIR"].contains(&k.as_str());
        if (k.starts_with("CARGO_") && !keep) || k == "OUT_DIR" || k.starts_with("RUST_") {
            cmd.env_remove(k);
        }
    }
    let st = cmd
        .args(["build", "--locked", "-p", "loadtest"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build -p loadtest");
    assert!(st.success(), "cargo build -p loadtest failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("debug").join("loadtest")
}

/// Runs `loadtest` with `args` to its end; its output.
pub fn run(args: &[&str]) -> Output {
    Command::new(loadtest())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run loadtest")
}

/// The last line of a run's stdout, the JSON line of figures.
pub fn json(o: &Output) -> serde_json::Value {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().last().unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// A run's stderr, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
