//! The relay's own identity as the services around it see it (DECISIONS 13): its Ed25519
//! public key from `GET /public-key` (64 hex characters), its `did:key` (the `relayId`), and
//! the check a service makes of a JWT the relay signed (a watch event's `eventAuth`).

use base64::Engine;
use serde_json::Value;

use super::Server;

/// The relay's public key as `GET /public-key` answers it (hex, trimmed); panics unless 200
/// with 64 hex characters.
pub fn public_key_hex(server: &Server) -> String {
    let (status, body) = server.get("/public-key");
    let text = String::from_utf8_lossy(&body).trim().to_string();
    assert_eq!(status, Some(200), "GET /public-key: {text}");
    assert!(
        text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()),
        "GET /public-key is not 64 hex characters: {text:?}"
    );
    text
}

/// The key's bytes.
pub fn key_bytes(hex_key: &str) -> [u8; 32] {
    let v: Vec<u8> = (0..64)
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex_key[i..i + 2], 16).expect("hex key"))
        .collect();
    v.try_into().expect("32 bytes")
}

/// `did:key:z...` of the relay (its `relayId`): `z` + base58btc(0xed 0x01 ‖ key).
pub fn did_key(hex_key: &str) -> String {
    let mut b = vec![0xed, 0x01];
    b.extend_from_slice(&key_bytes(hex_key));
    format!("did:key:z{}", bs58::encode(b).into_string())
}

/// Checks an EdDSA JWT's signature against the relay's key (hex) and returns its claims;
/// `Err` says what is wrong.
pub fn verify_jwt(jwt: &str, hex_key: &str) -> Result<Value, String> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = jwt.split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("not three parts: {jwt}"));
    };
    let header: Value = serde_json::from_slice(&b64.decode(h).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if header["alg"] != "EdDSA" || header["typ"] != "JWT" {
        return Err(format!("header {header}"));
    }
    let sig = b64.decode(s).map_err(|e| e.to_string())?;
    let key =
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key_bytes(hex_key));
    key.verify(format!("{h}.{c}").as_bytes(), &sig)
        .map_err(|_| "the signature does not verify against GET /public-key".to_string())?;
    serde_json::from_slice(&b64.decode(c).map_err(|e| e.to_string())?).map_err(|e| e.to_string())
}
