//! walletrelay: a thread-per-core wallet registry and WalletConnect (waku) message relay.
//!
//! Follow a message from `main` to a subscriber's socket:
//! [`server`] starts one [`worker`] per core; a worker's poll loop reads bytes from a
//! connection ([`conn`]), parses HTTP ([`http`]) until a WebSocket upgrade, then frames
//! ([`ws`]) carrying JSON-RPC ([`rpc`]); a `waku_publish` goes through the worker's [`relay`]
//! to the topic's [`engine`], which stores it (on its home worker, on disk, or in Redis) and
//! fans it out to every worker holding subscribers, and each of those writes a
//! `waku_subscription` frame into its subscribers' [`outbuf`]s.
#![deny(missing_docs)]
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)]

pub mod admin;
pub mod arcbuf;
pub mod auth;
pub mod clock;
pub mod config;
pub mod conn;
pub mod drain;
pub mod engine;
pub mod event;
pub mod handover;
pub mod health;
pub mod http;
pub mod identity;
pub mod ip;
pub mod json;
pub mod layout;
pub mod limits;
pub mod logging;
pub mod mailbox;
pub mod message;
pub mod metrics;
pub mod notice;
pub mod notify;
pub mod outbuf;
pub mod prefetch;
pub mod redact;
pub mod registry;
pub mod relay;
pub mod reload;
pub mod rng;
pub mod rpc;
pub mod server;
pub mod store;
pub mod timer;
pub mod tls;
pub mod version;
pub mod webhook;
pub mod worker;
pub mod ws;
