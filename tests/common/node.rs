//! Node.js scripts against the real binary: the real WalletConnect clients from npm, installed
//! on first run from a committed lockfile (`npm ci`) into the script's own directory, and a
//! script run with a deadline, its output kept for the failure message. Used by the
//! real-client tests (`tests/e2e-js/`, `tests/e2e-js-v1/`, `tests/e2e-sdk/`, `tests/e2e-browser/`;
//! the browser test also installs `examples/dapp/` as `../examples/dapp`).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// `tests/<name>` in the source tree.
pub fn script_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name)
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

/// Installs `tests/<name>/node_modules` from its committed lockfile (`npm ci`) unless
/// `node_modules/<marker>/package.json` is there already; once per test binary and
/// directory (the other tests wait for it). Panics with npm's output when it fails.
pub fn ensure_node_modules(name: &str, marker: &str) {
    static INSTALLED: OnceLock<Mutex<HashMap<String, Result<(), String>>>> = OnceLock::new();
    let mut done = INSTALLED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let result = done
        .entry(name.to_string())
        .or_insert_with(|| install(name, marker));
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn install(name: &str, marker: &str) -> Result<(), String> {
    let node = tool_version("node")?;
    let dir = script_dir(name);
    if dir
        .join("node_modules")
        .join(marker)
        .join("package.json")
        .exists()
    {
        return Ok(());
    }
    let npm = tool_version("npm")?;
    eprintln!("node {node}, npm {npm}: running `npm ci --prefix tests/{name}`");
    let out = Command::new("npm")
        .args(["ci", "--prefix"])
        .arg(&dir)
        .args(["--no-audit", "--no-fund"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map_err(|e| format!("could not run npm: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`npm ci --prefix tests/{name}` failed ({}): the real client could not be \
             installed from the npm registry\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Runs `node tests/<name>/<script>` (in that directory, with `env` set) until it exits or
/// `deadline` passes; panics unless it exited 0, with its output and `what` in the message.
/// Returns its standard output.
pub fn run_script(
    name: &str,
    script: &str,
    env: &[(&str, &str)],
    deadline: Duration,
    what: &str,
) -> String {
    run_script_interactive(name, script, env, deadline, what, |_| None)
}

/// Like [`run_script`], with the script's standard input open: every line it prints on
/// standard output is given to `on_line` as it comes, and a line `on_line` returns is written
/// to the script's standard input (how `tests/e2e-sdk/sdk.mjs` waits while the test restarts
/// the relay). Panics unless the script exited 0 within `deadline`; returns its standard
/// output.
pub fn run_script_interactive(
    name: &str,
    script: &str,
    env: &[(&str, &str)],
    deadline: Duration,
    what: &str,
    mut on_line: impl FnMut(&str) -> Option<String>,
) -> String {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::mpsc;
    let dir = script_dir(name);
    let mut child = Command::new("node")
        .arg(dir.join(script))
        .envs(env.iter().copied())
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn node");
    let mut stdin = child.stdin.take().expect("stdin");
    let (tx, rx) = mpsc::channel::<String>();
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    let reader = std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut err = child.stderr.take().expect("stderr");
    let stderr = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    });
    let started = Instant::now();
    let mut stdout = String::new();
    let mut take = |line: String, stdout: &mut String, stdin: &mut std::process::ChildStdin| {
        stdout.push_str(&line);
        stdout.push('\n');
        if let Some(reply) = on_line(&line) {
            let _ = writeln!(stdin, "{reply}");
            let _ = stdin.flush();
        }
    };
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => take(line, &mut stdout, &mut stdin),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // stdout closed: the script is exiting
                if let Some(status) = child.try_wait().expect("wait for node") {
                    break Some(status);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if let Some(status) = child.try_wait().expect("wait for node") {
            // what it printed last, before it exited
            while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                take(line, &mut stdout, &mut stdin);
            }
            break Some(status);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            while let Ok(line) = rx.try_recv() {
                stdout.push_str(&line);
                stdout.push('\n');
            }
            break None;
        }
    };
    drop(stdin);
    let _ = reader.join();
    let stderr = stderr.join().unwrap_or_default();
    let report =
        format!("{what}\n--- {script} stdout ---\n{stdout}--- {script} stderr ---\n{stderr}");
    match status {
        Some(status) if status.success() => println!("{report}"),
        Some(status) => {
            panic!("the real WalletConnect client failed against the relay: {status}\n{report}")
        }
        None => panic!("{script} did not finish within {deadline:?}\n{report}"),
    }
    stdout
}
