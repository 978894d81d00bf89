//! A relay-auth client as `@walletconnect/relay-auth` is one: an Ed25519 key, its client id
//! (`did:key:z6Mk...`), and the JWTs it signs (header, claims, signature), for tests that
//! connect as a client id.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::json;

use super::Ws;

/// One client id.
pub struct AuthClient {
    key: Ed25519KeyPair,
}

impl AuthClient {
    /// A new random key.
    pub fn new() -> AuthClient {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        AuthClient {
            key: Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
        }
    }

    /// The key of a 32-byte seed (the same client id on every run).
    pub fn from_seed(seed: &[u8; 32]) -> AuthClient {
        AuthClient {
            key: Ed25519KeyPair::from_seed_unchecked(seed).unwrap(),
        }
    }

    /// Its client id.
    pub fn id(&self) -> String {
        let pk: [u8; 32] = self.key.public_key().as_ref().try_into().unwrap();
        walletrelay::auth::issuer_of(&pk)
    }

    /// A token valid for a day from now.
    pub fn token(&self) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        self.token_at(now)
    }

    /// A token issued at `now` (Unix seconds: a server whose clock is not this one's),
    /// valid for a day.
    pub fn token_at(&self, now: u64) -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let header = b64(br#"{"alg":"EdDSA","typ":"JWT"}"#);
        let claims = json!({"iss": self.id(), "sub": "ab".repeat(32), "aud": "ws://relay",
            "iat": now, "exp": now + 86400});
        let signed = format!("{header}.{}", b64(claims.to_string().as_bytes()));
        let sig = b64(self.key.sign(signed.as_bytes()).as_ref());
        format!("{signed}.{sig}")
    }

    /// A WebSocket to `addr` as this client (project `p`).
    pub fn connect(&self, addr: SocketAddr) -> Ws {
        self.connect_with(addr, &self.token())
    }

    /// A WebSocket to `addr` as this client with `token`.
    pub fn connect_with(&self, addr: SocketAddr, token: &str) -> Ws {
        let stream = super::tcp_to(addr);
        let url = format!("ws://{addr}/?auth={token}&projectId=p");
        Ws::handshake(stream, &url)
    }
}
