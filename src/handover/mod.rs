//! The restart that refuses no one (`--handover-socket PATH`, `--take-over`; docs/DEPLOY.md
//! "Restarting a node"): the new process receives the old one's listening sockets over a
//! Unix socket (`SCM_RIGHTS`), so the kernel's accept queues are never closed and no
//! connection attempt is refused, then tells the old one to stop; the old one stops
//! accepting, closes its clients (1001), releases its data directory and exits.
//!
//! Owns the Unix socket at `PATH` ([`offer`]: the old side, a thread of its own), the
//! conversation ([`take`]: the new side) and its wire format (below); the descriptors
//! travel over [`channel`]. It hands out and takes in `std::net::TcpListener`s and a
//! callback: which socket serves which worker, when to shut down and when the data
//! directory is free are `server.rs`'s to decide. Must not touch workers or engines.
//!
//! The conversation, one line each way at a time:
//!
//! ```text
//! new -> old   walletrelay-handover 1 take pid=<new pid>
//! old -> new   walletrelay-handover 1 offer pid=<old pid> plain=<n> tls=<m> admin=<0|1>
//!              (with n + m + admin listening sockets: plain in worker order, TLS, admin)
//! new -> old   stop          (the new one has what it needs; nothing before this changes
//!                             the old one: a new one that fails or dies earlier leaves it
//!                             serving, and it offers again to the next)
//! old -> new   stopping      (it no longer accepts; it closes its clients and exits)
//! ```

pub mod channel;
pub mod offer;
pub mod take;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;

pub use offer::Offer;
pub use take::Takeover;

/// The protocol's name and version, first on every greeting.
pub const PROTOCOL: &str = "walletrelay-handover 1";

/// The listening sockets of one process, by role.
#[derive(Debug, Default)]
pub struct Listeners {
    /// The plain `SO_REUSEPORT` group, in worker order (the order a `--cpu-steering`
    /// program indexes them by).
    pub plain: Vec<TcpListener>,
    /// The TLS group, in worker order.
    pub tls: Vec<TcpListener>,
    /// The admin listener.
    pub admin: Option<TcpListener>,
}

impl Listeners {
    /// How many sockets.
    pub fn len(&self) -> usize {
        self.plain.len() + self.tls.len() + usize::from(self.admin.is_some())
    }

    /// No socket at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a handover could not be made. Nothing of the old process changed when one of
/// these is returned before [`Takeover::stop`] succeeded.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// Nothing answers at the path.
    #[error(
        "{path}: nothing to take over ({source}); is a walletrelay running with \
         --handover-socket {path}?",
        path = .path.display()
    )]
    Absent {
        /// The handover socket.
        path: PathBuf,
        /// The OS error of `connect`.
        source: io::Error,
    },
    /// Something answers, but not a walletrelay speaking this protocol.
    #[error("{path}: not a walletrelay handover socket (it answered {answer:?})", path = .path.display())]
    NotWalletrelay {
        /// The handover socket.
        path: PathBuf,
        /// What it said (at most a line).
        answer: String,
    },
    /// The other side closed the connection, or a read or write failed.
    #[error("{path}: {what}: {source}", path = .path.display())]
    Io {
        /// The handover socket.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error (`TimedOut` after the handover's timeout).
        source: io::Error,
    },
    /// The old process sent other sockets than it announced, or sockets that are not
    /// listening TCP sockets.
    #[error("{path}: the old process (pid {pid}) handed over bad sockets: {why}", path = .path.display())]
    BadSockets {
        /// The handover socket.
        path: PathBuf,
        /// The old process.
        pid: u32,
        /// What is wrong.
        why: String,
    },
    /// The old process listens on another address than the new one's flag names.
    #[error(
        "the old process (pid {pid}) listens on {theirs}; {flag} {ours} would not serve its \
         clients (give the same address, or port 0 for the old one's)"
    )]
    OtherAddress {
        /// The old process.
        pid: u32,
        /// `--listen`, `--tls-listen` or `--admin-listen`.
        flag: &'static str,
        /// The old one's address.
        theirs: SocketAddr,
        /// The flag's.
        ours: SocketAddr,
    },
    /// `PATH` is served by a live process and this one was not told to take over.
    #[error(
        "{path}: another walletrelay offers its listeners here; start with --take-over to \
         replace it, or give another --handover-socket",
        path = .path.display()
    )]
    InUse {
        /// The handover socket.
        path: PathBuf,
    },
    /// `PATH` could not be created.
    #[error("{path}: cannot listen: {source}", path = .path.display())]
    Bind {
        /// The handover socket.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// The old process's greeting, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    /// The old process.
    pub pid: u32,
    /// Sockets of the plain group.
    pub plain: usize,
    /// Sockets of the TLS group.
    pub tls: usize,
    /// Whether an admin listener follows.
    pub admin: bool,
}

impl Greeting {
    /// Its line.
    pub fn line(&self) -> String {
        format!(
            "{PROTOCOL} offer pid={} plain={} tls={} admin={}",
            self.pid,
            self.plain,
            self.tls,
            u8::from(self.admin)
        )
    }

    /// Parses the old process's line; `None` unless it is this protocol's offer.
    pub fn parse(line: &str) -> Option<Greeting> {
        let rest = line.strip_prefix(PROTOCOL)?.strip_prefix(" offer")?;
        let (mut pid, mut plain, mut tls, mut admin) = (None, None, None, None);
        for field in rest.split_ascii_whitespace() {
            let (k, v) = field.split_once('=')?;
            match k {
                "pid" => pid = v.parse().ok(),
                "plain" => plain = v.parse().ok(),
                "tls" => tls = v.parse().ok(),
                "admin" => admin = Some(v == "1"),
                _ => {}
            }
        }
        Some(Greeting {
            pid: pid?,
            plain: plain?,
            tls: tls?,
            admin: admin?,
        })
    }

    /// Sockets it announces.
    pub fn sockets(&self) -> usize {
        self.plain + self.tls + usize::from(self.admin)
    }
}

/// The new process's first line.
fn take_line(pid: u32) -> String {
    format!("{PROTOCOL} take pid={pid}")
}

/// The new process's second line: it has what it needs.
const STOP: &str = "stop";

/// The old process's answer to [`STOP`].
const STOPPING: &str = "stopping";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_greeting_reads_back_and_anything_else_is_not_one() {
        let g = Greeting {
            pid: 42,
            plain: 4,
            tls: 2,
            admin: true,
        };
        assert_eq!(Greeting::parse(&g.line()), Some(g));
        assert_eq!(g.sockets(), 7);
        for bad in [
            "",
            "HTTP/1.1 400 Bad Request",
            "walletrelay-handover 2 offer pid=1 plain=1 tls=0 admin=0",
            "walletrelay-handover 1 offer pid=1 plain=x tls=0 admin=0",
            "walletrelay-handover 1 offer pid=1 tls=0 admin=0",
            &take_line(7),
        ] {
            assert_eq!(Greeting::parse(bad), None, "{bad:?}");
        }
    }
}
