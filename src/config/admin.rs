//! The flags of the admin address and the drain (`[admin]` in the configuration file):
//! where `/metrics`, `/health`, `/live`, `/ready`, `POST /drain` and `/status` are served
//! apart from the clients, and how long the node keeps serving once told to stop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Longest drain accepted, in seconds (a day: longer is a typo, not a plan).
pub const MAX_DRAIN_SECONDS: f64 = 86_400.0;

/// Admin address and drain settings.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminOptions {
    /// Address of the admin listener, served by its own thread: `/metrics` (then no longer
    /// on the public port), `/health`, `/live`, `/ready`, `POST /drain`, `/status`. Unset:
    /// no admin listener.
    #[arg(long, env = "WALLETRELAY_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,

    /// Seconds the node keeps serving and accepting after the first SIGTERM (or `POST
    /// /drain`) while `/ready` answers 503, so a load balancer stops sending it new clients;
    /// then it closes them (1001) within `--shutdown-grace`. A second SIGTERM, or SIGINT,
    /// ends the drain at once. 0: no drain.
    #[arg(
        long,
        env = "WALLETRELAY_DRAIN",
        value_name = "SECONDS",
        default_value_t = 0.0,
        value_parser = parse_drain
    )]
    pub drain: f64,

    /// Unix socket (created at start, mode 0600) on which this node hands its listening
    /// sockets to the process that replaces it (`--take-over`), so that a restart refuses
    /// no connection (docs/DEPLOY.md, "Restarting a node"). Unset: no handover.
    #[arg(long, env = "WALLETRELAY_HANDOVER_SOCKET", value_name = "PATH")]
    pub handover_socket: Option<PathBuf>,

    /// Start by taking over from the node at `--handover-socket`: take its listening sockets
    /// (connections wait in their queues, none is refused), tell it to close its clients
    /// (1001) and exit, wait for its `--data-dir`, then serve. Fails, leaving the old node
    /// serving, when nothing or something else answers there.
    #[arg(long, env = "WALLETRELAY_TAKE_OVER", requires = "handover_socket")]
    pub take_over: bool,
}

impl AdminOptions {
    /// `--drain` as a duration.
    pub fn drain(&self) -> Duration {
        Duration::from_secs_f64(self.drain.clamp(0.0, MAX_DRAIN_SECONDS))
    }
}

/// `--drain`: a number of seconds from 0 to [`MAX_DRAIN_SECONDS`].
fn parse_drain(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{e} (expected seconds)"))?;
    if !(0.0..=MAX_DRAIN_SECONDS).contains(&v) {
        return Err(format!("expected 0 to {MAX_DRAIN_SECONDS} seconds"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_seconds_are_bounded() {
        assert_eq!(parse_drain("0"), Ok(0.0));
        assert_eq!(parse_drain("2.5"), Ok(2.5));
        assert!(parse_drain("-1").is_err());
        assert!(parse_drain("NaN").is_err());
        assert!(parse_drain("inf").is_err());
        assert!(parse_drain("86401").is_err());
        assert!(parse_drain("soon").is_err());
    }
}
