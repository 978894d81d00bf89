//! `--take-over` in the server's start-up (the mechanism is `handover`): take the old
//! process's listening sockets before anything is bound, fit them to this process's flags
//! and worker count, and tell the old process to stop at the right moment: before the
//! engine opens the data directory (the old one must release its lock first; connections
//! wait in the kernel's queues meanwhile), else once every worker accepts.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

use super::edge::{bind, set_options};
use super::StartError;
use crate::config::Config;
use crate::handover::{take, HandoverError, Listeners, Offer, Takeover};
use crate::store::{DirLock, StoreError};

/// A listener group: its sockets in worker order, and their address.
pub(super) type Group = (Vec<TcpListener>, Option<SocketAddr>);

/// How often the data directory's lock is tried while the old process shuts down.
const LOCK_POLL: Duration = Duration::from_millis(10);

/// Margin past the old process's own exit deadline (its `--shutdown-grace` and backstop,
/// read from this process's flags: a node is restarted with its own settings).
const LOCK_MARGIN: Duration = Duration::from_secs(5);

/// The old process's sockets, taken.
pub(super) struct Taken {
    /// The conversation with the old process (taken out by `Server::start`).
    pub(super) handover: Option<Takeover>,
    listeners: Listeners,
    /// The old process.
    pid: u32,
}

/// With `--take-over`, takes the listening sockets of the process at `--handover-socket`
/// (it keeps serving); without, checks that no live process offers there.
pub(super) fn begin(config: &Config) -> Result<Option<Taken>, StartError> {
    let Some(path) = config.admin.handover_socket.as_deref() else {
        return Ok(None);
    };
    if !config.admin.take_over {
        if Offer::in_use(path) {
            return Err(HandoverError::InUse {
                path: path.to_path_buf(),
            }
            .into());
        }
        return Ok(None);
    }
    let (t, listeners) = take::take(path)?;
    log::info!(
        handover = "taken", old_pid = t.pid(), sockets = listeners.len();
        "took over {} listening sockets from process {} ({})",
        listeners.len(), t.pid(), path.display()
    );
    Ok(Some(Taken {
        pid: t.pid(),
        handover: Some(t),
        listeners,
    }))
}

impl Taken {
    /// The plain group, the TLS group and the admin listener this process serves, from
    /// the old process's sockets where it had them.
    pub(super) fn into_groups(
        self,
        config: &Config,
        n: usize,
    ) -> Result<(Group, Group, Option<TcpListener>), StartError> {
        let Listeners { plain, tls, admin } = self.listeners;
        let pid = self.pid;
        let plain = fit(plain, config.listen, n, config, pid, "--listen")?;
        let tls = fit(tls, config.tls_listen, n, config, pid, "--tls-listen")?;
        let admin = match (admin, config.admin.admin_listen) {
            (Some(l), Some(ours)) => {
                check_address(&l, ours, pid, "--admin-listen")?;
                Some(l)
            }
            (None, Some(ours)) => {
                Some(TcpListener::bind(ours).map_err(super::io_err("binding the admin listener"))?)
            }
            (Some(_), None) => {
                log::warn!("the old process's admin listener is closed: this one has none");
                None
            }
            (None, None) => None,
        };
        Ok((plain, tls, admin))
    }
}

/// The old process's group `theirs` as this process's `n` workers serve it: options set
/// again, filters off, sockets bound into the group when it had fewer; a surplus is
/// closed (its queue reset, unless `net.ipv4.tcp_migrate_req` is 1).
fn fit(
    mut theirs: Vec<TcpListener>,
    ours: Option<SocketAddr>,
    n: usize,
    config: &Config,
    pid: u32,
    flag: &'static str,
) -> Result<Group, StartError> {
    let Some(ours) = ours else {
        if !theirs.is_empty() {
            log::warn!(
                "the old process's {flag} sockets are closed: this one has no {flag} (connections \
                 in their queues are reset)"
            );
        }
        return Ok((Vec::new(), None));
    };
    let Some(first) = theirs.first() else {
        return super::edge::bind_group(ours, n, config)
            .map(|(g, a)| (g, Some(a)))
            .map_err(super::io_err("binding a listener group"));
    };
    let addr = check_address(first, ours, pid, flag)?;
    if !config.cpu_steering {
        if let Err(e) = super::detach_cpu_steering(first) {
            log::warn!("the old process's --cpu-steering program stays attached: {e}");
        }
    }
    if theirs.len() > n {
        log::warn!(
            "the old process had {} {flag} sockets, this one has {n} workers: the rest are closed \
             (connections in their queues are reset unless net.ipv4.tcp_migrate_req=1)",
            theirs.len()
        );
        theirs.truncate(n);
    }
    for l in &theirs {
        let s = socket2::SockRef::from(l);
        set_options(&s, config)
            .and_then(|()| s.listen(config.backlog))
            .map_err(super::io_err("setting a taken listener's options"))?;
        // A storm's address filter of the old process: this one sets its own.
        let _ = s.detach_filter();
    }
    while theirs.len() < n {
        theirs.push(bind(addr, config).map_err(super::io_err("binding a listener"))?);
    }
    Ok((theirs, Some(addr)))
}

/// The address of the old process's socket `l`, if `ours` names it (port 0: any port on
/// the same address).
fn check_address(
    l: &TcpListener,
    ours: SocketAddr,
    pid: u32,
    flag: &'static str,
) -> Result<SocketAddr, StartError> {
    let theirs = l
        .local_addr()
        .map_err(super::io_err("reading a taken listener's address"))?;
    if theirs == ours || (ours.port() == 0 && ours.ip() == theirs.ip()) {
        Ok(theirs)
    } else {
        Err(HandoverError::OtherAddress {
            pid,
            flag,
            theirs,
            ours,
        }
        .into())
    }
}

/// With a data directory: tells the old process to stop and waits until it released the
/// directory (the engine opens it next). Otherwise hands the handover back for
/// [`after_start`].
pub(super) fn before_engine(
    config: &Config,
    handover: Option<Takeover>,
) -> Result<Option<Takeover>, StartError> {
    let Some(mut t) = handover else {
        return Ok(None);
    };
    let Some(dir) = config.data_dir().filter(|_| config.redis.is_empty()) else {
        return Ok(Some(t));
    };
    match t.stop() {
        Ok(()) => log::info!(
            handover = "stopped", old_pid = t.pid();
            "told process {} to stop; waiting for it to release {}", t.pid(), dir.display()
        ),
        // It may have stopped on its own (a SIGTERM meanwhile): then the directory is free
        // soon; if it goes on serving, the wait below ends in a clear error.
        Err(e) => log::warn!(
            "process {} did not answer stop ({e}); waiting for it to release {}",
            t.pid(),
            dir.display()
        ),
    }
    let wait = Duration::from_millis(config.limits.exit_deadline_ms)
        .max(config.limits.shutdown_grace() + super::BACKSTOP_MARGIN)
        + LOCK_MARGIN;
    wait_for_dir(&dir, wait)?;
    Ok(None)
}

/// Waits until the data directory's lock can be taken (then lets it go for the engine).
fn wait_for_dir(dir: &Path, wait: Duration) -> Result<(), StartError> {
    let began = Instant::now();
    loop {
        match DirLock::acquire(dir) {
            Ok(lock) => {
                drop(lock);
                log::info!(
                    waited_ms = began.elapsed().as_millis() as u64;
                    "{} released after {} ms", dir.display(), began.elapsed().as_millis()
                );
                return Ok(());
            }
            Err(StoreError::Locked { pid, .. }) if began.elapsed() >= wait => {
                return Err(StartError::StillLocked {
                    dir: dir.to_path_buf(),
                    pid,
                    secs: wait.as_secs(),
                })
            }
            Err(StoreError::Locked { .. }) => std::thread::sleep(LOCK_POLL),
            Err(e) => return Err(StartError::Engine(e.into())),
        }
    }
}

/// Every worker accepts: tells the old process (no data directory) to stop. A failure is
/// logged only: this process serves either way.
pub(super) fn after_start(handover: Option<Takeover>) {
    let Some(mut t) = handover else {
        return;
    };
    match t.stop() {
        Ok(()) => log::info!(
            handover = "stopped", old_pid = t.pid();
            "told process {} to stop", t.pid()
        ),
        Err(e) => log::warn!("the old process may still be serving: {e}"),
    }
}
