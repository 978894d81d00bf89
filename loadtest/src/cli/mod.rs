//! Command line: subcommands, their flags, and the target address.
//!
//! Owns flag parsing and the address rule for `--url` (loopback, or any address literal with
//! `--allow-remote`). It must not open sockets: the scenarios get a validated [`Target`] and
//! typed option structs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use thiserror::Error;

/// Load generator for the walletrelay WebSocket relay and HTTP registry (loopback unless
/// `--allow-remote`).
#[derive(Parser, Debug)]
#[command(name = "loadtest", version, about)]
pub struct Cli {
    /// Which load to generate.
    #[command(subcommand)]
    pub cmd: Command,
}

/// One subcommand per load shape.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// P topic pairs (dApp + wallet per topic), both sides publishing; open or closed loop.
    Pairs(PairsOpts),
    /// One publisher, N subscribers of one topic.
    Fanout(FanoutOpts),
    /// N subscribed connections held idle; reports the server's RSS per connection.
    Idle(IdleOpts),
    /// Connect, upgrade, subscribe, publish, receive, close: as fast as possible.
    Churn(ChurnOpts),
    /// N authenticated, subscribed connections held until the server restarts, then all
    /// reconnecting and subscribing again: how long until every one is back, what failed.
    Storm(StormOpts),
    /// Registry requests over keep-alive connections, at a fixed rate or flat out.
    Http(HttpOpts),
    /// Honest pairs at a steady rate beside one abuser (publish flood, subscribe flood,
    /// connection storm from one address), each without and with the abuser: what the
    /// server's limits per client (DECISIONS §11) leave the honest clients.
    Abuse(AbuseOpts),
    /// No server: this machine's loopback ceiling, one write per socket per round from one
    /// thread, read by another (what "one write() per delivery" allows here).
    Loopback(LoopbackOpts),
    /// Not a load: a trivial forwarder that `pairs` can run against (each publish written
    /// to its pair, and acknowledged; nothing else), this machine's floor for the relay.
    Forwarder(ForwarderOpts),
    /// No load: add up the `--hlog` interval logs of several generators (processes or
    /// machines) into one table, one JSON line and one log, exactly (histograms summed).
    Merge(MergeOpts),
    /// No load: one self-contained HTML page (inline SVG) of one or more runs' `--hlog`
    /// logs: percentile spectrum, latency and throughput over time, parameters, the
    /// generator's own figures.
    Report(ReportOpts),
}

/// `merge` flags.
#[derive(Args, Debug, Clone)]
pub struct MergeOpts {
    /// Interval logs written by `--hlog` (or `merge --out`), one per generator.
    #[arg(required = true)]
    pub logs: Vec<std::path::PathBuf>,
    /// Write the merged interval log here.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// Append the JSON line to this file too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// `report` flags.
#[derive(Args, Debug, Clone)]
pub struct ReportOpts {
    /// Runs to show, each an interval log, as `LABEL=FILE` or `FILE` (labelled by its file
    /// name); several logs of one run are merged first with `loadtest merge`.
    #[arg(required = true)]
    pub runs: Vec<String>,
    /// The HTML file to write.
    #[arg(long, default_value = "loadtest-report.html")]
    pub out: std::path::PathBuf,
    /// Also write the percentile spectrum chart alone as an SVG file (for documents).
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
    /// The page's title.
    #[arg(long, default_value = "loadtest report")]
    pub title: String,
    /// Which latency to chart (a histogram name of the runs' reports, e.g.
    /// `publish_delivery`); default: each run's headline (its first).
    #[arg(long)]
    pub latency: Option<String>,
}

/// `forwarder` flags.
#[derive(Args, Debug, Clone)]
pub struct ForwarderOpts {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:9600")]
    pub listen: SocketAddr,
    /// Exit after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub duration: Duration,
    /// Pin the forwarder to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
}

/// `loopback` flags.
#[derive(Args, Debug, Clone)]
pub struct LoopbackOpts {
    /// Socket pairs.
    #[arg(long, default_value_t = 1000)]
    pub sockets: usize,
    /// Bytes per message (a 512-character publish's push is about 680).
    #[arg(long, default_value_t = 680)]
    pub size: usize,
    /// Messages per write.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Measured time.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time before the measurement starts.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Pin the writer (the "server") to this CPU.
    #[arg(long)]
    pub writer_cpu: Option<usize>,
    /// Pin the reader (the "clients") to this CPU.
    #[arg(long)]
    pub reader_cpu: Option<usize>,
}

/// Flags every subcommand takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Server address; loopback only (127.0.0.0/8, localhost, [::1]) unless --allow-remote.
    #[arg(long, default_value = "ws://127.0.0.1:8080/")]
    pub url: String,
    /// Accept a `--url` whose host is any IP address literal, not only loopback (names are
    /// still not resolved): for a benchmark from client machines. The run first prints what
    /// it will send where.
    #[arg(long)]
    pub allow_remote: bool,
    /// Begin (warm-up, then measurement) at this wall-clock time, Unix seconds with an
    /// optional fraction (`date -d '+20 sec' +%s`), after setup: several generators given
    /// the same time measure the same window. Refused if more than 1 s in the past.
    #[arg(long, value_parser = crate::clock::parse_start_at)]
    pub start_at: Option<u64>,
    /// Write the latencies as an HdrHistogram interval log (one histogram per second per
    /// latency, the headline untagged, the others tagged; values in µs) to this file, for
    /// `loadtest merge`, `loadtest report` and HdrHistogram's own tools.
    #[arg(long)]
    pub hlog: Option<std::path::PathBuf>,
    /// Measured time (e.g. 10s, 500ms, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time before the measurement starts (load runs, nothing is counted).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Event-loop threads; the connections are split evenly among them.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Append the JSON line of figures to this file too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Give up if connecting and subscribing all connections takes longer than this.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub setup_timeout: Duration,
    /// Connections allowed to be connecting/upgrading at once during setup.
    #[arg(long, default_value_t = 256)]
    pub connect_concurrency: usize,
    /// Number of source addresses 127.0.0.2, 127.0.0.3, ... to spread connections over
    /// (0 = let the kernel choose; only for IPv4 loopback targets).
    #[arg(long, default_value_t = 0)]
    pub source_ips: u32,
    /// PEM file of the CA that signed the server's certificate (needed for wss:// and
    /// https://).
    #[arg(long)]
    pub cacert: Option<std::path::PathBuf>,
    /// TLS versions offered (wss://, https://).
    #[arg(long, value_enum, default_value = "any")]
    pub tls_version: crate::tls::Version,
    /// Make a full TLS handshake on every connection (no session resumption).
    #[arg(long)]
    pub tls_no_resume: bool,
    /// WebSocket scenarios: offer RFC 7692 permessage-deflate (both no-context-takeover
    /// parameters) on every connection, compress every text message that shrinks, and
    /// inflate what the server compresses. A connection whose server declines fails the run.
    #[arg(long)]
    pub permessage_deflate: bool,
    /// WebSocket scenarios: every connection upgrades with `?auth=<jwt>&projectId=loadtest`,
    /// a relay-auth JWT (EdDSA, aud = --url) of its own Ed25519 key pair, made before the
    /// measured phase (`churn`: made inside each cycle; see `--auth-reuse`).
    #[arg(long)]
    pub auth: bool,
    /// How the event loop waits for a send due in less than 2 ms: `spin` (poll without
    /// sleeping: sends and receive times exact to a few µs, the generator's core always
    /// busy) or `sleep` (on a timerfd: CPU in proportion to the messages, for generator
    /// threads that share cores, at the price of a wake-up, tens of µs on a VM, in every
    /// latency).
    #[arg(long, value_enum, default_value = "spin")]
    pub wait: Wait,
    /// The TLS client built from the flags above (set by `main` for wss:// and https://).
    #[arg(skip)]
    pub tls: Option<crate::tls::Client>,
}

/// How the event loop waits for a near send ([`Common::wait`]).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// Poll without sleeping.
    #[default]
    Spin,
    /// Sleep on a timerfd.
    Sleep,
}

/// Which relay protocol the WebSocket scenarios speak.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RelayProtocol {
    /// WalletConnect v2.0-beta JSON-RPC: `waku_subscribe`, `waku_publish` (acknowledged),
    /// pushes `waku_subscription`.
    #[default]
    #[value(alias = "v2")]
    Waku,
    /// Today's WalletConnect 2.x JSON-RPC (DECISIONS §10): `irn_subscribe`, `irn_publish`
    /// with `"tag":1108` and a ttl of 10 s to 30 days, pushes `irn_subscription`.
    Irn,
    /// Today's 2.x SDK as it talks (sign-client 2.25.0, tests/e2e-sdk/WIRE.md): `irn_*`, a
    /// relay-auth JWT per connection with the SDK's `ua` and `useOnCloseEvent` in the upgrade
    /// query (implies `--auth`), 19-digit string request ids, an `irn_batchSubscribe` of the
    /// pairing and the session topic at connect, every push acknowledged (implies `--ack`).
    /// In `pairs` the dApp sends session requests (tag 1108, `prompt` true, ttl 900) and the
    /// wallet answers each one (tag 1109); `--rate` counts requests. `pairs` and `idle` only.
    Sdk,
    /// WalletConnect 1.0 bridge frames: `{"topic","type":"sub"|"pub","payload","silent"}`
    /// (no answers: a `sub` is known to be in place by a ping sent after it, a `pub` counts
    /// as acknowledged when sent).
    V1,
}

impl RelayProtocol {
    /// `"waku"`, `"irn"`, `"sdk"` or `"v1"`.
    pub fn label(self) -> &'static str {
        match self {
            RelayProtocol::Waku => "waku",
            RelayProtocol::Irn => "irn",
            RelayProtocol::Sdk => "sdk",
            RelayProtocol::V1 => "v1",
        }
    }

    /// The JSON-RPC method family (v1 frames have none; they get `waku`'s, unused).
    pub fn rpc(self) -> crate::proto::Rpc {
        match self {
            RelayProtocol::Irn | RelayProtocol::Sdk => crate::proto::Rpc::Irn,
            RelayProtocol::Waku | RelayProtocol::V1 => crate::proto::Rpc::Waku,
        }
    }

    /// Refuse a publish ttl this protocol does not accept (irn, sdk: 10 s to 30 days).
    pub fn check_ttl(self, ttl: u64) -> Result<(), String> {
        let r = crate::proto::IRN_TTL_S;
        if self.rpc() == crate::proto::Rpc::Irn && !r.contains(&ttl) {
            return Err(format!(
                "--ttl {ttl}: irn_publish takes a ttl of {} to {} seconds",
                r.start(),
                r.end()
            ));
        }
        Ok(())
    }
}

/// `pairs` flags.
#[derive(Args, Debug, Clone)]
pub struct PairsOpts {
    /// Common flags.
    #[command(flatten)]
    pub common: Common,
    /// Relay protocol: `waku` (v2.0-beta JSON-RPC; `v2` is the same), `irn` (today's 2.x
    /// JSON-RPC), `sdk` (the 2.x SDK's whole shape: a dApp's requests, the wallet's answers;
    /// loadtest/README.md) or `v1` (WalletConnect 1.0 bridge frames).
    #[arg(long, value_enum, default_value_t = RelayProtocol::Waku)]
    pub protocol: RelayProtocol,
    /// Topic pairs (two connections each). `--connections` overrides as total connections / 2.
    #[arg(long, default_value_t = 100)]
    pub pairs: usize,
    /// Total connections (alternative to --pairs; must be even).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Open loop: total publishes per second over all connections (0 = closed loop).
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Closed loop: messages in flight per pair (used when --rate 0).
    #[arg(long, default_value_t = 1)]
    pub inflight: usize,
    /// Message payload size in hex characters (>= 32).
    #[arg(long, default_value_t = 512)]
    pub size: usize,
    /// Publish ttl in seconds (irn, sdk: 10 to 2,592,000). Default 21,600; `sdk`: 900, the
    /// SDK's ttl of a session request.
    #[arg(long)]
    pub ttl: Option<u64>,
    /// Wait this long after the measurement for deliveries still in flight.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Acknowledge each delivery with `{"id":N,"jsonrpc":"2.0","result":true}`.
    #[arg(long)]
    pub ack: bool,
    /// Stop after this many publishes in the measured window (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Also open this many connections that subscribe to the pairs' topics (round robin)
    /// and never read (4 KiB receive buffer): the server closes them at its outbound limit;
    /// compare the latencies with a run without them.
    #[arg(long, default_value_t = 0)]
    pub stalled: usize,
}

/// `fanout` flags.
#[derive(Args, Debug, Clone)]
pub struct FanoutOpts {
    /// Common flags.
    #[command(flatten)]
    pub common: Common,
    /// Relay protocol: `waku` (v2.0-beta JSON-RPC; `v2` is the same), `irn` (today's 2.x
    /// JSON-RPC) or `v1` (WalletConnect 1.0 bridge frames; in closed loop the next pub
    /// follows the first subscriber's delivery, as v1 has no acks).
    #[arg(long, value_enum, default_value_t = RelayProtocol::Waku)]
    pub protocol: RelayProtocol,
    /// Subscribers of the one topic.
    #[arg(long, alias = "connections", default_value_t = 1000)]
    pub subscribers: usize,
    /// Open loop: publishes per second (0 = closed loop).
    #[arg(long, default_value_t = 100)]
    pub rate: u64,
    /// Closed loop: publishes in flight (a publish completes when every subscriber has it).
    #[arg(long, default_value_t = 1)]
    pub inflight: usize,
    /// Message payload size in hex characters (>= 32).
    #[arg(long, default_value_t = 512)]
    pub size: usize,
    /// Publish ttl in seconds (irn: 10 to 2,592,000).
    #[arg(long, default_value_t = 21_600)]
    pub ttl: u64,
    /// Wait this long after the measurement for deliveries still in flight.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Stop after this many publishes in the measured window (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
}

/// `idle` flags.
#[derive(Args, Debug, Clone)]
pub struct IdleOpts {
    /// Common flags (`--duration` is the hold time).
    #[command(flatten)]
    pub common: Common,
    /// Connections to open and subscribe.
    #[arg(long, default_value_t = 1000)]
    pub connections: usize,
    /// Relay protocol of the subscriptions: `waku`, `irn` (one `irn_subscribe`) or `sdk` (a
    /// JWT, and an `irn_batchSubscribe` of a pairing and a session topic, as the SDK holds).
    #[arg(long, value_enum, default_value_t = RelayProtocol::Waku)]
    pub protocol: RelayProtocol,
    /// Server process id, for VmRSS from /proc/<pid>/status.
    #[arg(long)]
    pub server_pid: Option<u32>,
}

/// When a `storm` connection reconnects after its close.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconnect {
    /// At once, and again 100 ms after each failed attempt: every client at the same moment.
    Now,
    /// As @walletconnect/core 2.25.0 does: 100 ms after the close, then after a failed
    /// attempt k, k seconds later (at most 5); a refused subscribe restarts at once.
    Sdk,
}

/// `storm` flags.
#[derive(Args, Debug, Clone)]
pub struct StormOpts {
    /// Common flags (`--setup-timeout` bounds the first setup, whose failed connects and
    /// subscribes are tried again each second; `--duration` is unused).
    #[command(flatten)]
    pub common: Common,
    /// Connections to open, subscribe and hold.
    #[arg(long, default_value_t = 1000)]
    pub connections: usize,
    /// Topics per connection, all in one `*_batchSubscribe` (the SDK's pairing and session
    /// topics: 2). 1 to 500.
    #[arg(long, default_value_t = 2)]
    pub topics: usize,
    /// Relay protocol: `waku` or `irn`.
    #[arg(long, value_enum, default_value_t = RelayProtocol::Irn)]
    pub protocol: RelayProtocol,
    /// How connections reconnect after the cut.
    #[arg(long, value_enum, default_value_t = Reconnect::Now)]
    pub reconnect: Reconnect,
    /// After each subscribe, a `*_batchFetchMessages` of the same topics (sign-client 2.25.0
    /// does not send one on reconnect; off by default).
    #[arg(long)]
    pub fetch: bool,
    /// Reconnect with the token of the first connect (the server's verified-token cache
    /// hits) instead of a fresh one signed by the same key, as the SDK does.
    #[arg(long)]
    pub reuse_token: bool,
    /// Written (`held N`) once setup is over: the moment to restart the server.
    #[arg(long)]
    pub ready_file: Option<std::path::PathBuf>,
    /// A file holding the pid of the server that serves the storm (read when the storm
    /// ends): its CPU time (user + system) is reported.
    #[arg(long)]
    pub server_pid_file: Option<std::path::PathBuf>,
    /// Give up waiting for the cut after this long.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub cut_timeout: Duration,
    /// Give up on the connections not back this long after the first close.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub storm_timeout: Duration,
}

/// `churn` flags.
#[derive(Args, Debug, Clone)]
pub struct ChurnOpts {
    /// Common flags.
    #[command(flatten)]
    pub common: Common,
    /// Cycles running at once.
    #[arg(long, alias = "connections", default_value_t = 64)]
    pub concurrency: usize,
    /// Relay protocol of the subscribe and publish: `waku` or `irn`.
    #[arg(long, value_enum, default_value_t = RelayProtocol::Waku)]
    pub protocol: RelayProtocol,
    /// With auth, every cycle's connection presents the same token, made once at setup
    /// (what the server's verified-token cache saves); implies `--auth`, whose default in
    /// `churn` is a fresh key pair and token per cycle, made inside the cycle.
    #[arg(long)]
    pub auth_reuse: bool,
    /// Message payload size in hex characters (>= 32).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Publish ttl in seconds (irn: 10 to 2,592,000).
    #[arg(long, default_value_t = 21_600)]
    pub ttl: u64,
    /// Close with a FIN after the close handshake instead of a RST (leaves TIME_WAIT sockets,
    /// which exhaust loopback ports at high cycle rates).
    #[arg(long)]
    pub no_rst: bool,
    /// Stop after this many completed cycles (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
}

/// `http` flags.
#[derive(Args, Debug, Clone)]
pub struct HttpOpts {
    /// Common flags (`--url` may be ws:// or http://).
    #[command(flatten)]
    pub common: Common,
    /// Keep-alive connections.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Requests per second (0 = flat out: every connection always busy).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Requests in flight per connection (HTTP/1.1 pipelining when > 1).
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Weighted mix of request kinds: all, wallets, dapps, page, search, health.
    #[arg(long, default_value = "all=1,wallets=1,dapps=1,page=4,search=4")]
    pub mix: String,
    /// Send `Accept-Encoding: gzip`.
    #[arg(long)]
    pub gzip: bool,
    /// Stop after this many responses in the measured window (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
}

/// What the abuser of `abuse` does.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbuseKind {
    /// Publishes as fast as it can, pipelined, on `--abuser-conns` connections, to its own
    /// topics (which its own subscriber follows); reconnects when closed.
    Publish,
    /// Subscribes to fresh topics as fast as it can, single and batched in turn, pipelined,
    /// on `--abuser-conns` connections; reconnects when closed.
    Subscribe,
    /// Opens WebSocket connections as fast as it can (`--storm-concurrency` at once), each
    /// dropped with a RST once upgraded.
    Connect,
}

impl AbuseKind {
    /// `"publish"`, `"subscribe"` or `"connect"`.
    pub fn label(self) -> &'static str {
        match self {
            AbuseKind::Publish => "publish",
            AbuseKind::Subscribe => "subscribe",
            AbuseKind::Connect => "connect",
        }
    }
}

/// `abuse` flags.
#[derive(Args, Debug, Clone)]
pub struct AbuseOpts {
    /// Common flags: `--duration` and `--warmup` are per phase; `--source-ips K` spreads
    /// the honest connections over 127.0.0.2 .. 127.0.0.K+1 (0 = 100 addresses).
    #[command(flatten)]
    pub common: Common,
    /// Relay protocol: `waku` or `irn`.
    #[arg(long, value_enum, default_value_t = RelayProtocol::Waku)]
    pub protocol: RelayProtocol,
    /// Honest topic pairs (a dApp and a wallet connection each, both publishing).
    #[arg(long, default_value_t = 200)]
    pub pairs: usize,
    /// Honest publishes per second over all honest connections (open loop).
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// Message payload size in hex characters (>= 32), honest and abuser publishes.
    #[arg(long, default_value_t = 512)]
    pub size: usize,
    /// Publish ttl in seconds (irn: 10 to 2,592,000).
    #[arg(long, default_value_t = 21_600)]
    pub ttl: u64,
    /// Wait this long after each phase's measurement for honest deliveries in flight.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Abusers to run, in this order, each as a phase without and a phase with it.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "publish,subscribe,connect"
    )]
    pub kinds: Vec<AbuseKind>,
    /// The abuser's one source address (127.0.0.0/8, outside the honest addresses).
    #[arg(long, default_value = "127.0.0.200")]
    pub abuser_ip: Ipv4Addr,
    /// Publish and subscribe floods: the abuser's connections.
    #[arg(long, default_value_t = 4)]
    pub abuser_conns: usize,
    /// Publish and subscribe floods: requests in flight per abuser connection.
    #[arg(long, default_value_t = 64)]
    pub pipeline: usize,
    /// Subscribe flood: topics per batch subscribe (every other request is a batch; 1-500).
    #[arg(long, default_value_t = 50)]
    pub batch: usize,
    /// Connection storm: connections being opened at once.
    #[arg(long, default_value_t = 64)]
    pub storm_concurrency: usize,
    /// Nice value of the abuser's thread (it shares the generator's core with the honest
    /// clients; the niceness keeps it from delaying their sends). 0 = leave it.
    #[arg(long, default_value_t = 10)]
    pub abuser_nice: i32,
    /// EEVDF time slice of the abuser's thread (Linux 6.12+; 0 = the kernel's): short, so
    /// that when it runs it gives the core back to the honest loop within that long.
    #[arg(long, default_value = "100us", value_parser = parse_duration)]
    pub abuser_slice: Duration,
    /// Run the abuser's thread under SCHED_IDLE: it gets only the CPU time nothing else on
    /// its core wants, so it cannot delay the honest loop's sends at all (a remote abuser
    /// has its own CPUs; on one machine this is the closest to that). Overrides
    /// `--abuser-nice` and `--abuser-slice`.
    #[arg(long)]
    pub abuser_idle: bool,
    /// Most bytes the abuser hands to one `write` (a pipelined flood is still written
    /// whole, in several calls). On loopback the writer's own thread does the server side's
    /// TCP receive work too, which a remote abuser's packets would have done on the
    /// server's machine; on a kernel without preemption one large write of the abuser keeps
    /// the honest clients' thread off its shared core until it returns, however idle the
    /// abuser's priority. 16 KiB bounds that to tens of µs.
    #[arg(long, default_value_t = 16 << 10)]
    pub abuser_max_write: usize,
    /// Pin the abuser's thread to this CPU (e.g. the server's, to keep it off the honest
    /// loop's core: then it takes CPU from the server instead, which a remote abuser does not).
    #[arg(long)]
    pub abuser_cpu: Option<usize>,
    /// Server process id: each phase reports the server's CPU seconds (user + system) and
    /// the table its CPU share.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Repeat the whole sequence this many times (odd rounds run "with" before "without").
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
}

/// Which addresses `--url` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// 127.0.0.0/8, `localhost`, `[::1]`.
    Loopback,
    /// Any unicast IP address literal (`--allow-remote`).
    Remote,
}

/// A validated target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Where to connect.
    pub addr: SocketAddr,
    /// `Host` header value.
    pub host: String,
    /// Request target for the WebSocket upgrade (path and query).
    pub path: String,
    /// For `wss://` and `https://`: the name the server's certificate must carry (the host,
    /// without port or brackets).
    pub tls_name: Option<String>,
}

/// Why a `--url` was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum UrlError {
    /// Not ws://, http://, wss:// or https://.
    #[error("unsupported scheme in {0:?} (use ws://, wss://, http:// or https://)")]
    Scheme(String),
    /// The host is not an address on this machine's loopback.
    #[error("refusing non-loopback host {0:?}: traffic goes to 127.0.0.0/8 or [::1] only")]
    NotLoopback(String),
    /// Malformed host or port.
    #[error("bad host or port in {0:?}")]
    Malformed(String),
    /// `--allow-remote` takes addresses, not names (no DNS answer picks the target).
    #[error("refusing host name {0:?}: give the server's IP address")]
    Name(String),
    /// Not an address one connects to (0.0.0.0, multicast, broadcast).
    #[error("refusing {0:?}: not a unicast address")]
    NotUnicast(String),
}

/// Parse `ws://host[:port][/path]` (or `http://`, `wss://`, `https://`) and accept only
/// loopback hosts, or with [`Reach::Remote`] any unicast address literal.
///
/// Names other than `localhost` are refused rather than resolved, so no DNS answer can send
/// load elsewhere.
pub fn parse_target(url: &str, reach: Reach) -> Result<Target, UrlError> {
    let (rest, default_port, tls) = if let Some(r) = url.strip_prefix("ws://") {
        (r, 80, false)
    } else if let Some(r) = url.strip_prefix("http://") {
        (r, 80, false)
    } else if let Some(r) = url.strip_prefix("wss://") {
        (r, 443, true)
    } else if let Some(r) = url.strip_prefix("https://") {
        (r, 443, true)
    } else {
        return Err(UrlError::Scheme(url.to_string()));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_string()),
    };
    if authority.contains('@') {
        return Err(UrlError::Malformed(url.to_string()));
    }
    let (host, port) = if let Some(r) = authority.strip_prefix('[') {
        let end = r
            .find(']')
            .ok_or_else(|| UrlError::Malformed(url.to_string()))?;
        let host = &r[..end];
        let port = match &r[end + 1..] {
            "" => default_port,
            p => parse_port(p.strip_prefix(':'), url)?,
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, parse_port(Some(p), url)?),
            None => (authority, default_port),
        }
    };
    let ip: IpAddr = if host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.parse().map_err(|_| match reach {
            Reach::Loopback => UrlError::NotLoopback(host.to_string()),
            Reach::Remote => UrlError::Name(host.to_string()),
        })?
    };
    if !is_loopback(ip) {
        match reach {
            Reach::Loopback => return Err(UrlError::NotLoopback(host.to_string())),
            Reach::Remote if !is_unicast(ip) => return Err(UrlError::NotUnicast(host.to_string())),
            Reach::Remote => {}
        }
    }
    Ok(Target {
        addr: SocketAddr::new(ip, port),
        host: authority.to_string(),
        path,
        tls_name: tls.then(|| host.to_string()),
    })
}

/// 127.0.0.0/8 or ::1.
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.octets()[0] == 127,
        IpAddr::V6(v6) => v6.is_loopback(),
    }
}

/// An address a connection can go to.
fn is_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    }
}

fn parse_port(p: Option<&str>, url: &str) -> Result<u16, UrlError> {
    match p {
        Some(p) if !p.is_empty() => p.parse().map_err(|_| UrlError::Malformed(url.to_string())),
        _ => Err(UrlError::Malformed(url.to_string())),
    }
}

/// Parse `10s`, `500ms`, `2m`, `1.5s` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 0.000_001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {s:?}"))?;
    if !(v.is_finite() && v >= 0.0) || v * mul > 86_400.0 {
        return Err(format!("bad duration {s:?} (0 to 24h)"));
    }
    Ok(Duration::from_secs_f64(v * mul))
}

#[cfg(test)]
mod tests;
