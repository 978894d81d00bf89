//! Containers for the deploy tests: podman (installed as root with `apt-get` when missing;
//! the test skips via [`super::skip`] when it cannot be), the images `scripts/images` makes
//! (the walletrelay image built from `./Containerfile` once per tree state), and a running
//! container ([`Container`]) seen as a [`Server`] on loopback ports ([`Net`]: the host's
//! network, or the image's ports published), removed on drop, with its named volume
//! ([`Volume`], removed on drop too).
//!
//! Always `podman --runtime runc` with the ulimits this machine allows
//! (`../shared/notes/containers.md`, docs/DEPLOY.md). It must not reach into the server's
//! code: everything goes through podman, the container's ports and its log.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::wait::poll;
use super::Server;

/// The ulimits every `podman run` here needs (podman's defaults are refused on this machine).
pub const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=20000:20000",
    "--ulimit",
    "nproc=1000:1000",
];

/// `podman --runtime runc ARGS`, not run yet.
pub fn podman(args: &[&str]) -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc"]).args(args);
    c
}

/// Runs `podman ARGS` to its end; panics with its output unless it exited 0. Returns stdout.
pub fn podman_ok(args: &[&str]) -> String {
    let out = run(podman(args));
    assert!(
        out.status.success(),
        "podman {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn run(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().expect("run podman")
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Podman and runc are there (installed with `apt-get` when missing and this is root), and
/// the images can be made (root: `scripts/images` imports a debootstrap base). `Err` says why
/// not, for [`super::skip::skip`].
pub fn available() -> Result<(), String> {
    if !is_root() {
        return Err("building and running the image here needs root (rootful podman)".into());
    }
    for (bin, package) in [
        ("podman", "podman"),
        ("runc", "runc"),
        ("debootstrap", "debootstrap"),
    ] {
        super::apt::tool(bin, package)?;
    }
    Ok(())
}

/// Builds (or finds, when the tree has not changed) the walletrelay image with
/// `scripts/images walletrelay TAG`; returns the tag.
pub fn walletrelay_image(tag: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/images");
    let out = Command::new(script)
        .args(["walletrelay", tag])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/images");
    assert!(
        out.status.success(),
        "scripts/images walletrelay {tag}: {}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A name no other test (nor another run) uses: `walletrelay-test-<pid>-<n>-<what>`.
pub fn unique_name(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("walletrelay-test-{}-{n}-{what}", std::process::id())
}

/// A named podman volume, removed on drop.
pub struct Volume {
    /// Its name (`-v NAME:/var/lib/walletrelay`).
    pub name: String,
}

impl Volume {
    /// A new, empty volume.
    pub fn new(what: &str) -> Volume {
        let name = unique_name(what);
        podman_ok(&["volume", "create", &name]);
        Volume { name }
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = run(podman(&["volume", "rm", "-f", &self.name]));
    }
}

/// How a container's ports reach the test.
#[derive(Clone, Copy, Debug)]
pub enum Net {
    /// `--network host`: the server's own `--listen` / `--admin-listen` (loopback ports of
    /// the test's) are the addresses.
    Host,
    /// Podman's default network, the image's ports 8080 and 9091 published on these
    /// loopback ports (`-p 127.0.0.1:PUBLIC:8080 -p 127.0.0.1:ADMIN:9091`).
    Publish {
        /// The host port of 8080.
        public: u16,
        /// The host port of 9091.
        admin: u16,
    },
}

/// A container of the image, started with `podman run` in the foreground (its stdout and
/// stderr are the server's); removed (`podman rm -f`) on drop.
pub struct Container {
    /// Its name.
    pub name: String,
    /// The server it runs, on its loopback ports (the child is the `podman run` process).
    pub server: Server,
    /// Its stderr (the server's log) so far.
    log: Arc<Mutex<String>>,
}

impl Container {
    /// `podman run --name NAME NET OPTS IMAGE ARGS`, waiting until the server printed that it
    /// listens (on the admin address too when `args` is empty, the image's default arguments,
    /// or has `--admin-listen`).
    pub fn run(image: &str, what: &str, net: Net, opts: &[&str], args: &[&str]) -> Container {
        let name = unique_name(what);
        let mut cmd = podman(&["run", "--name", &name]);
        match net {
            Net::Host => {
                cmd.args(["--network", "host"]);
            }
            Net::Publish { public, admin } => {
                cmd.arg("-p")
                    .arg(format!("127.0.0.1:{public}:8080"))
                    .arg("-p")
                    .arg(format!("127.0.0.1:{admin}:9091"));
            }
        }
        cmd.args(ULIMITS).args(opts).arg(image).args(args);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn podman run");
        let log = Arc::new(Mutex::new(String::new()));
        let keep = Arc::clone(&log);
        let err = child.stderr.take().expect("stderr");
        let shown = name.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[{shown}] {line}");
                let mut l = keep.lock().unwrap_or_else(|e| e.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        let admin = args.is_empty() || args.contains(&"--admin-listen");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let (mut addr, mut admin_addr) = (None::<SocketAddr>, None::<SocketAddr>);
        while addr.is_none() || (admin && admin_addr.is_none()) {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(200));
                let _ = run(podman(&["rm", "-f", &name]));
                panic!(
                    "the container exited before listening:\n{}",
                    log.lock().unwrap_or_else(|e| e.into_inner())
                );
            };
            if let Some(rest) = line.strip_prefix("walletrelay listening on ") {
                addr = Some(rest.trim().parse().expect("address"));
            } else if let Some(rest) = line.strip_prefix("walletrelay admin listening on ") {
                admin_addr = Some(rest.trim().parse().expect("admin address"));
            }
        }
        std::thread::spawn(move || for _ in lines {});
        if let Net::Publish { public, admin } = net {
            addr = Some(SocketAddr::from(([127, 0, 0, 1], public)));
            admin_addr = Some(SocketAddr::from(([127, 0, 0, 1], admin)));
        }
        let mut server = Server::adopt(addr.expect("address"), child);
        server.admin_addr = admin_addr;
        Container { name, server, log }
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits (at most `within`) until the log has a line containing `needle`; returns it.
    pub fn wait_log(&self, needle: &str, within: Duration) -> Option<String> {
        poll(within, || {
            self.log()
                .lines()
                .find(|l| l.contains(needle))
                .map(str::to_string)
        })
    }

    /// `podman inspect --format FORMAT NAME`.
    pub fn inspect(&self, format: &str) -> String {
        podman_ok(&["inspect", "--format", format, &self.name])
    }

    /// `podman kill -s SIGNAL NAME` (`HUP`, `KILL`, ...).
    pub fn kill(&self, signal: &str) {
        podman_ok(&["kill", "-s", signal, &self.name]);
    }

    /// Waits until the container exited (the foreground `podman run` with it); returns its
    /// exit code as podman recorded it.
    pub fn wait_exit(&mut self, within: Duration) -> i32 {
        let child = &mut self.server.child;
        poll(within, || child.try_wait().expect("try_wait podman run"))
            .expect("the container did not exit");
        self.inspect("{{.State.ExitCode}}")
            .parse()
            .expect("exit code")
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = run(podman(&["rm", "-f", "-t", "0", &self.name]));
    }
}
