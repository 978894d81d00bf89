//! Where a project's pushes go: `--push-url URL` (one push server for every project;
//! `{projectId}` in it replaced by the project id) or `--push-urls @FILE` (one `PROJECT_ID
//! URL` pair a line, separated by whitespace, `#` comments; re-read on SIGHUP). Read by the
//! workers lock-free (`arc-swap`); a file that does not load keeps the old table.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::claims::is_http_url;

/// The push URL setting.
#[derive(Debug)]
pub enum PushUrls {
    /// No push configured.
    Off,
    /// One URL template for every project.
    Template(String),
    /// A table per project, from a file.
    File {
        /// The file.
        path: PathBuf,
        /// Its last good contents.
        table: ArcSwap<HashMap<String, String>>,
    },
}

impl PushUrls {
    /// From `--push-url` and `--push-urls` (`@FILE`); the file is read now.
    pub fn new(url: Option<&str>, urls: Option<&str>) -> Result<PushUrls, String> {
        match (url, urls) {
            (Some(_), Some(_)) => Err("--push-url and --push-urls: give one of them".into()),
            (Some(u), None) if is_http_url(u) => {
                Ok(PushUrls::Template(u.trim_end_matches('/').to_string()))
            }
            (Some(u), None) => Err(format!(
                "--push-url {:?}: not an http(s) URL",
                crate::redact::Masked(u)
            )),
            (None, Some(f)) => {
                let path = PathBuf::from(f.strip_prefix('@').ok_or("--push-urls: expected @FILE")?);
                let table = read(&path)?;
                Ok(PushUrls::File {
                    path,
                    table: ArcSwap::from_pointee(table),
                })
            }
            (None, None) => Ok(PushUrls::Off),
        }
    }

    /// Whether any push is configured.
    pub fn on(&self) -> bool {
        !matches!(self, PushUrls::Off)
    }

    /// The push URL of `project` (no trailing `/`), if it has one.
    pub fn url(&self, project: &str) -> Option<String> {
        match self {
            PushUrls::Off => None,
            PushUrls::Template(t) => Some(t.replace("{projectId}", project)),
            PushUrls::File { table, .. } => table.load().get(project).cloned(),
        }
    }

    /// Re-reads the file (SIGHUP); `None` when there is no file.
    pub fn reload(&self) -> Option<Result<usize, String>> {
        let PushUrls::File { path, table } = self else {
            return None;
        };
        Some(read(path).map(|t| {
            let n = t.len();
            table.store(Arc::new(t));
            n
        }))
    }
}

fn read(path: &std::path::Path) -> Result<HashMap<String, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut table = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some(project), Some(url), None) if is_http_url(url) => {
                table.insert(project.to_string(), url.trim_end_matches('/').to_string());
            }
            _ => {
                return Err(format!(
                    "{} line {}: expected `PROJECT_ID URL`",
                    path.display(),
                    i + 1
                ))
            }
        }
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_and_file() {
        let t = PushUrls::new(Some("https://echo.example/{projectId}/"), None).unwrap();
        assert_eq!(t.url("p1").as_deref(), Some("https://echo.example/p1"));
        assert!(PushUrls::new(Some("x"), None).is_err());
        let path = std::env::temp_dir().join(format!("wr-push-{}", std::process::id()));
        std::fs::write(
            &path,
            "# projects\np1 https://a.example/x\n\np2   http://b.example # b\n",
        )
        .unwrap();
        let arg = format!("@{}", path.display());
        let f = PushUrls::new(None, Some(&arg)).unwrap();
        assert_eq!(f.url("p2").as_deref(), Some("http://b.example"));
        assert_eq!(f.url("p3"), None);
        std::fs::write(&path, "p3 https://c.example\n").unwrap();
        assert_eq!(f.reload().unwrap().unwrap(), 1);
        assert_eq!(f.url("p1"), None);
        std::fs::write(&path, "p3\n").unwrap();
        assert!(f.reload().unwrap().is_err());
        assert_eq!(f.url("p3").as_deref(), Some("https://c.example"));
        let _ = std::fs::remove_file(&path);
    }
}
