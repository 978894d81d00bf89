//! Test support: runs the real `walletrelay` binary on a loopback port and talks to it over
//! real sockets.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running server process, killed on drop.
pub struct Server {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The process.
    pub child: Child,
}

impl Server {
    /// Starts the binary on `127.0.0.1:0` with extra `args` and waits until it listens.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn walletrelay");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = loop {
            let line = lines.next().expect("server exited before listening").expect("read stdout");
            if let Some(rest) = line.strip_prefix("walletrelay listening on ") {
                break rest.trim().parse().expect("address");
            }
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server { addr, child }
    }

    /// A raw TCP connection with generous timeouts.
    pub fn tcp(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// Sends `raw` on a fresh connection and reads until the server closes it.
    pub fn raw_exchange(&self, raw: &[u8]) -> Vec<u8> {
        let mut s = self.tcp();
        s.write_all(raw).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
