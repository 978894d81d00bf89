//! `registry-gen`: writes a synthetic registry (`wallets.json`, `dapps.json`, `LICENSE.md`)
//! of any size for `walletrelay --registry-dir`, benches and load tests.
//!
//! `registry-gen --entries 100000 --out /tmp/reg` makes a registry whose `/api/v1/all` has
//! 100,000 entries, built from the real entries and names (see `registry::synth`).

use std::path::PathBuf;

use clap::Parser;

/// Command line of `registry-gen`.
#[derive(Debug, Parser)]
#[command(
    name = "registry-gen",
    about = "Write a synthetic wallet/dApp registry of any size"
)]
struct Args {
    /// Entries in `/api/v1/all` (wallets, dApps and hybrids together).
    #[arg(long)]
    entries: usize,
    /// Directory to write into (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the generator (same seed, same files).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = walletrelay::registry::synth::write_dir(&args.out, args.entries, args.seed) {
        eprintln!("registry-gen: {}: {e}", args.out.display());
        std::process::exit(1);
    }
    println!(
        "registry-gen: wrote {} entries to {}",
        args.entries,
        args.out.display()
    );
}
