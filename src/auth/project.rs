//! The `--project-ids` allow-list: `ID,ID,...` or `@FILE`. A plain value: parsed once,
//! re-read from its file with [`ProjectIds::reload`]; the caller swaps it (an `Arc`) on SIGHUP.
//! Knows nothing of requests beyond "is this projectId allowed".

use std::collections::HashSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};

/// Largest allow-list file read, in bytes.
pub const MAX_FILE_LEN: u64 = 16 << 20;

/// The set of project ids allowed to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectIds {
    ids: HashSet<Box<str>>,
    /// The file the list came from (`@FILE`), for [`ProjectIds::reload`].
    file: Option<PathBuf>,
}

impl ProjectIds {
    /// The list `--project-ids` gives (`None`: unset, any project), shared by the workers.
    pub fn from_flag(spec: Option<&str>) -> Result<Option<std::sync::Arc<ProjectIds>>, String> {
        spec.map(|s| ProjectIds::parse(s).map(std::sync::Arc::new))
            .transpose()
    }

    /// Parses `ID,ID,...` (surrounding whitespace ignored) or `@FILE`: a file of ids separated
    /// by commas, spaces or newlines, `#` starting a comment to the end of the line. A list
    /// without any id is an error (it would refuse every client).
    pub fn parse(spec: &str) -> Result<ProjectIds, String> {
        match spec.strip_prefix('@') {
            Some(path) => ProjectIds::from_file(Path::new(path)),
            None => {
                let ids = ids_of(spec.split(','));
                if ids.is_empty() {
                    return Err(format!("--project-ids {spec:?}: no project id"));
                }
                Ok(ProjectIds { ids, file: None })
            }
        }
    }

    /// Reads the list again from its file; a list given inline is returned as it is.
    pub fn reload(&self) -> Result<ProjectIds, String> {
        match &self.file {
            Some(path) => ProjectIds::from_file(path),
            None => Ok(self.clone()),
        }
    }

    /// Whether a request with this `projectId` may connect (a missing one may not).
    pub fn allows(&self, id: Option<&str>) -> bool {
        id.is_some_and(|id| self.ids.contains(id))
    }

    /// The file the list came from, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Ids listed.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when no id is listed (never, for a parsed list).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Parses an allow-list file.
    fn from_file(path: &Path) -> Result<ProjectIds, String> {
        let shown = path.display();
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_FILE_LEN + 1).read_to_string(&mut text))
            .map_err(|e| format!("--project-ids @{shown}: {e}"))?;
        if text.len() as u64 > MAX_FILE_LEN {
            return Err(format!(
                "--project-ids @{shown}: larger than {MAX_FILE_LEN} bytes"
            ));
        }
        let words = text
            .lines()
            .map(|l| l.split_once('#').map_or(l, |(before, _)| before))
            .flat_map(|l| l.split(|c: char| c == ',' || c.is_whitespace()));
        let ids = ids_of(words);
        if ids.is_empty() {
            return Err(format!("--project-ids @{shown}: no project id in the file"));
        }
        Ok(ProjectIds {
            ids,
            file: Some(path.to_path_buf()),
        })
    }
}

/// The non-empty trimmed words as a set.
fn ids_of<'a>(words: impl Iterator<Item = &'a str>) -> HashSet<Box<str>> {
    words
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(Box::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh file under the temp dir, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, text: &str) -> TempFile {
            let p = std::env::temp_dir().join(format!(
                "walletrelay-project-ids-{}-{name}",
                std::process::id()
            ));
            std::fs::write(&p, text).unwrap();
            TempFile(p)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn inline_list() {
        let p = ProjectIds::parse("abc, def ,ghi,,").unwrap();
        assert_eq!(p.len(), 3);
        for id in ["abc", "def", "ghi"] {
            assert!(p.allows(Some(id)));
        }
        assert!(!p.allows(Some("ab")));
        assert!(!p.allows(Some("")));
        assert!(!p.allows(Some(" abc")));
        assert!(!p.allows(None));
        assert!(p.file().is_none());
        assert_eq!(p.reload().unwrap(), p);
    }

    #[test]
    fn empty_list_is_an_error() {
        assert!(ProjectIds::parse("").is_err());
        assert!(ProjectIds::parse(" , ,").is_err());
    }

    #[test]
    fn file_list_and_reload() {
        let f = TempFile::new(
            "list",
            "# allowed projects\nabc,def\n  ghi jkl\t# trailing comment, not-an-id\n\n#all of this\nmno\r\n",
        );
        let spec = format!("@{}", f.0.display());
        let p = ProjectIds::parse(&spec).unwrap();
        assert_eq!(p.len(), 5);
        for id in ["abc", "def", "ghi", "jkl", "mno"] {
            assert!(p.allows(Some(id)), "{id}");
        }
        assert!(!p.allows(Some("not-an-id")));
        assert!(!p.allows(Some("#all")));
        assert_eq!(p.file(), Some(f.0.as_path()));

        std::fs::write(&f.0, "xyz\n").unwrap();
        let q = p.reload().unwrap();
        assert!(q.allows(Some("xyz")));
        assert!(!q.allows(Some("abc")));
        assert!(p.allows(Some("abc")), "the old value is unchanged");

        std::fs::write(&f.0, "# nobody\n").unwrap();
        assert!(q.reload().is_err());
        std::fs::remove_file(&f.0).unwrap();
        let e = q.reload().unwrap_err();
        assert!(e.contains(&f.0.display().to_string()), "{e}");
    }

    #[test]
    fn missing_file_is_an_error() {
        assert!(ProjectIds::parse("@/nonexistent/walletrelay/project-ids").is_err());
        assert!(ProjectIds::parse("@").is_err());
    }
}
