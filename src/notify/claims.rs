//! The JWTs of `irn_watchRegister` / `irn_watchUnregister` (relay-api.md (a), DECISIONS 13):
//! signed by the watched client (`iss`, a did:key), `act`, `aud` = this relay's origin,
//! `iat`/`exp` with 120 s of leeway, `sub` the service URL, `whu` the webhook URL, `typ`,
//! and for a registration its filters `sts` and `tag`. Pure: a token, the time and the
//! accepted audiences in, the checked claims or the [`WatchError`] out.

use serde::Deserialize;

use crate::notice::{Status, Typ};

/// Clock leeway on `iat` and `exp`, seconds (relay_rpc's).
pub const LEEWAY_S: u64 = 120;
/// Longest registration: `exp` at most this long after `iat` (30 days).
pub const MAX_TTL_S: u64 = 30 * 24 * 3600;
/// Longest webhook URL (`whu`), bytes.
pub const MAX_WEBHOOK_URL: usize = 256;
/// Longest service URL (`sub`), bytes.
pub const MAX_SERVICE_URL: usize = 2048;

/// Why a watch request was refused: answered -32000 with `data` the tag ([`WatchError::tag`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// Bad format, signature, issuer, audience, or expired / not yet valid.
    #[error("Invalid JWT")]
    InvalidJwt,
    /// `act` is not the method's.
    #[error("Invalid action")]
    InvalidAction,
    /// `exp` missing, or more than 30 days after `iat`.
    #[error("Invalid TTL")]
    InvalidTtl,
    /// `sub` is not an http(s) URL.
    #[error("Invalid service URL")]
    InvalidServiceUrl,
    /// `whu` is not an http(s) URL of at most 256 characters.
    #[error("Invalid webhook URL")]
    InvalidWebhookUrl,
    /// The watched client has 64 registrations, or the relay `--max-watches`.
    #[error("Watch limit exceeded")]
    WatchLimitExceeded,
    /// The registration could not be made durable (the data directory's file could not be
    /// written and synced, Redis did not acknowledge it): -32000 with relay_rpc's internal
    /// tag `StorageError`. The table of the node that took it may still hold it.
    #[error("Storage error")]
    Storage,
}

impl WatchError {
    /// The tag relay_client parses back (`data`).
    pub fn tag(self) -> &'static str {
        match self {
            WatchError::InvalidJwt => "InvalidJwt",
            WatchError::InvalidAction => "InvalidAction",
            WatchError::InvalidTtl => "InvalidTtl",
            WatchError::InvalidServiceUrl => "InvalidServiceUrl",
            WatchError::InvalidWebhookUrl => "InvalidWebhookUrl",
            WatchError::WatchLimitExceeded => "WatchLimitExceeded",
            WatchError::Storage => "StorageError",
        }
    }

    /// The error's message, as relay_rpc words a handler error.
    pub fn message(self) -> String {
        format!("Request handler error: {self}")
    }
}

/// Which request a token came with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `irn_watchRegister` (`registerAuth`).
    Register,
    /// `irn_watchUnregister` (`unregisterAuth`).
    Unregister,
}

impl Action {
    fn act(self) -> &'static str {
        match self {
            Action::Register => "irn_watchRegister",
            Action::Unregister => "irn_watchUnregister",
        }
    }
}

/// The accepted `aud` values: `--auth-audience`, where a `wss://` (`ws://`) URL also accepts
/// its `https://` (`http://`) origin and the other way round, a trailing `/` ignored. None
/// configured: any http(s) or ws(s) URL (behind a load balancer the relay cannot know its
/// own address, as for relay-auth tokens).
#[derive(Debug, Clone, Default)]
pub struct Audiences(Vec<String>);

impl Audiences {
    /// From `--auth-audience`'s values.
    pub fn new(configured: &[String]) -> Audiences {
        Audiences(configured.iter().filter_map(|a| origin(a)).collect())
    }

    /// Whether `aud` is accepted.
    pub fn accepts(&self, aud: &str) -> bool {
        match origin(aud) {
            None => false,
            Some(o) => self.0.is_empty() || self.0.contains(&o),
        }
    }
}

/// `aud` reduced for comparison: ws -> http, wss -> https, lower-case scheme and host, no
/// trailing `/`; `None` for anything but an http(s)/ws(s) URL.
fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "https" | "wss" => "https",
        "http" | "ws" => "http",
        _ => return None,
    };
    let rest = rest.trim_end_matches('/');
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        return None;
    }
    let mut o = format!("{scheme}://{}", host.to_ascii_lowercase());
    if !path.is_empty() {
        o.push('/');
        o.push_str(path);
    }
    Some(o)
}

/// Whether `url` is an `http://` or `https://` URL with a host and nothing unprintable.
pub fn is_http_url(url: &str) -> bool {
    let rest = if let Some(r) = url.strip_prefix("https://") {
        r
    } else if let Some(r) = url.strip_prefix("http://") {
        r
    } else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    !host.is_empty() && url.bytes().all(|b| b.is_ascii_graphic())
}

/// A checked watch token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchClaims {
    /// The watched client (`iss`).
    pub client: String,
    /// The service URL (`sub`).
    pub sub: String,
    /// The webhook URL (`whu`).
    pub whu: String,
    /// Which side of its messages.
    pub typ: Typ,
    /// The statuses reported ([`Status::bit`]s; a registration only).
    pub sts: u8,
    /// The tags reported (empty: every tag; a registration only).
    pub tag: Vec<u32>,
    /// `exp`, Unix seconds (a registration always has one).
    pub exp: Option<u64>,
}

#[derive(Deserialize)]
struct Raw {
    iss: String,
    aud: String,
    sub: String,
    iat: u64,
    #[serde(default)]
    exp: Option<u64>,
    act: String,
    typ: RawTyp,
    whu: String,
    #[serde(default)]
    sts: Option<Vec<RawStatus>>,
    #[serde(default)]
    tag: Option<Vec<u32>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawTyp {
    Subscriber,
    Publisher,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawStatus {
    Accepted,
    Queued,
    Delivered,
}

/// Checks `token` for `action` at `now` (Unix seconds).
pub fn check(
    token: &str,
    action: Action,
    now: u64,
    audiences: &Audiences,
) -> Result<WatchClaims, WatchError> {
    let (payload, _key) =
        crate::auth::verify_signature(token).map_err(|_| WatchError::InvalidJwt)?;
    let raw: Raw = serde_json::from_slice(&payload).map_err(|_| WatchError::InvalidJwt)?;
    if raw.act != action.act() {
        return Err(WatchError::InvalidAction);
    }
    if raw
        .exp
        .is_some_and(|exp| now > exp.saturating_add(LEEWAY_S))
        || raw.iat > now.saturating_add(LEEWAY_S)
        || !audiences.accepts(&raw.aud)
    {
        return Err(WatchError::InvalidJwt);
    }
    if action == Action::Register {
        match raw.exp {
            Some(exp) if exp > raw.iat && exp - raw.iat <= MAX_TTL_S => {}
            _ => return Err(WatchError::InvalidTtl),
        }
    }
    if raw.sub.len() > MAX_SERVICE_URL || !is_http_url(&raw.sub) {
        return Err(WatchError::InvalidServiceUrl);
    }
    if raw.whu.len() > MAX_WEBHOOK_URL || !is_http_url(&raw.whu) {
        return Err(WatchError::InvalidWebhookUrl);
    }
    let sts = match (action, raw.sts) {
        (Action::Register, None) => return Err(WatchError::InvalidJwt),
        (_, s) => s.unwrap_or_default().iter().fold(0u8, |bits, s| {
            bits | match s {
                RawStatus::Accepted => Status::Accepted.bit(),
                RawStatus::Queued => Status::Queued.bit(),
                RawStatus::Delivered => Status::Delivered.bit(),
            }
        }),
    };
    let mut tag = raw.tag.unwrap_or_default();
    tag.sort_unstable();
    tag.dedup();
    Ok(WatchClaims {
        client: raw.iss,
        sub: raw.sub,
        whu: raw.whu,
        typ: match raw.typ {
            RawTyp::Subscriber => Typ::Subscriber,
            RawTyp::Publisher => Typ::Publisher,
        },
        sts,
        tag,
        exp: raw.exp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::test_signer::Signer;

    const NOW: u64 = 1_764_000_000;

    fn register(s: &Signer, extra: &str) -> String {
        s.sign_payload(&format!(
            r#"{{"iss":"{}","aud":"https://relay.example","sub":"https://notify.example/","iat":{NOW},"exp":{},"act":"irn_watchRegister","typ":"subscriber","whu":"https://notify.example/v1/relay-webhook","tag":[4000,4002],"sts":["accepted","queued"]{extra}}}"#,
            s.iss,
            NOW + MAX_TTL_S
        ))
    }

    fn aud() -> Audiences {
        Audiences::new(&["wss://relay.example".to_string()])
    }

    #[test]
    fn a_good_registration_passes_with_its_filters() {
        let s = Signer::random();
        let c = check(&register(&s, ""), Action::Register, NOW, &aud()).unwrap();
        assert_eq!(c.client, s.iss);
        assert_eq!(c.typ, Typ::Subscriber);
        assert_eq!(c.sts, Status::Accepted.bit() | Status::Queued.bit());
        assert_eq!(c.tag, vec![4000, 4002]);
        assert_eq!(c.exp, Some(NOW + MAX_TTL_S));
        // No audience configured: any http(s)/ws(s) URL.
        assert!(check(
            &register(&s, ""),
            Action::Register,
            NOW,
            &Audiences::default()
        )
        .is_ok());
    }

    #[test]
    fn refusals_carry_their_tags() {
        let s = Signer::random();
        let e = |t: &str, a: Action, now: u64| check(t, a, now, &aud()).unwrap_err();
        assert_eq!(
            e(&register(&s, ""), Action::Unregister, NOW),
            WatchError::InvalidAction
        );
        assert_eq!(
            e(&register(&s, ""), Action::Register, NOW + MAX_TTL_S + 200),
            WatchError::InvalidJwt
        );
        let other = Audiences::new(&["wss://other.example".to_string()]);
        assert_eq!(
            check(&register(&s, ""), Action::Register, NOW, &other),
            Err(WatchError::InvalidJwt)
        );
        // One character of the signature changed (never to itself).
        let mut forged = register(&s, "").into_bytes();
        let i = forged.len() - 10;
        forged[i] = if forged[i] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8(forged).unwrap();
        assert_eq!(e(&forged, Action::Register, NOW), WatchError::InvalidJwt);
        let long = s.sign_payload(&format!(
            r#"{{"iss":"{}","aud":"https://relay.example","sub":"https://n.example","iat":{NOW},"exp":{},"act":"irn_watchRegister","typ":"publisher","whu":"https://n.example/h","tag":[],"sts":["accepted"]}}"#,
            s.iss,
            NOW + MAX_TTL_S + 1
        ));
        assert_eq!(e(&long, Action::Register, NOW), WatchError::InvalidTtl);
        let no_exp = s.sign_payload(&format!(
            r#"{{"iss":"{}","aud":"https://relay.example","sub":"https://n.example","iat":{NOW},"act":"irn_watchRegister","typ":"publisher","whu":"https://n.example/h","tag":[],"sts":["accepted"]}}"#,
            s.iss
        ));
        assert_eq!(e(&no_exp, Action::Register, NOW), WatchError::InvalidTtl);
        let bad_whu = s.sign_payload(&format!(
            r#"{{"iss":"{}","aud":"https://relay.example","sub":"https://n.example","iat":{NOW},"exp":{},"act":"irn_watchRegister","typ":"publisher","whu":"ftp://n.example/h","tag":[],"sts":["accepted"]}}"#,
            s.iss,
            NOW + 60
        ));
        assert_eq!(
            e(&bad_whu, Action::Register, NOW),
            WatchError::InvalidWebhookUrl
        );
        let bad_sub = s.sign_payload(&format!(
            r#"{{"iss":"{}","aud":"https://relay.example","sub":"not a url","iat":{NOW},"exp":{},"act":"irn_watchRegister","typ":"publisher","whu":"https://n.example/h","tag":[],"sts":["accepted"]}}"#,
            s.iss,
            NOW + 60
        ));
        assert_eq!(
            e(&bad_sub, Action::Register, NOW),
            WatchError::InvalidServiceUrl
        );
    }

    #[test]
    fn an_unregistration_needs_no_exp_nor_filters() {
        let s = Signer::random();
        let t = s.sign_payload(&format!(
            r#"{{"iss":"{}","aud":"https://relay.example/","sub":"https://n.example","iat":{NOW},"act":"irn_watchUnregister","typ":"publisher","whu":"https://n.example/h"}}"#,
            s.iss
        ));
        let c = check(&t, Action::Unregister, NOW, &aud()).unwrap();
        assert_eq!((c.typ, c.exp), (Typ::Publisher, None));
    }

    #[test]
    fn origins_compare_across_ws_and_http() {
        let a = Audiences::new(&["wss://Relay.example/".to_string()]);
        assert!(a.accepts("https://relay.example"));
        assert!(a.accepts("wss://relay.example"));
        assert!(!a.accepts("http://relay.example"));
        assert!(!a.accepts("relay.example"));
        assert!(is_http_url("http://127.0.0.1:9/x"));
        assert!(!is_http_url("https:///x") && !is_http_url("https://a b"));
    }
}
