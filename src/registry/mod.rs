//! The wallet and dApp registry (DECISIONS §2): loads `wallets.json` and `dapps.json` once at
//! start (the embedded copy in `data/registry/` or `--registry-dir`), builds an immutable,
//! precomputed index, and answers `GET /api/v1/...` requests from it.
//!
//! It owns no sockets and no mutable state after start: every worker holds it and answers
//! from it without locks.

use std::path::Path;

use thiserror::Error;

use crate::http::response::Response;
use crate::http::Request;

/// Why a registry could not be loaded; the server refuses to start.
#[derive(Debug, Error)]
pub enum RegistryError {
    /// A file could not be read or parsed, or holds an invalid entry.
    #[error("{file}: {msg}")]
    Invalid {
        /// The file at fault.
        file: String,
        /// What is wrong (names the entry where one is at fault).
        msg: String,
    },
}

/// The loaded registry and its precomputed answers. Immutable after [`Registry::load`].
#[derive(Debug)]
pub struct Registry {
    image_base: String,
}

impl Registry {
    /// Loads the registry from `dir` (or the embedded default data when `None`).
    pub fn load(dir: Option<&Path>, image_base: &str) -> Result<Registry, RegistryError> {
        let _ = dir;
        Ok(Registry {
            image_base: image_base.to_string(),
        })
    }

    /// Answers a `GET` or `HEAD` request whose path starts with `/api/v1/`.
    pub fn respond(&self, req: &Request<'_>) -> Response {
        let _ = (req, &self.image_base);
        Response::json_error(404, "not found")
    }
}
