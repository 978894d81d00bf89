//! What push-server's handlers do with a request (`register_client.rs`, `push_message.rs`,
//! `middleware/validate_signature.rs`, `providers/noop.rs`, `error.rs`), on the stand-in's
//! state; each answer is `(status, body)`.

use serde_json::{json, Value};

use super::{header, Client, Half, Push, Shared};

/// Every provider name push-server knows (`ProviderKind::try_from`).
const KNOWN_PROVIDERS: [&str; 4] = ["apns", "apns-sandbox", "fcm", "noop"];

/// push-server's failure body (`handlers::Response::new_failure`).
pub(super) fn failure(name: &str, message: &str) -> String {
    json!({"status": "FAILURE", "errors": [{"name": name, "message": message}], "fields": []})
        .to_string()
}

fn success() -> String {
    json!({"status": "SUCCESS", "errors": null, "fields": null}).to_string()
}

/// axum's `Json` extractor's content-type test: `application/json` or `application/*+json`.
fn is_json(headers: &[(String, String)]) -> bool {
    let Some(ct) = header(headers, "content-type") else {
        return false;
    };
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

pub(super) fn route(
    shared: &Shared,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> (u16, String) {
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/health") => (200, String::new()),
        ("POST", "/clients") => register(shared, headers, &body),
        ("POST", p) if p.starts_with("/clients/") && p.len() > "/clients/".len() => {
            let id = &p["/clients/".len()..];
            if id.contains('/') {
                return (404, String::new());
            }
            push(shared, id, headers, body)
        }
        _ => (404, String::new()),
    }
}

pub(super) fn register(
    shared: &Shared,
    headers: &[(String, String)],
    body: &[u8],
) -> (u16, String) {
    if !is_json(headers) {
        return (
            415,
            "Expected request with `Content-Type: application/json`".into(),
        );
    }
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return (
                400,
                format!("Failed to parse the request body as JSON: {e}"),
            )
        }
    };
    let (Some(client_id), Some(kind), Some(token)) = (
        v["client_id"].as_str(),
        v["type"].as_str(),
        v["token"].as_str(),
    ) else {
        return (
            422,
            "Failed to deserialize the JSON body into the target type".into(),
        );
    };
    let always_raw = match &v["always_raw"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => {
            return (
                422,
                "Failed to deserialize the JSON body into the target type".into(),
            )
        }
    };
    let public_url = shared
        .state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .public_url
        .clone();
    if !authenticate(headers, &public_url, client_id) {
        return (
            401,
            failure(
                "authentication",
                "the provided authentication does not authenticate the request",
            ),
        );
    }
    let kind = kind.to_lowercase();
    if !KNOWN_PROVIDERS.contains(&kind.as_str()) {
        let m = format!("{kind} is an invalid push provider as it cannot be not found");
        return (400, failure("provider", &m));
    }
    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    if !st.providers.contains(&kind) {
        let m = format!("{kind} is an invalid push provider as it has not been enabled");
        return (400, failure("provider", &m));
    }
    if token.is_empty() {
        return (400, failure("token", "the `token` field must not be empty"));
    }
    let id = client_id.trim_start_matches("did:key:").to_string();
    let client = Client {
        provider: kind,
        token: token.to_string(),
        always_raw,
    };
    // stores/client.rs: the same id is updated; a token known under another id moves to
    // this id, and that id's notifications are forgotten.
    if !st.clients.contains_key(&id) {
        let old = st
            .clients
            .iter()
            .find(|(_, c)| c.token == token)
            .map(|(k, _)| k.clone());
        if let Some(old) = old {
            st.clients.remove(&old);
            st.seen.retain(|(_, c)| *c != old);
        }
    }
    st.clients.insert(id, client);
    (200, success())
}

fn push(shared: &Shared, id: &str, headers: &[(String, String)], body: Vec<u8>) -> (u16, String) {
    let key = shared
        .state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .relay_key
        .clone();
    let Some(key) = key else {
        return (500, failure("ed25519", "RELAY_PUBLIC_KEY is not set"));
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let sig = header(headers, "x-ed25519-signature");
    let ts = header(headers, "x-ed25519-timestamp");
    match (sig, ts) {
        (Some(sig), Some(ts)) => match signature_is_valid(sig, ts, &text, &key) {
            Ok(true) => {}
            Ok(false) => return (401, failure("webhook_validation_failed", "invalid")),
            Err(e) => return (500, failure("ed25519", e)),
        },
        _ => return (401, failure("webhook_validation_failed", "missing headers")),
    }
    if !is_json(headers) {
        return (
            500,
            failure("from_request", "middleware T::from_request failed"),
        );
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (
            500,
            failure("from_request", "middleware T::from_request failed"),
        );
    };
    if !v.is_object() {
        return (
            500,
            failure("from_request", "middleware T::from_request failed"),
        );
    }
    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    let Some(client) = st.clients.get(id).cloned() else {
        return (202, success()); // Error::ClientNotFound answers 202
    };
    let half = if client.always_raw {
        match raw_half(&v) {
            Some(h) => h,
            None => {
                let m = "the `missing topic, tag, or message field` field must not be empty";
                return (400, failure("field", m));
            }
        }
    } else {
        match legacy_half(&v) {
            Some(h) => h,
            None => {
                let m = "the `missing id or payload field` field must not be empty";
                return (400, failure("field", m));
            }
        }
    };
    let message_id = match &half {
        Half::Raw { message, .. } => sha256_hex(message.as_bytes()),
        Half::Legacy { id, .. } => id.clone(),
    };
    let client_id = id.trim_start_matches("did:key:").to_string();
    if !st.seen.insert((message_id.clone(), client_id.clone())) {
        return (200, String::new()); // "notification has already been received"
    }
    if client.provider == "noop" {
        drop(st); // the GET must not hold the state
        if let Err(status) = noop_send(&client.token) {
            return (
                status,
                failure("provider", "the noop provider's GET failed"),
            );
        }
        st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    }
    st.pushes.push(Push {
        client_id,
        provider: client.provider,
        token: client.token,
        half,
        message_id,
        body,
        headers: headers.to_vec(),
    });
    (202, String::new())
}

/// `RawPushMessage`, as serde's flattened `Option` reads it: all three fields, right types.
fn raw_half(v: &Value) -> Option<Half> {
    Some(Half::Raw {
        topic: v["topic"].as_str()?.to_string(),
        tag: u32::try_from(v["tag"].as_u64()?).ok()?,
        message: v["message"].as_str()?.to_string(),
    })
}

/// `LegacyPushMessage`: `id` and a `payload` of `{topic, flags, blob}`.
fn legacy_half(v: &Value) -> Option<Half> {
    let p = &v["payload"];
    Some(Half::Legacy {
        id: v["id"].as_str()?.to_string(),
        topic: p["topic"].as_str()?.to_string(),
        flags: u32::try_from(p["flags"].as_u64()?).ok()?,
        blob: p["blob"].as_str()?.to_string(),
    })
}

/// `validate_signature::signature_is_valid`: Ed25519 over `"{timestamp}.{len}.{body}"`, the
/// signature in hex. `Err` where push-server fails with 500 (not hex, not 64 bytes).
pub fn signature_is_valid(
    signature: &str,
    timestamp: &str,
    body: &str,
    public_key: &[u8],
) -> Result<bool, &'static str> {
    let signed = format!("{}.{}.{}", timestamp, body.len(), body);
    let sig = unhex(signature).ok_or("signature is not hex")?;
    if sig.len() != 64 {
        return Err("signature is not 64 bytes");
    }
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public_key);
    Ok(key.verify(signed.as_bytes(), &sig).is_ok())
}

/// The signature headers' value as the relay must make it (for tests that sign requests).
pub fn sign(key: &ring::signature::Ed25519KeyPair, timestamp: &str, body: &str) -> String {
    let signed = format!("{}.{}.{}", timestamp, body.len(), body);
    to_hex(key.sign(signed.as_bytes()).as_ref())
}

/// `relay_rpc::rpc::msg_id::get_message_id`: sha256 hex of the message.
pub fn sha256_hex(b: &[u8]) -> String {
    to_hex(ring::digest::digest(&ring::digest::SHA256, b).as_ref())
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(super) fn unhex(s: &str) -> Option<Vec<u8>> {
    // hex::decode: pairs of hex digits of either case, nothing else
    let digits: Option<Vec<u8>> = s.chars().map(|c| c.to_digit(16).map(|d| d as u8)).collect();
    let digits = digits?;
    if digits.len() % 2 != 0 {
        return None;
    }
    Some(digits.chunks(2).map(|p| p[0] << 4 | p[1]).collect())
}

/// `handlers::authenticate_client`: without an `Authorization` header a registration passes;
/// with one it must be a relay JWT (raw, no `Bearer`; `JwtBasicClaims`) signed by its `iss`,
/// issued for `aud` = PUBLIC_URL (120 s leeway), whose `iss` is the registered `client_id`.
fn authenticate(headers: &[(String, String)], public_url: &str, client_id: &str) -> bool {
    use base64::Engine;
    let Some(jwt) = header(headers, "authorization") else {
        return true;
    };
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let claims: Option<Value> = jwt
        .split('.')
        .nth(1)
        .and_then(|c| b64.decode(c).ok())
        .and_then(|c| serde_json::from_slice(&c).ok());
    let Some(claims) = claims else { return false };
    let Some(iss) = claims["iss"].as_str() else {
        return false;
    };
    let key = iss
        .strip_prefix("did:key:z")
        .and_then(|b| bs58::decode(b).into_vec().ok())
        .filter(|k| k.len() == 34 && k[..2] == [0xed, 0x01]);
    let Some(key) = key else { return false };
    let hex_key: String = key[2..].iter().map(|x| format!("{x:02x}")).collect();
    if crate::common::relay_id::verify_jwt(jwt, &hex_key).is_err() {
        return false;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let exp_ok = claims["exp"].as_i64().is_none_or(|exp| now - 120 <= exp);
    let iat_ok = claims["iat"].as_i64().is_some_and(|iat| iat <= now + 120);
    exp_ok && iat_ok && claims["aud"] == public_url && iss == client_id
}

/// `providers/noop.rs`: a token that parses as a URL is fetched (`GET`) and must answer 2xx
/// (an `assert!`: push-server's task panics and the connection is dropped, status 0 here); a
/// URL it cannot fetch is 500 (`Error::HttpRequest`). Any other token: nothing to do.
fn noop_send(token: &str) -> Result<(), u16> {
    use std::io::Write;
    let scheme_end = token.find(':').unwrap_or(0);
    let is_url = scheme_end > 0
        && token.as_bytes()[0].is_ascii_alphabetic()
        && token[..scheme_end]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    if !is_url {
        return Ok(());
    }
    let Some(rest) = token.strip_prefix("http://") else {
        return Err(500); // reqwest here has no TLS to loopback and no other scheme
    };
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut s = std::net::TcpStream::connect(host).map_err(|_| 500u16)?;
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(|_| 500u16)?;
    // The status line is all that counts (the peer may keep the connection open).
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut line);
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(500u16)?;
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(0)
    }
}
