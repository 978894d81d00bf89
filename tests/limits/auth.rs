//! A client authenticated with relay auth (DECISIONS §10, §11): its buckets follow its client
//! id across addresses. A part of `limits.rs`, in a file of its own for its size.

use super::*;

/// A relay-auth JWT (DECISIONS §10) of a fresh Ed25519 key: the client id is its key.
fn client_token() -> String {
    use base64::Engine as _;
    use ring::signature::{Ed25519KeyPair, KeyPair};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let pk: [u8; 32] = key.public_key().as_ref().try_into().unwrap();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = b64(br#"{"alg":"EdDSA","typ":"JWT"}"#);
    let claims = json!({"iss": walletrelay::auth::issuer_of(&pk), "sub": "ab".repeat(32),
        "aud": "ws://relay", "iat": now, "exp": now + 86400});
    let signed = format!("{header}.{}", b64(claims.to_string().as_bytes()));
    let sig = b64(key.sign(signed.as_bytes()).as_ref());
    format!("{signed}.{sig}")
}

#[test]
fn an_authenticated_client_shares_its_buckets_across_addresses() {
    let server = Server::start_limited(&[
        "--threads",
        "1",
        "--subscribe-rate",
        "0.001",
        "--subscribe-burst",
        "4",
    ]);
    let token = format!("Bearer {}", client_token());
    let auth = [("Authorization", token.as_str())];
    let batch = |n: usize| json!({"topics": (0..n).map(|_| topic()).collect::<Vec<_>>()});
    let mut a = ws_with(&server, "127.0.0.19", &auth).unwrap();
    assert!(a.call("irn_batchSubscribe", batch(3))["result"].is_array());
    // The same client from another address: one subscription left for it.
    let mut b = ws_with(&server, "127.0.0.20", &auth).unwrap();
    assert_rate_limited(&b.call("irn_batchSubscribe", batch(2)));
    // Another client, and no client at all, from that address: not affected.
    let other = format!("Bearer {}", client_token());
    let mut c = ws_with(&server, "127.0.0.20", &[("Authorization", other.as_str())]).unwrap();
    assert!(c.call("irn_batchSubscribe", batch(2))["result"].is_array());
    let mut d = ws_from(&server, "127.0.0.21").unwrap();
    assert!(d.call("irn_batchSubscribe", batch(2))["result"].is_array());
}
