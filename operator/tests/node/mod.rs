//! Support for the tests on the real node (tests/ground/node.sh): its state file, the pods' view of the
//! emulators, the worker pods' logs followed through the API server (`kubectl logs -f`), and the
//! node's containerd (`ctr`) for killing a container's process.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, LogParams};
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;

const START_HINT: &str =
    "start it with `tests/ground/node.sh start` and load the images with `make images`, or run `make test`";

/// The running node, as tests/ground/node.sh wrote it to `$LEASEHOLD_STATE/node.env`.
pub struct Node {
    vars: HashMap<String, String>,
}

impl Node {
    /// Reads the node's state file; panics with instructions when the node is not running.
    pub fn get() -> Self {
        let path = leasehold_testkit::state_dir().join("node.env");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("no {} ({e}): the real node is not running; {START_HINT}", path.display()));
        let vars = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect();
        let node = Self { vars };
        let pid = node.var("KUBELET_PID");
        assert!(
            PathBuf::from(format!("/proc/{pid}")).exists(),
            "the node's kubelet (pid {pid}) is not running; {START_HINT}"
        );
        node
    }

    fn var(&self, name: &str) -> String {
        self.vars.get(name).cloned().unwrap_or_else(|| panic!("node.env has no {name}; {START_HINT}"))
    }

    /// `spec.aws` for pods: the emulators as the node's namespace reaches them (the forwarder on the veth).
    pub fn aws(&self) -> serde_json::Value {
        serde_json::json!({
            "region": "us-east-1",
            "kinesisEndpoint": self.var("LEASEHOLD_NODE_KINESIS_ENDPOINT"),
            "dynamodbEndpoint": self.var("LEASEHOLD_NODE_DYNAMODB_ENDPOINT"),
        })
    }

    /// Runs `ctr` against the node's containerd (namespace k8s.io); returns stdout, panics on failure.
    pub fn ctr(&self, args: &[&str]) -> String {
        let output = std::process::Command::new("ctr")
            .args(["--address", &self.var("CONTAINERD_ADDRESS"), "-n", "k8s.io"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run ctr: {e}"));
        assert!(output.status.success(), "ctr {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Panics unless the node's containerd holds `image` (imported by `make images`).
    pub fn assert_image(&self, image: &str) {
        let images = self.ctr(&["images", "ls", "-q"]);
        assert!(
            images.lines().any(|l| l.trim() == image),
            "image {image} is not in the node's containerd: run `make images` (tests/ground/images.sh build import); \
             if it was imported, the kubelet may have evicted it for disk pressure ({} GB free, tests/ground/disk.sh)",
            disk_free_gb()
        );
    }

    /// kill -9 of a container's process (the task's init, PID 1 in the container), from the host.
    pub fn kill_container(&self, container_id: &str) {
        let id = container_id.trim_start_matches("containerd://");
        self.ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
    }
}

/// The image `make images` builds for the worker (the chart's default name and the crate's version).
pub fn worker_image() -> String {
    format!("ghcr.io/leasehold/worker:{}", env!("CARGO_PKG_VERSION"))
}

/// The operator as a process watching `namespace`, its worker pods running [`worker_image`] (polling
/// shard counts every `poll`).
pub fn spawn_operator(binary: &std::path::Path, namespace: &str, poll: &str) -> leasehold_testkit::process::KillOnDrop {
    let mut command =
        crate::support::operator_command(binary, namespace, &crate::support::kubeconfig_path(), poll, "127.0.0.1:0");
    command.args(["--worker-image", &worker_image()]);
    crate::support::start_operator(command)
}

/// True once the pod's Ready condition is True.
pub fn ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The http processor's test sidecar (`worker/examples/http_sink.rs`), built by `make images`.
pub const HTTP_SINK_IMAGE: &str = "leasehold.local/http-sink:test";

/// Runs the cached `kubectl` against the control plane; returns stdout, panics on failure.
pub fn kubectl(args: &[&str]) -> String {
    let program = leasehold_testkit::cache_dir().join("k8s-bin").join("kubectl");
    let output = std::process::Command::new(&program)
        .args(args)
        .env("KUBECONFIG", crate::support::kubeconfig_path())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    assert!(output.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// One record as the stdout processor printed it, with when the test read the line.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub shard_id: String,
    pub data: String,
    pub seen_at: Instant,
}

/// A followed container instance: pod name and restart count.
type Instance = (String, i32);

/// Lines (with when they were read) by container instance.
type Lines = HashMap<Instance, Vec<(Instant, String)>>;

/// Every line of every worker container instance, followed from its start.
#[derive(Clone, Default)]
pub struct Logs {
    lines: Arc<Mutex<Lines>>,
}

impl Logs {
    /// Follows the `worker` container of every pod matching `selector` in `pods`, each instance once,
    /// until `stop`.
    pub fn follow(pods: Api<Pod>, selector: &str, stop: CancellationToken) -> Self {
        Self::follow_container(pods, selector, "worker", stop)
    }

    /// Follows the `container` of every pod matching `selector` in `pods` (each instance once) until `stop`.
    pub fn follow_container(pods: Api<Pod>, selector: &str, container: &str, stop: CancellationToken) -> Self {
        let logs = Self::default();
        let (all, selector, container) = (logs.clone(), selector.to_string(), container.to_string());
        tokio::spawn(async move {
            let mut followed: HashSet<(String, i32)> = HashSet::new();
            while !stop.is_cancelled() {
                if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
                    for pod in list.items {
                        let Some(status) = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()) else {
                            continue;
                        };
                        let Some(followed_one) = status.iter().find(|c| c.name == container) else { continue };
                        let running = followed_one.state.as_ref().is_some_and(|s| s.running.is_some());
                        let key = (pod.name_any(), followed_one.restart_count);
                        if running && followed.insert(key.clone()) {
                            tokio::spawn(all.clone().follow_one(pods.clone(), container.clone(), key));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        logs
    }

    async fn follow_one(self, pods: Api<Pod>, container: String, key: (String, i32)) {
        let params = LogParams { container: Some(container), follow: true, ..LogParams::default() };
        // A container that has just (re)started may not serve its log yet: retry for a while.
        let mut attempt = 0;
        let stream = loop {
            match pods.log_stream(&key.0, &params).await {
                Ok(stream) => break stream,
                Err(e) if attempt < 50 => {
                    attempt += 1;
                    if attempt == 1 {
                        eprintln!("logs of {key:?} not served yet ({e}), retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("logs of {key:?}: {e}"),
            }
        };
        let mut lines = stream.lines();
        while let Ok(Some(line)) = lines.try_next().await {
            self.lines.lock().expect("logs").entry(key.clone()).or_default().push((Instant::now(), line));
        }
    }

    /// The records printed by every instance followed so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        let lines = self.lines.lock().expect("logs");
        lines.values().flatten().filter_map(|(at, line)| delivery(*at, line)).collect()
    }

    /// The records printed by one container instance.
    pub fn deliveries_of(&self, pod: &str, restart: i32) -> Vec<Delivery> {
        let lines = self.lines.lock().expect("logs");
        let key = (pod.to_string(), restart);
        lines.get(&key).into_iter().flatten().filter_map(|(at, line)| delivery(*at, line)).collect()
    }

    /// The records printed by every instance of `pod` (its containers before and after restarts).
    pub fn deliveries_of_pod(&self, pod: &str) -> Vec<Delivery> {
        let lines = self.lines.lock().expect("logs");
        let of_pod = lines.iter().filter(|((name, _), _)| name == pod).flat_map(|(_, l)| l);
        of_pod.filter_map(|(at, line)| delivery(*at, line)).collect()
    }

    /// Every line of one container instance (for failure messages).
    pub fn text_of(&self, pod: &str, restart: i32) -> String {
        let lines = self.lines.lock().expect("logs");
        let key = (pod.to_string(), restart);
        lines.get(&key).into_iter().flatten().map(|(_, l)| l.as_str()).collect::<Vec<_>>().join("\n")
    }
}

fn delivery(seen_at: Instant, line: &str) -> Option<Delivery> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let text = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_string);
    text("sequenceNumber")?;
    let data = base64::engine::general_purpose::STANDARD.decode(text("data")?).ok()?;
    Some(Delivery { shard_id: text("shardId")?, data: String::from_utf8_lossy(&data).into_owned(), seen_at })
}

/// (records missing, records delivered more than once) of `expected` in `deliveries`.
pub fn missing_and_repeats(expected: &HashSet<String>, deliveries: &[Delivery]) -> (usize, usize) {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for d in deliveries {
        *counts.entry(d.data.as_str()).or_default() += 1;
    }
    let missing = expected.iter().filter(|e| !counts.contains_key(e.as_str())).count();
    let repeats = counts.values().map(|c| c.saturating_sub(1)).sum();
    (missing, repeats)
}

/// GB free where the test ground keeps its caches (the node's containerd among them), or "unknown".
fn disk_free_gb() -> String {
    let cache = std::env::var("LEASEHOLD_CACHE")
        .unwrap_or_else(|_| format!("{}/.cache/leasehold", std::env::var("HOME").unwrap_or_default()));
    std::process::Command::new("df")
        .args(["--output=avail", "-B1G", &cache])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().last().map(|l| l.trim().to_string()))
        .unwrap_or_else(|| "unknown".into())
}
