//! TLS server configuration: reads the PEM certificate chain and private key named by
//! `--tls-cert` / `--tls-key` and builds the `rustls` [`ServerConfig`] every TLS connection
//! of every worker starts from (TLS 1.2 and 1.3 with the `ring` provider, ALPN `http/1.1`,
//! session resumption by tickets and by a session cache).
//!
//! It owns the resumption state that outlives a reload (the ticket keys and the session
//! cache), so a client resumes across a SIGHUP. It does no socket I/O and keeps no
//! per-connection state (see `tls::session`); handing a new config to the workers is the
//! caller's job.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ProducesTickets, ServerSessionMemoryCache, StoresServerSessions};
use rustls::ServerConfig;

use super::TlsError;

/// The only application protocol offered (RFC 7301): HTTP/1.1, upgraded to WebSocket
/// in place. A client offering ALPN without it gets the `no_application_protocol` alert.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// Sessions kept for TLS 1.2 clients that resume by session id (clients that take tickets,
/// and every TLS 1.3 client, resume statelessly from a ticket). Shared by all workers;
/// about 150 bytes each.
pub const SESSION_CACHE: usize = 4096;

/// Where the certificate chain and the key are read from (`--tls-cert`, `--tls-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file with the certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM file with the private key (PKCS#8, PKCS#1 RSA or SEC1 EC).
    pub key: PathBuf,
}

/// Builds server configs from [`TlsFiles`], at start-up and on every reload.
///
/// Every config it builds shares one ticket key set and one session cache, so a session
/// made before a reload still resumes after it (with the keys it was made with; only new
/// full handshakes show the new certificate).
pub struct TlsLoader {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    ticketer: Arc<dyn ProducesTickets>,
    cache: Arc<dyn StoresServerSessions>,
}

impl std::fmt::Debug for TlsLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsLoader")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl TlsLoader {
    /// A loader for `files` with fresh ticket keys (rotated every 6 hours by `rustls`) and
    /// an empty session cache. Reads nothing yet: call [`TlsLoader::load`].
    pub fn new(files: TlsFiles) -> Result<TlsLoader, TlsError> {
        let ticketer = rustls::crypto::ring::Ticketer::new().map_err(TlsError::Config)?;
        Ok(TlsLoader {
            files,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            ticketer,
            cache: ServerSessionMemoryCache::new(SESSION_CACHE),
        })
    }

    /// A loader for other files that shares this one's ticket keys and session cache, so
    /// sessions made before a move to new files still resume.
    pub fn with_files(&self, files: TlsFiles) -> TlsLoader {
        TlsLoader {
            files,
            provider: Arc::clone(&self.provider),
            ticketer: Arc::clone(&self.ticketer),
            cache: Arc::clone(&self.cache),
        }
    }

    /// The files this loader reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Reads both files now and builds a config from them: at start-up, and on SIGHUP.
    /// On error nothing changes anywhere: keep serving with the previous config.
    pub fn load(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let cert = read(&self.files.cert)?;
        let key = read(&self.files.key)?;
        let chain = parse_chain(&cert, &self.files.cert)?;
        let key = parse_key(&key, &self.files.key)?;
        self.build(chain, key)
    }

    /// Builds a config from PEM bytes already in memory (`cert_path` and `key_path` only
    /// name them in errors).
    pub fn load_pem(
        &self,
        cert_pem: &[u8],
        cert_path: &Path,
        key_pem: &[u8],
        key_path: &Path,
    ) -> Result<Arc<ServerConfig>, TlsError> {
        let chain = parse_chain(cert_pem, cert_path)?;
        let key = parse_key(key_pem, key_path)?;
        self.build(chain, key)
    }

    fn build(
        &self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Arc<ServerConfig>, TlsError> {
        let mut config = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            // Also checks that the key belongs to the leaf certificate.
            .with_single_cert(chain, key)
            .map_err(TlsError::KeyMismatch)?;
        config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        config.ticketer = Arc::clone(&self.ticketer);
        config.session_storage = Arc::clone(&self.cache);
        // No 0-RTT data: it can be replayed, and nothing here needs the round trip saved.
        config.max_early_data_size = 0;
        Ok(Arc::new(config))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn pem_error(path: &Path, e: pem::Error) -> TlsError {
    TlsError::Pem {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// Every `CERTIFICATE` block of `pem`, in order (leaf first, as the file must have them).
fn parse_chain(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(chain)
}

/// The first private key of `pem` (PKCS#8, PKCS#1 or SEC1).
fn parse_key(pem: &[u8], path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoKey {
            path: path.to_path_buf(),
        },
        e => pem_error(path, e),
    })
}
