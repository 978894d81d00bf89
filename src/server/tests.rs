//! `server.rs`'s unit tests: socket options set on the listeners and inherited by accepted
//! connections.

use super::edge::bind;
use super::*;
use clap::Parser;
use std::io::Write;
use std::os::fd::AsRawFd;

fn int_opt(sock: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
    let mut v: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes to `v`, a live local c_int, and
    // its length to `len`; the fd is owned by `sock`, which outlives the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    v
}

/// The per-connection options are set only on the listener (no setsockopt per
/// accepted connection): this checks that the kernel really hands them down.
#[test]
fn accepted_connections_inherit_the_listeners_options() {
    for (sndbuf, lowat) in [(96 << 10, 12 << 10), (200 << 10, 20 << 10)] {
        let config = Config::parse_from([
            "walletrelay",
            "--listen",
            "127.0.0.1:0",
            "--sndbuf",
            &sndbuf.to_string(),
            "--notsent-lowat",
            &lowat.to_string(),
        ]);
        let listener = bind(config.listen.unwrap(), &config).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        client.write_all(b"x").unwrap();
        let mut accepted = None;
        for _ in 0..1000 {
            match listener.accept() {
                Ok((s, _)) => {
                    accepted = Some(s);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        let s = accepted.expect("no connection accepted");
        assert_eq!(int_opt(&s, libc::IPPROTO_TCP, libc::TCP_NODELAY), 1);
        // The kernel doubles SO_SNDBUF for its bookkeeping.
        assert_eq!(
            int_opt(&s, libc::SOL_SOCKET, libc::SO_SNDBUF),
            2 * sndbuf as libc::c_int
        );
        assert_eq!(
            int_opt(&s, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT),
            lowat as libc::c_int
        );
    }
}
