//! The new side of a handover (`--take-over`): connects to the old process's handover
//! socket, receives its listening sockets and checks them, and, when the server says it
//! has what it needs, tells the old process to stop.

use std::io;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use socket2::{Socket, Type};

use super::channel::Channel;
use super::{take_line, Greeting, HandoverError, Listeners, STOP, STOPPING};

/// How long the old process may take to answer a line.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// A handover in progress: the sockets are taken, the old process still serves.
#[derive(Debug)]
pub struct Takeover {
    channel: Channel,
    path: PathBuf,
    /// The old process.
    pid: u32,
}

/// Takes the listening sockets of the process serving `path`; it keeps serving (and
/// accepting) until [`Takeover::stop`]. Dropping the [`Takeover`] before that gives up.
pub fn take(path: &Path) -> Result<(Takeover, Listeners), HandoverError> {
    let io_err = |what| {
        move |source| HandoverError::Io {
            path: path.to_path_buf(),
            what,
            source,
        }
    };
    let stream = UnixStream::connect(path).map_err(|source| HandoverError::Absent {
        path: path.to_path_buf(),
        source,
    })?;
    let mut channel = Channel::new(stream);
    channel
        .set_timeout(Some(ANSWER_WAIT))
        .map_err(io_err("setting a timeout"))?;
    channel
        .send(&take_line(std::process::id()), &[])
        .map_err(io_err("greeting the old process"))?;
    let line = match channel.recv() {
        Ok(Some(line)) => line,
        Ok(None) => {
            return Err(HandoverError::NotWalletrelay {
                path: path.to_path_buf(),
                answer: String::new(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return Err(HandoverError::NotWalletrelay {
                path: path.to_path_buf(),
                answer: format!("<{e}>"),
            })
        }
        Err(e) => return Err(io_err("reading the old process's answer")(e)),
    };
    let Some(greeting) = Greeting::parse(&line.text) else {
        return Err(HandoverError::NotWalletrelay {
            path: path.to_path_buf(),
            answer: line.text.chars().take(200).collect(),
        });
    };
    let bad = |why: String| HandoverError::BadSockets {
        path: path.to_path_buf(),
        pid: greeting.pid,
        why,
    };
    if line.fds.len() != greeting.sockets() {
        return Err(bad(format!(
            "{} announced, {} received",
            greeting.sockets(),
            line.fds.len()
        )));
    }
    let mut sockets = Vec::with_capacity(line.fds.len());
    for fd in line.fds {
        sockets.push(listening_tcp(fd).map_err(&bad)?);
    }
    let mut rest = sockets.into_iter();
    let listeners = Listeners {
        plain: rest.by_ref().take(greeting.plain).collect(),
        tls: rest.by_ref().take(greeting.tls).collect(),
        admin: rest.next(),
    };
    Ok((
        Takeover {
            channel,
            path: path.to_path_buf(),
            pid: greeting.pid,
        },
        listeners,
    ))
}

/// `fd` as a `TcpListener`, if it is a listening TCP socket.
fn listening_tcp(fd: OwnedFd) -> Result<TcpListener, String> {
    let s = Socket::from(fd);
    let ok = s.r#type().map_err(|e| e.to_string())? == Type::STREAM
        && s.local_addr()
            .map_err(|e| e.to_string())?
            .as_socket()
            .is_some()
        && s.is_listener().map_err(|e| e.to_string())?;
    if !ok {
        return Err("a descriptor is not a listening TCP socket".into());
    }
    Ok(s.into())
}

impl Takeover {
    /// The old process's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Tells the old process to stop: it stops accepting, closes its clients (1001),
    /// releases its data directory and exits. From here on the sockets are this process's
    /// alone to serve.
    pub fn stop(&mut self) -> Result<(), HandoverError> {
        let io_err = |what| {
            let path = self.path.clone();
            move |source| HandoverError::Io { path, what, source }
        };
        self.channel
            .send(STOP, &[])
            .map_err(io_err("telling the old process to stop"))?;
        match self.channel.recv() {
            Ok(Some(line)) if line.text == STOPPING => Ok(()),
            Ok(Some(line)) => Err(HandoverError::NotWalletrelay {
                path: self.path.clone(),
                answer: line.text,
            }),
            Ok(None) => Err(io_err("the old process's answer to stop")(
                io::ErrorKind::UnexpectedEof.into(),
            )),
            Err(e) => Err(io_err("the old process's answer to stop")(e)),
        }
    }
}
