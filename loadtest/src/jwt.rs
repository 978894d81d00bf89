//! Relay auth tokens, made the way WalletConnect 2.x SDKs make them (DECISIONS §10): an
//! Ed25519 key pair per client, and a JWT `{"alg":"EdDSA","typ":"JWT"}` with claims `iss`
//! (`did:key:z` + base58btc(`0xed 0x01` ‖ public key)), `sub` (32 random bytes, hex), `aud`
//! (the relay URL), `iat`, `exp = iat + 86400`; the signature is Ed25519 over the ASCII
//! `b64url(header).b64url(payload)`, every part unpadded base64url.
//!
//! Signing costs tens of microseconds, so scenarios make their tokens before the measured
//! phase (except `churn`, which measures connection setup and signs inside the loop).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{Ed25519KeyPair, KeyPair as _};

/// `base64url({"alg":"EdDSA","typ":"JWT"})`, the same for every token.
const HEADER_JSON: &str = r#"{"alg":"EdDSA","typ":"JWT"}"#;
/// Token lifetime, seconds (the SDK's).
pub const TTL_S: u64 = 86_400;
/// The `projectId` every upgrade names.
pub const PROJECT_ID: &str = "loadtest";

/// Why no token could be made (the system's random source failed).
#[derive(Debug, thiserror::Error)]
#[error("cannot make an auth token: {0}")]
pub struct Error(&'static str);

/// One client's identity: an Ed25519 key pair and its `did:key`.
pub struct Client {
    key: Ed25519KeyPair,
    iss: String,
}

impl Client {
    /// A fresh key pair.
    pub fn generate(rng: &SystemRandom) -> Result<Client, Error> {
        let mut seed = [0u8; 32];
        rng.fill(&mut seed).map_err(|_| Error("random source"))?;
        let key = Ed25519KeyPair::from_seed_unchecked(&seed).map_err(|_| Error("Ed25519 seed"))?;
        let iss = did_key(key.public_key().as_ref());
        Ok(Client { key, iss })
    }

    /// The client id the relay will see: `did:key:z6Mk...`.
    #[cfg(test)]
    pub fn iss(&self) -> &str {
        &self.iss
    }

    /// A signed token for `aud`, issued at `iat` (seconds since the Unix epoch), with a fresh
    /// random `sub`.
    pub fn token(&self, rng: &SystemRandom, aud: &str, iat: u64) -> Result<String, Error> {
        let mut sub = [0u8; 32];
        rng.fill(&mut sub).map_err(|_| Error("random source"))?;
        let payload = format!(
            r#"{{"iss":"{}","sub":"{}","aud":"{}","iat":{iat},"exp":{}}}"#,
            self.iss,
            hex(&sub),
            json_escape(aud),
            iat + TTL_S
        );
        let mut jwt = URL_SAFE_NO_PAD.encode(HEADER_JSON);
        jwt.push('.');
        URL_SAFE_NO_PAD.encode_string(payload, &mut jwt);
        let sig = self.key.sign(jwt.as_bytes());
        jwt.push('.');
        URL_SAFE_NO_PAD.encode_string(sig.as_ref(), &mut jwt);
        Ok(jwt)
    }
}

/// `did:key:z` + base58btc(`0xed 0x01` ‖ the 32-byte public key).
pub fn did_key(public: &[u8]) -> String {
    let mut multi = Vec::with_capacity(2 + public.len());
    multi.extend_from_slice(&[0xed, 0x01]);
    multi.extend_from_slice(public);
    format!("did:key:z{}", bs58::encode(multi).into_string())
}

/// Seconds since the Unix epoch.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The upgrade query of an authenticated connection: `auth=<jwt>&projectId=loadtest`
/// (a JWT is base64url and dots: nothing to escape).
pub fn query(jwt: &str) -> String {
    format!("auth={jwt}&projectId={PROJECT_ID}")
}

/// A fresh client and its token, as an upgrade query.
pub fn fresh_query(rng: &SystemRandom, aud: &str) -> Result<String, Error> {
    Ok(query(&Client::generate(rng)?.token(rng, aud, now_s())?))
}

/// `n` fresh clients' upgrade queries (one key pair and token each).
pub fn fresh_queries(n: usize, aud: &str) -> Result<Vec<String>, Error> {
    let rng = SystemRandom::new();
    (0..n).map(|_| fresh_query(&rng, aud)).collect()
}

fn hex(b: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    b.iter()
        .flat_map(|&x| {
            [
                HEX[(x >> 4) as usize] as char,
                HEX[(x & 15) as usize] as char,
            ]
        })
        .collect()
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, ED25519};

    /// The value of the JSON member `key` in compact `json`, as written (strings unquoted).
    fn member<'a>(json: &'a str, key: &str) -> &'a str {
        let at = json.find(&format!("\"{key}\":")).expect(key) + key.len() + 3;
        let rest = &json[at..];
        if let Some(s) = rest.strip_prefix('"') {
            &s[..s.find('"').unwrap()]
        } else {
            &rest[..rest.find([',', '}']).unwrap()]
        }
    }

    #[test]
    fn token_decodes_and_verifies() {
        let rng = SystemRandom::new();
        let c = Client::generate(&rng).unwrap();
        let aud = "ws://127.0.0.1:18080/";
        let jwt = c.token(&rng, aud, 1_700_000_000).unwrap();
        assert!(!jwt.contains('='), "unpadded: {jwt}");
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header = URL_SAFE_NO_PAD.decode(parts[0]).unwrap();
        assert_eq!(header, br#"{"alg":"EdDSA","typ":"JWT"}"#);
        let payload = String::from_utf8(URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(member(&payload, "aud"), aud);
        assert_eq!(member(&payload, "iat"), "1700000000");
        assert_eq!(member(&payload, "exp"), "1700086400");
        let sub = member(&payload, "sub");
        assert_eq!(sub.len(), 64);
        assert!(sub.bytes().all(|b| b.is_ascii_hexdigit()));
        let iss = member(&payload, "iss");
        assert_eq!(iss, c.iss());
        assert!(iss.starts_with("did:key:z6Mk"), "{iss}");
        // The public key comes back out of `iss`, and verifies the signature.
        let multi = bs58::decode(&iss["did:key:z".len()..]).into_vec().unwrap();
        assert_eq!(multi.len(), 34);
        assert_eq!(&multi[..2], &[0xed, 0x01]);
        let sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        assert_eq!(sig.len(), 64);
        let signed = format!("{}.{}", parts[0], parts[1]);
        let pk = UnparsedPublicKey::new(&ED25519, &multi[2..]);
        pk.verify(signed.as_bytes(), &sig).unwrap();
        // Any change to what was signed fails.
        let mut bad = signed.into_bytes();
        bad[5] ^= 1;
        assert!(pk.verify(&bad, &sig).is_err());
        // Two tokens of one client differ in `sub` (and so in signature).
        assert_ne!(jwt, c.token(&rng, aud, 1_700_000_000).unwrap());
    }

    #[test]
    fn fresh_queries_have_distinct_clients() {
        let q = fresh_queries(2, "ws://127.0.0.1:1/").unwrap();
        assert!(q[0].starts_with("auth=ey") && q[0].ends_with("&projectId=loadtest"));
        let iss = |q: &str| {
            let jwt = &q["auth=".len()..q.find('&').unwrap()];
            let p = jwt.split('.').nth(1).unwrap();
            String::from_utf8(URL_SAFE_NO_PAD.decode(p).unwrap()).unwrap()
        };
        assert_ne!(
            member(&iss(&q[0]), "iss").to_string(),
            member(&iss(&q[1]), "iss")
        );
    }

    #[test]
    fn did_key_of_a_known_key() {
        // The all-zero public key's did:key (multicodec ed25519-pub, base58btc).
        let d = did_key(&[0u8; 32]);
        assert!(d.starts_with("did:key:z6Mk"), "{d}");
        assert_eq!(bs58::decode(&d[9..]).into_vec().unwrap()[..2], [0xed, 0x01]);
    }
}
