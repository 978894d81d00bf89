//! [`SentinelGroup`]: a primary, its replicas (`--replicaof`) and 3 Sentinels watching it
//! as `mymaster` (quorum 2, `down-after-milliseconds 1000`, `failover-timeout 5000`,
//! `parallel-syncs 1`), as an operator runs Redis with failover (`redis+sentinel://`).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{conn, info, info_field, ping, try_conn, Proc, FORM};
use crate::common::wait::poll;

/// The name the Sentinels know the group by.
pub const MASTER: &str = "mymaster";

/// A Sentinel-watched primary with replicas, every process killed on drop.
pub struct SentinelGroup {
    /// The data nodes: the first one started as the primary.
    data: Vec<Proc>,
    sentinels: Vec<Proc>,
    killed_at: Option<Instant>,
}

/// A Sentinel command's answer as a flat list of strings (`None`: no answer).
fn sentinel_cmd(port: u16, args: &[&str]) -> Option<Vec<String>> {
    let mut c = try_conn(port)?;
    let mut cmd = redis::cmd("SENTINEL");
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(&mut c).ok()
}

/// A Sentinel answer of field/value pairs as a map.
fn pairs(flat: &[String]) -> HashMap<String, String> {
    flat.chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0].clone(), c[1].clone()))
        .collect()
}

/// The replicas a Sentinel knows, each as a map of its fields.
fn sentinel_replicas(port: u16) -> Option<Vec<HashMap<String, String>>> {
    let mut c = try_conn(port)?;
    let v: Vec<Vec<String>> = redis::cmd("SENTINEL")
        .arg("REPLICAS")
        .arg(MASTER)
        .query(&mut c)
        .ok()?;
    Some(v.iter().map(|r| pairs(r)).collect())
}

/// The role (`master` / `slave`) a data node reports.
fn role(port: u16) -> Option<String> {
    let i = info(port, "replication")?;
    info_field(&i, "role").map(str::to_string)
}

impl SentinelGroup {
    /// A primary, one replica and 3 Sentinels; with `persistent`, every data node runs
    /// `appendonly yes` + `appendfsync always`, else no persistence at all.
    pub fn start(persistent: bool) -> SentinelGroup {
        Self::start_with(persistent, 1)
    }

    /// A primary, `replicas` replicas and 3 Sentinels. Returns once every replica is in
    /// sync and every Sentinel knows the other two and every replica.
    pub fn start_with(persistent: bool, replicas: usize) -> SentinelGroup {
        let data_args = |primary: Option<u16>| {
            move |port: u16, dir: &Path| {
                let mut a: Vec<String> = [
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--dir",
                    &dir.display().to_string(),
                    "--logfile",
                    "redis.log",
                ]
                .map(String::from)
                .to_vec();
                if persistent {
                    a.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
                } else {
                    a.extend(["--appendonly", "no"].map(String::from));
                }
                if let Some(p) = primary {
                    a.extend(["--replicaof".into(), "127.0.0.1".into(), p.to_string()]);
                }
                a
            }
        };
        let primary = Proc::start("sentinel-primary", data_args(None), ping);
        let mut data = vec![primary];
        for _ in 0..replicas {
            let p = data[0].port;
            data.push(Proc::start("sentinel-replica", data_args(Some(p)), ping));
        }
        let primary_port = data[0].port;
        let sentinels = (0..3)
            .map(|_| {
                Proc::start(
                    "sentinel",
                    |port, dir| {
                        // A Sentinel rewrites its configuration file: one writable file each.
                        let conf = dir.join("sentinel.conf");
                        let text = format!(
                            "port {port}\nbind 127.0.0.1\ndir {}\nlogfile \"redis.log\"\n\
                             sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n\
                             sentinel down-after-milliseconds {MASTER} 1000\n\
                             sentinel failover-timeout {MASTER} 5000\n\
                             sentinel parallel-syncs {MASTER} 1\n",
                            dir.display()
                        );
                        std::fs::write(&conf, text).expect("write sentinel.conf");
                        vec![conf.display().to_string(), "--sentinel".to_string()]
                    },
                    ping,
                )
            })
            .collect();
        let g = SentinelGroup {
            data,
            sentinels,
            killed_at: None,
        };
        g.wait_replicas(replicas);
        let ports = g.data_ports();
        let formed = poll(FORM, || {
            g.sentinels
                .iter()
                .all(|s| {
                    let Some(m) = sentinel_cmd(s.port, &["MASTER", MASTER]) else {
                        return false;
                    };
                    let m = pairs(&m);
                    let known =
                        |f: &str, n: usize| m.get(f).map(String::as_str) == Some(&n.to_string());
                    let Some(reps) = sentinel_replicas(s.port) else {
                        return false;
                    };
                    known("num-other-sentinels", 2)
                        && reps.len() == replicas
                        && reps.iter().all(|r| {
                            r.get("flags").map(String::as_str) == Some("slave")
                                && r.get("master-link-status").map(String::as_str) == Some("ok")
                                && r.get("port")
                                    .and_then(|p| p.parse::<u16>().ok())
                                    .is_some_and(|p| ports[1..].contains(&p))
                        })
                })
                .then_some(())
        });
        assert!(
            formed.is_some(),
            "the Sentinels never all knew each other and the replicas; a Sentinel's log:\n{}",
            g.sentinels[0].log_tail(30)
        );
        g
    }

    /// `redis+sentinel://127.0.0.1:S1/mymaster?addr=127.0.0.1:S2&addr=127.0.0.1:S3`.
    pub fn url(&self) -> String {
        self.url_with_scheme("redis+sentinel")
    }

    /// The same URL with another scheme (`rediss+sentinel`, for a refusal test).
    pub fn url_with_scheme(&self, scheme: &str) -> String {
        let p: Vec<u16> = self.sentinel_ports();
        format!(
            "{scheme}://127.0.0.1:{}/{MASTER}?addr=127.0.0.1:{}&addr=127.0.0.1:{}",
            p[0], p[1], p[2]
        )
    }

    /// The Sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The data nodes' ports (the first one started as the primary), killed ones too.
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(|d| d.port).collect()
    }

    /// The primary's port as the first Sentinel that answers says
    /// (`SENTINEL get-master-addr-by-name`).
    pub fn primary_port(&self) -> u16 {
        self.try_primary_port()
            .expect("no Sentinel answers get-master-addr-by-name")
    }

    /// `SIGKILL`s whichever data node is the primary now; returns when. The group keeps
    /// the time for [`SentinelGroup::wait_failover`].
    pub fn kill_primary(&mut self) -> Instant {
        let port = self.primary_port();
        self.kill_data(port)
    }

    /// `SIGKILL`s the data node on `port`; returns when.
    pub fn kill_data(&mut self, port: u16) -> Instant {
        let d = self
            .data
            .iter_mut()
            .find(|d| d.port == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"));
        let at = d.kill();
        self.killed_at = Some(at);
        at
    }

    /// Starts a killed data node again (its Sentinels make it a replica of the primary).
    pub fn restart_data(&mut self, port: u16) {
        let d = self
            .data
            .iter_mut()
            .find(|d| d.port == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"));
        d.restart();
    }

    /// Waits until a Sentinel reports a primary other than `old_port` and that node says it
    /// is a primary; returns how long after the last kill (or after the call, without one)
    /// that was seen. Returns once every Sentinel reports that primary (the others learn it
    /// from the first within about 2 s), so [`SentinelGroup::primary_port`] agrees. Fails the
    /// test after [`FORM`], with the Sentinels' logs.
    pub fn wait_failover(&self, old_port: u16) -> Duration {
        let from = self.killed_at.unwrap_or_else(Instant::now);
        let reported = |s: &Proc| -> Option<u16> {
            let a = sentinel_cmd(s.port, &["get-master-addr-by-name", MASTER])?;
            a.get(1)?.parse().ok()
        };
        let fail = |what: &str| -> ! {
            let logs: Vec<String> = self.sentinels.iter().map(|s| s.log_tail(15)).collect();
            panic!(
                "{what} within {FORM:?}; the Sentinels' logs:\n{}",
                logs.join("\n---\n")
            );
        };
        let new = poll(FORM, || {
            self.sentinels.iter().find_map(|s| {
                let p = reported(s)?;
                (p != old_port && role(p).as_deref() == Some("master")).then_some(p)
            })
        });
        let took = from.elapsed();
        let Some(new) = new else {
            fail(&format!("no failover from port {old_port}"))
        };
        let agreed = poll(FORM, || {
            self.sentinels
                .iter()
                .all(|s| reported(s) == Some(new))
                .then_some(())
        });
        if agreed.is_none() {
            fail(&format!(
                "the Sentinels did not all report the new primary {new}"
            ));
        }
        took
    }

    /// Waits until the current primary has `n` replicas online (`connected_slaves` and each
    /// `state=online`): what `WAIT n` needs. Fails the test after [`FORM`].
    pub fn wait_replicas(&self, n: usize) {
        let ok = poll(FORM, || {
            let p = self.try_primary_port()?;
            let i = info(p, "replication")?;
            let online = i
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                .count();
            (info_field(&i, "role") == Some("master")
                && info_field(&i, "connected_slaves") == Some(&n.to_string())
                && online == n)
                .then_some(())
        });
        assert!(
            ok.is_some(),
            "the primary never had {n} replicas online: {:?}",
            self.try_primary_port().and_then(|p| info(p, "replication"))
        );
    }

    fn try_primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let a = sentinel_cmd(s.port, &["get-master-addr-by-name", MASTER])?;
            a.get(1)?.parse().ok()
        })
    }

    /// A plain connection to the current primary (for inspecting keys).
    pub fn conn_primary(&self) -> redis::Connection {
        conn(self.primary_port())
    }

    /// The last lines of every process's log (for failure messages).
    pub fn logs(&self, n: usize) -> String {
        let all = self.data.iter().chain(&self.sentinels);
        let parts: Vec<String> = all
            .map(|p| format!("== port {}\n{}", p.port, p.log_tail(n)))
            .collect();
        parts.join("\n")
    }
}
