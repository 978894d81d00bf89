//! A test-only relay-auth signer on ring: Ed25519 keys and tokens of any header and payload,
//! to cover claim shapes the SDK's vectors do not.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair as _};

use super::issuer_of;

/// The SDK's header, byte for byte.
pub(crate) const HEADER: &str = r#"{"alg":"EdDSA","typ":"JWT"}"#;

pub(crate) struct Signer {
    key: Ed25519KeyPair,
    pub(crate) public: [u8; 32],
    pub(crate) iss: String,
}

impl Signer {
    /// A fresh random key.
    pub(crate) fn random() -> Signer {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Signer::of(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap())
    }

    /// The key of a 32-byte seed, as `generateKeyPair(seed)` makes it.
    pub(crate) fn from_seed(seed: &[u8]) -> Signer {
        Signer::of(Ed25519KeyPair::from_seed_unchecked(seed).unwrap())
    }

    fn of(key: Ed25519KeyPair) -> Signer {
        let public: [u8; 32] = key.public_key().as_ref().try_into().unwrap();
        Signer {
            iss: issuer_of(&public),
            key,
            public,
        }
    }

    /// `b64(header).b64(payload).b64(sig)` over arbitrary header and payload bytes.
    pub(crate) fn sign_raw(&self, header: &[u8], payload: &[u8]) -> String {
        let mut t = URL_SAFE_NO_PAD.encode(header);
        t.push('.');
        t.push_str(&URL_SAFE_NO_PAD.encode(payload));
        let sig = self.key.sign(t.as_bytes());
        t.push('.');
        t.push_str(&URL_SAFE_NO_PAD.encode(sig.as_ref()));
        t
    }

    /// A token as the SDK makes it (same key order, same header).
    pub(crate) fn sign(&self, sub: &str, aud: &str, iat: u64, exp: u64) -> String {
        let payload = format!(
            r#"{{"iss":"{}","sub":"{sub}","aud":"{aud}","iat":{iat},"exp":{exp}}}"#,
            self.iss
        );
        self.sign_raw(HEADER.as_bytes(), payload.as_bytes())
    }

    /// A token of the SDK's header and this payload JSON.
    pub(crate) fn sign_payload(&self, payload: &str) -> String {
        self.sign_raw(HEADER.as_bytes(), payload.as_bytes())
    }
}
