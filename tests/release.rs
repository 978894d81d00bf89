//! Releases move together (docs/RELEASING.md): the crate's version has a dated section at the
//! top of CHANGELOG.md (under `## [Unreleased]`) with its link at the bottom, and the binary's
//! `--version` prints that version with a commit and the data layouts it reads and writes.

use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn changelog() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/CHANGELOG.md");
    std::fs::read_to_string(path).expect("read CHANGELOG.md")
}

/// The version headings of the changelog, in order: `(version, date)`, `Unreleased` without one.
fn headings(text: &str) -> Vec<(String, Option<String>)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("## ["))
        .map(|rest| {
            let (version, after) = rest.split_once(']').expect("a heading closes its [");
            let date = after.strip_prefix(" - ").map(str::to_string);
            (version.to_string(), date)
        })
        .collect()
}

#[test]
fn the_crate_version_is_the_newest_dated_section_of_the_changelog() {
    let text = changelog();
    let h = headings(&text);
    assert_eq!(
        h.first().map(|(v, _)| v.as_str()),
        Some("Unreleased"),
        "the changelog starts with ## [Unreleased]"
    );
    let (newest, date) = h.get(1).expect("a released section under Unreleased");
    assert_eq!(
        newest, VERSION,
        "Cargo.toml says {VERSION}, the changelog's newest release is {newest}"
    );
    let date = date.as_deref().expect("the release is dated");
    let ok = date.len() == 10
        && date.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    assert!(ok, "release date {date:?} is not YYYY-MM-DD");
    // Versions only go down the page, each once.
    let released: Vec<Vec<u64>> = h[1..]
        .iter()
        .map(|(v, _)| {
            v.split('.')
                .map(|n| n.parse().expect("numeric version"))
                .collect()
        })
        .collect();
    assert!(
        released.windows(2).all(|w| w[0] > w[1]),
        "versions decrease down the changelog: {released:?}"
    );
    for (v, _) in &h {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("[{v}]: "))),
            "no link line for [{v}] at the bottom"
        );
    }
    // Each release names the data layouts it reads and writes.
    for (v, _) in &h[1..] {
        let section = text
            .split(&format!("## [{v}]"))
            .nth(1)
            .and_then(|s| s.split("\n## [").next())
            .expect("section text");
        assert!(
            section.contains("Data layouts:"),
            "section {v} does not name its data layouts"
        );
    }
}

#[test]
fn version_prints_the_crate_version_the_commit_and_the_layouts() {
    let out = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .arg("--version")
        .output()
        .expect("run walletrelay --version");
    assert!(out.status.success(), "--version exits 0");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("walletrelay {VERSION} (commit ")),
        "first line: {first:?}"
    );
    let layouts = lines.next().unwrap_or_default();
    assert!(
        layouts.starts_with("data layouts: redis ") && layouts.contains(", journal "),
        "second line: {layouts:?}"
    );
    // The changelog's newest section names the same layouts the binary says it writes.
    let text = changelog();
    let section = text
        .split(&format!("## [{VERSION}]"))
        .nth(1)
        .expect("the version's section");
    let redis = layouts
        .split("redis ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .expect("redis layout number");
    let journal = layouts
        .split("journal ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .expect("journal layout number");
    assert!(
        section.contains(&format!("Redis {redis} "))
            && section.contains(&format!("journal {journal} ")),
        "the changelog's {VERSION} section names Redis {redis} and journal {journal}"
    );
}
