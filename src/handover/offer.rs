//! The old side of a handover: the Unix socket at `--handover-socket PATH`, created at start
//! (mode 0600, and only a peer of this process's user is answered), and the thread that
//! serves it: one handover at a time, each offered copies of this process's listening
//! sockets; the first new process that says `stop` ends the offer, and the callback the
//! server gave tells the rest of the process to shut down.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::channel::Channel;
use super::{Greeting, HandoverError, Listeners, PROTOCOL, STOP, STOPPING};

/// How long the new process may take to greet.
const GREETING_WAIT: Duration = Duration::from_secs(5);

/// How long the new process may take, once it has the sockets, to say `stop` (it builds its
/// engine meanwhile, when it has no data directory to wait for): longer, and the offer is
/// withdrawn and this process goes on alone.
const STOP_WAIT: Duration = Duration::from_secs(120);

/// The handover socket of a running process.
#[derive(Debug)]
pub struct Offer {
    path: PathBuf,
    /// The socket file it made (device, inode): removed at shutdown only if still there.
    id: (u64, u64),
}

/// What became of one handover.
enum Served {
    /// The new process took the sockets and said `stop`.
    Stopped {
        /// The new process.
        pid: u32,
        /// Kept open until this process exits (the new one sees its end then).
        channel: Channel,
    },
    /// It went away or misbehaved first: nothing changed here.
    Abandoned(String),
}

impl Offer {
    /// Creates the socket at `path` and serves handovers of `listeners` (copies of this
    /// process's) from a thread of its own; `stopped(pid)` runs on that thread when the new
    /// process `pid` said `stop`. A live socket at `path` is [`HandoverError::InUse`]
    /// unless `replace` (the process taking over replaces the one it took from); a stale
    /// one (nothing answers) is replaced.
    pub fn start(
        path: &Path,
        replace: bool,
        listeners: Listeners,
        stopped: Box<dyn FnOnce(u32) + Send>,
    ) -> Result<Offer, HandoverError> {
        let bind_err = |source| HandoverError::Bind {
            path: path.to_path_buf(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(m) if !m.file_type().is_socket() => {
                return Err(bind_err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists and is not a socket",
                )))
            }
            Ok(_) => {
                if !replace && Offer::in_use(path) {
                    return Err(HandoverError::InUse {
                        path: path.to_path_buf(),
                    });
                }
                std::fs::remove_file(path).map_err(bind_err)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(bind_err(e)),
        }
        let listener = UnixListener::bind(path).map_err(bind_err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
        let m = std::fs::symlink_metadata(path).map_err(bind_err)?;
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("handover".into())
            .spawn(move || serve(listener, listeners, stopped, &shown))
            .map_err(bind_err)?;
        Ok(Offer {
            path: path.to_path_buf(),
            id: (m.dev(), m.ino()),
        })
    }

    /// Whether a live process serves the socket at `path` (something accepts there).
    pub fn in_use(path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
            && UnixStream::connect(path).is_ok()
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket file, unless another process's replaced it (a normal shutdown;
    /// after a handover the next process's socket is there).
    pub fn remove(&self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// The handover thread: one new process at a time, until one says `stop`.
fn serve(
    listener: UnixListener,
    listeners: Listeners,
    stopped: Box<dyn FnOnce(u32) + Send>,
    path: &str,
) {
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                log::warn!(error:% = e; "handover socket {path}: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        match serve_one(Channel::new(stream), &listeners) {
            Served::Stopped { pid, mut channel } => {
                log::info!(
                    handover = "stopping", new_pid = pid;
                    "handover: process {pid} has taken the listeners; no longer accepting, \
                     closing the clients (1001)"
                );
                drop(listeners);
                stopped(pid);
                let _ = channel.set_timeout(None);
                // Until this process exits (or the new one closes its end).
                while let Ok(Some(_)) = channel.recv() {}
                return;
            }
            Served::Abandoned(why) => {
                log::warn!(handover = "abandoned"; "handover abandoned: {why}; still serving");
            }
        }
    }
}

/// One handover: greeting, sockets, then `stop` or not.
fn serve_one(mut ch: Channel, listeners: &Listeners) -> Served {
    let abandoned = |what: &str, e: io::Error| Served::Abandoned(format!("{what}: {e}"));
    match peer_uid(ch.stream()) {
        // SAFETY: geteuid takes no arguments and cannot fail.
        Ok(uid) if uid == unsafe { libc::geteuid() } => {}
        Ok(uid) => return Served::Abandoned(format!("refused a peer of uid {uid}")),
        Err(e) => return abandoned("peer credentials", e),
    }
    if let Err(e) = ch.set_timeout(Some(GREETING_WAIT)) {
        return abandoned("timeout", e);
    }
    let pid = match ch.recv() {
        Ok(Some(line)) => match parse_take(&line.text) {
            Some(pid) => pid,
            None => return Served::Abandoned(format!("not a takeover: {:?}", line.text)),
        },
        Ok(None) => return Served::Abandoned("the peer closed at once".into()),
        Err(e) => return abandoned("reading the greeting", e),
    };
    let greeting = Greeting {
        pid: std::process::id(),
        plain: listeners.plain.len(),
        tls: listeners.tls.len(),
        admin: listeners.admin.is_some(),
    };
    let fds: Vec<BorrowedFd<'_>> = listeners
        .plain
        .iter()
        .chain(&listeners.tls)
        .chain(&listeners.admin)
        .map(AsFd::as_fd)
        .collect();
    if let Err(e) = ch.send(&greeting.line(), &fds) {
        return abandoned("sending the listeners", e);
    }
    log::info!(
        handover = "offered", new_pid = pid, sockets = fds.len();
        "handover: {} listening sockets handed to process {pid}; waiting for it to say stop",
        fds.len()
    );
    if let Err(e) = ch.set_timeout(Some(STOP_WAIT)) {
        return abandoned("timeout", e);
    }
    match ch.recv() {
        Ok(Some(line)) if line.text == STOP => {}
        Ok(Some(line)) => return Served::Abandoned(format!("process {pid} said {:?}", line.text)),
        Ok(None) => {
            return Served::Abandoned(format!(
                "process {pid} went away before asking this one to stop"
            ))
        }
        Err(e) => return abandoned(&format!("waiting for process {pid}"), e),
    }
    if let Err(e) = ch.send(STOPPING, &[]) {
        // It asked: stop anyway (it may have died just after; then the supervisor starts
        // another, and the sockets it held are gone with it).
        log::warn!("handover: could not answer process {pid}: {e}");
    }
    Served::Stopped { pid, channel: ch }
}

/// The pid in a `take` line.
fn parse_take(line: &str) -> Option<u32> {
    line.strip_prefix(PROTOCOL)?
        .strip_prefix(" take pid=")?
        .trim()
        .parse()
        .ok()
}

/// The user id of the process at the other end (`SO_PEERCRED`).
fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (the size of `cred`, a live local) to
    // `cred` and its length to `len`; the fd is owned by `stream`, alive for the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(cred.uid)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_line_names_its_pid() {
        assert_eq!(parse_take(&super::super::take_line(77)), Some(77));
        assert_eq!(parse_take("walletrelay-handover 1 take pid=x"), None);
        assert_eq!(parse_take("GET / HTTP/1.1"), None);
    }
}
