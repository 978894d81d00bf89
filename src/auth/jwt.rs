//! Relay-auth JWT verification: the token a WalletConnect SDK signs with its client key
//! (`@walletconnect/relay-auth`) and sends on the upgrade. Pure: a token, the time and the
//! config in, the client id or the reason for refusing out. Owns the token format (three
//! unpadded base64url parts), the `did:key` issuer encoding and the claim checks; the
//! signature itself is ring's Ed25519. Knows nothing of connections or of the cache.

use std::borrow::Cow;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{UnparsedPublicKey, ED25519};
use serde::Deserialize;

use super::AuthConfig;

/// The longest token accepted, in bytes, checked before any decoding. The SDK's tokens are
/// about 400 bytes; the cap bounds the work an unauthenticated client can ask for.
pub const MAX_TOKEN_LEN: usize = 4096;

/// What every issuer starts with: a `did:key` in base58btc multibase (`z`).
const DID_KEY_PREFIX: &str = "did:key:z";

/// The multicodec varint of an Ed25519 public key, ahead of its 32 bytes in the `did:key`.
const ED25519_MULTICODEC: [u8; 2] = [0xed, 0x01];

/// Longest base58 part of an issuer decoded: 34 bytes are at most 47 characters, and the cap
/// keeps base58's quadratic decoding away from long strings.
const MAX_ISS_B58_LEN: usize = 64;

/// A token that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The `iss` claim as sent (`did:key:z6Mk...`): the connection's client id.
    pub client_id: Arc<str>,
    /// The `exp` claim, Unix seconds.
    pub exp: u64,
}

/// Why a token was refused. `Display` (and [`AuthError::reason`]) is a short reason fit to
/// send to the client in a 401 body or a close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Longer than [`MAX_TOKEN_LEN`].
    #[error("invalid token: too long")]
    TooLong,
    /// Not three non-empty parts separated by dots.
    #[error("invalid token: malformed")]
    Malformed,
    /// A part is not unpadded base64url (or not canonical).
    #[error("invalid token: bad base64url")]
    Base64,
    /// The header is not a JSON object with a string `alg` (and a string `typ`, if any).
    #[error("invalid token: bad header")]
    Header,
    /// `alg` is not `EdDSA` or `typ` is not `JWT`.
    #[error("invalid token: unsupported algorithm")]
    Algorithm,
    /// The payload is not a JSON object with string `iss`, `sub` and `aud` and non-negative
    /// integer `iat` and `exp`.
    #[error("invalid token: bad claims")]
    Claims,
    /// `iss` is not the `did:key` of an Ed25519 public key.
    #[error("invalid issuer")]
    Issuer,
    /// The signature is not the issuer's Ed25519 signature of `header.payload`.
    #[error("invalid signature")]
    Signature,
    /// `exp` plus the leeway is in the past.
    #[error("token expired")]
    Expired,
    /// `iat` minus the leeway is in the future.
    #[error("token not yet valid")]
    NotYetValid,
    /// `aud` is not one of the configured audiences.
    #[error("invalid audience")]
    Audience,
}

impl AuthError {
    /// The same text as `Display`, without formatting: for a close frame's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::TooLong => "invalid token: too long",
            AuthError::Malformed => "invalid token: malformed",
            AuthError::Base64 => "invalid token: bad base64url",
            AuthError::Header => "invalid token: bad header",
            AuthError::Algorithm => "invalid token: unsupported algorithm",
            AuthError::Claims => "invalid token: bad claims",
            AuthError::Issuer => "invalid issuer",
            AuthError::Signature => "invalid signature",
            AuthError::Expired => "token expired",
            AuthError::NotYetValid => "token not yet valid",
            AuthError::Audience => "invalid audience",
        }
    }
}

/// The JOSE header; other keys are ignored.
#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: Cow<'a, str>,
    #[serde(borrow, default)]
    typ: Option<Cow<'a, str>>,
}

/// The claims the relay reads; other keys are ignored, a duplicate key is refused.
#[derive(Deserialize)]
struct Payload<'a> {
    #[serde(borrow)]
    iss: Cow<'a, str>,
    /// Required (the SDK always sends it) but unused by the relay.
    #[serde(borrow, rename = "sub")]
    _sub: Cow<'a, str>,
    #[serde(borrow)]
    aud: Cow<'a, str>,
    iat: u64,
    /// Required unless the config allows tokens without it (`AuthConfig::allow_no_exp`).
    #[serde(default)]
    exp: Option<u64>,
}

/// A verified token with the claims the cache re-checks on a hit.
pub(super) struct Verified {
    pub(super) claims: Claims,
    /// The issuer's Ed25519 public key.
    pub(super) key: [u8; 32],
    pub(super) iat: u64,
    pub(super) aud: Box<str>,
}

/// Verifies a relay-auth JWT at `now_unix_s`: format, `EdDSA` header, issuer, signature,
/// then `exp`/`iat` with `cfg.leeway_s` of leeway and `aud` when `cfg.audiences` is set.
pub fn verify(token: &str, now_unix_s: u64, cfg: &AuthConfig) -> Result<Claims, AuthError> {
    verify_full(token, now_unix_s, cfg).map(|v| v.claims)
}

/// [`verify`], keeping `iat` and `aud` for the cache.
pub(super) fn verify_full(
    token: &str,
    now_unix_s: u64,
    cfg: &AuthConfig,
) -> Result<Verified, AuthError> {
    let (payload, key) = verify_signature(token)?;
    claims_of(&payload, key, now_unix_s, cfg)
}

/// The claims of a payload whose signature was verified: what [`verify_full`] answers after
/// the signature.
pub(super) fn claims_of(
    payload: &[u8],
    key: [u8; 32],
    now_unix_s: u64,
    cfg: &AuthConfig,
) -> Result<Verified, AuthError> {
    let payload: Payload<'_> = serde_json::from_slice(payload).map_err(|_| AuthError::Claims)?;
    let exp = match payload.exp {
        Some(exp) => exp,
        None if cfg.allow_no_exp => u64::MAX,
        None => return Err(AuthError::Claims),
    };
    check_claims(payload.iat, exp, &payload.aud, now_unix_s, cfg)?;
    Ok(Verified {
        claims: Claims {
            client_id: Arc::from(&*payload.iss),
            exp,
        },
        key,
        iat: payload.iat,
        aud: Box::from(&*payload.aud),
    })
}

/// Only the issuer of a payload (for [`verify_signature`]).
#[derive(Deserialize)]
struct IssOnly<'a> {
    #[serde(borrow)]
    iss: Cow<'a, str>,
}

/// A token taken apart and checked up to its signature, which is not verified yet.
#[derive(Debug)]
pub(super) struct Parsed {
    /// The decoded payload.
    pub(super) payload: Vec<u8>,
    /// The issuer's Ed25519 public key.
    pub(super) key: [u8; 32],
    /// The decoded signature.
    pub(super) sig: Vec<u8>,
    /// The signing input is the token's first `signed_len` bytes (`header.payload`).
    pub(super) signed_len: usize,
}

impl Parsed {
    /// Verifies the signature on its own (ring: the check every token had before batches).
    pub(super) fn signature_ok(&self, token: &str) -> bool {
        let signed = &token.as_bytes()[..self.signed_len.min(token.len())];
        UnparsedPublicKey::new(&ED25519, &self.key)
            .verify(signed, &self.sig)
            .is_ok()
    }
}

/// Everything [`verify_signature`] checks but the signature itself, in the same order.
pub(super) fn parse(token: &str) -> Result<Parsed, AuthError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(AuthError::TooLong);
    }
    let mut parts = token.split('.');
    let (Some(h64), Some(p64), Some(s64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthError::Malformed);
    };
    if h64.is_empty() || p64.is_empty() || s64.is_empty() {
        return Err(AuthError::Malformed);
    }
    let header = b64(h64)?;
    let header: Header<'_> = serde_json::from_slice(&header).map_err(|_| AuthError::Header)?;
    if header.alg != "EdDSA" || header.typ.as_deref().is_some_and(|t| t != "JWT") {
        return Err(AuthError::Algorithm);
    }
    let payload = b64(p64)?;
    let iss: IssOnly<'_> = serde_json::from_slice(&payload).map_err(|_| AuthError::Claims)?;
    let key = issuer_key(&iss.iss)?;
    let sig = b64(s64)?;
    Ok(Parsed {
        payload,
        key,
        sig,
        signed_len: h64.len() + 1 + p64.len(),
    })
}

/// Checks a token's form, its `EdDSA` header and the signature by its `iss` did:key, and
/// returns the decoded payload (JSON bytes) with the issuer's key; the claims themselves are
/// the caller's to check (watch registrations, `notify`).
pub(crate) fn verify_signature(token: &str) -> Result<(Vec<u8>, [u8; 32]), AuthError> {
    let parsed = parse(token)?;
    if !parsed.signature_ok(token) {
        return Err(AuthError::Signature);
    }
    Ok((parsed.payload, parsed.key))
}

/// True when every `(token, parsed)` signature is valid, checked as one batch (Ed25519 batch
/// verification, random linear combination: about half the cost of checking them one by one
/// from 8 tokens on). False when any is invalid (or malformed); the caller then checks each on
/// its own to find which. The batch equation is the cofactored one (ZIP 215): it may accept a
/// signature that the key's holder crafted with a small-order component, which the single
/// check refuses; no one without the secret key can make one pass.
pub(super) fn batch_ok(items: &[(&str, &Parsed)]) -> bool {
    let mut msgs = Vec::with_capacity(items.len());
    let mut sigs = Vec::with_capacity(items.len());
    let mut keys = Vec::with_capacity(items.len());
    for (token, p) in items {
        let Some(signed) = token.as_bytes().get(..p.signed_len) else {
            return false;
        };
        let Ok(sig) = ed25519_dalek::Signature::from_slice(&p.sig) else {
            return false;
        };
        let Ok(key) = ed25519_dalek::VerifyingKey::from_bytes(&p.key) else {
            return false;
        };
        msgs.push(signed);
        sigs.push(sig);
        keys.push(key);
    }
    ed25519_dalek::verify_batch(&msgs, &sigs, &keys).is_ok()
}

/// The checks that depend on the time and the config: also what a cache hit re-runs.
pub(super) fn check_claims(
    iat: u64,
    exp: u64,
    aud: &str,
    now: u64,
    cfg: &AuthConfig,
) -> Result<(), AuthError> {
    if now > exp.saturating_add(cfg.leeway_s) {
        return Err(AuthError::Expired);
    }
    if iat > now.saturating_add(cfg.leeway_s) {
        return Err(AuthError::NotYetValid);
    }
    if !cfg.audiences.is_empty() && !cfg.audiences.iter().any(|a| a == aud) {
        return Err(AuthError::Audience);
    }
    Ok(())
}

/// Decodes one part: unpadded, canonical base64url only.
fn b64(part: &str) -> Result<Vec<u8>, AuthError> {
    URL_SAFE_NO_PAD.decode(part).map_err(|_| AuthError::Base64)
}

/// The Ed25519 public key named by an issuer `did:key:z<base58btc(0xed 0x01 ‖ key)>`.
fn issuer_key(iss: &str) -> Result<[u8; 32], AuthError> {
    let b58 = iss.strip_prefix(DID_KEY_PREFIX).ok_or(AuthError::Issuer)?;
    if b58.len() > MAX_ISS_B58_LEN {
        return Err(AuthError::Issuer);
    }
    let mut raw = [0u8; 34];
    let n = bs58::decode(b58)
        .onto(&mut raw[..])
        .map_err(|_| AuthError::Issuer)?;
    let (codec, key) = raw.split_at(2);
    if n != raw.len() || codec != ED25519_MULTICODEC {
        return Err(AuthError::Issuer);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(key);
    Ok(out)
}

/// The issuer of an Ed25519 public key: for the tests' signer and the fuzz seeds.
pub fn issuer_of(public_key: &[u8; 32]) -> String {
    let mut raw = [0u8; 34];
    raw[..2].copy_from_slice(&ED25519_MULTICODEC);
    raw[2..].copy_from_slice(public_key);
    let mut s = String::from(DID_KEY_PREFIX);
    s.push_str(&bs58::encode(raw).into_string());
    s
}
