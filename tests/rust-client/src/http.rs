//! The relay's HTTP transport as reown-rust's `relay_client/src/http.rs` (d7d78ad) speaks it,
//! with `reown-relay-rpc`'s own request, claim and response types (the published
//! `reown-relay-client` 0.1.0 has no HTTP client): `POST {relay}/rpc?projectId=..&auth=JWT`
//! (the query of `ConnectionOptions::as_url`), the body one `rpc::Payload::Request` as JSON
//! with ids from `MessageIdGenerator`, a non-2xx status an error with its body, the answer an
//! `rpc::Payload::Response`. The auth JWT has no `exp`, as Notify server makes it ("HTTP
//! client cannot currently use an expiring JWT"); `aud` is the http origin. Blocking (ureq)
//! where upstream uses reqwest: the requests on the wire are the same.
//!
//! Also the watching service's side: a webhook receiver on 127.0.0.1 and the event check of
//! Notify server (`relay_webhook/mod.rs`): one JWT, its signature (`try_from_str`),
//! `iss` = the relay id, `aud` = the service URL (`verify_basic`), `act`.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reown_relay_client::{ConnectionOptions, MessageIdGenerator};
use reown_relay_rpc::{
    auth::{ed25519_dalek::SigningKey, AuthToken},
    domain::{DecodedClientId, MessageId, Topic},
    jwt::{JwtBasicClaims, VerifyableClaims},
    rpc::{self, Receipt, ServiceRequest},
};
use serde_json::{json, Value};

use crate::{did_key, keypair, random_topic, report, STEP};

/// One identity's HTTP client.
pub struct HttpClient {
    agent: ureq::Agent,
    url: url::Url,
    origin: String,
    ids: MessageIdGenerator,
    key: SigningKey,
}

impl HttpClient {
    /// `relay` is the relay's http(s) base URL; the client posts to `{relay}/rpc`.
    pub fn new(relay: &str, project: &str) -> Result<HttpClient, String> {
        let key = keypair();
        let address = format!("{}/rpc", relay.trim_end_matches('/'));
        let origin = url::Url::parse(&address)
            .map_err(|e| e.to_string())?
            .origin()
            .unicode_serialization();
        let auth = AuthToken::new("wr-rust-client")
            .aud(origin.clone())
            .as_jwt(&key)
            .map_err(|e| e.to_string())?;
        let url = ConnectionOptions::new(project.to_string(), auth)
            .with_address(address)
            .as_url()
            .map_err(|e| e.to_string())?;
        let agent = ureq::AgentBuilder::new().timeout(STEP).build();
        Ok(HttpClient {
            agent,
            url,
            origin,
            ids: MessageIdGenerator::new(),
            key,
        })
    }

    /// This client's `did:key`.
    pub fn id(&self) -> String {
        did_key(&self.key)
    }

    /// `Client::request`: one request, its typed result or the error as text.
    pub fn request<T: ServiceRequest>(&self, payload: T) -> Result<T::Response, String> {
        let payload = rpc::Payload::Request(rpc::Request {
            id: self.ids.next(),
            jsonrpc: rpc::JSON_RPC_VERSION.clone(),
            params: payload.into_params(),
        });
        let body = serde_json::to_string(&payload).map_err(|e| e.to_string())?;
        let answer = self
            .agent
            .post(self.url.as_str())
            .set("Content-Type", "application/json")
            .send_string(&body);
        let text = match answer {
            Ok(r) => r.into_string().map_err(|e| e.to_string())?,
            Err(ureq::Error::Status(code, r)) => {
                let body = r.into_string().unwrap_or_default();
                return Err(format!("InvalidHttpCode({code}, {body:?})"));
            }
            Err(e) => return Err(format!("transport: {e}")),
        };
        match serde_json::from_str::<rpc::Payload>(&text) {
            Ok(rpc::Payload::Response(rpc::Response::Success(r))) => {
                serde_json::from_value(r.result).map_err(|_| format!("InvalidResponse: {text}"))
            }
            Ok(rpc::Payload::Response(rpc::Response::Error(r))) => Err(format!(
                "error {} {} ({:?})",
                r.error.code, r.error.message, r.error.data
            )),
            _ => Err(format!("InvalidResponse: {text}")),
        }
    }

    /// `Client::watch_register`: the claims signed by this client's key.
    pub fn watch_register(
        &self,
        service_url: &str,
        webhook_url: &str,
        typ: rpc::WatchType,
        tags: Vec<u32>,
        statuses: Vec<rpc::WatchStatus>,
        ttl: Duration,
    ) -> Result<rpc::WatchRegisterResponse, String> {
        let iat = now();
        let claims = rpc::WatchRegisterClaims {
            basic: JwtBasicClaims {
                iss: DecodedClientId::from_key(&self.key.verifying_key()).into(),
                aud: self.origin.clone(),
                iat,
                sub: service_url.to_string(),
                exp: Some(iat + ttl.as_secs() as i64),
            },
            act: rpc::WatchAction::Register,
            typ,
            whu: webhook_url.to_string(),
            tag: tags,
            sts: statuses,
        };
        let register_auth = claims.encode(&self.key).map_err(|e| e.to_string())?;
        self.request(rpc::WatchRegister { register_auth })
    }

    /// `Client::watch_unregister` (no `exp`, as upstream).
    pub fn watch_unregister(
        &self,
        service_url: &str,
        webhook_url: &str,
        typ: rpc::WatchType,
    ) -> Result<bool, String> {
        let claims = rpc::WatchUnregisterClaims {
            basic: JwtBasicClaims {
                iss: DecodedClientId::from_key(&self.key.verifying_key()).into(),
                aud: self.origin.clone(),
                iat: now(),
                sub: service_url.to_string(),
                exp: None,
            },
            act: rpc::WatchAction::Unregister,
            typ,
            whu: webhook_url.to_string(),
        };
        let unregister_auth = claims.encode(&self.key).map_err(|e| e.to_string())?;
        self.request(rpc::WatchUnregister { unregister_auth })
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A webhook POST as the service received it.
struct Hook {
    path: String,
    body: Vec<u8>,
}

/// A webhook receiver on 127.0.0.1 answering 204 to everything (its own thread).
fn webhook_receiver() -> Result<(u16, mpsc::Receiver<Hook>), String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let Ok(mut w) = s.try_clone() else { return };
                let mut r = BufReader::new(s);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    let mut len = 0usize;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.trim().eq_ignore_ascii_case("content-length") {
                                len = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0; len.min(1 << 20)];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = tx.send(Hook { path, body });
                    if w.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok((port, rx))
}

/// Notify server's check of one webhook body; the event's fields and the JWT.
fn check_event(body: &[u8], relay_id: &str, service_url: &str) -> Result<Value, String> {
    let payload: rpc::WatchWebhookPayload =
        serde_json::from_slice(body).map_err(|e| format!("body: {e}"))?;
    if payload.event_auth.len() != 1 {
        return Err(format!("{} JWTs in eventAuth", payload.event_auth.len()));
    }
    let jwt = &payload.event_auth[0];
    let claims = rpc::WatchEventClaims::try_from_str(jwt).map_err(|e| format!("jwt: {e}"))?;
    claims
        .verify_basic(&HashSet::from([service_url.to_string()]), None)
        .map_err(|e| format!("claims: {e}"))?;
    let iss = claims.basic.iss.0.to_did_key();
    if iss != relay_id {
        return Err(format!("iss {iss} is not the relay id {relay_id}"));
    }
    if claims.act != rpc::WatchAction::WatchEvent {
        return Err(format!("act {:?}", claims.act));
    }
    let e = &claims.evt;
    Ok(
        json!({"status": e.status, "message_id": e.message_id.value(), "topic": e.topic.value().as_ref(),
        "message": e.message.as_ref(), "tag": e.tag, "published_at": e.published_at,
        "typ": claims.typ, "sub": claims.basic.sub, "whu": claims.whu, "jwt": jwt}),
    )
}

/// The HTTP scenario (see the crate's header).
pub fn scenario(relay: &str, project: &str, topic: &str) {
    const S: &str = "http";
    let (publisher, service) = match (
        HttpClient::new(relay, project),
        HttpClient::new(relay, project),
    ) {
        (Ok(p), Ok(s)) => (p, s),
        (Err(e), _) | (_, Err(e)) => return report(S, "client", Err(e)),
    };
    report(
        S,
        "client",
        Ok(json!({"publisher": publisher.id(), "service": service.id()})),
    );

    let topic = Topic::from(topic.to_string());
    let message = format!("wr-rust-client \"http\" é {}", &service.id()[8..20]);
    let r = publisher.request(rpc::Publish {
        topic: topic.clone(),
        message: message.as_str().into(),
        attestation: None,
        ttl_secs: 300,
        tag: 1000,
        prompt: false,
    });
    report(
        S,
        "publish",
        r.map(|_| json!({"topic": topic.value().as_ref(), "message": message})),
    );

    let r = service.request(rpc::FetchMessages {
        topic: topic.clone(),
    });
    report(S, "fetch", r.map(|f| fetched(&f)));

    // The watching service: a topic of its own, its webhook, a subscriber watch.
    let watched = random_topic();
    let r = service.request(rpc::Subscribe {
        topic: watched.clone(),
    });
    report(
        S,
        "subscribe",
        r.map(
            |id| json!({"topic": watched.value().as_ref(), "subscription_id": id.value().as_ref()}),
        ),
    );

    let (port, hooks) = match webhook_receiver() {
        Ok(x) => x,
        Err(e) => return report(S, "webhook_receiver", Err(e)),
    };
    // Notify server: sub = its base URL (with the trailing '/'), whu = {base}/v1/relay-webhook.
    let service_url = format!("http://127.0.0.1:{port}/");
    let webhook_url = format!("{service_url}v1/relay-webhook");
    let statuses = vec![rpc::WatchStatus::Accepted, rpc::WatchStatus::Queued];
    let r = service.watch_register(
        &service_url,
        &webhook_url,
        rpc::WatchType::Subscriber,
        vec![1001],
        statuses,
        Duration::from_secs(86400),
    );
    let relay_id = r.as_ref().ok().map(|r| r.relay_id.0.to_did_key());
    report(S, "watch_register", r.map(|r| json!({"relay_id": r.relay_id.0.to_did_key(), "service_url": service_url, "webhook": webhook_url})));

    let watched_message = format!("wr-rust-client watched {}", &publisher.id()[8..20]);
    let r = publisher.request(rpc::Publish {
        topic: watched.clone(),
        message: watched_message.as_str().into(),
        attestation: None,
        ttl_secs: 300,
        tag: 1001,
        prompt: false,
    });
    report(
        S,
        "publish_watched",
        r.map(|_| json!({"topic": watched.value().as_ref(), "message": watched_message})),
    );

    // Events until a `queued` one came (or the time is up): accepted and queued are asked.
    let mut queued: Option<MessageId> = None;
    let deadline = Instant::now() + STEP;
    while queued.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(hook) = hooks.recv_timeout(left) else {
            report(
                S,
                "watch_event",
                Err(format!("no queued event within {STEP:?}")),
            );
            break;
        };
        let r = match &relay_id {
            Some(id) => check_event(&hook.body, id, &service_url),
            None => Err("no relay id (watch_register failed)".into()),
        };
        if let Ok(e) = &r {
            if e["status"] == "queued" {
                queued = e["message_id"].as_u64().map(MessageId::new);
            }
        }
        report(
            S,
            "watch_event",
            r.map(|mut e| {
                e["path"] = json!(hook.path);
                e
            }),
        );
    }

    match queued {
        Some(id) => {
            let r = service.request(rpc::BatchReceiveMessages {
                receipts: vec![Receipt {
                    topic: watched.clone(),
                    message_id: id,
                }],
            });
            report(S, "batch_receive", r.map(|b| json!(b)));
        }
        None => report(
            S,
            "batch_receive",
            Err("no queued event to acknowledge".into()),
        ),
    }

    let r = service.request(rpc::FetchMessages {
        topic: watched.clone(),
    });
    report(S, "fetch_after_receive", r.map(|f| fetched(&f)));

    let r = service.watch_unregister(&service_url, &webhook_url, rpc::WatchType::Subscriber);
    report(S, "watch_unregister", r.map(|b| json!(b)));

    let r = service.request(rpc::Unsubscribe {
        topic: watched.clone(),
    });
    report(S, "unsubscribe", r.map(|b| json!(b)));
    report(S, "done", Ok(json!({})));
}

fn fetched(f: &rpc::FetchResponse) -> Value {
    let messages: Vec<Value> = f
        .messages
        .iter()
        .map(|m| json!({"topic": m.topic.value().as_ref(), "message": m.message.as_ref(), "tag": m.tag}))
        .collect();
    json!({"messages": messages, "has_more": f.has_more})
}
