//! Tests of [`verify`] (the cache's are in `cache.rs`, on these helpers): the SDK's own tokens (`vectors.json`, made by
//! `tests/auth-vectors/make-vectors.mjs` with `@walletconnect/relay-auth@1.1.0`), tampered
//! and malformed tokens, and tokens of many shapes signed here with ring.

use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::Value;

use super::test_signer::{Signer, HEADER};
use super::*;

pub(super) const SDK_AUD: &str = "wss://relay.walletconnect.org";
pub(super) const OTHER_AUD: &str = "wss://relay.example.com";

pub(super) struct Vector {
    pub(super) token: String,
    pub(super) iat: u64,
    pub(super) exp: u64,
}

pub(super) struct Vectors {
    all: Value,
    pub(super) iss: String,
    pub(super) valid: Vector,
    other_aud: Vector,
    pub(super) expired: Vector,
}

/// The SDK's tokens from `vectors.json`.
pub(super) fn vectors() -> Vectors {
    let all: Value = serde_json::from_str(include_str!("vectors.json")).unwrap();
    let get = |name: &str| {
        let v = all["vectors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap();
        Vector {
            token: v["token"].as_str().unwrap().to_owned(),
            iat: v["iat"].as_u64().unwrap(),
            exp: v["exp"].as_u64().unwrap(),
        }
    };
    Vectors {
        iss: all["iss"].as_str().unwrap().to_owned(),
        valid: get("valid"),
        other_aud: get("other_aud"),
        expired: get("expired"),
        all,
    }
}

pub(super) fn cfg() -> AuthConfig {
    AuthConfig::default()
}

pub(super) fn with_aud(auds: &[&str]) -> AuthConfig {
    AuthConfig {
        audiences: auds.iter().map(|s| s.to_string()).collect(),
        ..AuthConfig::default()
    }
}

fn parts(token: &str) -> (String, String, String) {
    let p: Vec<&str> = token.split('.').collect();
    assert_eq!(p.len(), 3);
    (p[0].to_owned(), p[1].to_owned(), p[2].to_owned())
}

#[test]
fn sdk_token_is_valid_inside_its_window() {
    let v = vectors();
    let mid = (v.valid.iat + v.valid.exp) / 2;
    for now in [v.valid.iat, mid, v.valid.exp] {
        let c = verify(&v.valid.token, now, &cfg()).unwrap();
        assert_eq!(&*c.client_id, v.iss);
        assert_eq!(c.exp, v.valid.exp);
    }
    assert!(v.iss.starts_with("did:key:z6Mk"));
}

#[test]
fn leeway_is_120_s_each_side() {
    let v = vectors();
    let t = &v.valid.token;
    assert!(verify(t, v.valid.exp + 120, &cfg()).is_ok());
    assert_eq!(
        verify(t, v.valid.exp + 121, &cfg()),
        Err(AuthError::Expired)
    );
    assert!(verify(t, v.valid.iat - 120, &cfg()).is_ok());
    assert_eq!(
        verify(t, v.valid.iat - 121, &cfg()),
        Err(AuthError::NotYetValid)
    );
    assert_eq!(verify(t, 0, &cfg()), Err(AuthError::NotYetValid));
    assert_eq!(verify(t, u64::MAX, &cfg()), Err(AuthError::Expired));
    let strict = AuthConfig {
        leeway_s: 0,
        ..cfg()
    };
    assert_eq!(verify(t, v.valid.exp + 1, &strict), Err(AuthError::Expired));
    assert!(verify(t, v.valid.exp, &strict).is_ok());
}

#[test]
fn sdk_expired_token_is_refused() {
    let v = vectors();
    assert_eq!(
        verify(&v.expired.token, v.valid.iat, &cfg()),
        Err(AuthError::Expired)
    );
    assert!(verify(&v.expired.token, v.expired.iat, &cfg()).is_ok());
}

#[test]
fn audience_is_checked_only_when_configured() {
    let v = vectors();
    let now = v.valid.iat;
    assert!(verify(&v.other_aud.token, now, &cfg()).is_ok());
    let sdk_only = with_aud(&[SDK_AUD]);
    assert!(verify(&v.valid.token, now, &sdk_only).is_ok());
    assert_eq!(
        verify(&v.other_aud.token, now, &sdk_only),
        Err(AuthError::Audience)
    );
    let both = with_aud(&[SDK_AUD, OTHER_AUD]);
    assert!(verify(&v.other_aud.token, now, &both).is_ok());
    // Exact comparison: no trailing slash, case or prefix games.
    let near = with_aud(&[
        "wss://relay.walletconnect.org/",
        "WSS://relay.walletconnect.org",
    ]);
    assert_eq!(verify(&v.valid.token, now, &near), Err(AuthError::Audience));
}

#[test]
fn sdk_header_and_claims_are_as_documented() {
    let v = vectors();
    let valid = &v.all["vectors"][0];
    assert_eq!(valid["header_json"], HEADER);
    let p: Value = serde_json::from_str(valid["payload_json"].as_str().unwrap()).unwrap();
    let keys: Vec<&str> = p.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, ["aud", "exp", "iat", "iss", "sub"]); // serde_json sorts
    assert_eq!(
        p["exp"].as_u64().unwrap() - p["iat"].as_u64().unwrap(),
        86400
    );
    assert_eq!(v.all["default_iat_unit"], "seconds");
}

#[test]
fn ring_reproduces_the_sdk_key_and_signature() {
    let v = vectors();
    let seed = hex(v.all["seed_hex"].as_str().unwrap());
    let s = Signer::from_seed(&seed);
    assert_eq!(
        s.public.to_vec(),
        hex(v.all["public_key_hex"].as_str().unwrap())
    );
    assert_eq!(s.iss, v.iss);
    // Ed25519 is deterministic: the same payload bytes give the SDK's token exactly.
    let payload = v.all["vectors"][0]["payload_json"].as_str().unwrap();
    assert_eq!(s.sign_payload(payload), v.valid.token);
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn resigned_payload_with_old_signature_is_refused() {
    let v = vectors();
    let now = v.valid.iat;
    let (h, p, s) = parts(&v.valid.token);
    let payload = String::from_utf8(URL_SAFE_NO_PAD.decode(&p).unwrap()).unwrap();
    let longer = payload.replace("1700086400", "1900086400");
    assert_ne!(longer, payload);
    let forged = format!("{h}.{}.{s}", URL_SAFE_NO_PAD.encode(longer));
    assert_eq!(verify(&forged, now, &cfg()), Err(AuthError::Signature));
    // Another genuine token's payload under this one's signature.
    let (_, p2, _) = parts(&v.other_aud.token);
    let swapped = format!("{h}.{p2}.{s}");
    assert_eq!(verify(&swapped, now, &cfg()), Err(AuthError::Signature));
    // The same claims signed by another key under the SDK's issuer.
    let other = Signer::random();
    let stolen_iss = other.sign_payload(&payload);
    assert_eq!(verify(&stolen_iss, now, &cfg()), Err(AuthError::Signature));
}

#[test]
fn flipped_signature_bits_are_refused() {
    let v = vectors();
    let (h, p, s) = parts(&v.valid.token);
    let sig = URL_SAFE_NO_PAD.decode(&s).unwrap();
    assert_eq!(sig.len(), 64);
    for i in 0..sig.len() {
        for bit in [0x01u8, 0x80] {
            let mut bad = sig.clone();
            bad[i] ^= bit;
            let t = format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(&bad));
            assert_eq!(
                verify(&t, v.valid.iat, &cfg()),
                Err(AuthError::Signature),
                "byte {i}"
            );
        }
    }
    // Short and long signatures.
    for len in [0usize, 1, 63, 65, 128] {
        let t = format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(vec![7u8; len.max(1)]));
        assert!(verify(&t, v.valid.iat, &cfg()).is_err());
    }
}

#[test]
fn non_canonical_base64_is_refused() {
    let v = vectors();
    let (h, p, s) = parts(&v.valid.token);
    // 64 bytes are 86 characters: the last one carries 2 unused bits. Setting them keeps
    // the decoded bytes if decoding were lenient; it must not be.
    let last = s.as_bytes()[s.len() - 1];
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let idx = alphabet.iter().position(|&c| c == last).unwrap();
    let sloppy = alphabet[idx | 1] as char;
    assert_ne!(sloppy as u8, last);
    let t = format!("{h}.{p}.{}{sloppy}", &s[..s.len() - 1]);
    assert_eq!(verify(&t, v.valid.iat, &cfg()), Err(AuthError::Base64));
    // Standard alphabet characters.
    let t = format!("{h}.{p}.{}", s.replace('-', "+").replace('_', "/"));
    if t != v.valid.token {
        assert_eq!(verify(&t, v.valid.iat, &cfg()), Err(AuthError::Base64));
    }
}

#[test]
fn padded_base64_is_refused() {
    let v = vectors();
    let (h, p, s) = parts(&v.valid.token);
    // Re-encode each part with padding; the signature (64 bytes) always gets "==".
    let pad = |part: &str| URL_SAFE.encode(URL_SAFE_NO_PAD.decode(part).unwrap());
    assert!(pad(&s).ends_with("=="));
    let t = format!("{h}.{p}.{}", pad(&s));
    assert_eq!(verify(&t, v.valid.iat, &cfg()), Err(AuthError::Base64));
    for (hh, pp) in [(pad(&h), p.clone()), (h.clone(), pad(&p))] {
        let t = format!("{hh}.{pp}.{s}");
        if t != v.valid.token {
            assert_eq!(verify(&t, v.valid.iat, &cfg()), Err(AuthError::Base64));
        }
    }
    // A signed token whose parts need padding, with it added.
    let signer = Signer::random();
    let t = signer.sign("s", "a", 10, 20);
    let (h, p, s) = parts(&t);
    let t = format!("{h}.{p}.{s}==");
    assert_eq!(verify(&t, 10, &cfg()), Err(AuthError::Base64));
}

#[test]
fn other_algorithms_are_refused() {
    let s = Signer::random();
    let payload = format!(
        r#"{{"iss":"{}","sub":"s","aud":"a","iat":100,"exp":200}}"#,
        s.iss
    );
    for header in [
        r#"{"alg":"HS256","typ":"JWT"}"#,
        r#"{"alg":"none","typ":"JWT"}"#,
        r#"{"alg":"none"}"#,
        r#"{"alg":"ES256K","typ":"JWT"}"#,
        r#"{"alg":"eddsa","typ":"JWT"}"#,
        r#"{"alg":"EdDSA","typ":"JWS"}"#,
    ] {
        let t = s.sign_raw(header.as_bytes(), payload.as_bytes());
        assert_eq!(
            verify(&t, 150, &cfg()),
            Err(AuthError::Algorithm),
            "{header}"
        );
    }
    for header in [
        r#"{"typ":"JWT"}"#,
        r#"{"alg":5}"#,
        "[]",
        "null",
        r#"{"alg":"EdDSA""#,
    ] {
        let t = s.sign_raw(header.as_bytes(), payload.as_bytes());
        assert_eq!(verify(&t, 150, &cfg()), Err(AuthError::Header), "{header}");
    }
    // An empty part.
    let t = s.sign_raw(b"", payload.as_bytes());
    assert_eq!(verify(&t, 150, &cfg()), Err(AuthError::Malformed));
    // `alg: none` without a signature.
    let t = s.sign_raw(br#"{"alg":"none"}"#, payload.as_bytes());
    let unsigned = &t[..t.rfind('.').unwrap() + 1];
    assert_eq!(verify(unsigned, 150, &cfg()), Err(AuthError::Malformed));
    // Lenient on extra keys and a missing `typ`.
    for header in [
        r#"{"alg":"EdDSA"}"#,
        r#"{"typ":"JWT","alg":"EdDSA","kid":"x","cty":{"a":[1]}}"#,
        r#"{"alg":"EdDSA","typ":null}"#,
    ] {
        let t = s.sign_raw(header.as_bytes(), payload.as_bytes());
        assert!(verify(&t, 150, &cfg()).is_ok(), "{header}");
    }
}

#[test]
fn truncated_and_misshapen_tokens_are_refused() {
    let v = vectors();
    let t = &v.valid.token;
    for n in 0..t.len() {
        assert!(verify(&t[..n], v.valid.iat, &cfg()).is_err(), "prefix {n}");
        assert!(
            verify(&t[n + 1..], v.valid.iat, &cfg()).is_err(),
            "suffix {n}"
        );
    }
    for bad in [
        format!("{t}."),
        format!(".{t}"),
        format!("{t}.{t}"),
        format!("{t}A"),
        t.replacen('.', "..", 1),
        format!(" {t}"),
        format!("{t}\n"),
        "..".to_owned(),
        "a.b.c".to_owned(),
    ] {
        assert!(verify(&bad, v.valid.iat, &cfg()).is_err(), "{bad}");
    }
    assert_eq!(verify("", 0, &cfg()), Err(AuthError::Malformed));
    assert_eq!(verify("a.b", 0, &cfg()), Err(AuthError::Malformed));
    assert_eq!(verify("a.b.c.d", 0, &cfg()), Err(AuthError::Malformed));
}

#[test]
fn huge_token_is_refused_before_decoding() {
    let big = "A".repeat(MAX_TOKEN_LEN + 1);
    assert_eq!(verify(&big, 0, &cfg()), Err(AuthError::TooLong));
    let dotted = format!(
        "{}.{}.{}",
        "e".repeat(3000),
        "e".repeat(3000),
        "e".repeat(3000)
    );
    assert_eq!(verify(&dotted, 0, &cfg()), Err(AuthError::TooLong));
    let at_cap = format!(
        "{}.{}.{}",
        "e".repeat(2000),
        "e".repeat(2000),
        "e".repeat(94)
    );
    assert_eq!(at_cap.len(), MAX_TOKEN_LEN);
    assert_ne!(verify(&at_cap, 0, &cfg()), Err(AuthError::TooLong));
}

#[test]
fn non_utf8_parts_are_refused() {
    let s = Signer::random();
    let t = s.sign_raw(HEADER.as_bytes(), b"{\"iss\":\"\xff\xfe\",\"sub\":\"s\"}");
    assert_eq!(verify(&t, 0, &cfg()), Err(AuthError::Claims));
    let mut payload = format!(
        r#"{{"iss":"{}","sub":"s","aud":"a?","iat":1,"exp":2}}"#,
        s.iss
    )
    .into_bytes();
    let at = payload.iter().position(|&b| b == b'?').unwrap();
    payload[at] = 0xff;
    let t = s.sign_raw(HEADER.as_bytes(), &payload);
    assert_eq!(verify(&t, 1, &cfg()), Err(AuthError::Claims));
    let t = s.sign_raw(b"{\"alg\":\"EdDSA\xff\"}", b"{}");
    assert_eq!(verify(&t, 0, &cfg()), Err(AuthError::Header));
    let t = s.sign_raw(&[0xff; 40], &[0x80; 40]);
    assert_eq!(verify(&t, 0, &cfg()), Err(AuthError::Header));
}

/// Base58btc of raw bytes, with the did:key prefix.
fn did_of(raw: &[u8]) -> String {
    format!("did:key:z{}", bs58::encode(raw).into_string())
}

#[test]
fn issuer_must_be_an_ed25519_did_key() {
    let s = Signer::random();
    let good = {
        let mut r = vec![0xed, 0x01];
        r.extend_from_slice(&s.public);
        r
    };
    assert_eq!(did_of(&good), s.iss);
    let with_iss = |iss: &str| {
        s.sign_payload(&format!(
            r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":100,"exp":200}}"#
        ))
    };
    assert!(verify(&with_iss(&s.iss), 150, &cfg()).is_ok());
    let mut x25519 = good.clone();
    x25519[0] = 0xec; // multicodec 0xec 0x01: an X25519 key
    let mut secp = vec![0xe7, 0x01];
    secp.extend_from_slice(&[2u8; 33]);
    let mut zero_lead = vec![0x00];
    zero_lead.extend_from_slice(&good);
    let b58 = &s.iss["did:key:z".len()..];
    for iss in [
        did_of(&x25519),
        did_of(&secp),
        did_of(&good[..33]),
        did_of(&[&good[..], &[0][..]].concat()),
        did_of(&good[2..]),
        did_of(&zero_lead),
        format!("did:key:f{b58}"),
        format!("did:web:z{b58}"),
        format!("did:key:z{b58}0"), // '0' is not base58
        format!("did:key:z{b58}{}", "1".repeat(100)),
        format!("did:key:{b58}"),
        "did:key:z".to_owned(),
        String::new(),
    ] {
        assert_eq!(
            verify(&with_iss(&iss), 150, &cfg()),
            Err(AuthError::Issuer),
            "{iss}"
        );
    }
}

#[test]
fn claim_shapes() {
    let s = Signer::random();
    let iss = &s.iss;
    let ok = |payload: String| verify(&s.sign_payload(&payload), 1_000, &cfg());
    // Accepted shapes.
    for p in [
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":1000,"exp":1000}}"#),
        format!(r#"{{"exp":2000,"iat":0,"aud":"","sub":"","iss":"{iss}","extra":[1,{{}}]}}"#),
        format!(
            r#" {{ "iss" : "{iss}", "sub":"s","aud":"a","iat":1000,"exp":18446744073709551615 }} "#
        ),
        format!(r#"{{"iss":"{iss}","sub":"\u00e9\n","aud":"a","iat":1000,"exp":1000,"nbf":"x"}}"#),
    ] {
        assert!(ok(p.clone()).is_ok(), "{p}");
    }
    // Refused shapes.
    for p in [
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":1000.0,"exp":2000}}"#),
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":1000,"exp":2000.5}}"#),
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":-1,"exp":2000}}"#),
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":1000,"exp":1e30}}"#),
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":1000,"exp":18446744073709551616}}"#),
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":1000,"exp":"2000"}}"#),
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":1000,"exp":null}}"#),
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":1000}}"#),
        format!(r#"{{"iss":"{iss}","aud":"a","iat":1000,"exp":2000}}"#),
        format!(r#"{{"iss":"{iss}","sub":1,"aud":"a","iat":1000,"exp":2000}}"#),
        format!(r#"{{"iss":"{iss}","sub":"s","aud":["a"],"iat":1000,"exp":2000}}"#),
        format!(r#"{{"iss":"{iss}","iss":"{iss}","sub":"s","aud":"a","iat":1000,"exp":2000}}"#),
        format!(r#"{{"iss":"{iss}","sub":"s","aud":"a","iat":1000,"exp":2000}}x"#),
        r#"{"sub":"s","aud":"a","iat":1000,"exp":2000}"#.to_owned(),
        "[]".to_owned(),
        "{}".to_owned(),
        "9".repeat(2000),
    ] {
        assert_eq!(ok(p.clone()), Err(AuthError::Claims), "{p}");
    }
    // Escapes in the audience are compared decoded.
    let t = s.sign_payload(&format!(
        r#"{{"iss":"{iss}","sub":"s","aud":"wss:\/\/relay.walletconnect.org","iat":1000,"exp":2000}}"#
    ));
    assert!(verify(&t, 1000, &with_aud(&[SDK_AUD])).is_ok());
}

#[test]
fn round_trip_with_ring_keys() {
    for i in 0..40u64 {
        let s = Signer::random();
        let iat = 1_600_000_000 + i * 997_331;
        let exp = iat + (i * 7_919) % 200_000;
        let aud = format!("wss://relay-{i}.example/?projectId=x");
        let t = s.sign(&format!("{i:064x}"), &aud, iat, exp);
        let c = verify(&t, iat, &with_aud(&[SDK_AUD, &aud])).unwrap();
        assert_eq!(&*c.client_id, s.iss);
        assert_eq!(c.exp, exp);
        assert_eq!(verify(&t, exp + 121, &cfg()), Err(AuthError::Expired));
        assert_eq!(
            verify(&t, iat, &with_aud(&[SDK_AUD])),
            Err(AuthError::Audience)
        );
    }
}

#[test]
fn reasons_match_display() {
    for e in [
        AuthError::TooLong,
        AuthError::Malformed,
        AuthError::Base64,
        AuthError::Header,
        AuthError::Algorithm,
        AuthError::Claims,
        AuthError::Issuer,
        AuthError::Signature,
        AuthError::Expired,
        AuthError::NotYetValid,
        AuthError::Audience,
    ] {
        assert_eq!(e.to_string(), e.reason());
        assert!(e.reason().len() < 64);
    }
}
