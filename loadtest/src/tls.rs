//! `wss://` and `https://`: a `rustls` client per connection, driven from the same
//! non-blocking event loop as plain sockets. [`read`] and [`write`] stand in for the
//! socket's own `read`/`write` (plaintext in and out, ciphertext on the socket), so `net`
//! keeps one code path; [`Client`] is the shared client configuration (trusted CA from
//! `--cacert`, ALPN `http/1.1`, `--tls-version`, resumption unless `--tls-no-resume`).
//!
//! It owns no socket and no connection state beyond `rustls`'s: `net` decides when to read,
//! write and close.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// Which TLS versions to offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Version {
    /// TLS 1.3 and 1.2 (the server picks 1.3).
    Any,
    /// TLS 1.2 only.
    #[value(name = "1.2")]
    V12,
    /// TLS 1.3 only.
    #[value(name = "1.3")]
    V13,
}

/// The client side of every TLS connection of a run.
#[derive(Clone, Debug)]
pub struct Client {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl Client {
    /// Trusts the CA certificates in `cacert` (PEM) and checks the server as `name` (a DNS
    /// name or an IP address).
    pub fn new(
        cacert: &Path,
        name: &str,
        version: Version,
        resume: bool,
    ) -> Result<Client, String> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(cacert)
            .map_err(|e| format!("--cacert {}: {e}", cacert.display()))?
        {
            let cert = cert.map_err(|e| format!("--cacert {}: {e}", cacert.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("--cacert {}: {e}", cacert.display()))?;
        }
        if roots.is_empty() {
            return Err(format!("--cacert {}: no certificate", cacert.display()));
        }
        let versions: &[&'static rustls::SupportedProtocolVersion] = match version {
            Version::Any => &[&rustls::version::TLS13, &rustls::version::TLS12],
            Version::V12 => &[&rustls::version::TLS12],
            Version::V13 => &[&rustls::version::TLS13],
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        if !resume {
            config.resumption = Resumption::disabled();
        }
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| format!("server name {name:?}: {e}"))?;
        Ok(Client {
            config: Arc::new(config),
            name,
        })
    }

    /// A new connection's TLS state (its ClientHello goes out with the first write).
    pub fn session(&self) -> io::Result<Session> {
        let conn = ClientConnection::new(Arc::clone(&self.config), self.name.clone())
            .map_err(io::Error::other)?;
        Ok(Session {
            conn,
            left: Vec::new(),
        })
    }
}

/// One connection's TLS state: `rustls`'s, and ciphertext read from the socket that
/// `rustls` could not take yet (empty, holding no allocation, almost always).
#[derive(Debug)]
pub struct Session {
    conn: ClientConnection,
    left: Vec<u8>,
}

impl Session {
    /// Ciphertext waits for the socket.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }
}

/// Bytes of ciphertext read from the socket per `read` call: `rustls`'s own `read_tls` reads
/// 4 KiB per call, a syscall each; one read of this much is fed to it from memory instead.
pub const CIPHER_READ: usize = 64 * 1024;

/// Reads plaintext into `buf`: the socket's own `read` without TLS. `Ok(0)` is the end of
/// the stream (a `close_notify`, or TCP closed), `WouldBlock` means wait for readable (the
/// socket would block and nothing is left to decrypt, so an edge is never left unread).
/// `cipher` is the caller's buffer for ciphertext (grown to [`CIPHER_READ`] on first use).
pub fn read(
    sock: &mut TcpStream,
    tls: Option<&mut Session>,
    buf: &mut [u8],
    cipher: &mut Vec<u8>,
) -> io::Result<usize> {
    let Some(s) = tls else {
        return sock.read(buf);
    };
    loop {
        match s.conn.reader().read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
            Err(e) => return Err(e),
        }
        if s.left.is_empty() {
            if cipher.len() < CIPHER_READ {
                cipher.resize(CIPHER_READ, 0);
            }
            let n = sock.read(cipher)?;
            if n == 0 {
                return Ok(0);
            }
            let used = feed(&mut s.conn, &cipher[..n])?;
            s.left.extend_from_slice(&cipher[used..n]);
        } else {
            let left = std::mem::take(&mut s.left);
            let used = feed(&mut s.conn, &left)?;
            s.left = left;
            s.left.drain(..used);
            if s.left.is_empty() {
                s.left = Vec::new();
            }
        }
        // Handshake messages (and the data written before the handshake ended).
        match send_pending(sock, s) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            _ => {}
        }
    }
}

/// Hands `rustls` what of `bytes` it takes (it stops when its plaintext buffer is full) and
/// decrypts it; returns how many bytes it took.
fn feed(conn: &mut ClientConnection, bytes: &[u8]) -> io::Result<usize> {
    let mut rest = bytes;
    while !rest.is_empty() {
        // An error: its buffers are full, the plaintext must be read first. 0: it takes
        // nothing more (after `close_notify`).
        if !matches!(conn.read_tls(&mut rest), Ok(n) if n > 0) {
            break;
        }
        conn.process_new_packets()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
    Ok(bytes.len() - rest.len())
}

/// Writes plaintext from `buf`: the socket's own `write` without TLS. With TLS, takes
/// plaintext only once earlier ciphertext is all out (else `WouldBlock`), so what waits in
/// `rustls` stays within one write; the rest of its ciphertext goes out with
/// [`send_pending`] when the socket is writable again.
pub fn write(sock: &mut TcpStream, tls: Option<&mut Session>, buf: &[u8]) -> io::Result<usize> {
    let Some(s) = tls else {
        return sock.write(buf);
    };
    send_pending(sock, s)?;
    let n = s.conn.writer().write(buf)?;
    if n == 0 && !buf.is_empty() {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    match send_pending(sock, s) {
        Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
        _ => Ok(n),
    }
}

/// Writes the ciphertext `rustls` holds until none is left (`Ok`) or the socket is full
/// (`WouldBlock`).
pub fn send_pending(sock: &mut TcpStream, s: &mut Session) -> io::Result<()> {
    while s.conn.wants_write() {
        if s.conn.write_tls(sock)? == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// The test CA of walletrelay's own TLS tests.
#[cfg(test)]
#[path = "../../tests/common/tls_pki.rs"]
mod tls_pki;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    use super::tls_pki;

    /// A blocking `rustls` server on a thread: echoes every byte back, then closes.
    fn echo_server(leaf: &tls_pki::Leaf) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
        let chain = CertificateDer::pem_slice_iter(leaf.chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
            let mut s = rustls::StreamOwned::new(conn, sock);
            let mut buf = vec![0u8; 16384];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => s.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        (addr, t)
    }

    /// 2 MiB through a non-blocking socket with a small send buffer, both ways, with the
    /// calls `net` makes: every byte comes back, in order, and the end is a clean EOF.
    #[test]
    fn bytes_cross_tls_whole_through_non_blocking_calls() {
        let ca = tls_pki::TestCa::new();
        let leaf = ca.leaf(1);
        let (addr, server) = echo_server(&leaf);
        let dir = std::env::temp_dir().join(format!("loadtest-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, &ca.cert_pem).unwrap();
        let client = Client::new(&ca_file, "localhost", Version::Any, true).unwrap();
        let _ = std::fs::remove_dir_all(&dir);

        let std_sock = std::net::TcpStream::connect(addr).unwrap();
        socket2::SockRef::from(&std_sock)
            .set_send_buffer_size(8192)
            .unwrap();
        std_sock.set_nonblocking(true).unwrap();
        let mut sock = TcpStream::from_std(std_sock);
        let mut tls = client.session().unwrap();
        let mut cipher = Vec::new();
        let data: Vec<u8> = (0..2 << 20).map(|i| (i % 251) as u8).collect();
        let (mut sent, mut got) = (0, Vec::new());
        let mut buf = vec![0u8; 65536];
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.len() < data.len() {
            assert!(
                Instant::now() < deadline,
                "stuck at {} of {}",
                got.len(),
                data.len()
            );
            if sent < data.len() {
                let end = (sent + 30000).min(data.len());
                match write(&mut sock, Some(&mut tls), &data[sent..end]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("write: {e}"),
                }
            } else {
                match send_pending(&mut sock, &mut tls) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("send: {e}"),
                }
            }
            loop {
                match read(&mut sock, Some(&mut tls), &mut buf, &mut cipher) {
                    Ok(0) => panic!("EOF after {} bytes", got.len()),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("read: {e}"),
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(got == data, "the echo differs");
        // A clean close: close_notify, then EOF reads as 0.
        tls.conn.send_close_notify();
        while send_pending(&mut sock, &mut tls).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        server.join().unwrap();
        let end = loop {
            match read(&mut sock, Some(&mut tls), &mut buf, &mut cipher) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                other => break other,
            }
        };
        assert_eq!(end.unwrap(), 0);
    }
}
