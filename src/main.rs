//! The `walletrelay` binary: parses flags, starts the server, and runs it until SIGTERM or
//! SIGINT.

use std::io::Write;

use clap::Parser;
use walletrelay::config::Config;
use walletrelay::server::{self, Server};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let config = Config::parse();
    match server::raise_nofile_limit() {
        Some(n) => log::info!("open-file limit raised to {n}"),
        None => log::warn!("could not read or raise the open-file limit"),
    }
    let threads = config.worker_count();
    let server = match Server::start(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("walletrelay: cannot start: {e}");
            std::process::exit(1);
        }
    };
    log::info!("{threads} workers");
    // The first line on stdout names the bound address (tests and scripts read it).
    let mut out = std::io::stdout();
    let _ = writeln!(out, "walletrelay listening on {}", server.addr);
    let _ = out.flush();
    if let Err(e) = server.run_until_signal() {
        eprintln!("walletrelay: signal handling failed: {e}");
        std::process::exit(1);
    }
}
