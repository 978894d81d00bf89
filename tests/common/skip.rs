//! Skipped tests, said out loud. A test that cannot set up what it needs on this machine
//! (a tmpfs without root, a kernel without a field, a browser that cannot be installed)
//! calls [`skip`] and returns: the reason goes to stderr and to `target/test-skipped.txt`,
//! and `scripts/test` lists those lines and counts them as skipped, not passed, in its
//! closing line (`tests: N passed, M failed, K skipped`).

use std::io::Write;
use std::path::PathBuf;

/// The file `scripts/test` reads (it empties it before the run).
pub fn skipped_file() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("test-skipped.txt")
}

/// Records that `test` did not run, and why (on one line, whatever `reason` holds: the
/// file is counted by lines). The caller returns right after.
pub fn skip(test: &str, reason: &str) {
    let reason = reason.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = format!("SKIPPED {test}: {reason}");
    eprintln!("{line}");
    let path = skipped_file();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        eprintln!("could not record the skip in {}: {e}", path.display());
    }
}
