//! Start-up and shutdown: raises the open-file limit, loads the registry, binds one
//! `SO_REUSEPORT` listener per worker, builds the mailboxes, starts the webhook pool and the
//! pinned worker threads; on SIGTERM/SIGINT tells every worker to close its connections
//! (WebSocket close 1001) and waits for them within the grace period.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use thiserror::Error;

use crate::config::Config;
use crate::conn::Shared;
use crate::http::response::{Response, TEXT};
use crate::metrics::Metrics;
use crate::registry::{Registry, RegistryError};
use crate::relay::{CoreMsg, Homes, Mailboxes, Relay};
use crate::webhook::WebhookPool;
use crate::worker::{Worker, WAKER};

/// Why the server could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// The registry data is bad.
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    /// A socket, poll or thread could not be created.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> StartError {
    move |source| StartError::Io { what, source }
}

/// A running server.
pub struct Server {
    /// The address it listens on (with the real port when 0 was asked for).
    pub addr: SocketAddr,
    mailboxes: Arc<Mailboxes>,
    threads: Vec<JoinHandle<()>>,
    webhooks: WebhookPool,
}

/// Raises the soft open-file limit to the hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read or write the struct we pass, which lives on
    // this stack frame for the duration of each call.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return None;
        }
        if rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                return None;
            }
        }
    }
    Some(rl.rlim_cur)
}

/// Sets `SO_BUSY_POLL` (microseconds) on a socket; errors are ignored (needs privileges
/// on some kernels).
pub fn set_busy_poll(sock: &impl AsRawFd, us: u32) {
    let v: libc::c_int = us.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a pointer to a live local
    // c_int; the fd is owned by `sock`, which outlives the call.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BUSY_POLL,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

fn bind(addr: SocketAddr, backlog: i32) -> io::Result<std::net::TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(backlog)?;
    Ok(s.into())
}

fn random_seeds() -> [u64; 4] {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("OS random number generator failed");
    let mut s = [0u64; 4];
    for (i, v) in s.iter_mut().enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i * 8..i * 8 + 8]);
        *v = u64::from_le_bytes(w);
    }
    s
}

impl Server {
    /// Starts the server: every worker is accepting when this returns.
    pub fn start(config: Config) -> Result<Server, StartError> {
        let registry = Arc::new(Registry::load(
            config.registry_dir.as_deref(),
            &config.image_base,
        )?);
        let n = config.worker_count();
        let metrics = Metrics::new(n);

        let mut polls = Vec::with_capacity(n);
        let mut wakers = Vec::with_capacity(n);
        for _ in 0..n {
            let poll = mio::Poll::new().map_err(io_err("creating a poll instance"))?;
            wakers
                .push(mio::Waker::new(poll.registry(), WAKER).map_err(io_err("creating a waker"))?);
            polls.push(poll);
        }
        // Each queue holds batches; a batch is at most one loop iteration's messages.
        let (mailboxes, inboxes) = Mailboxes::new(wakers, 4096);

        let first = bind(config.listen, config.backlog).map_err(io_err("binding the listener"))?;
        let addr = first
            .local_addr()
            .map_err(io_err("reading the listener address"))?;
        let mut listeners = vec![first];
        for _ in 1..n {
            listeners
                .push(bind(addr, config.backlog).map_err(io_err("binding a worker listener"))?);
        }

        let webhooks = WebhookPool::default();
        let shared = Arc::new(Shared {
            hello: Response::new(
                200,
                TEXT,
                format!("Hello World, this is {} v2.0", config.service_name),
            ),
            registry,
            metrics: metrics.clone(),
            webhooks: webhooks.clone(),
            config: config.clone(),
        });
        let homes = Homes::new(n, random_seeds());
        let webhook_count = Arc::new(AtomicUsize::new(0));
        let cores = if config.no_pin {
            Vec::new()
        } else if !config.cpus.is_empty() {
            config
                .cpus
                .iter()
                .map(|&id| core_affinity::CoreId { id })
                .collect()
        } else {
            core_affinity::get_core_ids().unwrap_or_default()
        };

        let mut threads = Vec::with_capacity(n);
        for (i, ((poll, listener), inbox)) in
            polls.into_iter().zip(listeners).zip(inboxes).enumerate()
        {
            let relay = Relay::new(
                i,
                homes.clone(),
                mailboxes.clone(),
                config.limits.clone(),
                metrics.clone(),
                webhooks.clone(),
                webhook_count.clone(),
            );
            let listener = mio::net::TcpListener::from_std(listener);
            let worker = Worker::new(
                i,
                listener,
                poll,
                inbox,
                mailboxes.clone(),
                relay,
                shared.clone(),
            )
            .map_err(io_err("registering the listener"))?;
            let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
            let t = std::thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || {
                    if let Some(c) = core {
                        if !core_affinity::set_for_current(c) {
                            log::warn!("worker {i}: could not pin to core {}", c.id);
                        }
                    }
                    worker.run();
                })
                .map_err(io_err("spawning a worker thread"))?;
            threads.push(t);
        }
        Ok(Server {
            addr,
            mailboxes,
            threads,
            webhooks,
        })
    }

    /// Stops accepting, closes every connection (WebSocket close 1001), waits for the
    /// workers (each gives up after the grace period) and the webhook pool.
    pub fn shutdown(self) {
        for i in 0..self.mailboxes.len() {
            self.mailboxes.send_external(i, CoreMsg::Shutdown);
        }
        for t in self.threads {
            let _ = t.join();
        }
        let _ = &self.webhooks;
    }

    /// Blocks until SIGTERM or SIGINT, then shuts down.
    pub fn run_until_signal(self) -> io::Result<()> {
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGINT,
        ])?;
        if let Some(sig) = signals.forever().next() {
            log::info!("signal {sig}: shutting down");
        }
        // Whatever happens, exit within 5 s of the signal.
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(4800));
            log::warn!("shutdown took too long; exiting");
            std::process::exit(0);
        });
        self.shutdown();
        Ok(())
    }
}
