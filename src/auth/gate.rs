//! The relay's door (DECISIONS §10): what one worker decides about a WebSocket upgrade from
//! its token and project id, before it upgrades. It holds the worker's verified-token cache
//! (no lock: one per worker) and the project allow-list it was last given (SIGHUP replaces
//! it through the worker's mailbox).
//!
//! It only decides; `conn::upgrade` answers (401/403 before upgrading, or close 3000 after
//! it when the client asked for close events).

use std::sync::Arc;

use super::{AuthConfig, ClientKey, ProjectIds, TokenCache, UpgradeAuth};

/// What the door says about one upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let in; with the client id a valid token gave.
    Open(Option<Arc<ClientKey>>),
    /// Refused with this HTTP status (401, 403) and reason.
    Refused(u16, &'static str),
}

/// One worker's relay-auth state.
#[derive(Debug)]
pub struct Gate {
    cache: TokenCache,
    cfg: AuthConfig,
    /// `--require-auth`.
    require: bool,
    /// `--project-ids`, as last loaded.
    projects: Option<Arc<ProjectIds>>,
}

impl Gate {
    /// A worker's door: `audiences` from `--auth-audience`, `require` from `--require-auth`.
    pub fn new(audiences: Vec<String>, require: bool, projects: Option<Arc<ProjectIds>>) -> Gate {
        Gate {
            cache: TokenCache::default(),
            cfg: AuthConfig {
                audiences,
                ..AuthConfig::default()
            },
            require,
            projects,
        }
    }

    /// Takes a reloaded project allow-list (`None`: any project).
    pub fn set_projects(&mut self, projects: Option<Arc<ProjectIds>>) {
        self.projects = projects;
    }

    /// Decides an upgrade whose query and `Authorization` header are `up`, at `now_s`
    /// (Unix seconds): the token first (a bad one is refused even when not required),
    /// then the project.
    pub fn check(&mut self, up: &UpgradeAuth<'_>, now_s: u64) -> Verdict {
        let client = match up.token.as_deref() {
            Some(token) => match self.cache.check(token, now_s, &self.cfg) {
                Ok(id) => Some(id),
                Err(e) => return Verdict::Refused(401, e.reason()),
            },
            None if self.require => return Verdict::Refused(401, "missing auth token"),
            None => None,
        };
        if let Some(p) = &self.projects {
            if !p.allows(up.project_id.as_deref()) {
                return Verdict::Refused(403, "project not allowed");
            }
        }
        Verdict::Open(client)
    }
}

#[cfg(test)]
mod gate_tests {
    use super::*;

    fn up(token: Option<&str>, project: Option<&str>) -> UpgradeAuth<'static> {
        UpgradeAuth {
            token: token.map(|t| t.to_string().into()),
            project_id: project.map(|p| p.to_string().into()),
            use_on_close_event: false,
        }
    }

    #[test]
    fn tokens_and_projects_are_checked_in_order() {
        let mut open = Gate::new(Vec::new(), false, None);
        assert_eq!(open.check(&up(None, None), 0), Verdict::Open(None));
        assert!(matches!(
            open.check(&up(Some("a.b.c"), None), 0),
            Verdict::Refused(401, _)
        ));
        let mut strict = Gate::new(Vec::new(), true, None);
        assert_eq!(
            strict.check(&up(None, None), 0),
            Verdict::Refused(401, "missing auth token")
        );
        let ids = Arc::new(ProjectIds::parse("p1,p2").unwrap());
        let mut listed = Gate::new(Vec::new(), false, Some(ids));
        assert_eq!(listed.check(&up(None, Some("p2")), 0), Verdict::Open(None));
        assert_eq!(
            listed.check(&up(None, Some("p3")), 0),
            Verdict::Refused(403, "project not allowed")
        );
        assert_eq!(
            listed.check(&up(None, None), 0),
            Verdict::Refused(403, "project not allowed")
        );
    }
}
