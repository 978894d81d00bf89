//! The `walletrelay` binary: builds its configuration (flags, environment, `--config` file,
//! defaults), starts the server, and runs it until SIGTERM or SIGINT (SIGHUP reloads the
//! TLS certificate, the registry directory, the project allow-list and what the file says
//! of them).

use std::io::Write;

/// mimalloc: per-thread free lists suit the one-thread-per-core design (every message
/// allocates and frees on the worker that handles it); docs/PERFORMANCE.md, "Smaller
/// choices".
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use walletrelay::config::{self, LoadError};
use walletrelay::logging;
use walletrelay::server::{self, Server};

/// Reports an error that stops the process ([`logging::fatal`]: a JSON record with
/// `--log-format json`, `walletrelay: MSG` otherwise) and exits with `code`.
fn fail(code: i32, msg: std::fmt::Arguments<'_>) -> ! {
    logging::fatal(&msg);
    std::process::exit(code);
}

fn main() {
    // Errors before the configuration is read (a bad flag, a bad file) are plain text: the
    // format is not known yet.
    let loaded = match config::load(std::env::args_os()) {
        Ok(loaded) => loaded,
        Err(LoadError::Args(e)) => e.exit(),
        Err(e) => {
            eprintln!("walletrelay: {e}");
            std::process::exit(2);
        }
    };
    if loaded.config.print_config {
        let mut out = std::io::stdout();
        let _ = out.write_all(loaded.print().as_bytes());
        let _ = out.flush();
        return;
    }
    logging::init(loaded.config.log_format);
    if let Some(path) = loaded.path() {
        log::info!(path:% = path.display(); "configuration file {}", path.display());
    }
    let watch = loaded.watch();
    let config = loaded.config;
    match server::raise_nofile_limit() {
        Some(n) => log::info!(limit = n; "open-file limit raised to {n}"),
        None => log::warn!("could not read or raise the open-file limit"),
    }
    if config.huge_pages {
        log::info!("transparent huge pages allowed (--huge-pages)");
    } else {
        match server::disable_huge_pages() {
            Ok(()) => {
                log::info!("transparent huge pages off for this process (--huge-pages to allow)")
            }
            Err(e) => log::warn!("could not turn transparent huge pages off: {e}"),
        }
    }
    if let Err(e) = config.check() {
        fail(2, format_args!("{e}"));
    }
    let threads = config.worker_count();
    let signals = match Server::signals() {
        Ok(s) => s,
        Err(e) => fail(1, format_args!("cannot install signal handlers: {e}")),
    };
    let mut server = match Server::start(config) {
        Ok(s) => s,
        Err(e) => fail(1, format_args!("cannot start: {e}")),
    };
    if let Some(watch) = watch {
        server.watch_config(watch);
    }
    log::info!(workers = threads; "{threads} workers");
    // Stdout names the bound addresses (tests and scripts read these lines): the plain
    // listener's first, then the TLS listener's.
    let mut out = std::io::stdout();
    if let Some(addr) = server.addr {
        log::info!(addr:% = addr, tls = false; "listening on {addr}");
        let _ = writeln!(out, "walletrelay listening on {addr}");
    }
    if let Some(addr) = server.tls_addr {
        log::info!(addr:% = addr, tls = true; "listening for TLS on {addr}");
        let _ = writeln!(out, "walletrelay listening for TLS on {addr}");
    }
    let _ = out.flush();
    if let Err(e) = server.run_until_signal(signals) {
        fail(1, format_args!("signal handling failed: {e}"));
    }
}
