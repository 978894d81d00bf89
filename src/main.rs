//! The `walletrelay` binary: builds its configuration (flags, environment, `--config` file,
//! defaults), starts the server, and runs it until SIGTERM (after the drain) or SIGINT
//! (SIGHUP reloads the TLS certificate, the registry directory, the project allow-list and
//! what the file says of them). Its first argument may instead name a subcommand, run
//! before any flag is parsed: `probe URL`, `drain ADMIN_ADDR` and `switch-layout
//! ADMIN_ADDR` (`admin::client`).

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
    if let Some(code) = subcommand() {
        std::process::exit(code);
    }
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
    if let Some(addr) = server.admin_addr {
        log::info!(addr:% = addr, admin = true; "admin address listening on {addr}");
        let _ = writeln!(out, "walletrelay admin listening on {addr}");
    }
    let _ = out.flush();
    if let Err(e) = server.run_until_signal(signals) {
        fail(1, format_args!("signal handling failed: {e}"));
    }
}

/// Runs the subcommand the first argument names (`probe`, `drain`), if it names one;
/// returns its exit code. Anything else is the server's command line, parsed as before.
fn subcommand() -> Option<i32> {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let (name, rest) = args.split_first()?;
    let usage = match name.as_str() {
        "probe" => {
            "usage: walletrelay probe URL\n\nOne HTTP/1.1 GET of URL (http:// only), within \
                    2 s; exit 0 when the answer is 2xx, 1 otherwise (the status line or the \
                    error on stderr)."
        }
        "drain" => {
            "usage: walletrelay drain ADMIN_ADDR\n\nPOST /drain to the node's admin \
                    address (--admin-listen, e.g. 127.0.0.1:9091), then wait until the drain \
                    time it answers has passed; exit 0 then, 1 when the node could not be asked."
        }
        "switch-layout" => {
            "usage: walletrelay switch-layout ADMIN_ADDR\n\nPOST /layout/switch to a node's \
                    admin address: the Redis cluster writes this build's newest data layout \
                    from now on, and nodes of the older one can no longer join (run it once \
                    every node runs this build; docs/UPGRADING.md). Exit 0 with the answer on \
                    stdout, 1 otherwise."
        }
        _ => return None,
    };
    let [arg] = rest else {
        eprintln!("{usage}");
        return Some(2);
    };
    if arg == "--help" || arg == "-h" {
        println!("{usage}");
        return Some(0);
    }
    Some(match name.as_str() {
        "probe" => probe(arg),
        "switch-layout" => switch_layout(arg),
        _ => drain(arg),
    })
}

/// `walletrelay probe URL`.
fn probe(url: &str) -> i32 {
    match walletrelay::admin::client::probe(url) {
        Ok(a) if a.success() => 0,
        Ok(a) => {
            let body = String::from_utf8_lossy(&a.body);
            let body: String = body.trim().chars().take(512).collect();
            eprintln!("walletrelay probe: {url}: {} {body}", a.status_line);
            1
        }
        Err(e) => {
            eprintln!("walletrelay probe: {e}");
            1
        }
    }
}

/// `walletrelay switch-layout ADMIN_ADDR`.
fn switch_layout(admin: &str) -> i32 {
    match walletrelay::admin::client::switch_layout(admin) {
        Ok(body) => {
            println!("{body}");
            0
        }
        Err(e) => {
            eprintln!("walletrelay switch-layout: {e}");
            1
        }
    }
}

/// `walletrelay drain ADMIN_ADDR`.
fn drain(admin: &str) -> i32 {
    match walletrelay::admin::client::drain(admin) {
        Ok(d) => {
            eprintln!(
                "walletrelay drain: {admin} is draining ({} s); waiting {} ms for the rest of it",
                d.drain_seconds, d.remaining_ms
            );
            std::thread::sleep(std::time::Duration::from_millis(d.remaining_ms));
            0
        }
        Err(e) => {
            eprintln!("walletrelay drain: {e}");
            1
        }
    }
}
