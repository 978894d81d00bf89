//! Stalled subscribers (`pairs --stalled N`): connections that subscribe to the run's topics
//! and then never read again, with a small receive buffer, so that the server's queue for
//! them fills up while the measured connections keep going. Compare a run with and without
//! them, side by side, to see what stalled clients cost everyone else.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use super::RunError;
use crate::cli::Target;
use crate::{proto, upgrade};

/// Receive buffer of a stalled connection: small, so it stops taking data soon.
const RCVBUF: usize = 4096;

/// Opens `n` connections, subscribes connection `i` to `topics[i % topics.len()]` (with
/// `rpc`'s subscribe, upgrading with `queries[i]` if given), and returns them; they are never
/// read again. Blocking, one at a time (setup only).
pub fn open(
    target: &Target,
    topics: &[String],
    n: usize,
    rpc: proto::Rpc,
    queries: &[String],
) -> Result<Vec<TcpStream>, RunError> {
    let mut conns = Vec::with_capacity(n);
    if topics.is_empty() {
        return Ok(conns);
    }
    for i in 0..n {
        let topic = &topics[i % topics.len()];
        conns.push(
            open_one(
                &target.addr,
                target,
                topic,
                rpc,
                queries.get(i).map(String::as_str),
            )
            .map_err(|e| RunError::Setup(format!("stalled connection {i}: {e}")))?,
        );
    }
    Ok(conns)
}

fn open_one(
    addr: &SocketAddr,
    target: &Target,
    topic: &str,
    rpc: proto::Rpc,
    query: Option<&str>,
) -> std::io::Result<TcpStream> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    // Before connect, so the advertised window stays small.
    sock.set_recv_buffer_size(RCVBUF)?;
    sock.connect_timeout(&(*addr).into(), Duration::from_secs(5))?;
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(&upgrade::upgrade_request(
        &target.host,
        &target.path,
        query,
        false,
    ))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let start = loop {
        let k = s.read(&mut chunk)?;
        if k == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..k]);
        match upgrade::parse_upgrade_response(&buf, false) {
            Ok(Some(n)) => break n,
            Ok(None) => continue,
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        }
    };
    let mut frame = Vec::new();
    proto::write_subscribe(&mut frame, rpc, 1, topic);
    s.write_all(&frame)?;
    // Wait for the subscription's answer, so the subscription exists before the run starts.
    buf.drain(..start);
    while memchr::memmem::find(&buf, b"\"result\"").is_none() {
        let k = s.read(&mut chunk)?;
        if k == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..k]);
        if buf.len() > 64 * 1024 {
            return Err(std::io::Error::other("no answer to the subscribe"));
        }
    }
    Ok(s)
}
