//! The TLS client settings of the connections to Redis (`rediss://`, DECISIONS §12): the
//! roots a server is verified against (`--redis-tls-ca FILE`, else the system's bundle) and
//! an optional client certificate (`--redis-tls-cert` / `--redis-tls-key`).
//!
//! Owns: reading those PEM files once at start into one `rustls` [`ClientConfig`] that
//! every shard's connections share. No socket I/O (`link` does the handshakes).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// Where the TLS files are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTlsFiles {
    /// PEM bundle of the CAs a Redis server's certificate must chain to (`None`: the
    /// system's bundle).
    pub ca: Option<PathBuf>,
    /// PEM certificate chain of this node, when Redis wants client certificates.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
}

/// Why the TLS settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RedisTlsError {
    /// A file could not be read or held nothing usable.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// No CA file given and no system bundle found.
    #[error("rediss:// needs the CAs to trust: give --redis-tls-ca FILE (no system bundle found at {0})")]
    NoRoots(String),
    /// Only one of `--redis-tls-cert` / `--redis-tls-key`.
    #[error("--redis-tls-cert and --redis-tls-key go together")]
    HalfPair,
    /// rustls refused the certificate and key.
    #[error("client certificate: {0}")]
    Rustls(String),
}

/// Where Debian, Fedora, Alpine and openSUSE keep the system's CA bundle.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

fn file_err(path: &Path, why: impl ToString) -> RedisTlsError {
    RedisTlsError::File {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, RedisTlsError> {
    let pem = std::fs::read(path).map_err(|e| file_err(path, e))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

/// Builds the client config (TLS 1.2 and 1.3, the `ring` provider).
pub fn client_config(files: &RedisTlsFiles) -> Result<Arc<ClientConfig>, RedisTlsError> {
    let ca = match &files.ca {
        Some(p) => p.clone(),
        None => std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .into_iter()
            .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from))
            .find(|p| p.is_file())
            .ok_or_else(|| RedisTlsError::NoRoots(SYSTEM_BUNDLES.join(", ")))?,
    };
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs(&ca)?);
    if added == 0 {
        return Err(file_err(&ca, "no usable CA certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| RedisTlsError::Rustls(e.to_string()))?
        .with_root_certificates(roots);
    let config = match (&files.cert, &files.key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(c), Some(k)) => {
            let chain = certs(c)?;
            let pem = std::fs::read(k).map_err(|e| file_err(k, e))?;
            let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| file_err(k, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| RedisTlsError::Rustls(e.to_string()))?
        }
        _ => return Err(RedisTlsError::HalfPair),
    };
    Ok(Arc::new(config))
}
