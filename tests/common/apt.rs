//! Tools a test needs from Debian's packages: found on `PATH`, or installed with apt-get
//! when the test runs as root (a fresh CI machine has only Rust, gcc, python3 and node).
//! A test that gets `Err` records why with [`super::skip::skip`] and returns.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// The path of an executable called `name` on `PATH`, if any.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `bin` on `PATH`, or installed from Debian's package `package` (apt-get, only as root);
/// `Err` says why not. One install at a time per test binary (apt holds a lock).
pub fn tool(bin: &str, package: &str) -> Result<PathBuf, String> {
    static APT: Mutex<()> = Mutex::new(());
    let _apt = APT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = on_path(bin) {
        return Ok(p);
    }
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || on_path("apt-get").is_none() {
        return Err(format!(
            "`{bin}` is not installed and cannot be installed here (needs root and apt-get: \
             apt-get install {package})"
        ));
    }
    eprintln!("`{bin}` not found; running apt-get install -y {package}");
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .map_err(|e| format!("could not run apt-get: {e}"))
            .and_then(|o| {
                if o.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "apt-get {} failed ({}): {}",
                        args.join(" "),
                        o.status,
                        String::from_utf8_lossy(&o.stderr)
                    ))
                }
            })
    };
    apt(&["update", "-qq"])?;
    apt(&["install", "-y", "-qq", package])?;
    on_path(bin).ok_or_else(|| format!("apt-get installed {package} but `{bin}` is not on PATH"))
}
