//! SIGHUP: what is re-read without a restart (the TLS certificate and key, the registry
//! directory, the project allow-list; first the `--config` file, whose new `tls-cert`,
//! `tls-key`, `registry-dir` and `project-ids` are taken unless a flag or an environment
//! variable gives them) and how the result reaches the workers: one [`Reload`]
//! per worker, handed to the [`Broadcast`] the server gives (each worker's own mailbox) and
//! applied by the worker between two connections' input, so a request is answered wholly
//! from the old state or wholly from the new one.
//!
//! Whatever fails to load leaves every worker with what it had, and is logged with the
//! reason (the file, the entry); a configuration file that does not load changes nothing
//! it names (the files already named are still re-read). Connections already open are not touched: a TLS
//! connection keeps the configuration it was accepted with.
//!
//! This module owns the loading and the sending; it must not touch a worker's state (the
//! worker applies the message) nor the signal handling itself (`server`).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;

use crate::auth::ProjectIds;
use crate::config::{Reloadable, Watch};
use crate::registry::{Registry, RegistryError};
use crate::tls::{TlsError, TlsFiles, TlsLoader};

/// A reloaded piece of state, for one worker.
#[derive(Clone)]
pub enum Reload {
    /// The configuration new TLS connections start from.
    Tls(Arc<ServerConfig>),
    /// The registry to answer from (the worker also drops its cache of assembled answers).
    Registry(Arc<Registry>),
    /// The project allow-list new upgrades are checked against (`None`: any project).
    Projects(Option<Arc<ProjectIds>>),
}

impl std::fmt::Debug for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reload::Tls(_) => f.write_str("Reload::Tls"),
            Reload::Registry(_) => f.write_str("Reload::Registry"),
            Reload::Projects(_) => f.write_str("Reload::Projects"),
        }
    }
}

/// What one reload did, per part (`None`: that part is not configured).
#[derive(Debug)]
pub struct Outcome {
    /// The TLS certificate and key.
    pub tls: Option<Result<(), TlsError>>,
    /// The registry directory.
    pub registry: Option<Result<(), RegistryError>>,
    /// The project allow-list.
    pub projects: Option<Result<(), String>>,
}

/// Re-reads what SIGHUP re-reads and hands it to every worker.
pub struct Reloader {
    tls: Option<TlsLoader>,
    /// `--registry-dir` (`None`: the embedded registry, which never changes).
    registry_dir: Option<PathBuf>,
    image_base: String,
    /// `--project-ids` as given, and the list it made (`None`: any project).
    project_spec: Option<String>,
    projects: Option<Arc<ProjectIds>>,
    /// The `--config` file, re-read first.
    config: Option<Watch>,
    broadcast: Broadcast,
}

/// Hands a reload to every worker.
pub type Broadcast = Box<dyn Fn(Reload) + Send + Sync>;

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("tls", &self.tls)
            .field("registry_dir", &self.registry_dir)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// A reloader for the TLS files of `tls` (if any) and `registry_dir` (if any; the
    /// embedded registry never changes), handing what loaded to `broadcast`.
    pub fn new(
        tls: Option<TlsLoader>,
        registry_dir: Option<PathBuf>,
        image_base: String,
        broadcast: Broadcast,
    ) -> Reloader {
        Reloader {
            tls,
            registry_dir,
            image_base,
            project_spec: None,
            projects: None,
            config: None,
            broadcast,
        }
    }

    /// Also re-reads the project allow-list `ids` (made from `spec`, `--project-ids`) when
    /// it came from a file.
    pub fn with_projects(mut self, spec: Option<String>, ids: Option<Arc<ProjectIds>>) -> Reloader {
        self.project_spec = spec;
        self.projects = ids;
        self
    }

    /// Re-reads `config` first on every reload and applies its reloadable values.
    pub fn watch_config(&mut self, config: Watch) {
        self.config = Some(config);
    }

    /// Loads everything configured and sends what loaded to every worker; logs what was
    /// reloaded and, for what failed, why the old state stays.
    pub fn reload(&mut self) -> Outcome {
        let wanted = self.config.as_ref().and_then(|w| match w.reread() {
            Ok(r) => {
                log::info!(reload = "config", outcome = "loaded", path:% = w.path().display();
                    "reload: config {} re-read", w.path().display());
                Some(r)
            }
            Err(e) => {
                log::error!(reload = "config", outcome = "failed", error:% = e;
                    "reload: {e}; the values it gave stay");
                None
            }
        });
        Outcome {
            tls: self.reload_tls(wanted.as_ref()),
            registry: self.reload_registry(wanted.as_ref()),
            projects: self.reload_projects(wanted.as_ref()),
        }
    }

    /// The certificate and key: from the files `wanted` names when they differ (the loader
    /// moves to them once they load), else again from the same files.
    fn reload_tls(&mut self, wanted: Option<&Reloadable>) -> Option<Result<(), TlsError>> {
        let loader = self.tls.as_ref()?;
        let moved = wanted
            .and_then(|w| {
                Some(TlsFiles {
                    cert: w.tls_cert.clone()?,
                    key: w.tls_key.clone()?,
                })
            })
            .filter(|f| f != loader.files())
            .map(|f| loader.with_files(f));
        let from = moved.as_ref().unwrap_or(loader);
        let (cert, key) = (from.files().cert.display(), from.files().key.display());
        match from.load() {
            Ok(config) => {
                (self.broadcast)(Reload::Tls(config));
                log::info!(reload = "tls", outcome = "loaded", cert:% = cert, key:% = key;
                    "reload: TLS certificate {cert} and key {key} loaded; new connections use them"
                );
                if moved.is_some() {
                    self.tls = moved;
                }
                Some(Ok(()))
            }
            Err(e) => {
                log::error!(
                    reload = "tls", outcome = "failed", cert:% = cert, key:% = key, error:% = e;
                    "reload: TLS not reloaded, the old certificate stays: {e}");
                Some(Err(e))
            }
        }
    }

    /// The registry: from the directory `wanted` names when it differs (none: the embedded
    /// data), else again from the same directory.
    fn reload_registry(
        &mut self,
        wanted: Option<&Reloadable>,
    ) -> Option<Result<(), RegistryError>> {
        let moved = wanted
            .map(|w| w.registry_dir.clone())
            .filter(|d| *d != self.registry_dir);
        let dir = match &moved {
            Some(dir) => dir.clone(),
            None => Some(self.registry_dir.clone()?),
        };
        let shown = dir
            .as_ref()
            .map_or("the embedded data".to_string(), |d| d.display().to_string());
        match Registry::load(dir.as_deref(), &self.image_base) {
            Ok(r) => {
                (self.broadcast)(Reload::Registry(Arc::new(r)));
                log::info!(reload = "registry", outcome = "loaded", from = shown.as_str();
                    "reload: registry reloaded from {shown}");
                if let Some(dir) = moved {
                    self.registry_dir = dir;
                }
                Some(Ok(()))
            }
            Err(e) => {
                log::error!(reload = "registry", outcome = "failed", error:% = e;
                    "reload: registry not reloaded, the old one stays: {e}");
                Some(Err(e))
            }
        }
    }

    /// The project allow-list: the one `wanted` gives when it differs, else again from its
    /// file (a list given inline does not change).
    fn reload_projects(&mut self, wanted: Option<&Reloadable>) -> Option<Result<(), String>> {
        if let Some(spec) = wanted
            .map(|w| w.project_ids.clone())
            .filter(|s| *s != self.project_spec)
        {
            return Some(match ProjectIds::from_flag(spec.as_deref()) {
                Ok(ids) => {
                    (self.broadcast)(Reload::Projects(ids.clone()));
                    match &ids {
                        Some(ids) => {
                            log::info!(reload = "project-ids", outcome = "loaded", ids = ids.len();
                            "reload: project-ids changed: {} ids", ids.len())
                        }
                        None => log::info!(reload = "project-ids", outcome = "loaded";
                            "reload: project-ids unset: any project may connect"),
                    }
                    (self.project_spec, self.projects) = (spec, ids);
                    Ok(())
                }
                Err(e) => {
                    log::error!(reload = "project-ids", outcome = "failed", error:% = e;
                        "reload: project ids not reloaded, the old list stays: {e}");
                    Err(e)
                }
            });
        }
        let p = self.projects.as_ref().filter(|p| p.file().is_some())?;
        Some(match p.reload() {
            Ok(ids) => {
                let ids = Arc::new(ids);
                (self.broadcast)(Reload::Projects(Some(Arc::clone(&ids))));
                log::info!(reload = "project-ids", outcome = "loaded", ids = ids.len();
                    "reload: {} project ids loaded", ids.len());
                self.projects = Some(ids);
                Ok(())
            }
            Err(e) => {
                log::error!(reload = "project-ids", outcome = "failed", error:% = e;
                    "reload: project ids not reloaded, the old list stays: {e}");
                Err(e)
            }
        })
    }
}
