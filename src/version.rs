//! What this build is: the crate's version, the commit and the date `build.rs` recorded,
//! and the text of `walletrelay --version` (with the data layouts of [`crate::layout`]).
//! A leaf under `layout`.
//!
//! Owns these strings only; `config` hands [`text`] to clap, `admin` renders
//! `walletrelay_build_info` from them.

use std::sync::OnceLock;

/// The crate's version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the binary was built from: `WALLETRELAY_COMMIT` at build time, else
/// `git rev-parse --short=12 HEAD`, else `unknown` (`build.rs`).
pub const COMMIT: &str = env!("WALLETRELAY_COMMIT");

/// The build's date, `YYYY-MM-DD` in UTC (`SOURCE_DATE_EPOCH` when set; `build.rs`).
pub const BUILD_DATE: &str = env!("WALLETRELAY_BUILD_DATE");

/// What `--version` prints after the program's name: two lines, e.g.
/// `0.2.0 (commit 0123456789ab, 2026-12-02)` and
/// `data layouts: redis 5 (reads 5, writes 5), journal 1 (reads 1, writes 1)`.
pub fn text() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let layouts: Vec<String> = crate::layout::all()
            .iter()
            .map(ToString::to_string)
            .collect();
        format!(
            "{VERSION} (commit {COMMIT}, {BUILD_DATE})\ndata layouts: {}",
            layouts.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_text_is_two_lines() {
        let t = text();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "{t}");
        assert!(lines[0].starts_with(&format!("{VERSION} (commit ")), "{t}");
        assert!(lines[0].ends_with(&format!(", {BUILD_DATE})")), "{t}");
        assert_eq!(BUILD_DATE.len(), 10, "{BUILD_DATE}");
        assert!(COMMIT == "unknown" || COMMIT.len() >= 7, "{COMMIT}");
        assert!(lines[1].starts_with("data layouts: redis 5 "), "{t}");
    }
}
