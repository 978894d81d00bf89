//! Start-up and shutdown: raises the open-file limit and turns transparent huge pages off
//! (both called from `main`), loads the registry and the TLS certificate, binds one
//! `SO_REUSEPORT` listener per worker (per group: plain and TLS), gives each worker its
//! doorbell and mailbox, has the engine build itself (`server/engines.rs`: its mailboxes,
//! helper threads, recovery, webhook pool), and starts the pinned worker threads; on SIGHUP re-reads the TLS
//! files and the registry (`reload`); starts the admin thread (`--admin-listen`, `admin`);
//! on SIGTERM drains (`--drain`: `/ready` 503 while the node keeps serving, `drain`), then,
//! as at once on SIGINT or a second SIGTERM, tells every worker to close its connections
//! (WebSocket close 1001) and waits for them within the grace period. With
//! `--handover-socket` it offers its listening sockets to the process that replaces it and
//! shuts down (no drain) once that one has them; with `--take-over` it starts from the
//! sockets of the process it replaces (`handover`, `server/takeover.rs`).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::admin::Admin;
use crate::config::{Config, ConfigError};
use crate::conn::Shared;
use crate::drain::Drain;
use crate::engine::{BuildError, Setup};
use crate::handover::{HandoverError, Offer};
use crate::http::response::{Response, TEXT};
use crate::mailbox::{self, Doorbell, Mailbox};
use crate::metrics::Metrics;
use crate::registry::{Registry, RegistryError};
use crate::relay::Relay;
use crate::reload::{Reload, Reloader};
use crate::tls::TlsError;
use crate::webhook::WebhookPool;
use crate::worker::{Control, Serving, Worker, WAKER};

mod edge;
mod engines;
mod host;
mod takeover;

use edge::{open_edge, steer_all, Groups};
pub use host::{
    attach_cpu_steering, detach_cpu_steering, disable_huge_pages, raise_nofile_limit,
    set_busy_poll, set_notsent_lowat,
};

/// Why the server could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// The flags cannot work together.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The registry data is bad.
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    /// The engine could not be built (its data directory, its Redis servers...).
    #[error("{0}")]
    Engine(#[from] BuildError),
    /// `--project-ids` could not be read.
    #[error("--project-ids: {0}")]
    Projects(String),
    /// The relay key, the watch table or the push URLs could not be set up.
    #[error("{0}")]
    Notify(String),
    /// The TLS certificate or key is missing or bad (the message names the file).
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// The handover from the old process (`--take-over`) or the handover socket failed.
    #[error("handover: {0}")]
    Handover(#[from] HandoverError),
    /// `--take-over`: the old process did not release the data directory in time.
    #[error(
        "--take-over: {dir} is still locked (by pid {holder}) {secs} s after the old process \
         was told to stop",
        dir = .dir.display(),
        holder = .pid.map_or("?".to_string(), |p| p.to_string())
    )]
    StillLocked {
        /// The data directory.
        dir: std::path::PathBuf,
        /// Its holder, as its lock file names it.
        pid: Option<u32>,
        /// How long this process waited.
        secs: u64,
    },
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
    /// The address of the plain listener (with the real port when 0 was asked for), unless
    /// `--listen none`.
    pub addr: Option<SocketAddr>,
    /// The address of the TLS listener, when `--tls-listen` is given.
    pub tls_addr: Option<SocketAddr>,
    /// The address of the admin listener, when `--admin-listen` is given.
    pub admin_addr: Option<SocketAddr>,
    /// The admin thread, stopped after the workers.
    admin: Option<crate::admin::Admin>,
    /// The drain the signal thread begins and waits for (the admin thread may begin it).
    drain: Arc<Drain>,
    reloader: Reloader,
    /// Each worker's own mailbox.
    controls: Arc<[Mailbox<Control>]>,
    threads: Vec<JoinHandle<()>>,
    webhooks: WebhookPool,
    /// The engine's helper threads, stopped after the workers.
    on_stop: Option<Box<dyn FnOnce() + Send>>,
    /// The data directory's lock, released when the process ends.
    _lock: Option<crate::store::DirLock>,
    limits: crate::config::Limits,
    /// Watches and pushes (their pool stops at shutdown; `--push-urls` reloads on SIGHUP).
    notifier: Arc<crate::notify::Notifier>,
    /// `--handover-socket`: offers the listeners to the next process.
    offer: Option<Offer>,
    /// The signals, and the handover thread's word that the next process took over.
    events: (
        crossbeam_channel::Sender<Event>,
        crossbeam_channel::Receiver<Event>,
    ),
}

/// What the signal thread waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// A signal (SIGTERM, SIGINT, SIGHUP).
    Signal(libc::c_int),
    /// The process of this pid took the listeners over and said `stop`.
    HandedOver(u32),
}

/// The cores the workers pin to, in order (none with `--no-pin`).
fn worker_cores(config: &Config) -> Vec<core_affinity::CoreId> {
    if config.no_pin {
        Vec::new()
    } else if !config.cpus.is_empty() {
        config
            .cpus
            .iter()
            .map(|&id| core_affinity::CoreId { id })
            .collect()
    } else {
        core_affinity::get_core_ids().unwrap_or_default()
    }
}

/// Starts worker `i`'s thread, pinned to `core`.
fn spawn_worker(
    i: usize,
    worker: Worker,
    core: Option<core_affinity::CoreId>,
) -> Result<JoinHandle<()>, StartError> {
    std::thread::Builder::new()
        .name(format!("worker-{i}"))
        .spawn(move || {
            if let Some(c) = core {
                if !core_affinity::set_for_current(c) {
                    log::warn!(
                        worker = i, core = c.id;
                        "worker {i}: could not pin to core {}", c.id
                    );
                }
            }
            // A worker that panicked would leave its core's connections and topics dead
            // while the process looks alive: end the process instead, so that the
            // supervisor (systemd: Restart=on-failure) starts a whole one.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run())).is_err() {
                log::error!(worker = i; "worker {i} panicked; aborting the process");
                std::process::abort();
            }
        })
        .map_err(io_err("spawning a worker thread"))
}

/// One poll instance per worker, each with its doorbell (whoever sends to the worker or
/// How a watch registration's answer reaches its worker from the thread that made it
/// durable: a control message to that worker.
fn watch_reply(controls: Arc<[Mailbox<Control>]>) -> crate::conn::WatchReply {
    Arc::new(move |worker, conn, answer, result| {
        if let Some(c) = controls.get(worker) {
            c.send_blocking(Control::Watched {
                conn,
                answer,
                result,
            });
        }
    })
}

/// SIGHUP's reloader: certificates, the registry directory and the project ids, each new
/// set broadcast to every worker.
fn reloader(
    config: &Config,
    loader: Option<crate::tls::TlsLoader>,
    controls: Arc<[Mailbox<Control>]>,
    projects: Option<Arc<crate::auth::ProjectIds>>,
) -> Reloader {
    let broadcast = Box::new(move |r: Reload| {
        tell_all(&controls, || Control::Reload(r.clone()));
    });
    Reloader::new(
        loader,
        config.registry_dir.clone(),
        config.image_base.clone(),
        broadcast,
    )
    .with_projects(config.project_ids.clone(), projects)
}

/// With `--handover-socket`: offers this process's listeners to the next one, which tells
/// the server's event loop when it took them (`Event::HandedOver`).
fn offer_handover(
    config: &Config,
    offered: Option<crate::handover::Listeners>,
    events: &crossbeam_channel::Sender<Event>,
) -> Result<Option<Offer>, StartError> {
    let (Some(path), Some(listeners)) = (&config.admin.handover_socket, offered) else {
        return Ok(None);
    };
    let tx = events.clone();
    let stopped = Box::new(move |pid| {
        let _ = tx.send(Event::HandedOver(pid));
    });
    Ok(Some(Offer::start(
        path,
        config.admin.take_over,
        listeners,
        stopped,
    )?))
}

/// its engine rings it).
fn polls_and_bells(n: usize) -> Result<(Vec<mio::Poll>, Vec<Arc<Doorbell>>), StartError> {
    let mut polls = Vec::with_capacity(n);
    let mut bells = Vec::with_capacity(n);
    for _ in 0..n {
        let poll = mio::Poll::new().map_err(io_err("creating a poll instance"))?;
        let waker = mio::Waker::new(poll.registry(), WAKER).map_err(io_err("creating a waker"))?;
        bells.push(Doorbell::new(waker));
        polls.push(poll);
    }
    Ok((polls, bells))
}

/// How long after the clients' `--shutdown-grace` the process exits whatever happens
/// (the backstop, when a worker or a helper thread does not stop).
const BACKSTOP_MARGIN: Duration = Duration::from_millis(1800);

/// Control messages a worker's own mailbox holds.
const CONTROL_QUEUE: usize = 64;

/// What every worker and the admin thread share besides the engine's parts.
struct Common<'a> {
    metrics: &'a Arc<Metrics>,
    notifier: &'a Arc<crate::notify::Notifier>,
    controls: &'a Arc<[Mailbox<Control>]>,
    drain: &'a Arc<Drain>,
    projects: &'a Option<Arc<crate::auth::ProjectIds>>,
}

/// The state every worker shares (`conn::Shared`): what the engine built (its health, its
/// `/metrics` exporters, the layout switch) and the process's own parts.
fn shared_state(
    config: &Config,
    built: &mut crate::engine::Built,
    layouts: Arc<crate::layout::Current>,
    with: Common<'_>,
) -> Arc<Shared> {
    let Common {
        metrics,
        notifier,
        controls,
        drain,
        projects,
    } = with;
    let n = config.worker_count();
    let webhooks = built.webhooks.clone();
    Arc::new(Shared {
        projects: projects.clone(),
        hello: Response::new(
            200,
            TEXT,
            format!("Hello World, this is {} v2.0", config.service_name),
        ),
        metrics: metrics.clone(),
        webhooks: webhooks.clone(),
        relay_key: notifier.key().clone(),
        notifier: notifier.clone(),
        watch_reply: watch_reply(controls.clone()),
        health: built.health.clone(),
        layouts,
        layout_switch: built.layout_switch.take(),
        drain: drain.clone(),
        exporters: {
            let mut e = std::mem::take(&mut built.exporters);
            let n = notifier.clone();
            e.push(Box::new(move |out: &mut String| n.render_metrics(out)));
            e
        },
        limit_policy: crate::limits::Policy::new(&config.limits, n),
        config: config.clone(),
    })
}

/// Each worker's poll, its own mailbox, its doorbell and its engine, in worker order.
struct Loops {
    polls: Vec<mio::Poll>,
    inboxes: Vec<crossbeam_channel::Receiver<Control>>,
    bells: Vec<Arc<Doorbell>>,
    engines: Vec<Box<dyn crate::engine::Engine>>,
}

/// Builds each worker (its relay on its engine, its listeners) and starts its thread,
/// pinned to its core unless `--no-pin` (and, with `--cpu-steering`, each
/// listener's connections steered to its worker's core).
fn start_workers(
    config: &Config,
    loops: Loops,
    groups: Groups,
    registry: &Arc<Registry>,
    shared: &Arc<Shared>,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    // This process among the relay's nodes: random, never 0 (`Origin::NONE`).
    let node = random_seeds()[0] | 1;
    let cores = worker_cores(config);
    if config.cpu_steering {
        steer_all(&groups, &cores, loops.polls.len());
    }
    let Loops {
        polls,
        inboxes,
        bells,
        engines,
    } = loops;
    let (mut plain, mut tls_group) = (groups.plain.into_iter(), groups.tls.into_iter());
    let mut threads = Vec::with_capacity(polls.len());
    let parts = polls.into_iter().zip(inboxes).zip(bells).zip(engines);
    for (i, (((poll, inbox), bell), engine)) in parts.enumerate() {
        let metrics = shared.metrics.clone();
        let relay = Relay::new(i, node, engine, config.limits.clone(), metrics);
        let serving = Serving {
            plain: plain.next().map(mio::net::TcpListener::from_std),
            tls: tls_group
                .next()
                .map(mio::net::TcpListener::from_std)
                .zip(groups.tls_config.clone()),
            registry: Arc::clone(registry),
        };
        let worker = Worker::new(i, serving, poll, inbox, bell, relay, shared.clone())
            .map_err(io_err("registering the listeners"))?;
        let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
        threads.push(spawn_worker(i, worker, core)?);
    }
    Ok(threads)
}

/// Hands `msg` to every worker's own mailbox (waiting up to a second for room in each).
/// Each worker's own mailbox (`worker::Control`): the senders, shared by the signal
/// thread and the admin thread, and each worker's receiving end.
fn control_mailboxes(
    bells: &[Arc<Doorbell>],
) -> (
    Arc<[Mailbox<Control>]>,
    Vec<crossbeam_channel::Receiver<Control>>,
) {
    let (controls, inboxes): (Vec<_>, Vec<_>) = bells
        .iter()
        .map(|bell| mailbox::bounded(bell.clone(), CONTROL_QUEUE))
        .unzip();
    (controls.into(), inboxes)
}

fn tell_all(controls: &[Mailbox<Control>], msg: impl Fn() -> Control) {
    for (i, mb) in controls.iter().enumerate() {
        if !mb.send_patient(msg()) {
            log::warn!("worker {i}: mailbox full; a control message was dropped");
        }
    }
}

fn random_seeds() -> [u64; 4] {
    let mut b = [0u8; 32];
    #[allow(
        clippy::expect_used,
        reason = "at start, before any input; no safe fallback"
    )]
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
    /// Starts the server: every worker is accepting when this returns. It reads top to
    /// bottom in start-up order: registry, listeners (taken over or bound), mailboxes,
    /// engines with the data directory's recovery, shared state, workers, the admin thread.
    pub fn start(config: Config) -> Result<Server, StartError> {
        config.check()?;
        let registry = Arc::new(Registry::load(
            config.registry_dir.as_deref(),
            &config.image_base,
        )?);
        let n = config.worker_count();
        let (edge, offered, handover) = open_edge(&config, n)?;
        let drain = Arc::new(Drain::new(config.admin.drain()));
        let metrics = Metrics::of_engine(n, engines::label(&config));

        let (polls, bells) = polls_and_bells(n)?;
        let (controls, inboxes) = control_mailboxes(&bells);

        let notifier =
            Arc::new(crate::notify::Notifier::build(&config).map_err(StartError::Notify)?);
        let layouts = Arc::new(crate::layout::Current::default());
        let mut built = engines::build(&Setup {
            layouts: &layouts,
            config: &config,
            bells: &bells,
            metrics: &metrics,
            seeds: random_seeds(),
            notify: notifier.clone(),
        })?;
        let webhooks = built.webhooks.clone();
        let projects = crate::auth::ProjectIds::from_flag(config.project_ids.as_deref())
            .map_err(StartError::Projects)?;
        let with = Common {
            metrics: &metrics,
            notifier: &notifier,
            controls: &controls,
            drain: &drain,
            projects: &projects,
        };
        let shared = shared_state(&config, &mut built, layouts, with);
        let (groups, rest) = edge.split();
        let engines = std::mem::take(&mut built.engines);
        let loops = Loops {
            polls,
            inboxes,
            bells,
            engines,
        };
        let threads = start_workers(&config, loops, groups, &registry, &shared)?;
        let admin = match rest.admin {
            Some(l) => Some(Admin::start(l, shared.clone()).map_err(io_err("the admin thread"))?),
            None => None,
        };
        let reloader = reloader(&config, rest.loader, controls.clone(), projects);
        // Every worker accepts now: the old process may stop (without a data directory; with
        // one it stopped before the engine opened it).
        takeover::after_start(handover);
        let events = crossbeam_channel::bounded(16);
        let offer = offer_handover(&config, offered, &events.0)?;
        Ok(Server {
            addr: rest.addr,
            tls_addr: rest.tls_addr,
            admin_addr: admin.as_ref().map(Admin::addr),
            admin,
            drain,
            reloader,
            controls,
            threads,
            webhooks,
            on_stop: built.on_stop,
            _lock: built.lock,
            limits: config.limits.clone(),
            notifier,
            offer,
            events,
        })
    }

    /// Stops accepting, closes every connection (WebSocket close 1001), waits for the
    /// workers (each gives up after the grace period) and the webhook pool.
    pub fn shutdown(self) {
        self.finish(false);
    }

    /// [`Server::shutdown`]; after a handover the admin thread stops first (its address
    /// is the next process's now) and the handover socket is the next process's.
    fn finish(mut self, handed_over: bool) {
        if handed_over {
            if let Some(admin) = self.admin.take() {
                admin.stop();
            }
        } else if let Some(offer) = &self.offer {
            offer.remove();
        }
        // The webhook pool finishes its calls in flight while the workers close.
        let pool = self.webhooks.clone();
        let grace = Duration::from_millis(self.limits.webhook_shutdown_ms);
        let notifier = self.notifier.clone();
        let webhooks = std::thread::spawn(move || {
            // The notifier's signed calls finish beside the topic webhooks, in the same grace.
            let signed = std::thread::spawn(move || notifier.shutdown(grace));
            pool.shutdown(grace);
            let _ = signed.join();
        });
        tell_all(&self.controls, || Control::Shutdown);
        for t in self.threads {
            let _ = t.join();
        }
        if let Some(stop) = self.on_stop {
            stop();
        }
        let _ = webhooks.join();
        // Last: `/ready`, `/health` and `/metrics` answer while the clients are closed.
        if let Some(admin) = self.admin {
            admin.stop();
        }
    }

    /// Installs the SIGTERM/SIGINT/SIGHUP handlers (before the server announces itself,
    /// so a signal can never find the default handler, which for SIGHUP is to exit).
    pub fn signals() -> io::Result<signal_hook::iterator::Signals> {
        signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGHUP,
        ])
    }

    /// Re-reads the `--config` file (when watched), the TLS certificate and key, the
    /// registry directory and the project allow-list file (what is configured) and hands
    /// what loaded to every worker; what failed keeps its old state and is logged. SIGHUP
    /// does this.
    pub fn reload(&mut self) -> crate::reload::Outcome {
        self.notifier.reload();
        self.reloader.reload()
    }

    /// Re-reads the `--config` file `watch` stands for on every reload, and applies its
    /// reloadable keys (`config::file::RELOADABLE`).
    pub fn watch_config(&mut self, watch: crate::config::Watch) {
        self.reloader.watch_config(watch);
    }

    /// Reloads on SIGHUP (on this thread, one at a time); on SIGTERM drains, then shuts
    /// down; on SIGINT, or a second SIGTERM during the drain, shuts down at once.
    pub fn run_until_signal(mut self, signals: signal_hook::iterator::Signals) -> io::Result<()> {
        let events = self.events.1.clone();
        forward(signals, self.events.0.clone())?;
        let first = loop {
            match events.recv() {
                Ok(Event::Signal(signal_hook::consts::SIGHUP)) => {
                    log::info!(signal = "SIGHUP"; "SIGHUP: reloading");
                    self.reload();
                }
                Ok(e) => break e,
                Err(_) => return Err(io::Error::other("the signal thread ended")),
            }
        };
        let mut handed_over = matches!(first, Event::HandedOver(_));
        match first {
            Event::Signal(signal_hook::consts::SIGTERM) => {
                handed_over = self.drain_until_over(&events);
            }
            Event::Signal(sig) => {
                log::info!(signal = signal_name(sig); "signal {sig}: shutting down")
            }
            // The next process serves the address: no drain, the clients reconnect to it.
            Event::HandedOver(_) => {}
        }
        let started = std::time::Instant::now();
        // Whatever happens, exit soon after the drain (`Limits::exit_deadline_ms`, and never
        // before the clients had their `--shutdown-grace`).
        let deadline = Duration::from_millis(self.limits.exit_deadline_ms)
            .max(self.limits.shutdown_grace() + BACKSTOP_MARGIN);
        std::thread::spawn(move || {
            std::thread::sleep(deadline);
            log::warn!(
                deadline_ms = deadline.as_millis() as u64;
                "shutdown took too long; exiting"
            );
            std::process::exit(0);
        });
        self.finish(handed_over);
        let ms = started.elapsed().as_millis() as u64;
        log::info!(took_ms = ms; "shut down");
        Ok(())
    }

    /// After the first SIGTERM: begins the drain (unless `POST /drain` did) and waits for
    /// what is left of it, reloading on SIGHUP; a SIGTERM or SIGINT ends it at once, and so
    /// does a handover (then it returns true).
    fn drain_until_over(&mut self, events: &crossbeam_channel::Receiver<Event>) -> bool {
        let d = self.drain.begin(crate::clock::now_ms());
        if d.remaining_ms == 0 {
            log::info!(signal = "SIGTERM"; "SIGTERM: shutting down");
            return false;
        }
        if d.began_now {
            log::info!(
                signal = "SIGTERM", drain = "begun", drain_seconds = d.seconds;
                "SIGTERM: draining for {:.1} s: /ready answers 503, clients are still served and \
                 accepted (another SIGTERM or SIGINT ends the drain)",
                d.seconds
            );
        } else {
            log::info!(
                signal = "SIGTERM", drain = "running", remaining_ms = d.remaining_ms;
                "SIGTERM: {:.1} s left of the drain POST /drain began (another SIGTERM or SIGINT \
                 ends it)",
                d.remaining().as_secs_f64()
            );
        }
        let end = std::time::Instant::now() + d.remaining();
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                log::info!(drain = "over"; "drain over: shutting down");
                return false;
            }
            match events.recv_timeout(left) {
                Ok(Event::Signal(signal_hook::consts::SIGHUP)) => {
                    log::info!(signal = "SIGHUP"; "SIGHUP: reloading");
                    self.reload();
                }
                Ok(Event::Signal(sig)) => {
                    log::info!(signal = signal_name(sig), drain = "ended early"; "signal {sig}: drain ended early; shutting down");
                    return false;
                }
                Ok(Event::HandedOver(_)) => return true,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return false,
            }
        }
    }
}

/// Signals handed over a channel by a thread of their own, so that the drain can wait for
/// the next one with a timeout.
fn forward(
    mut signals: signal_hook::iterator::Signals,
    tx: crossbeam_channel::Sender<Event>,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(Event::Signal(sig)).is_err() {
                    return;
                }
            }
        })?;
    Ok(())
}

/// The name of a signal the server handles, for the log.
fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        signal_hook::consts::SIGTERM => "SIGTERM",
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGHUP => "SIGHUP",
        _ => "other",
    }
}

#[cfg(test)]
mod tests;
