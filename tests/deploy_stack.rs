//! The stack of `deploy/compose.yaml`, run as written with podman-compose (issue 54, item 2):
//! Redis, two relays built from the repository's `Containerfile`, HAProxy in TCP mode in front of
//! them, Prometheus scraping their admin addresses. The test
//! - makes the images it needs when they are missing: the walletrelay image with
//!   `scripts/images walletrelay` (or the image named by `WALLETRELAY_TEST_IMAGE`), the stand-ins
//!   for the upstream Redis, HAProxy and Prometheus images with `scripts/stack-images` (no
//!   registry is reachable here);
//! - starts the file under a project name of its own, with an override that only names the
//!   walletrelay image and the host ports (free loopback ports, through the file's
//!   `*_PUBLISH` variables); the stack's network, DNS, volumes and health checks are the
//!   file's (the relays': the image's);
//! - waits until HAProxy reports both relays up (its checks on `/ready`), the services' health
//!   checks (`walletrelay probe`, `redis-cli ping`) pass and Prometheus has scraped both relays;
//! - runs today's SDK (sign-client 2.25.0, `tests/e2e-sdk/sdk.mjs` SCENARIO=failover) through
//!   HAProxy's port: pairing and a request; then, reading which relay holds the most of the
//!   SDK's sockets from each relay's `walletrelay_connections_open` on its admin port, it
//!   drains that relay (`walletrelay drain` in its container: HAProxy marks it down while it
//!   still serves the SDK's socket, a new connection goes to the other relay), `podman stop`s
//!   it (SIGTERM: its clients closed with 1001, exit 0), and
//!   later, with it started again, `podman kill`s (SIGKILL) the one holding the sockets then;
//!   each time the SDK's cut clients reconnect through HAProxy to the other relay and one more
//!   request gets its answer;
//! - sees Prometheus mark the killed relay down and the other up (and Prometheus load the
//!   alert rules when `deploy/prometheus/rules.yml` exists); the killed relay, started again,
//!   is checked up by HAProxy again;
//! - takes the stack down (`podman-compose down -v`, then its network), also when it fails.
//!
//! Needs root: podman, runc, podman-compose, aardvark-dns and debootstrap are installed with
//! apt-get when missing (the test is skipped, said out loud, when that cannot be done), and
//! Node.js with npm for the SDK.
//! Containers run with runc and the limits this machine allows, through a `containers.conf` of
//! the test's own (`CONTAINERS_CONF`). Every wait is bounded; no timing is asserted.

mod common;

use common::node;
use common::skip::skip;
use common::wait::poll_every;
use common::TempDir;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// The SDK package whose presence means `npm ci` has run.
const MARKER: &str = "@walletconnect/sign-client";

/// Upper bound for the SDK script (its own timeout is 120 s).
const SCRIPT_DEADLINE: Duration = Duration::from_secs(180);

/// Upper bound for a stack-wide wait: the relays up behind HAProxy, a Prometheus scrape (every
/// 15 s in `deploy/prometheus.yml`).
const STACK_WAIT: Duration = Duration::from_secs(120);

/// What podman needs on this machine (docs: ../shared/notes/containers.md): runc (crun refuses
/// the cgroup layout) and limits below the hard ones (podman's defaults are refused).
const CONTAINERS_CONF: &str = "[containers]\n\
    default_ulimits = [\"nofile=20000:20000\", \"nproc=1000:1000\"]\n\
    [engine]\n\
    runtime = \"runc\"\n";

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The Debian packages the test needs, each with how to tell it is installed: podman and runc,
/// podman-compose, netavark's DNS (the services find each other by name), debootstrap (for
/// `scripts/images base` on a machine without the base image).
const PACKAGES: [(&str, Present); 5] = [
    ("podman", Present::Tool("podman")),
    ("runc", Present::Tool("runc")),
    ("podman-compose", Present::Tool("podman-compose")),
    (
        "aardvark-dns",
        Present::File("/usr/lib/podman/aardvark-dns"),
    ),
    ("debootstrap", Present::Tool("debootstrap")),
];

/// How to tell that a package is installed.
enum Present {
    /// This program answers `--version`.
    Tool(&'static str),
    /// This file exists.
    File(&'static str),
}

impl Present {
    fn holds(&self) -> bool {
        match self {
            Present::Tool(t) => have(t),
            Present::File(f) => Path::new(f).exists(),
        }
    }
}

/// The [`PACKAGES`] not installed.
fn missing_packages() -> Vec<&'static str> {
    PACKAGES
        .iter()
        .filter(|(_, present)| !present.holds())
        .map(|(p, _)| *p)
        .collect()
}

/// [`PACKAGES`], installed with apt-get when missing; `Err` says why they are not (the test
/// is then skipped).
fn ensure_tools() -> Result<(), String> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(());
    }
    let install: Vec<&str> = ["install", "-y"].into_iter().chain(missing).collect();
    // SAFETY: geteuid(2) has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!("not root, cannot apt-get {}", install.join(" ")));
    }
    eprintln!("deploy_stack: apt-get {}", install.join(" "));
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    // A fresh machine may need the package lists first.
    if !(apt(&install) || (apt(&["update"]) && apt(&install))) {
        return Err(format!("apt-get {} failed", install.join(" ")));
    }
    match missing_packages().as_slice() {
        [] => Ok(()),
        left => Err(format!("still missing after apt-get: {}", left.join(", "))),
    }
}

/// Runs `cmd` and returns its output; panics naming `what` unless it exited 0.
fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {cmd:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The walletrelay image to run: `WALLETRELAY_TEST_IMAGE` when set (an image already in the
/// store), else what `scripts/images walletrelay` built from `./Containerfile` (its last line).
fn walletrelay_image(conf: &Path) -> String {
    if let Some(image) = std::env::var("WALLETRELAY_TEST_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
    {
        return image;
    }
    let out = run(
        Command::new(root().join("scripts/images"))
            .arg("walletrelay")
            .env("CONTAINERS_CONF", conf)
            .current_dir(root()),
        "scripts/images walletrelay (the image from ./Containerfile)",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .expect("scripts/images walletrelay printed no tag")
}

/// A loopback port nothing listens on now (bound, then let go).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("addr").port()
}

/// `GET url`, its body when the answer is 2xx.
fn http_get(url: &str) -> Option<String> {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .new_agent();
    agent.get(url).call().ok()?.body_mut().read_to_string().ok()
}

/// A running project of `deploy/compose.yaml`; taken down on drop.
struct Stack {
    /// The compose project name (containers, volumes and network are named after it).
    project: String,
    /// The test's override file (image and host ports) and `containers.conf`.
    dir: TempDir,
    /// The walletrelay image both relays run.
    image: String,
    /// Host ports: HAProxy's relay port, its stats page, Prometheus.
    relay_port: u16,
    stats_port: u16,
    prometheus_port: u16,
    /// Whether `down` ran already.
    down: bool,
}

impl Stack {
    /// The images (made when missing), then `podman-compose up -d` of the file.
    fn up() -> Stack {
        let dir = TempDir::new("deploy-stack");
        let conf = dir.join("containers.conf");
        std::fs::write(&conf, CONTAINERS_CONF).expect("write containers.conf");
        run(
            Command::new(root().join("scripts/stack-images"))
                .env("CONTAINERS_CONF", &conf)
                .current_dir(root()),
            "scripts/stack-images (the stand-ins for the upstream images)",
        );
        let image = walletrelay_image(&conf);
        let project = std::env::var("DEPLOY_STACK_PROJECT")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("walletrelay-stack-{}", std::process::id()));
        std::fs::write(
            dir.join("override.yaml"),
            format!(
                "# tests/deploy_stack.rs: the image under test\n\
                 services:\n  relay-1:\n    image: {image}\n  relay-2:\n    image: {image}\n"
            ),
        )
        .expect("write the override");
        let mut stack = Stack {
            project,
            dir,
            image,
            relay_port: free_port(),
            stats_port: free_port(),
            prometheus_port: free_port(),
            down: false,
        };
        eprintln!(
            "deploy_stack: project {}, image {}, HAProxy on 127.0.0.1:{}, stats {}, Prometheus {}",
            stack.project, stack.image, stack.relay_port, stack.stats_port, stack.prometheus_port
        );
        // A project of that name left over by a killed run would be reused: start clean.
        stack.down_quietly();
        stack.down = false;
        run(
            stack.compose().args(["up", "-d", "--no-build"]),
            "podman-compose up -d",
        );
        stack
    }

    /// `podman-compose -p PROJECT -f deploy/compose.yaml -f OVERRIDE` with the environment.
    fn compose(&self) -> Command {
        let mut cmd = Command::new("podman-compose");
        cmd.arg("-p")
            .arg(&self.project)
            .arg("-f")
            .arg(root().join("deploy/compose.yaml"))
            .arg("-f")
            .arg(self.dir.join("override.yaml"))
            .current_dir(root());
        self.env(&mut cmd);
        cmd
    }

    /// The environment of every podman command: the test's containers.conf, the host ports.
    fn env<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env(
                "WALLETRELAY_PUBLISH",
                format!("127.0.0.1:{}", self.relay_port),
            )
            .env(
                "HAPROXY_STATS_PUBLISH",
                format!("127.0.0.1:{}", self.stats_port),
            )
            .env(
                "PROMETHEUS_PUBLISH",
                format!("127.0.0.1:{}", self.prometheus_port),
            )
    }

    fn podman(&self) -> Command {
        let mut cmd = Command::new("podman");
        self.env(&mut cmd);
        cmd
    }

    /// The ids of `service`'s containers (by the compose labels, whatever the naming scheme).
    fn containers_of(&self, service: &str) -> Vec<String> {
        let out = self
            .podman()
            .args(["ps", "-a", "-q", "--filter"])
            .arg(format!("label=com.docker.compose.project={}", self.project))
            .arg("--filter")
            .arg(format!("label=com.docker.compose.service={service}"))
            .output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
    }

    /// The id of `service`'s one container.
    fn container(&self, service: &str) -> String {
        let ids = self.containers_of(service);
        assert_eq!(ids.len(), 1, "containers of service {service}: {ids:?}");
        ids[0].clone()
    }

    /// `service`'s address on the stack's network (reachable from the host: rootful bridge).
    fn ip(&self, service: &str) -> String {
        let out = run(
            self.podman().args([
                "inspect",
                "--format",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                &self.container(service),
            ]),
            "podman inspect",
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_else(|| panic!("{service} has no address"))
            .to_string()
    }

    /// HAProxy's view of the relays: (server, status) from its stats page.
    fn haproxy_servers(&self) -> Option<Vec<(String, String)>> {
        let csv = http_get(&format!("http://127.0.0.1:{}/stats;csv", self.stats_port))?;
        let header: Vec<&str> = csv
            .lines()
            .next()?
            .trim_start_matches("# ")
            .split(',')
            .collect();
        let col = |name: &str| header.iter().position(|h| *h == name);
        let (px, sv, st) = (col("pxname")?, col("svname")?, col("status")?);
        Some(
            csv.lines()
                .skip(1)
                .map(|l| l.split(',').collect::<Vec<_>>())
                .filter(|f| f.len() > st && f[px] == "walletrelay" && f[sv].starts_with("relay-"))
                .map(|f| (f[sv].to_string(), f[st].to_string()))
                .collect(),
        )
    }

    /// Waits (bounded) until HAProxy's checks have both relays `UP`; whether they came.
    fn wait_both_up(&self) -> bool {
        let both_up =
            |s: &[(String, String)]| s.len() == 2 && s.iter().all(|(_, status)| status == "UP");
        let every = Duration::from_millis(500);
        poll_every(every, STACK_WAIT, || {
            self.haproxy_servers().filter(|s| both_up(s))
        })
        .is_some()
    }

    /// The drain of a deploy, without a timing: `walletrelay drain` (`POST /drain`, what a
    /// `preStop` hook runs) in `relay`'s container; HAProxy then marks it down while it still
    /// serves the SDK's sockets, and a new connection through HAProxy goes to the other relay.
    fn drain(&self, relay: &str) {
        let other = if relay == "relay-1" {
            "relay-2"
        } else {
            "relay-1"
        };
        let held = self.connections_open(relay);
        run(
            self.podman().args([
                "exec",
                &self.container(relay),
                "/usr/local/bin/walletrelay",
                "drain",
                "127.0.0.1:9091",
            ]),
            &format!("walletrelay drain in {relay}"),
        );
        let down = poll_every(Duration::from_millis(500), STACK_WAIT, || {
            let servers = self.haproxy_servers()?;
            servers
                .iter()
                .any(|(s, st)| s == relay && st == "DOWN")
                .then_some(servers)
        });
        assert!(
            down.is_some(),
            "HAProxy never marked the draining {relay} down: {:?}",
            self.haproxy_servers()
        );
        assert_eq!(
            self.connections_open(relay),
            held,
            "the draining {relay} no longer serves the SDK's sockets"
        );
        let before = self.connections_open(other);
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", self.relay_port))
            .expect("connect through HAProxy");
        conn.set_read_timeout(Some(common::READ_TIMEOUT)).unwrap();
        std::io::Write::write_all(&mut conn, common::http::get("/health").as_bytes()).unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while common::http::head_end(&head).is_none() {
            let n = std::io::Read::read(&mut conn, &mut buf).expect("read through HAProxy");
            assert!(
                n > 0,
                "HAProxy closed a new connection while {relay} drained"
            );
            head.extend_from_slice(&buf[..n]);
        }
        assert_eq!(
            self.connections_open(other),
            before + 1.0,
            "a new connection through HAProxy did not go to {other} while {relay} drained"
        );
        eprintln!(
            "deploy_stack: {relay} draining: HAProxy marked it down, it still holds {held} \
             socket(s), a new connection went to {other}"
        );
    }

    /// Starts `relay`'s stopped container again and waits until HAProxy finds it (through the
    /// network's DNS, at whatever address it got) and checks it up.
    fn restart(&self, relay: &str) {
        run(
            self.podman().args(["start", &self.container(relay)]),
            &format!("podman start {relay}"),
        );
        assert!(
            self.wait_both_up(),
            "HAProxy never saw {relay} UP again after its restart: {:?}",
            self.haproxy_servers()
        );
    }

    /// A Prometheus instant query's result vector.
    fn prometheus_query(&self, query: &str) -> Option<Vec<Value>> {
        let body = http_get(&format!(
            "http://127.0.0.1:{}/api/v1/query?query={}",
            self.prometheus_port,
            encode(query)
        ))?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"].as_array().cloned()
    }

    /// `up{job="walletrelay"}` per relay service (`relay-1` -> 1.0).
    fn prometheus_up(&self) -> Vec<(String, f64)> {
        let mut up: Vec<(String, f64)> = self
            .prometheus_query("up{job=\"walletrelay\"}")
            .unwrap_or_default()
            .iter()
            .filter_map(|s| {
                let instance = s["metric"]["instance"].as_str()?;
                let value = s["value"][1].as_str()?.parse().ok()?;
                Some((instance.split(':').next()?.to_string(), value))
            })
            .collect();
        up.sort_by(|a, b| a.0.cmp(&b.0));
        up
    }

    /// The relay holding the most of the SDK's sockets (its `walletrelay_connections_open`);
    /// fails the test when neither holds one.
    fn busiest(&self) -> &'static str {
        let open: Vec<(&'static str, f64)> = ["relay-1", "relay-2"]
            .into_iter()
            .map(|s| (s, self.connections_open(s)))
            .collect();
        eprintln!("deploy_stack: the SDK's sockets per relay: {open:?}");
        let (busiest, n) =
            open.iter()
                .copied()
                .fold(("relay-1", -1.0), |a, b| if b.1 > a.1 { b } else { a });
        assert!(n >= 1.0, "no relay holds an SDK socket: {open:?}");
        busiest
    }

    /// The sum of `walletrelay_connections_open` on `service`'s admin address.
    fn connections_open(&self, service: &str) -> f64 {
        let url = format!("http://{}:9091/metrics", self.ip(service));
        let text = http_get(&url).unwrap_or_else(|| panic!("GET {url}"));
        text.lines()
            .filter(|l| l.starts_with("walletrelay_connections_open"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The last lines each container logged (for a failure's message).
    fn logs(&self) -> String {
        let mut all = String::new();
        for service in ["redis", "relay-1", "relay-2", "haproxy", "prometheus"] {
            for id in self.containers_of(service) {
                if let Ok(l) = self.podman().args(["logs", "--tail", "25", &id]).output() {
                    all.push_str(&format!(
                        "--- {service} ---\n{}{}",
                        String::from_utf8_lossy(&l.stdout),
                        String::from_utf8_lossy(&l.stderr)
                    ));
                }
            }
        }
        all
    }

    /// `podman-compose down -v` and the project's network (podman-compose 1.0.3 leaves it);
    /// returns what is left of the project afterwards (containers, volumes, network).
    fn down_quietly(&mut self) -> Vec<String> {
        self.down = true;
        let _ = self.compose().args(["down", "-v"]).output();
        let network = format!("{}_default", self.project);
        let _ = self
            .podman()
            .args(["network", "rm", "-f", &network])
            .output();
        let label = format!("label=io.podman.compose.project={}", self.project);
        let mut left = Vec::new();
        for what in [
            vec!["ps", "-a", "-q", "--filter", &label],
            vec!["volume", "ls", "-q", "--filter", &label],
        ] {
            if let Ok(out) = self.podman().args(&what).output() {
                left.extend(
                    String::from_utf8_lossy(&out.stdout)
                        .split_whitespace()
                        .map(|s| format!("{} {s}", what[0])),
                );
            }
        }
        if self
            .podman()
            .args(["network", "exists", &network])
            .status()
            .is_ok_and(|s| s.success())
        {
            left.push(format!("network {network}"));
        }
        left
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.down {
            return;
        }
        if std::thread::panicking() {
            eprintln!("deploy_stack: the stack's last logs\n{}", self.logs());
        }
        let left = self.down_quietly();
        if !left.is_empty() {
            eprintln!("deploy_stack: left after down: {left:?}");
        }
    }
}

/// `s` percent-encoded for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn sdk_session_goes_on_through_haproxy_when_a_relay_of_the_compose_stack_is_stopped_or_killed() {
    const TEST: &str = "deploy_stack";
    if let Err(why) = ensure_tools() {
        skip(TEST, &why);
        return;
    }
    node::ensure_node_modules("e2e-sdk", MARKER);
    let stack = Stack::up();

    // Both relays up behind HAProxy (its checks on each relay's admin /ready).
    assert!(
        stack.wait_both_up(),
        "HAProxy never saw both relays UP: {:?}\n{}",
        stack.haproxy_servers(),
        stack.logs()
    );
    // The compose file's health checks (`walletrelay probe` of /ready, `redis-cli ping`).
    for service in ["redis", "relay-1", "relay-2"] {
        run(
            stack
                .podman()
                .args(["healthcheck", "run", &stack.container(service)]),
            &format!("the compose health check of {service}"),
        );
    }
    // Prometheus scraped both relays' admin addresses.
    let up = poll_every(Duration::from_secs(1), STACK_WAIT, || {
        let up = stack.prometheus_up();
        (up.len() == 2 && up.iter().all(|(_, v)| *v == 1.0)).then_some(up)
    });
    assert_eq!(
        up.as_ref()
            .map(|u| u.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>()),
        Some(vec!["relay-1", "relay-2"]),
        "Prometheus did not scrape both relays: up = {:?}",
        stack.prometheus_up()
    );
    if root().join("deploy/prometheus/rules.yml").exists() {
        let body = http_get(&format!(
            "http://127.0.0.1:{}/api/v1/rules",
            stack.prometheus_port
        ))
        .expect("GET /api/v1/rules");
        let v: Value = serde_json::from_str(&body).expect("rules JSON");
        let groups = v["data"]["groups"].as_array().map_or(0, Vec::len);
        assert!(
            groups > 0,
            "Prometheus loaded no group of deploy/prometheus/rules.yml: {body}"
        );
    }

    // The SDK through HAProxy. Round 1: the relay holding most of its sockets is stopped
    // (SIGTERM: the drain, then its clients closed with 1001); round 2: that relay is started
    // again and the one holding the sockets now is killed (SIGKILL).
    let url = format!("ws://127.0.0.1:{}", stack.relay_port);
    let (mut stopped, mut killed): (Option<&str>, Option<&str>) = (None, None);
    node::run_script_interactive(
        "e2e-sdk",
        "sdk.mjs",
        &[
            ("SCENARIO", "failover"),
            ("FAILOVER_ROUNDS", "2"),
            ("RELAY_URL", url.as_str()),
        ],
        SCRIPT_DEADLINE,
        &format!(
            "SCENARIO=failover through HAProxy at {url}, image {}",
            stack.image
        ),
        |line| match line.trim() {
            "READY_FOR_KILL 1" if stopped.is_none() => {
                let victim = stack.busiest();
                stack.drain(victim);
                let id = stack.container(victim);
                run(
                    stack.podman().args(["stop", "-t", "30", &id]),
                    &format!("podman stop {victim}"),
                );
                let code = run(
                    stack
                        .podman()
                        .args(["inspect", "--format", "{{.State.ExitCode}}", &id]),
                    "podman inspect",
                );
                assert_eq!(
                    String::from_utf8_lossy(&code.stdout).trim(),
                    "0",
                    "{victim} did not exit 0 after SIGTERM (the drain)"
                );
                eprintln!("deploy_stack: {victim} stopped (SIGTERM, drained, exit 0)");
                stopped = Some(victim);
                Some("KILLED 1".to_string())
            }
            "READY_FOR_KILL 2" if killed.is_none() => {
                stack.restart(stopped.expect("round 1 came first"));
                let victim = stack.busiest();
                run(
                    stack.podman().args(["kill", &stack.container(victim)]),
                    &format!("podman kill {victim}"),
                );
                eprintln!("deploy_stack: {victim} killed (SIGKILL)");
                killed = Some(victim);
                Some("KILLED 2".to_string())
            }
            _ => None,
        },
    );
    let victim = killed.expect("the script never asked for the kill");
    let survivor = if victim == "relay-1" {
        "relay-2"
    } else {
        "relay-1"
    };

    // Prometheus sees the killed relay down and the other up.
    let want = {
        let mut w = vec![(victim.to_string(), 0.0), (survivor.to_string(), 1.0)];
        w.sort_by(|a, b| a.0.cmp(&b.0));
        w
    };
    let seen = poll_every(Duration::from_secs(1), STACK_WAIT, || {
        let up = stack.prometheus_up();
        (up == want).then_some(up)
    });
    assert!(
        seen.is_some(),
        "Prometheus never showed {victim} down and {survivor} up: up = {:?}",
        stack.prometheus_up()
    );

    // The killed relay started again rejoins.
    stack.restart(victim);

    let mut stack = stack;
    let left = stack.down_quietly();
    assert!(
        left.is_empty(),
        "podman-compose down -v left parts of the stack: {left:?}"
    );
}
