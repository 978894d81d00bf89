//! Relay auth for today's WalletConnect SDKs (DECISIONS section 10): verifying the client's
//! JWT ([`verify`]), a worker's cache of verified tokens ([`TokenCache`]), reading the auth
//! parameters of an upgrade request ([`UpgradeAuth`]) and the `--project-ids` allow-list
//! ([`ProjectIds`]). Pure: no sockets, no clocks (the caller passes the time), no globals;
//! what a refusal looks like on the wire (401/403, close 3000) is the caller's.

mod cache;
mod gate;
mod jwt;
mod project;
mod upgrade;

#[cfg(test)]
pub(crate) mod test_signer;
#[cfg(test)]
mod tests;

pub use cache::{TokenCache, DEFAULT_CAPACITY};
pub use gate::{http_audiences, Gate, Verdict};
pub(crate) use jwt::verify_signature;
pub use jwt::{issuer_of, verify, AuthError, Claims, MAX_TOKEN_LEN};
pub use project::ProjectIds;
pub use upgrade::UpgradeAuth;

/// An authenticated client: the Ed25519 public key of its tokens' `iss`, shared by the
/// connections of one token (32 bytes where the `did:key` string would take 56).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKey(pub [u8; 32]);

impl ClientKey {
    /// Its client id, `did:key:z6Mk...` (what it signs its tokens as).
    pub fn did(&self) -> String {
        issuer_of(&self.0)
    }
}

/// Clock leeway on `iat` and `exp` by default, in seconds (what `relay_rpc` allows).
pub const DEFAULT_LEEWAY_S: u64 = 120;

/// How tokens are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// Accepted `aud` values (`--auth-audience`), compared exactly; empty accepts any (behind
    /// a load balancer the relay cannot know the URL the client was given).
    pub audiences: Vec<String>,
    /// Seconds of clock leeway on `iat` and `exp`.
    pub leeway_s: u64,
    /// A token without `exp` is accepted and never expires (the HTTP transport's tokens:
    /// DECISIONS 13); otherwise `exp` is required.
    pub allow_no_exp: bool,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            audiences: Vec::new(),
            leeway_s: DEFAULT_LEEWAY_S,
            allow_no_exp: false,
        }
    }
}
