//! SIGHUP: what is re-read without a restart (the TLS certificate and key, the registry
//! directory, the project allow-list) and how the result reaches the workers: one [`Reload`]
//! per worker, handed to the [`Broadcast`] the server gives (each worker's own mailbox) and
//! applied by the worker between two connections' input, so a request is answered wholly
//! from the old state or wholly from the new one.
//!
//! Whatever fails to load leaves every worker with what it had, and is logged with the
//! reason (the file, the entry). Connections already open are not touched: a TLS
//! connection keeps the configuration it was accepted with.
//!
//! This module owns the loading and the sending; it must not touch a worker's state (the
//! worker applies the message) nor the signal handling itself (`server`).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;

use crate::auth::ProjectIds;
use crate::registry::{Registry, RegistryError};
use crate::tls::{TlsError, TlsLoader};

/// A reloaded piece of state, for one worker.
#[derive(Clone)]
pub enum Reload {
    /// The configuration new TLS connections start from.
    Tls(Arc<ServerConfig>),
    /// The registry to answer from (the worker also drops its cache of assembled answers).
    Registry(Arc<Registry>),
    /// The project allow-list (`--project-ids @FILE`) new upgrades are checked against.
    Projects(Arc<ProjectIds>),
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
    /// The project allow-list file.
    pub projects: Option<Result<(), String>>,
}

/// Re-reads what SIGHUP re-reads and hands it to every worker.
pub struct Reloader {
    tls: Option<TlsLoader>,
    registry_dir: Option<PathBuf>,
    image_base: String,
    /// `--project-ids`, when it names a file.
    projects: Option<Arc<ProjectIds>>,
    broadcast: Broadcast,
}

/// Hands a reload to every worker.
pub type Broadcast = Box<dyn Fn(Reload) + Send + Sync>;

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("tls", &self.tls)
            .field("registry_dir", &self.registry_dir)
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
            projects: None,
            broadcast,
        }
    }

    /// Also re-reads the project allow-list `ids` came from, when it came from a file.
    pub fn with_projects(mut self, ids: Option<Arc<ProjectIds>>) -> Reloader {
        self.projects = ids.filter(|p| p.file().is_some());
        self
    }

    /// Loads everything configured and sends what loaded to every worker; logs what was
    /// reloaded and, for what failed, why the old state stays.
    pub fn reload(&self) -> Outcome {
        let tls = self.tls.as_ref().map(|loader| match loader.load() {
            Ok(config) => {
                (self.broadcast)(Reload::Tls(Arc::clone(&config)));
                log::info!(
                    "reload: TLS certificate {} and key {} loaded; new connections use them",
                    loader.files().cert.display(),
                    loader.files().key.display()
                );
                Ok(())
            }
            Err(e) => {
                log::error!("reload: TLS not reloaded, the old certificate stays: {e}");
                Err(e)
            }
        });
        let registry = self.registry_dir.as_deref().map(|dir| {
            match Registry::load(Some(dir), &self.image_base) {
                Ok(r) => {
                    let r = Arc::new(r);
                    (self.broadcast)(Reload::Registry(Arc::clone(&r)));
                    log::info!("reload: registry reloaded from {}", dir.display());
                    Ok(())
                }
                Err(e) => {
                    log::error!("reload: registry not reloaded, the old one stays: {e}");
                    Err(e)
                }
            }
        });
        let projects = self.projects.as_ref().map(|p| match p.reload() {
            Ok(ids) => {
                let ids = Arc::new(ids);
                (self.broadcast)(Reload::Projects(Arc::clone(&ids)));
                log::info!("reload: {} project ids loaded", ids.len());
                Ok(())
            }
            Err(e) => {
                log::error!("reload: project ids not reloaded, the old list stays: {e}");
                Err(e)
            }
        });
        Outcome {
            tls,
            registry,
            projects,
        }
    }
}
