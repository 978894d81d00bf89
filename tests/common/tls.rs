//! TLS for the tests against the real binary: [`TlsSetup`] (a test CA, a server
//! certificate written to a temp dir, the flags that make the server use it), `rustls`
//! client streams to the server's TLS listener ([`TlsStream`]), and the [`Stream`] trait the
//! test clients (`HttpConn`, `RawWs`, `Ws`) take, so one test body runs over TCP or TLS.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::{ClientConfig, ClientConnection};

use super::raw_ws::{RawWs, RELAY_PATH};
use super::tls_pki::{Leaf, TestCa};
use super::ws::Ws;
use super::{Server, TempDir, READ_TIMEOUT};

/// A blocking TLS client connection (`rustls`) over TCP.
pub type TlsStream = rustls::StreamOwned<ClientConnection, TcpStream>;

/// A client byte stream to the server: plain TCP or TLS.
pub trait Stream: Read + Write {
    /// The TCP socket under it (timeouts, shutdown, socket options).
    fn tcp(&self) -> &TcpStream;
}

impl Stream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Stream for TlsStream {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

/// A test CA and a server certificate (`localhost`, `127.0.0.1`) in files.
pub struct TlsSetup {
    /// The CA.
    pub ca: TestCa,
    /// The certificate the files hold now.
    pub leaf: Leaf,
    /// `cert.pem` (chain), `key.pem` and `ca.pem` live here.
    pub dir: TempDir,
    /// The certificate chain file (`--tls-cert`).
    pub cert: PathBuf,
    /// The key file (`--tls-key`).
    pub key: PathBuf,
    /// The CA certificate file (for `curl --cacert`, Python, Node).
    pub ca_file: PathBuf,
}

impl TlsSetup {
    /// A fresh CA and a leaf with serial 1, written out.
    pub fn new() -> TlsSetup {
        let ca = TestCa::new();
        let dir = TempDir::new("tls");
        let leaf = ca.leaf(1);
        let (cert, key) = leaf.write_to(&dir.0);
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, &ca.cert_pem).unwrap();
        TlsSetup {
            ca,
            leaf,
            dir,
            cert,
            key,
            ca_file,
        }
    }

    /// Replaces the files with a new leaf (serial `serial`) of the same CA.
    pub fn rotate(&mut self, serial: u64) {
        self.leaf = self.ca.leaf(serial);
        self.leaf.write_to(&self.dir.0);
    }

    /// The flags of a TLS listener on `127.0.0.1:0` with these files.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--tls-listen".into(),
            "127.0.0.1:0".into(),
            "--tls-cert".into(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
        ]
    }

    /// Starts a server with these TLS flags and `extra` ones.
    pub fn start(&self, extra: &[&str]) -> Server {
        let args = self.args();
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend_from_slice(extra);
        Server::start(&all)
    }

    /// Like [`TlsSetup::start`], keeping the server's log (`Server::log`).
    pub fn start_logged(&self, extra: &[&str]) -> Server {
        let args = self.args();
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend_from_slice(extra);
        Server::start_logged(&all)
    }

    /// A client trusting the CA, TLS 1.3 and 1.2, ALPN `http/1.1`, with its own session
    /// store (connections made with it resume).
    pub fn client(&self) -> Arc<ClientConfig> {
        self.ca
            .client_config(&[&rustls::version::TLS13, &rustls::version::TLS12])
    }
}

impl Server {
    /// The TLS listener's address.
    pub fn tls_addr(&self) -> std::net::SocketAddr {
        self.tls_addr.expect("server started without --tls-listen")
    }

    /// A TCP connection to the TLS listener (nothing sent).
    pub fn tls_tcp(&self) -> TcpStream {
        let s = TcpStream::connect(self.tls_addr()).expect("connect to the TLS listener");
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// A TLS connection to the TLS listener, handshake done (name `localhost`).
    pub fn tls(&self, config: &Arc<ClientConfig>) -> TlsStream {
        let conn = ClientConnection::new(Arc::clone(config), "localhost".try_into().unwrap())
            .expect("client connection");
        let mut s = rustls::StreamOwned::new(conn, self.tls_tcp());
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock).expect("TLS handshake");
        }
        s
    }

    /// A tungstenite WebSocket over TLS (`wss://`) at the relay's address.
    pub fn wss(&self, config: &Arc<ClientConfig>) -> Ws<TlsStream> {
        let url = format!("wss://localhost:{}{RELAY_PATH}", self.tls_addr().port());
        Ws::handshake(self.tls(config), &url)
    }

    /// A raw WebSocket over TLS at the relay's address.
    pub fn raw_wss(&self, config: &Arc<ClientConfig>) -> RawWs<TlsStream> {
        RawWs::upgrade(self.tls(config))
    }
}
