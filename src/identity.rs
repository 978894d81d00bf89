//! The relay's own identity (DECISIONS 13): one Ed25519 key per relay (per cluster), which
//! `GET /public-key` shows as 64 lowercase hex characters and whose `did:key` is the
//! `relayId` of watch registrations. It signs watch-event JWTs and the push requests to
//! push servers.
//!
//! Where the key comes from, first match wins: `--relay-key FILE` (the 32-byte seed as 64
//! hex characters; whitespace around them is ignored); with `--redis`, the cluster's shared
//! seed (`SET walletrelay:relay-key <hex> NX` then `GET`, done by `notify::cluster_key` at
//! start); `key.hex` in `--data-dir` (created 0600 on first start, read afterwards; a damaged
//! file stops the start); with `--data-dir none`, a fresh key for this process only.
//! Owns the key and its encodings; knows nothing of HTTP or watches.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair as _};

/// The file name of the key in `--data-dir`.
pub const KEY_FILE: &str = "relay-key.hex";

/// The JWT header the relay signs with (relay_rpc's order is `typ` first; any order is read).
const HEADER: &str = r#"{"alg":"EdDSA","typ":"JWT"}"#;

/// Why the key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read or written.
    #[error("relay key {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file does not hold 64 hex characters (a 32-byte seed).
    #[error("relay key {0}: not a 32-byte seed in 64 hex characters (a damaged file: restore or remove it)")]
    Damaged(PathBuf),
    /// The OS random number generator failed.
    #[error("relay key: no randomness for a new key")]
    Random,
    /// The cluster's shared key could not be read or set.
    #[error("relay key in Redis: {0}")]
    Cluster(String),
}

/// The relay's Ed25519 key.
pub struct RelayKey {
    pair: Ed25519KeyPair,
    public_hex: String,
    did_key: String,
    seed_hex: String,
}

impl fmt::Debug for RelayKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayKey")
            .field("public", &self.public_hex)
            .finish_non_exhaustive()
    }
}

/// Where [`RelayKey::load_or_create`] looks.
#[derive(Debug, Clone, Copy)]
pub enum KeySource<'a> {
    /// `--relay-key FILE`.
    File(&'a Path),
    /// `key.hex` in the data directory, created when missing.
    DataDir(&'a Path),
    /// A fresh key for this process.
    Fresh,
}

impl RelayKey {
    /// The key of a 32-byte seed.
    pub fn from_seed(seed: &[u8; 32]) -> RelayKey {
        // A 32-byte seed is always a valid Ed25519 private key; ring only refuses other lengths.
        #[allow(clippy::expect_used, reason = "cannot fail for a 32-byte seed")]
        let pair = Ed25519KeyPair::from_seed_unchecked(seed).expect("32-byte seed");
        let mut public = [0u8; 32];
        public.copy_from_slice(pair.public_key().as_ref());
        RelayKey {
            public_hex: hex(&public),
            did_key: crate::auth::issuer_of(&public),
            seed_hex: hex(seed),
            pair,
        }
    }

    /// The key of a seed written as 64 hex characters (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Option<RelayKey> {
        let t = text.trim();
        let bytes = t.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut seed = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            seed[i] = (hi * 16 + lo) as u8;
        }
        Some(RelayKey::from_seed(&seed))
    }

    /// A fresh random key.
    pub fn random() -> Result<RelayKey, KeyError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|_| KeyError::Random)?;
        Ok(RelayKey::from_seed(&seed))
    }

    /// The key from `source` (see the module's header for the order the server uses).
    pub fn load_or_create(source: KeySource<'_>) -> Result<RelayKey, KeyError> {
        match source {
            KeySource::File(path) => read(path),
            KeySource::DataDir(dir) => {
                let path = dir.join(KEY_FILE);
                match std::fs::metadata(&path) {
                    Ok(_) => read(&path),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        let key = RelayKey::random()?;
                        create(dir, &path, &key)?;
                        log::info!(
                            path:% = path.display();
                            "relay key: created {}", path.display()
                        );
                        Ok(key)
                    }
                    Err(source) => Err(KeyError::Io { path, source }),
                }
            }
            KeySource::Fresh => {
                log::info!("relay key: a fresh key for this process (no --relay-key, no data directory, no Redis)");
                RelayKey::random()
            }
        }
    }

    /// The public key, 64 lowercase hex characters (`GET /public-key`).
    pub fn public_hex(&self) -> &str {
        &self.public_hex
    }

    /// The public key as `did:key:z...` (the `relayId`).
    pub fn did_key(&self) -> &str {
        &self.did_key
    }

    /// The seed as 64 hex characters (what the data directory and Redis hold).
    pub fn seed_hex(&self) -> &str {
        &self.seed_hex
    }

    /// The Ed25519 signature of `msg`.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        let mut out = [0u8; 64];
        out.copy_from_slice(self.pair.sign(msg).as_ref());
        out
    }

    /// A JWT of these claims (JSON bytes): `{"alg":"EdDSA","typ":"JWT"}`, unpadded base64url.
    pub fn jwt(&self, claims_json: &[u8]) -> String {
        let mut t = URL_SAFE_NO_PAD.encode(HEADER);
        t.push('.');
        t.push_str(&URL_SAFE_NO_PAD.encode(claims_json));
        let sig = self.sign(t.as_bytes());
        t.push('.');
        t.push_str(&URL_SAFE_NO_PAD.encode(sig));
        t
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

fn read(path: &Path) -> Result<RelayKey, KeyError> {
    let text = std::fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::InvalidData => KeyError::Damaged(path.to_owned()),
        _ => KeyError::Io {
            path: path.to_owned(),
            source,
        },
    })?;
    RelayKey::from_hex(&text).ok_or_else(|| KeyError::Damaged(path.to_owned()))
}

/// Writes the seed to `path` (mode 0600) through a temporary file, synced and renamed.
fn create(dir: &Path, path: &Path, key: &RelayKey) -> Result<(), KeyError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| KeyError::Io {
        path: path.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!("{KEY_FILE}.tmp"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(key.seed_hex().as_bytes()).map_err(io)?;
    f.write_all(b"\n").map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, ED25519};

    #[test]
    fn encodings_and_signatures_of_a_known_seed() {
        let key = RelayKey::from_seed(&[7u8; 32]);
        assert_eq!(key.public_hex().len(), 64);
        assert!(key
            .public_hex()
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(key.did_key().starts_with("did:key:z6Mk"));
        let again = RelayKey::from_hex(key.seed_hex()).unwrap();
        assert_eq!(again.public_hex(), key.public_hex());
        let sig = key.sign(b"hello");
        let public = UnparsedPublicKey::new(&ED25519, key.pair.public_key().as_ref().to_vec());
        assert!(public.verify(b"hello", &sig).is_ok());
        assert!(public.verify(b"hellO", &sig).is_err());
        let jwt = key.jwt(br#"{"iss":"x"}"#);
        // Not a did:key issuer: the signature checker refuses it before looking further.
        assert_eq!(
            crate::auth::verify_signature(&jwt).err(),
            Some(crate::auth::AuthError::Issuer)
        );
    }

    #[test]
    fn jwt_verifies_against_the_public_key() {
        let key = RelayKey::from_seed(&[9u8; 32]);
        let claims = format!(r#"{{"iss":"{}","act":"irn_watchEvent"}}"#, key.did_key());
        let jwt = key.jwt(claims.as_bytes());
        let (payload, public) = crate::auth::verify_signature(&jwt).unwrap();
        assert_eq!(payload, claims.as_bytes());
        assert_eq!(hex(&public), key.public_hex());
    }

    #[test]
    fn data_dir_key_is_created_0600_then_read_and_a_damaged_file_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("wr-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = RelayKey::load_or_create(KeySource::DataDir(&dir)).unwrap();
        let meta = std::fs::metadata(dir.join(KEY_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let b = RelayKey::load_or_create(KeySource::DataDir(&dir)).unwrap();
        assert_eq!(a.public_hex(), b.public_hex());
        std::fs::write(dir.join(KEY_FILE), "not hex").unwrap();
        let e = RelayKey::load_or_create(KeySource::DataDir(&dir)).unwrap_err();
        assert!(matches!(e, KeyError::Damaged(_)), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
