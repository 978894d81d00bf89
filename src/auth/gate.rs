//! The relay's door (DECISIONS §10): what one worker decides about a WebSocket upgrade from
//! its token and project id, before it upgrades. It holds the worker's verified-token cache
//! (no lock: one per worker) and the project allow-list it was last given (SIGHUP replaces
//! it through the worker's mailbox).
//!
//! It only decides; `conn::upgrade` answers (401/403 before upgrading, or close 3000 after
//! it when the client asked for close events).

use std::sync::Arc;

use super::cache::Check;
use super::{AuthConfig, ClientKey, ProjectIds, TokenCache, UpgradeAuth};

/// What the door says about one upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let in; with the client id a valid token gave.
    Open(Option<Arc<ClientKey>>),
    /// Refused with this HTTP status (401, 403) and reason.
    Refused(u16, &'static str),
    /// The token waits for the round's batch ([`Gate::settle`]): ask again after it.
    Pending,
}

/// One worker's relay-auth state.
#[derive(Debug)]
pub struct Gate {
    cache: TokenCache,
    cfg: AuthConfig,
    /// `POST /rpc`'s tokens: a cache of their own (a token without `exp` verified here
    /// must not pass at the upgrade), `exp` optional, the audiences' http(s) origins too.
    http_cache: TokenCache,
    http_cfg: AuthConfig,
    /// `--require-auth`.
    require: bool,
    /// `--project-ids`, as last loaded.
    projects: Option<Arc<ProjectIds>>,
}

impl Gate {
    /// A worker's door: `audiences` from `--auth-audience`, `require` from `--require-auth`.
    pub fn new(audiences: Vec<String>, require: bool, projects: Option<Arc<ProjectIds>>) -> Gate {
        let http_cfg = AuthConfig {
            audiences: http_audiences(&audiences),
            allow_no_exp: true,
            ..AuthConfig::default()
        };
        Gate {
            cache: TokenCache::default(),
            http_cache: TokenCache::new(DEFAULT_HTTP_CACHE),
            http_cfg,
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

    /// Decides a `POST /rpc` request whose query and `Authorization` header are `up`, at
    /// `now_s`: a token is required (its client id owns what the request does), then the
    /// project, as for an upgrade.
    pub fn check_http(&mut self, up: &UpgradeAuth<'_>, now_s: u64) -> Verdict {
        let client = match up.token.as_deref() {
            Some(token) => match self.http_cache.check(token, now_s, &self.http_cfg) {
                Ok(id) => id,
                Err(e) => return Verdict::Refused(401, e.reason()),
            },
            None => return Verdict::Refused(401, "missing auth token"),
        };
        if let Some(p) = &self.projects {
            if !p.allows(up.project_id.as_deref()) {
                return Verdict::Refused(403, "project not allowed");
            }
        }
        Verdict::Open(Some(client))
    }

    /// Decides an upgrade whose query and `Authorization` header are `up`, at `now_s`
    /// (Unix seconds): the token first (a bad one is refused even when not required),
    /// then the project.
    pub fn check(&mut self, up: &UpgradeAuth<'_>, now_s: u64) -> Verdict {
        self.decide(up, now_s, false)
    }

    /// [`Gate::check`], except that a token this worker has not verified yet is queued
    /// ([`Verdict::Pending`]) to be verified with the round's others in [`Gate::settle`].
    pub fn check_or_queue(&mut self, up: &UpgradeAuth<'_>, now_s: u64) -> Verdict {
        self.decide(up, now_s, true)
    }

    /// Verifies the tokens queued this round (one batch), so that their upgrades, asked
    /// again, are answered from the cache.
    pub fn settle(&mut self, now_s: u64) {
        if self.cache.has_queued() {
            self.cache.settle(now_s, &self.cfg);
        }
    }

    /// Batches of upgrade tokens verified so far, and the tokens they held.
    pub fn batches(&self) -> (u64, u64) {
        self.cache.batches()
    }

    fn decide(&mut self, up: &UpgradeAuth<'_>, now_s: u64, queue: bool) -> Verdict {
        let client = match up.token.as_deref() {
            Some(token) => {
                let checked = if queue {
                    self.cache.check_or_queue(token, now_s, &self.cfg)
                } else {
                    Check::Done(self.cache.check(token, now_s, &self.cfg))
                };
                match checked {
                    Check::Queued => return Verdict::Pending,
                    Check::Done(Ok(id)) => Some(id),
                    Check::Done(Err(e)) => return Verdict::Refused(401, e.reason()),
                }
            }
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

/// Tokens of `POST /rpc` callers a worker remembers (they are few: services).
const DEFAULT_HTTP_CACHE: usize = 256;

/// The audiences an HTTP token may name: each configured one, and for a `ws(s)://` URL also
/// its `http(s)://` origin (what `relay_client`'s HTTP client puts in `aud`), for an
/// `http(s)://` URL also its origin.
pub fn http_audiences(audiences: &[String]) -> Vec<String> {
    let mut out = audiences.to_vec();
    for a in audiences {
        let (scheme, rest) = match a.split_once("://") {
            Some(("wss", r)) | Some(("https", r)) => ("https", r),
            Some(("ws", r)) | Some(("http", r)) => ("http", r),
            _ => continue,
        };
        let host = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        let origin = format!("{scheme}://{host}");
        if !out.contains(&origin) {
            out.push(origin);
        }
    }
    out
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
    fn http_audiences_add_origins() {
        let a = |v: &[&str]| http_audiences(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            a(&["wss://relay.example.com/ws?x=1"]),
            [
                "wss://relay.example.com/ws?x=1",
                "https://relay.example.com"
            ]
        );
        assert_eq!(
            a(&["ws://127.0.0.1:80"]),
            ["ws://127.0.0.1:80", "http://127.0.0.1:80"]
        );
        assert_eq!(a(&["https://r.example"]), ["https://r.example"]);
        assert_eq!(a(&["relay"]), ["relay"]);
    }

    #[test]
    fn http_needs_a_token() {
        let mut open = Gate::new(Vec::new(), false, None);
        assert_eq!(
            open.check_http(&up(None, None), 0),
            Verdict::Refused(401, "missing auth token")
        );
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
