//! Records what the binary was built from, for `walletrelay --version` and
//! `walletrelay_build_info` (`src/version.rs`):
//! - `WALLETRELAY_COMMIT`: the environment variable of that name when set (the Containerfile
//!   passes it as a build argument: the image's build has no `.git`), else
//!   `git rev-parse --short=12 HEAD`, else `unknown`;
//! - `WALLETRELAY_BUILD_DATE`: `YYYY-MM-DD` (UTC) of `SOURCE_DATE_EPOCH` when set
//!   (reproducible builds), else of the day this script ran.
//!
//! It reruns only when those variables change or the checkout moves to another commit
//! (`HEAD`, the branch it names, `packed-refs`), not at every edit of the sources.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=WALLETRELAY_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = match std::env::var("WALLETRELAY_COMMIT") {
        Ok(c) if !clean(&c).is_empty() => clean(&c),
        _ => git_commit().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=WALLETRELAY_COMMIT={commit}");
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    println!("cargo:rustc-env=WALLETRELAY_BUILD_DATE={}", date(secs));
}

/// A commit name as it may appear in `--version` and a metric label: letters, digits,
/// `.`, `-`, `_`, at most 40 characters.
fn clean(s: &str) -> String {
    s.trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(40)
        .collect()
}

/// The short commit of the checkout, and the files whose change means another commit.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = clean(&git(&["rev-parse", "--short=12", "HEAD"])?);
    if commit.is_empty() {
        return None;
    }
    // In a worktree `.git` is a file and the refs live in the common directory: ask git
    // where each file is. A path that does not exist would make cargo rerun every time.
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for name in watch {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    Some(commit)
}

/// `YYYY-MM-DD` of `secs` after the Unix epoch (UTC; Howard Hinnant's civil-from-days).
fn date(secs: u64) -> String {
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}
