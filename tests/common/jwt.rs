//! Relay-auth JWTs as `@walletconnect/relay-auth` and `relay_client` make them: an Ed25519
//! client key ([`Client`]), its `did:key` client id, and tokens with the claims a test
//! chooses (`exp` may be left out, as the HTTP transport's tokens do).

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};

/// Unix seconds now.
pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A client's Ed25519 key: it signs its relay-auth tokens.
pub struct Client {
    key: Ed25519KeyPair,
}

impl Default for Client {
    fn default() -> Self {
        Client::new()
    }
}

impl Client {
    /// A fresh random key.
    pub fn new() -> Client {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        Client {
            key: Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
        }
    }

    /// Its client id, `did:key:z6Mk...`.
    pub fn id(&self) -> String {
        let pk: [u8; 32] = self.key.public_key().as_ref().try_into().unwrap();
        walletrelay::auth::issuer_of(&pk)
    }

    /// A token with these claims, signed (header `{"alg":"EdDSA","typ":"JWT"}`).
    pub fn sign(&self, claims: &Value) -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let header = b64(br#"{"alg":"EdDSA","typ":"JWT"}"#);
        let payload = b64(claims.to_string().as_bytes());
        let signed = format!("{header}.{payload}");
        let sig = b64(self.key.sign(signed.as_bytes()).as_ref());
        format!("{signed}.{sig}")
    }

    /// A token issued at `iat`, expiring at `exp` (none when `None`), for audience `aud`.
    pub fn token_for(&self, aud: &str, iat: u64, exp: Option<u64>) -> String {
        let mut claims = json!({"iss": self.id(), "sub": "ab".repeat(32), "aud": aud, "iat": iat});
        if let Some(exp) = exp {
            claims["exp"] = json!(exp);
        }
        self.sign(&claims)
    }

    /// A token for `ws://relay` issued at `iat`, expiring at `exp`.
    pub fn token(&self, iat: u64, exp: u64) -> String {
        self.token_for("ws://relay", iat, Some(exp))
    }

    /// A token valid for a day from now.
    pub fn fresh_token(&self) -> String {
        let now = now_s();
        self.token(now, now + 86400)
    }
}
