//! `loadtest`: a load generator for walletrelay's WebSocket relay and HTTP registry.
//!
//! Reads the command line, refuses any target that is not on loopback unless
//! `--allow-remote` (exit 2; with it, says what it will send where), raises its own
//! open-file limit, runs one scenario, prints a table and one JSON line of figures and, with
//! `--hlog`, writes the latencies as an HdrHistogram interval log. `merge` and `report` read
//! such logs and send nothing. Every scenario is bounded in time and stops by itself. See
//! `loadtest/README.md`.

mod cli;
mod clock;
mod deflate;
mod forwarder;
mod jwt;
mod lab;
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
    // The process's time zero, before anything else is timed.
    let _ = clock::epoch();
    let mut args = Cli::parse();
    if let Command::Merge(o) = &args.cmd {
        return match lab::merge(o) {
            Ok(r) => {
                print!("{}", r.table());
                let line = r.json();
                println!("{line}");
                append_json(o.json.as_deref(), &line)
            }
            Err(e) => {
                eprintln!("loadtest: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Command::Report(o) = &args.cmd {
        return match lab::report(o) {
            Ok(said) => {
                println!("{said}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("loadtest: {e}");
                ExitCode::FAILURE
            }
        };
    }
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
    let shape = load_shape(&args.cmd);
    let common = match &mut args.cmd {
        Command::Pairs(o) => &mut o.common,
        Command::Fanout(o) => &mut o.common,
        Command::Idle(o) => &mut o.common,
        Command::Churn(o) => &mut o.common,
        Command::Storm(o) => &mut o.common,
        Command::Http(o) => &mut o.common,
        Command::Abuse(o) => &mut o.common,
        Command::Loopback(_) | Command::Forwarder(_) | Command::Merge(_) | Command::Report(_) => {
            return ExitCode::FAILURE
        }
    };
    let reach = if common.allow_remote {
        cli::Reach::Remote
    } else {
        cli::Reach::Loopback
    };
    let target = match cli::parse_target(&common.url, reach) {
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
    if let Some(at) = common.start_at {
        if let Err(e) = clock::check_start_at(at, clock::unix_now_ns()) {
            eprintln!("loadtest: {e}");
            return ExitCode::from(2);
        }
    }
    if !cli::is_loopback(target.addr.ip()) {
        if common.source_ips > 0 {
            eprintln!("loadtest: --source-ips spreads over loopback addresses only");
            return ExitCode::from(2);
        }
        eprintln!("loadtest: {}", plan(&shape, common, &target));
    }
    match sys::raise_nofile() {
        Ok((old, new)) if old != new => {
            eprintln!("loadtest: open-file limit raised {old} -> {new}")
        }
        Ok(_) => {}
        Err(e) => eprintln!("loadtest: could not raise the open-file limit: {e}"),
    }
    let json_path = common.json.clone();
    let hlog_path = common.hlog.clone();
    if let Command::Abuse(o) = &args.cmd {
        return match scenario::abuse::run(&target, o) {
            Ok((reports, table)) => {
                print!("{table}");
                if let Some(p) = &hlog_path {
                    let all: Vec<&stats::Report> = reports.iter().collect();
                    if let Err(e) = lab::hlog::Log::of_reports(&all).write(p) {
                        eprintln!("loadtest: {e}");
                        return ExitCode::FAILURE;
                    }
                }
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
        Command::Abuse(_) | Command::Forwarder(_) | Command::Merge(_) | Command::Report(_) => {
            return ExitCode::FAILURE
        }
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
    if let Some(p) = &hlog_path {
        match lab::hlog::Log::of_reports(&[&report]).write(p) {
            Ok(()) => eprintln!("loadtest: interval log written to {}", p.display()),
            Err(e) => {
                eprintln!("loadtest: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    append_json(json_path.as_deref(), &line)
}

/// Append `line` to `path`, if given.
fn append_json(path: Option<&std::path::Path>, line: &str) -> ExitCode {
    let Some(p) = path else {
        return ExitCode::SUCCESS;
    };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .and_then(|mut f| writeln!(f, "{line}"));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadtest: cannot append to {}: {e}", p.display());
            ExitCode::FAILURE
        }
    }
}

/// What a scenario will send, in words (for [`plan`]).
fn load_shape(cmd: &Command) -> String {
    match cmd {
        Command::Pairs(o) => {
            let pairs = o.connections.map_or(o.pairs, |c| c / 2);
            let load = if o.rate > 0 {
                format!("{} publishes/s in all of {} hex characters", o.rate, o.size)
            } else {
                format!("closed loop, {} in flight per pair", o.inflight)
            };
            format!("pairs: {} connections ({pairs} pairs), {load}", 2 * pairs)
        }
        Command::Fanout(o) => format!(
            "fanout: 1 publisher and {} subscribers, {} publishes/s",
            o.subscribers, o.rate
        ),
        Command::Idle(o) => format!("idle: {} connections held", o.connections),
        Command::Churn(o) => format!("churn: {} connect cycles at once", o.concurrency),
        Command::Storm(o) => format!("storm: {} connections", o.connections),
        Command::Http(o) if o.rate > 0 => {
            format!("http: {} connections, {} requests/s", o.connections, o.rate)
        }
        Command::Http(o) => format!("http: {} connections, flat out", o.connections),
        Command::Abuse(o) => format!("abuse: {} honest pairs and an abuser", o.pairs),
        Command::Loopback(_) | Command::Forwarder(_) | Command::Merge(_) | Command::Report(_) => {
            String::new()
        }
    }
}

/// What a run against a non-loopback target will send where (`--allow-remote`).
fn plan(shape: &str, c: &cli::Common, target: &cli::Target) -> String {
    let start = match c.start_at {
        Some(at) => format!("from {:.3} (Unix s)", at as f64 / 1e9),
        None => "once set up".to_string(),
    };
    format!(
        "--allow-remote: sending {shape} to {} (Host {}, path {}), {start}, for {:.1} s of \
         warm-up and {:.1} s measured, {} thread(s)",
        target.addr,
        target.host,
        target.path,
        c.warmup.as_secs_f64(),
        c.duration.as_secs_f64(),
        c.threads
    )
}
