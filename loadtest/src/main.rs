//! `loadtest`: a load generator for walletrelay's WebSocket relay and HTTP registry.
//!
//! Reads the command line, refuses any target that is not on loopback (exit 2), raises its own
//! open-file limit, runs one scenario, and prints a table and one JSON line of figures.
//! Every scenario is bounded in time and stops by itself. See `loadtest/README.md`.

mod cli;
mod deflate;
mod forwarder;
mod jwt;
mod net;
mod proto;
mod scenario;
mod stats;
mod sys;
mod tls;
mod upgrade;
mod ws;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let mut args = Cli::parse();
    if let Command::Loopback(o) = &args.cmd {
        return match scenario::loopback::run(o) {
            Ok(r) => {
                print!("{}", r.table());
                println!("{}", r.json());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("loadtest: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Command::Forwarder(o) = &args.cmd {
        if !o.listen.ip().is_loopback() {
            eprintln!("loadtest: --listen must be a loopback address");
            return ExitCode::from(2);
        }
        if let Err(e) = sys::raise_nofile() {
            eprintln!("loadtest: could not raise the open-file limit: {e}");
        }
        return match forwarder::run(o.listen, o.duration, o.cpu) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("loadtest: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Command::Http(o) = &args.cmd {
        if o.common.permessage_deflate {
            eprintln!("loadtest: --permessage-deflate is for the WebSocket scenarios");
            return ExitCode::from(2);
        }
        if o.common.auth {
            eprintln!("loadtest: --auth is for the WebSocket scenarios");
            return ExitCode::from(2);
        }
    }
    let common = match &mut args.cmd {
        Command::Pairs(o) => &mut o.common,
        Command::Fanout(o) => &mut o.common,
        Command::Idle(o) => &mut o.common,
        Command::Churn(o) => &mut o.common,
        Command::Storm(o) => &mut o.common,
        Command::Http(o) => &mut o.common,
        Command::Abuse(o) => &mut o.common,
        Command::Loopback(_) | Command::Forwarder(_) => return ExitCode::FAILURE,
    };
    let target = match cli::parse_target(&common.url) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("loadtest: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(name) = &target.tls_name {
        let Some(cacert) = &common.cacert else {
            eprintln!("loadtest: {} needs --cacert FILE", common.url);
            return ExitCode::from(2);
        };
        match tls::Client::new(cacert, name, common.tls_version, !common.tls_no_resume) {
            Ok(c) => common.tls = Some(c),
            Err(e) => {
                eprintln!("loadtest: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if common.threads == 0 || common.duration.is_zero() {
        eprintln!("loadtest: --threads and --duration must be > 0");
        return ExitCode::from(2);
    }
    match sys::raise_nofile() {
        Ok((old, new)) if old != new => {
            eprintln!("loadtest: open-file limit raised {old} -> {new}")
        }
        Ok(_) => {}
        Err(e) => eprintln!("loadtest: could not raise the open-file limit: {e}"),
    }
    let json_path = common.json.clone();
    if let Command::Abuse(o) = &args.cmd {
        return match scenario::abuse::run(&target, o) {
            Ok((reports, table)) => {
                print!("{table}");
                if let Some(p) = json_path {
                    let written = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&p)
                        .and_then(|mut f| {
                            reports.iter().try_for_each(|r| writeln!(f, "{}", r.json()))
                        });
                    if let Err(e) = written {
                        eprintln!("loadtest: cannot append to {}: {e}", p.display());
                        return ExitCode::FAILURE;
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("loadtest: {e}");
                match e {
                    scenario::RunError::Options(_) => ExitCode::from(2),
                    _ => ExitCode::FAILURE,
                }
            }
        };
    }
    let result = match &args.cmd {
        Command::Pairs(o) => scenario::pairs::run(&target, o),
        Command::Fanout(o) => scenario::fanout::run(&target, o),
        Command::Idle(o) => scenario::idle::run(&target, o),
        Command::Churn(o) => scenario::churn::run(&target, o),
        Command::Storm(o) => scenario::storm::run(&target, o),
        Command::Http(o) => scenario::http::run(&target, o),
        Command::Abuse(_) | Command::Forwarder(_) => return ExitCode::FAILURE,
        Command::Loopback(o) => scenario::loopback::run(o),
    };
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadtest: {e}");
            return match e {
                scenario::RunError::Options(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            };
        }
    };
    print!("{}", report.table());
    let line = report.json();
    println!("{line}");
    if let Some(p) = json_path {
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = written {
            eprintln!("loadtest: cannot append to {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
