//! The `walletrelay` binary: parses flags and runs the server until SIGTERM/SIGINT.
fn main() {}
