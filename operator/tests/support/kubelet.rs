//! A stand-in kubelet for end-to-end tests: there is no container runtime here, so the worker pods the
//! operator's Deployments create are run as local processes of the binary their image stands for, with the pod's args,
//! its environment (including the downward API's pod name) and its mounted ConfigMap. A pod deleted by
//! Kubernetes has its process killed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use leasehold_operator::pipeline::build::{CONFIG_KEY, CONFIG_VOLUME, WORKER_CONTAINER};
use leasehold_testkit::process::WorkerProcess;
use tokio_util::sync::CancellationToken;

/// The image a user's own worker binary stands for: `worker/examples/custom_processor.rs`.
pub const CUSTOM_PROCESSOR_IMAGE: &str = "example.invalid/custom-processor:dev";

/// The worker binary built next to the test (`cargo test --workspace` builds it).
pub fn worker_binary() -> PathBuf {
    built("leasehold-worker", "cargo build -p leasehold-worker")
}

/// The `leasehold` CLI built next to the test (`cargo test --workspace` builds it).
pub fn cli_binary() -> PathBuf {
    built("leasehold", "cargo build -p leasehold-cli")
}

/// The binary a worker container's image stands for: the custom-processor example for
/// [`CUSTOM_PROCESSOR_IMAGE`], else `leasehold-worker`.
fn binary_for(image: Option<&str>) -> PathBuf {
    match image {
        Some(CUSTOM_PROCESSOR_IMAGE) => {
            built("examples/custom_processor", "cargo build -p leasehold-worker --example custom_processor")
        }
        _ => worker_binary(),
    }
}

/// `path` under the target's debug directory, which must have been built.
fn built(path: &str, how: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let debug = exe.parent().and_then(Path::parent).expect("target/debug");
    let binary = debug.join(path);
    assert!(binary.exists(), "{} is missing: build it first (`{how}`, or run `make test`)", binary.display());
    binary
}

/// Pods run as processes, by pod name.
pub type Running = Arc<Mutex<HashMap<String, WorkerProcess>>>;

/// Processes of deleted pods, once they exited (their output read to the end).
pub type Finished = Arc<Mutex<Vec<WorkerProcess>>>;

/// How many processes of deleted pods are between `running` and `finished` (signalled, not yet exited).
pub type Exiting = Arc<AtomicUsize>;

/// Runs the worker pods matching `selector` in `namespace` until `stop`.
pub struct Kubelet {
    /// The processes, by pod name.
    pub running: Running,
    /// The processes of pods deleted since, after they exited.
    pub finished: Finished,
    /// Processes of deleted pods still exiting: in neither list, so their output is in neither.
    pub exiting: Exiting,
    stop: CancellationToken,
}

impl Kubelet {
    /// Starts watching (polling every 250 ms).
    pub fn start(client: Client, namespace: &str, selector: &str) -> Self {
        let running: Running = Arc::default();
        let finished: Finished = Arc::default();
        let exiting: Exiting = Arc::default();
        let stop = CancellationToken::new();
        let (pods, config_maps) =
            (Api::<Pod>::namespaced(client.clone(), namespace), Api::<ConfigMap>::namespaced(client, namespace));
        let (state, token, selector) = (running.clone(), stop.clone(), selector.to_string());
        let ended = Ended { finished: finished.clone(), exiting: exiting.clone() };
        tokio::spawn(async move {
            while !token.is_cancelled() {
                if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
                    sync(&pods, &config_maps, &state, &ended, list.items).await;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Self { running, finished, exiting, stop }
    }

    /// Waits (up to 20 s) until no process of a deleted pod is still exiting, so that `running` and
    /// `finished` together hold every process's output.
    pub fn wait_exited(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while self.exiting.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Names of the pods running as processes.
    pub fn pods(&self) -> Vec<String> {
        let mut names: Vec<String> = self.running.lock().expect("running").keys().cloned().collect();
        names.sort();
        names
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.cancel();
        self.running.lock().expect("running").clear();
    }
}

/// Where processes of deleted pods go.
struct Ended {
    finished: Finished,
    exiting: Exiting,
}

async fn sync(pods: &Api<Pod>, config_maps: &Api<ConfigMap>, running: &Running, ended: &Ended, listed: Vec<Pod>) {
    let alive: Vec<String> =
        listed.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).map(|p| p.name_any()).collect();
    // Pods gone (or terminating): SIGTERM their processes, as the kubelet would.
    let gone: Vec<WorkerProcess> = {
        let mut state = running.lock().expect("running");
        let names: Vec<String> = state.keys().filter(|n| !alive.contains(n)).cloned().collect();
        // Counted as exiting before they leave `running`, under its lock: never in no list uncounted.
        ended.exiting.fetch_add(names.len(), Ordering::SeqCst);
        names.into_iter().filter_map(|n| state.remove(&n)).collect()
    };
    for process in gone {
        process.signal("TERM");
        let (finished, exiting) = (ended.finished.clone(), ended.exiting.clone());
        std::thread::spawn(move || {
            let mut process = process;
            let _ = process.wait_exit(Duration::from_secs(10));
            finished.lock().expect("finished").push(process);
            exiting.fetch_sub(1, Ordering::SeqCst);
        });
    }
    for pod in listed.into_iter().filter(|p| alive.contains(&p.name_any())) {
        if running.lock().expect("running").contains_key(&pod.name_any()) {
            continue;
        }
        if let Some(process) = start(config_maps, &pod).await {
            running.lock().expect("running").insert(pod.name_any(), process);
            let status = super::ready_pod_status();
            let _ = pods.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await;
        }
    }
}

/// Starts the `worker` container of `pod` as a process: its args with `$(VAR)` expanded, its config
/// read from the ConfigMap its volume names.
async fn start(config_maps: &Api<ConfigMap>, pod: &Pod) -> Option<WorkerProcess> {
    let spec = pod.spec.as_ref()?;
    let container = spec.containers.iter().find(|c| c.name == WORKER_CONTAINER)?;
    let volume = spec.volumes.as_ref()?.iter().find(|v| v.name == CONFIG_VOLUME)?;
    let config_map = config_maps.get(&volume.config_map.as_ref()?.name).await.ok()?;
    let config = config_map.data?.get(CONFIG_KEY)?.clone();
    let mut env: HashMap<String, String> = HashMap::new();
    for var in container.env.clone().unwrap_or_default() {
        let from_pod_name =
            var.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).is_some_and(|f| f.field_path == "metadata.name");
        let value = if from_pod_name { pod.name_any() } else { var.value.clone().unwrap_or_default() };
        env.insert(var.name, value);
    }
    let args: Vec<String> = container
        .args
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|arg| env.iter().fold(arg, |arg, (k, v)| arg.replace(&format!("$({k})"), v)))
        .collect();
    // The process is started with the pod's config; its owner id comes from the pod's args.
    let owner = args.iter().skip_while(|a| *a != "--owner-id").nth(1).cloned().unwrap_or_else(|| pod.name_any());
    assert!(args.first().map(String::as_str) == Some("--config"), "unexpected worker args {args:?}");
    Some(WorkerProcess::spawn(&binary_for(container.image.as_deref()), &config, &owner))
}
