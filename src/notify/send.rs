//! What the relay POSTs, byte for byte: a watch event (`{"eventAuth":["<JWT>"]}`, the JWT the
//! relay-signed `WatchEventClaims` of relay-api.md (a)) and a push to a push server
//! (relay-api.md (d): the body, `X-Ed25519-Timestamp` and `X-Ed25519-Signature` over
//! `"{ts}.{body length}.{body}"`, as reown-com/push-server's `validate_signature.rs` checks
//! it). Pure builders; `notify` hands the results to the webhook pool.

use serde::Serialize;

use super::table::Registration;
use crate::identity::{hex, RelayKey};
use crate::notice::{Notice, PushNotice};

/// Longest life of an event JWT and of its retries, seconds (72 hours).
pub const MAX_EVENT_LIFE_S: u64 = 72 * 3600;

#[derive(Serialize)]
struct EventClaims<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: &'a str,
    iat: u64,
    exp: u64,
    act: &'static str,
    typ: &'static str,
    whu: &'a str,
    evt: Event<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Event<'a> {
    message_id: u64,
    status: &'static str,
    topic: &'a str,
    message: &'a str,
    attestation: Option<&'a str>,
    published_at: u64,
    tag: u32,
}

/// The seconds an event (its JWT, its retries) lives: the message's ttl, at most 72 hours.
pub fn event_life(n: &Notice<'_>) -> u64 {
    u64::from(n.ttl).clamp(1, MAX_EVENT_LIFE_S)
}

/// The webhook body of one event for one registration, signed at `now` (Unix seconds).
pub fn event_body(key: &RelayKey, r: &Registration, n: &Notice<'_>, now: u64) -> Vec<u8> {
    let claims = EventClaims {
        iss: key.did_key(),
        aud: &r.sub,
        sub: n.client,
        iat: now,
        exp: now + event_life(n),
        act: "irn_watchEvent",
        typ: n.typ.as_str(),
        whu: &r.whu,
        evt: Event {
            message_id: n.message_id,
            status: n.status.as_str(),
            topic: n.topic,
            message: n.message,
            attestation: n.attestation,
            published_at: n.published_at,
            tag: n.tag,
        },
    };
    // Serialising plain strings and numbers cannot fail.
    let json = serde_json::to_vec(&claims).unwrap_or_default();
    let mut body = br#"{"eventAuth":[""#.to_vec();
    body.extend_from_slice(key.jwt(&json).as_bytes());
    body.extend_from_slice(br#""]}"#);
    body
}

#[derive(Serialize)]
struct PushBody<'a> {
    topic: &'a str,
    tag: u32,
    message: &'a str,
    id: String,
    payload: Payload<'a>,
}

#[derive(Serialize)]
struct Payload<'a> {
    topic: &'a str,
    flags: u32,
    blob: &'a str,
}

/// `flags` of the legacy half: Encrypted | Sign.
pub const PUSH_FLAGS: u32 = 3;

/// A push request: its URL path suffix, body and the two signature headers at `ts` (Unix
/// seconds).
pub struct PushRequest {
    /// `clients/{client id without "did:key:"}`, to append to the push URL after a `/`.
    pub path: String,
    /// The JSON body.
    pub body: Vec<u8>,
    /// `X-Ed25519-Timestamp`.
    pub timestamp: String,
    /// `X-Ed25519-Signature`: hex of the signature of `"{ts}.{body length}.{body}"`.
    pub signature: String,
}

/// The push of `p` signed by `key` at `ts`.
pub fn push_request(key: &RelayKey, p: &PushNotice<'_>, ts: u64) -> PushRequest {
    let id = hex(ring::digest::digest(&ring::digest::SHA256, p.message.as_bytes()).as_ref());
    let body = PushBody {
        topic: p.topic,
        tag: p.tag,
        message: p.message,
        id,
        payload: Payload {
            topic: p.topic,
            flags: PUSH_FLAGS,
            blob: p.message,
        },
    };
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let timestamp = ts.to_string();
    let mut signed = format!("{timestamp}.{}.", body.len()).into_bytes();
    signed.extend_from_slice(&body);
    PushRequest {
        path: format!(
            "clients/{}",
            p.client.strip_prefix("did:key:").unwrap_or(p.client)
        ),
        signature: hex(&key.sign(&signed)),
        body,
        timestamp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notice::{Status, Typ};
    use ring::signature::{UnparsedPublicKey, ED25519};
    use std::sync::Arc;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn the_event_jwt_verifies_and_carries_the_claims() {
        let key = RelayKey::from_seed(&[1u8; 32]);
        let r = Registration {
            sub: "https://notify.example/".into(),
            whu: "https://notify.example/v1/relay-webhook".into(),
            typ: Typ::Subscriber,
            sts: 2,
            tag: Arc::from([]),
            exp: 0,
        };
        let n = Notice {
            client: "did:key:z6MkClient",
            typ: Typ::Subscriber,
            status: Status::Queued,
            message_id: 451_584_000_000_001,
            topic: "ab",
            message: "m\"x",
            attestation: None,
            published_at: 1_764_000_000_123,
            tag: 4002,
            ttl: 300,
        };
        let body = event_body(&key, &r, &n, 1_764_000_000);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let jwt = v["eventAuth"][0].as_str().unwrap();
        assert_eq!(v["eventAuth"].as_array().unwrap().len(), 1);
        let (payload, public) = crate::auth::verify_signature(jwt).unwrap();
        assert_eq!(hex(&public), key.public_hex());
        let c: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(c["iss"], key.did_key());
        assert_eq!(c["aud"], "https://notify.example/");
        assert_eq!(c["sub"], "did:key:z6MkClient");
        assert_eq!(c["act"], "irn_watchEvent");
        assert_eq!(c["exp"], 1_764_000_300u64);
        assert_eq!(c["evt"]["messageId"], 451_584_000_000_001u64);
        assert_eq!(c["evt"]["status"], "queued");
        assert_eq!(c["evt"]["message"], "m\"x");
        assert!(c["evt"]["attestation"].is_null());
        assert_eq!(c["evt"]["publishedAt"], 1_764_000_000_123u64);
    }

    #[test]
    fn the_push_is_signed_as_push_server_checks_it() {
        let key = RelayKey::from_seed(&[2u8; 32]);
        let p = PushNotice {
            client: "did:key:z6MkWallet",
            project: "p1",
            topic: "cd",
            message: "enc",
            tag: 1108,
            ttl: 300,
        };
        let req = push_request(&key, &p, 1_764_000_000);
        assert_eq!(req.path, "clients/z6MkWallet");
        // push-server: format!("{}.{}.{}", timestamp, body.len(), body), hex signature.
        let msg = format!(
            "{}.{}.{}",
            req.timestamp,
            req.body.len(),
            String::from_utf8(req.body.clone()).unwrap()
        );
        let public = UnparsedPublicKey::new(&ED25519, unhex(key.public_hex()));
        assert!(public
            .verify(msg.as_bytes(), &unhex(&req.signature))
            .is_ok());
        let v: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(v["payload"]["flags"], 3);
        assert_eq!(v["payload"]["blob"], "enc");
        assert_eq!(v["id"].as_str().unwrap().len(), 64);
    }
}
