//! The server's edge: the listening sockets. Each worker's `SO_REUSEPORT` listener of each
//! group (plain `--listen`, TLS `--tls-listen`) with the options accepted connections
//! inherit, bound here or taken over from the old process (`--take-over`), their copies
//! for the next one, the admin listener, the TLS configuration's loader, and the steering
//! of a group's connections to its workers' cores (`--cpu-steering`).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};

use super::host::{attach_cpu_steering, set_busy_poll, set_notsent_lowat};
use super::{io_err, takeover, StartError};
use crate::config::Config;
use crate::handover::Listeners;
use crate::tls::{TlsFiles, TlsLoader};

/// A listener of the `SO_REUSEPORT` group. The options every accepted connection needs
/// (`TCP_NODELAY`, `--sndbuf`, `--notsent-lowat`, `--busy-poll-us`) are set here, once:
/// Linux copies them from the listener into each connection it accepts (the child socket
/// is a clone of the listener's), which saves three to four `setsockopt` calls per
/// connection (test `accepted_connections_inherit_the_listeners_options`).
pub(super) fn bind(addr: SocketAddr, config: &Config) -> io::Result<std::net::TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    set_options(&s, config)?;
    s.bind(&addr.into())?;
    s.listen(config.backlog)?;
    Ok(s.into())
}

/// The options a listener hands down to the connections it accepts (see [`bind`]); also
/// set again on the listeners a process takes over, whose options its predecessor set.
pub(super) fn set_options(s: &Socket, config: &Config) -> io::Result<()> {
    s.set_nonblocking(true)?;
    s.set_nodelay(true)?;
    if config.sndbuf > 0 {
        s.set_send_buffer_size(config.sndbuf)?;
    }
    if config.notsent_lowat > 0 {
        set_notsent_lowat(s, config.notsent_lowat);
    }
    if config.busy_poll_us > 0 {
        set_busy_poll(s, config.busy_poll_us);
    }
    Ok(())
}

/// The `n` sockets of one `SO_REUSEPORT` group at `addr` (the first one picks the port
/// when 0 is asked for), and the address they are bound to.
pub(super) fn bind_group(
    addr: SocketAddr,
    n: usize,
    config: &Config,
) -> io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let first = bind(addr, config)?;
    let addr = first.local_addr()?;
    let mut group = vec![first];
    for _ in 1..n {
        group.push(bind(addr, config)?);
    }
    Ok((group, addr))
}

/// The listener groups, and the TLS configuration loaded at start: a missing or bad
/// certificate is fatal here (on SIGHUP it is not).
pub(super) struct Edge {
    plain: Vec<std::net::TcpListener>,
    addr: Option<SocketAddr>,
    tls: Vec<std::net::TcpListener>,
    tls_addr: Option<SocketAddr>,
    admin: Option<std::net::TcpListener>,
    loader: Option<TlsLoader>,
    tls_config: Option<Arc<rustls::ServerConfig>>,
}

impl Edge {
    /// Binds the listeners, or (`--take-over`) starts from the old process's, `taken`.
    fn open(config: &Config, n: usize, taken: Option<takeover::Taken>) -> Result<Edge, StartError> {
        // The certificate and key, when TLS is on (clap makes the three flags go together).
        let files = config.tls_listen.and_then(|_| {
            Some(TlsFiles {
                cert: config.tls_cert.clone()?,
                key: config.tls_key.clone()?,
            })
        });
        let (loader, tls_config) = match files {
            Some(files) => {
                let loader = TlsLoader::new(files)?;
                let tls_config = loader.load()?;
                (Some(loader), Some(tls_config))
            }
            None => (None, None),
        };
        let group = |addr: Option<SocketAddr>, what| match addr {
            Some(a) => bind_group(a, n, config)
                .map(|(g, a)| (g, Some(a)))
                .map_err(io_err(what)),
            None => Ok((Vec::new(), None)),
        };
        let ((plain, addr), (tls, tls_addr), admin) = match taken {
            Some(t) => t.into_groups(config, n)?,
            None => (
                group(config.listen, "binding the listener")?,
                group(config.tls_listen, "binding the TLS listener")?,
                match config.admin.admin_listen {
                    Some(a) => Some(
                        std::net::TcpListener::bind(a)
                            .map_err(io_err("binding the admin listener"))?,
                    ),
                    None => None,
                },
            ),
        };
        Ok(Edge {
            plain,
            addr,
            tls,
            tls_addr,
            admin,
            loader,
            tls_config,
        })
    }

    /// Copies of its sockets, for the handover socket to offer.
    /// The workers' sockets, and the rest.
    pub(super) fn split(self) -> (Groups, Rest) {
        let groups = Groups {
            plain: self.plain,
            tls: self.tls,
            tls_config: self.tls_config,
        };
        let rest = Rest {
            addr: self.addr,
            tls_addr: self.tls_addr,
            admin: self.admin,
            loader: self.loader,
        };
        (groups, rest)
    }

    fn copies(&self) -> io::Result<Listeners> {
        let dup = |g: &[std::net::TcpListener]| -> io::Result<Vec<_>> {
            g.iter().map(|l| l.try_clone()).collect()
        };
        Ok(Listeners {
            plain: dup(&self.plain)?,
            tls: dup(&self.tls)?,
            admin: self.admin.as_ref().map(|l| l.try_clone()).transpose()?,
        })
    }
}

/// Where the listeners come from: the old process's (`--take-over`) or bound here; their
/// copies to offer the next process (`--handover-socket`); and the handover, once the old
/// process let go of the data directory (before the engine opens it).
pub(super) type Opened = (Edge, Option<Listeners>, Option<crate::handover::Takeover>);

pub(super) fn open_edge(config: &Config, n: usize) -> Result<Opened, StartError> {
    let mut taken = takeover::begin(config)?;
    let handover = taken.as_mut().map(|t| t.handover.take());
    let edge = Edge::open(config, n, taken)?;
    let offered = match config.admin.handover_socket {
        Some(_) => Some(edge.copies().map_err(io_err("copying the listeners"))?),
        None => None,
    };
    let handover = takeover::before_engine(config, handover.flatten())?;
    Ok((edge, offered, handover))
}

/// What the server keeps of its edge besides the workers' sockets: the addresses bound,
/// the admin listener, the TLS files' loader (for SIGHUP).
pub(super) struct Rest {
    pub(super) addr: Option<SocketAddr>,
    pub(super) tls_addr: Option<SocketAddr>,
    pub(super) admin: Option<std::net::TcpListener>,
    pub(super) loader: Option<TlsLoader>,
}

/// Each worker's sockets: of the plain group, of the TLS group (with the configuration new
/// TLS connections start from).
pub(super) struct Groups {
    pub(super) plain: Vec<std::net::TcpListener>,
    pub(super) tls: Vec<std::net::TcpListener>,
    pub(super) tls_config: Option<Arc<rustls::ServerConfig>>,
}

/// `--cpu-steering`: both listener groups steered to the worker pinned to the receiving CPU.
pub(super) fn steer_all(groups: &Groups, cores: &[core_affinity::CoreId], n: usize) {
    if cores.is_empty() {
        log::warn!("--cpu-steering needs pinned workers; not enabled");
        return;
    }
    let cpus: Vec<usize> = (0..n).map(|i| cores[i % cores.len()].id).collect();
    steer(&groups.plain, &cpus);
    steer(&groups.tls, &cpus);
}

/// Attaches `--cpu-steering`'s program to a listener group (logged, never fatal).
fn steer(group: &[std::net::TcpListener], cpus: &[usize]) {
    let Some(first) = group.first() else {
        return;
    };
    match attach_cpu_steering(first, cpus) {
        Ok(()) => log::info!("connections steered to the worker of the receiving CPU"),
        Err(e) => log::warn!("--cpu-steering: {e}"),
    }
}
