//! Ed25519 JWTs as a WalletConnect client signs them (`@walletconnect/relay-auth`'s header,
//! unpadded base64url, the key's `did:key` as `iss`), over any claims: relay-auth tokens
//! and the watched client's `registerAuth` / `unregisterAuth`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use serde_json::{json, Value};

/// Unix seconds now.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A relay-auth client: its key is its client id.
pub type Client = Signer;

/// A client key.
pub struct Signer {
    key: Ed25519KeyPair,
}

impl Default for Signer {
    fn default() -> Self {
        Signer::random()
    }
}

impl Signer {
    /// A fresh random key.
    pub fn random() -> Signer {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Signer {
            key: Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
        }
    }

    /// Its client id, `did:key:z6Mk...`.
    pub fn did(&self) -> String {
        did_key(self.key.public_key().as_ref())
    }

    /// A fresh random key (as [`Signer::random`]).
    pub fn new() -> Signer {
        Signer::random()
    }

    /// Its client id (as [`Signer::did`]).
    pub fn id(&self) -> String {
        self.did()
    }

    /// A relay-auth token issued at `iat`, expiring at `exp` (none when `None`), for
    /// audience `aud`.
    pub fn token_for(&self, aud: &str, iat: u64, exp: Option<u64>) -> String {
        let mut claims = json!({"iss": self.did(), "sub": "ab".repeat(32), "aud": aud, "iat": iat});
        if let Some(exp) = exp {
            claims["exp"] = json!(exp);
        }
        self.sign(&claims)
    }

    /// A relay-auth token for `ws://relay` issued at `iat`, expiring at `exp`.
    pub fn token(&self, iat: u64, exp: u64) -> String {
        self.token_for("ws://relay", iat, Some(exp))
    }

    /// A relay-auth token valid for a day from now.
    pub fn fresh_token(&self) -> String {
        let now = now_s();
        self.token(now, now + 86400)
    }

    /// A token of these claims (a JSON object), signed by this key.
    pub fn sign(&self, claims: &Value) -> String {
        let mut t = URL_SAFE_NO_PAD.encode(br#"{"alg":"EdDSA","typ":"JWT"}"#);
        t.push('.');
        t.push_str(&URL_SAFE_NO_PAD.encode(claims.to_string()));
        let sig = self.key.sign(t.as_bytes());
        t.push('.');
        t.push_str(&URL_SAFE_NO_PAD.encode(sig.as_ref()));
        t
    }
}

/// `did:key:z` + base58btc(0xed 0x01 ‖ key) of an Ed25519 public key.
pub fn did_key(public: &[u8]) -> String {
    let mut raw = vec![0xed, 0x01];
    raw.extend_from_slice(public);
    format!("did:key:z{}", bs58::encode(raw).into_string())
}

/// The payload of a token, decoded (no check).
pub fn claims_of(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// Whether `token`'s signature is the Ed25519 signature of the key `public`.
pub fn verifies(token: &str, public: &[u8]) -> bool {
    let (signed, sig) = token.rsplit_once('.').unwrap();
    let sig = URL_SAFE_NO_PAD.decode(sig).unwrap();
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
        .verify(signed.as_bytes(), &sig)
        .is_ok()
}

/// Bytes of a hex string.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
