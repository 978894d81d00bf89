//! The flags of watches and pushes (DECISIONS 13): the relay's key, the push servers, the
//! watch table's cap.

use std::path::PathBuf;

/// Watch and push settings.
#[derive(Debug, Clone, clap::Args)]
pub struct NotifyOptions {
    /// File with the relay's Ed25519 key: its 32-byte seed as 64 hex characters. Default:
    /// shared through Redis with `--redis`, else `relay-key.hex` in `--data-dir` (created on
    /// first start), else a fresh key per process. `GET /public-key` shows its public half.
    #[arg(long, env = "WALLETRELAY_RELAY_KEY", value_name = "FILE")]
    pub relay_key: Option<PathBuf>,

    /// Push server of every project: `prompt` messages for a subscribed client id with no
    /// socket are POSTed to `{URL}/clients/{client id}`; `{projectId}` in the URL is replaced
    /// by the subscriber's project id.
    #[arg(
        long,
        env = "WALLETRELAY_PUSH_URL",
        value_name = "URL",
        conflicts_with = "push_urls"
    )]
    pub push_url: Option<String>,

    /// Push server per project: `@FILE` with one `PROJECT_ID URL` pair a line (`#`
    /// comments); re-read on SIGHUP.
    #[arg(long, env = "WALLETRELAY_PUSH_URLS", value_name = "@FILE")]
    pub push_urls: Option<String>,

    /// Most watch registrations (`irn_watchRegister`) the relay keeps in all (64 per
    /// watched client).
    #[arg(long, env = "WALLETRELAY_MAX_WATCHES", default_value_t = 100_000)]
    pub max_watches: usize,
}
