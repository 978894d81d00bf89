//! One connection to one Redis server: TCP or TLS (rustls), logged in (`AUTH`, with an ACL
//! user or not), its database selected; used whole by the command thread, or split into a
//! read half and a write half for the subscriber's two threads.
//!
//! Owns: the socket, the TLS session and the RESP parser of one connection. Must not know
//! what the commands mean: callers pack them (`script::Packer`) and read [`Value`]s.
//!
//! A TLS session cannot be read on one thread while another writes unless they share it:
//! [`ReadHalf`] reads ciphertext from its own clone of the socket without any lock (so a
//! blocked read never holds up a write), then feeds it to the session under the session's
//! mutex; [`WriteHalf`] writes under the same mutex, and so does the reader when the session
//! has something to send back. Every write to the socket happens under that mutex, so TLS
//! records leave in order.

use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::Value;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

use super::addr::Endpoint;
use super::resp::Packer;

/// Why a connection failed or was refused. Never holds a password.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The socket failed or timed out.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The TLS handshake or a record failed.
    #[error("TLS: {0}")]
    Tls(String),
    /// Redis answered an error (`code details`).
    #[error("{0}")]
    Server(String),
    /// Redis answered something this client does not understand.
    #[error("unexpected reply: {0}")]
    Protocol(String),
    /// No primary could be found (Sentinel) or the server is not one.
    #[error("{0}")]
    NoPrimary(String),
}

impl LinkError {
    /// The error a `-CODE details` reply makes.
    pub fn server(e: &redis::ServerError) -> LinkError {
        LinkError::Server(format!("{} {}", e.code(), e.details().unwrap_or("")))
    }

    fn parse(e: redis::RedisError) -> LinkError {
        match e.kind() {
            // A read timeout is EAGAIN on Linux ("Resource temporarily unavailable"): say
            // what it means to whoever reads /health or the log.
            redis::ErrorKind::Io if is_timeout(&e.to_string()) => LinkError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "no reply from Redis within the read timeout",
            )),
            redis::ErrorKind::Io => LinkError::Io(io::Error::other(e.to_string())),
            _ => LinkError::Protocol(e.to_string()),
        }
    }
}

/// Whether an I/O error's text is a socket timeout's (the parser's error keeps only its text).
fn is_timeout(s: &str) -> bool {
    s.contains("os error 11") || s.contains("timed out") || s.contains("WouldBlock")
}

impl LinkError {
    /// The error of a failed read or write on the socket, a timeout said as one.
    pub(crate) fn io(e: io::Error) -> LinkError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => LinkError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "no reply from Redis within the read timeout",
            )),
            _ => LinkError::Io(e),
        }
    }
}

/// How to reach and log in to a server.
#[derive(Clone)]
pub(crate) struct Login<'a> {
    /// TLS settings (`None`: plain TCP).
    pub tls: Option<&'a Arc<ClientConfig>>,
    /// ACL user (with `password`), if any.
    pub user: Option<&'a str>,
    /// Password, if any.
    pub password: Option<&'a str>,
    /// Database to select (0: none).
    pub db: i64,
    /// Time to open the TCP connection (and, again, for the TLS handshake).
    pub connect_timeout: Duration,
    /// Read timeout of the socket.
    pub read_timeout: Duration,
    /// Write timeout of the socket.
    pub write_timeout: Duration,
}

pub(crate) struct TlsShared {
    conn: Mutex<ClientConnection>,
    /// The socket the session writes to (every write under `conn`'s lock).
    sock: TcpStream,
}

impl TlsShared {
    fn lock(&self) -> MutexGuard<'_, ClientConnection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn tls_io(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Sends whatever the session has to send (called with its lock held).
fn flush_tls(conn: &mut ClientConnection, mut sock: &TcpStream) -> io::Result<()> {
    while conn.wants_write() {
        conn.write_tls(&mut sock)?;
    }
    Ok(())
}

/// The reading side of a connection.
pub(crate) enum ReadHalf {
    Plain(TcpStream),
    Tls {
        shared: Arc<TlsShared>,
        /// This half's own clone of the socket: read without the lock.
        sock: TcpStream,
        cipher: Box<[u8]>,
        /// Plain text taken out of the session, not yet returned.
        plain: Vec<u8>,
        at: usize,
    },
}

impl Read for ReadHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let ReadHalf::Tls {
            shared,
            sock,
            cipher,
            plain,
            at,
        } = self
        else {
            let ReadHalf::Plain(s) = self else {
                return Ok(0);
            };
            return s.read(buf);
        };
        loop {
            if *at < plain.len() {
                let n = buf.len().min(plain.len() - *at);
                buf[..n].copy_from_slice(&plain[*at..*at + n]);
                *at += n;
                if *at == plain.len() {
                    plain.clear();
                    *at = 0;
                }
                return Ok(n);
            }
            let n = sock.read(cipher)?;
            if n == 0 {
                return Ok(0);
            }
            let mut c = shared.lock();
            let mut rest = &cipher[..n];
            while !rest.is_empty() {
                if c.read_tls(&mut rest)? == 0 {
                    return Err(io::Error::other("TLS session took no bytes"));
                }
                let state = c.process_new_packets().map_err(tls_io)?;
                if state.plaintext_bytes_to_read() > 0 {
                    let from = plain.len();
                    plain.resize(from + state.plaintext_bytes_to_read(), 0);
                    c.reader().read_exact(&mut plain[from..])?;
                }
                if state.peer_has_closed() && plain.is_empty() {
                    return Ok(0);
                }
            }
            flush_tls(&mut c, &shared.sock)?;
        }
    }
}

/// The writing side of a connection.
pub(crate) enum WriteHalf {
    Plain(TcpStream),
    Tls(Arc<TlsShared>),
}

impl WriteHalf {
    /// Writes all of `buf` (a whole pipeline).
    pub(crate) fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            WriteHalf::Plain(s) => s.write_all(buf),
            WriteHalf::Tls(shared) => {
                let mut c = shared.lock();
                let mut rest = buf;
                while !rest.is_empty() {
                    let n = c.writer().write(rest)?;
                    rest = &rest[n..];
                    flush_tls(&mut c, &shared.sock)?;
                }
                Ok(())
            }
        }
    }
}

/// A logged-in connection, whole.
pub(crate) struct Link {
    r: BufReader<ReadHalf>,
    w: WriteHalf,
    parser: redis::Parser,
    /// A clone of the socket to shut it down from anywhere.
    sock: TcpStream,
}

/// The parts a split [`Link`] gives its two threads.
pub(crate) struct Split {
    pub reader: BufReader<ReadHalf>,
    pub parser: redis::Parser,
    pub writer: WriteHalf,
    /// Shut it down to wake a blocked reader.
    pub sock: TcpStream,
}

fn connect_tcp(at: &Endpoint, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in (at.host.as_str(), at.port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                // Closed, the socket is reset and what it still held unsent is dropped: a
                // command whose reply never came was answered "unavailable", and must not
                // reach Redis later, after the commands of the next connection, when a
                // partition heals and the kernel retransmits it (a refused publish stored
                // out of its order).
                socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl Link {
    /// Connects to `at`, does the TLS handshake when asked, logs in and selects the
    /// database (one round trip for both).
    pub(crate) fn open(at: &Endpoint, login: &Login<'_>) -> Result<Link, LinkError> {
        let sock = connect_tcp(at, login.connect_timeout)?;
        let _ = sock.set_nodelay(true);
        sock.set_write_timeout(Some(login.write_timeout))?;
        let (read, write) = halves(&sock, at, login)?;
        sock.set_read_timeout(Some(login.read_timeout))?;
        let mut link = Link {
            r: BufReader::with_capacity(64 * 1024, read),
            w: write,
            parser: redis::Parser::new(),
            sock,
        };
        link.log_in(login)?;
        Ok(link)
    }

    /// `AUTH` (with the ACL user when given) and `SELECT`, in one round trip; a refusal
    /// names the command, never the password.
    fn log_in(&mut self, login: &Login<'_>) -> Result<(), LinkError> {
        let mut buf = Vec::new();
        let mut replies = 0;
        if let Some(pw) = login.password {
            let mut p = Packer::new(&mut buf);
            match login.user {
                Some(u) => p.cmd(3).arg(b"AUTH").arg(u.as_bytes()).arg(pw.as_bytes()),
                None => p.cmd(2).arg(b"AUTH").arg(pw.as_bytes()),
            };
            replies += 1;
        }
        if login.db != 0 {
            let mut n = itoa::Buffer::new();
            Packer::new(&mut buf)
                .cmd(2)
                .arg(b"SELECT")
                .arg(n.format(login.db).as_bytes());
            replies += 1;
        }
        if replies > 0 {
            self.send(&buf)?;
            for i in 0..replies {
                if let Value::ServerError(e) = self.recv()? {
                    let what = if i == 0 && login.password.is_some() {
                        "AUTH"
                    } else {
                        "SELECT"
                    };
                    // A server that echoes its arguments (`unknown command ... with args
                    // beginning with:`) would put the password in the log and /health.
                    let details = e.details().unwrap_or("");
                    let details = match login.password {
                        Some(pw) if !pw.is_empty() && details.contains(pw) => {
                            details.replace(pw, "***")
                        }
                        _ => details.to_string(),
                    };
                    return Err(LinkError::Server(format!("{what}: {} {details}", e.code())));
                }
            }
        }
        Ok(())
    }

    /// Writes a packed pipeline.
    pub(crate) fn send(&mut self, buf: &[u8]) -> Result<(), LinkError> {
        self.w.send(buf).map_err(LinkError::io)
    }

    /// Reads the next reply.
    pub(crate) fn recv(&mut self) -> Result<Value, LinkError> {
        self.parser
            .parse_value(&mut self.r)
            .map_err(LinkError::parse)
    }

    /// One command, its reply (a server error is an `Err`).
    pub(crate) fn query(&mut self, args: &[&[u8]]) -> Result<Value, LinkError> {
        let mut buf = Vec::new();
        let mut p = Packer::new(&mut buf);
        p.cmd(args.len());
        for a in args {
            p.arg(a);
        }
        self.send(&buf)?;
        match self.recv()? {
            Value::ServerError(e) => Err(LinkError::server(&e)),
            v => Ok(v),
        }
    }

    /// Changes the socket's read timeout.
    pub(crate) fn set_read_timeout(&self, d: Duration) -> Result<(), LinkError> {
        Ok(self.sock.set_read_timeout(Some(d))?)
    }

    /// Closes the connection (wakes a reader blocked on it).
    pub(crate) fn shutdown(&self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    /// The halves for two threads.
    pub(crate) fn split(self) -> Split {
        Split {
            reader: self.r,
            parser: self.parser,
            writer: self.w,
            sock: self.sock,
        }
    }
}

/// The two halves of a link on `sock`: plain, or TLS after the handshake with `at`.
fn halves(
    sock: &TcpStream,
    at: &Endpoint,
    login: &Login<'_>,
) -> Result<(ReadHalf, WriteHalf), LinkError> {
    Ok(match login.tls {
        None => (
            ReadHalf::Plain(sock.try_clone()?),
            WriteHalf::Plain(sock.try_clone()?),
        ),
        Some(cfg) => {
            let name = ServerName::try_from(at.host.clone())
                .map_err(|e| LinkError::Tls(format!("server name {:?}: {e}", at.host)))?;
            let mut conn = ClientConnection::new(Arc::clone(cfg), name)
                .map_err(|e| LinkError::Tls(e.to_string()))?;
            sock.set_read_timeout(Some(login.connect_timeout))?;
            let mut s = sock;
            while conn.is_handshaking() {
                conn.complete_io(&mut s).map_err(|e| match e.kind() {
                    io::ErrorKind::InvalidData => LinkError::Tls(e.to_string()),
                    _ => LinkError::Io(e),
                })?;
            }
            let shared = Arc::new(TlsShared {
                conn: Mutex::new(conn),
                sock: sock.try_clone()?,
            });
            (
                ReadHalf::Tls {
                    shared: Arc::clone(&shared),
                    sock: sock.try_clone()?,
                    cipher: vec![0; 18 * 1024].into_boxed_slice(),
                    plain: Vec::new(),
                    at: 0,
                },
                WriteHalf::Tls(shared),
            )
        }
    })
}
