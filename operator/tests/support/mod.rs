//! Test support for the operator against a real kube-apiserver (with etcd and kube-controller-manager,
//! started by `make control-plane`) and the AWS emulators.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use leasehold_crds::StreamConsumer;
use leasehold_operator::context::{Context, Settings};
use leasehold_operator::metrics::Metrics;
use leasehold_testkit::process::KillOnDrop;
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub mod kubelet;
pub mod observability;
pub mod windows;

const START_HINT: &str = "start it with `make control-plane` (tests/ground/control-plane.sh start), or run `make test`";

/// The admin kubeconfig of the local control plane (or `$KUBECONFIG`).
pub fn kubeconfig_path() -> PathBuf {
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| leasehold_testkit::state_dir().join("control-plane/kubeconfig"))
}

/// A client for the local control plane; panics with instructions when it is not running.
pub async fn client() -> Client {
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
        panic!("no kubeconfig at {} ({e}): the local control plane is not running; {START_HINT}", path.display())
    });
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("kubeconfig");
    let client = Client::try_from(config).expect("client");
    client.apiserver_version().await.unwrap_or_else(|e| panic!("kube-apiserver is not answering ({e}); {START_HINT}"));
    client
}

/// Installs (or updates) the StreamConsumer CRD and waits until it is established.
pub async fn install_crd(client: &Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd = StreamConsumer::crd();
    crds.patch(&crd.name_any(), &PatchParams::apply("leasehold-tests").force(), &Patch::Apply(&crd))
        .await
        .expect("apply CRD");
    for _ in 0..100 {
        let current = crds.get(&crd.name_any()).await.expect("get CRD");
        let established = current
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"));
        if established {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CRD not established");
}

/// A fresh namespace (labelled to enforce the restricted Pod Security Standard) with its own operator.
pub struct TestNamespace {
    pub client: Client,
    pub name: String,
    /// The operator's shared state: metrics, failure streaks, readiness.
    pub ctx: Arc<Context>,
    stop: CancellationToken,
}

impl TestNamespace {
    /// Creates the namespace and starts an operator watching only it.
    pub async fn new(prefix: &str) -> Self {
        Self::with_settings(prefix, |_| {}).await
    }

    /// A namespace with its own in-process operator whose settings `tweak` changes from the tests' own.
    pub async fn with_settings(prefix: &str, tweak: impl FnOnce(&mut Settings)) -> Self {
        let client = client().await;
        install_crd(&client).await;
        let name = create_namespace(&client, prefix, true).await;
        wait_for_default_service_account(&client, &name, Duration::from_secs(20)).await;
        let mut settings = Settings {
            worker_image: "leasehold/worker:test".into(),
            shard_poll_interval: Duration::from_secs(1),
            static_credentials: Some(("leasehold-test".into(), "leasehold-test".into())),
            restrict_templates: false,
            worker_network_policy: None,
        };
        tweak(&mut settings);
        let ctx = Arc::new(Context::new(client.clone(), settings, Metrics::default()));
        let stop = CancellationToken::new();
        tokio::spawn(leasehold_operator::controller::run(ctx.clone(), Some(name.clone()), stop.clone()));
        Self { client, name, ctx, stop }
    }

    /// Stops this namespace's operator (as a shutdown would).
    pub fn stop_operator(&self) {
        self.stop.cancel();
    }

    pub fn consumers(&self) -> Api<StreamConsumer> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    pub fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Creates a StreamConsumer from a JSON spec, its pods left to a stand-in kubelet.
    pub async fn create(&self, name: &str, spec: serde_json::Value) -> Result<StreamConsumer, kube::Error> {
        self.consumers().create(&PostParams::default(), &stand_in_consumer(name, spec)).await
    }

    /// The replicas of the worker Deployment `name`, once it exists.
    pub async fn replicas(&self, name: &str) -> Option<i32> {
        self.deployments().get_opt(name).await.ok().flatten().and_then(|d| d.spec?.replicas)
    }

    /// Plays the kubelet's part for the worker pods of `consumer`: marks every pod Running and Ready.
    pub async fn mark_pods_ready(&self, consumer: &str) {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.name);
        let selector = format!("leasehold.io/consumer={consumer}");
        for pod in pods.list(&ListParams::default().labels(&selector)).await.expect("pods").items {
            let _ =
                pods.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(ready_pod_status())).await;
        }
    }

    /// The condition `kind` of `consumer` as (status, reason).
    pub async fn condition(&self, consumer: &str, kind: &str) -> Option<(String, String)> {
        condition(&self.consumers(), consumer, kind).await
    }
}

/// Creates a namespace named after `prefix` (enforcing the restricted Pod Security Standard when
/// `restricted`) and returns its name.
pub async fn create_namespace(client: &Client, prefix: &str, restricted: bool) -> String {
    let name = leasehold_testkit::unique_name(prefix).to_lowercase();
    let labels = if restricted {
        json!({"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"})
    } else {
        json!({})
    };
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).expect("namespace");
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.expect("create namespace");
    name
}

/// A StreamConsumer named `name` with a JSON spec, as `kubectl apply` would send it.
pub fn consumer(name: &str, spec: serde_json::Value) -> StreamConsumer {
    serde_json::from_value(json!({
        "apiVersion": "leasehold.io/v1alpha1", "kind": "StreamConsumer",
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("consumer")
}

/// The scheduler the stand-in kubelet's pods name: none runs, so the real node's kube-scheduler (up during
/// `make test`) leaves them unbound and its kubelet never starts a second copy of them as containers.
pub const STAND_IN_SCHEDULER: &str = "leasehold-stand-in";

/// [`consumer`] whose worker pods are left to a stand-in kubelet: they name [`STAND_IN_SCHEDULER`].
pub fn stand_in_consumer(name: &str, spec: serde_json::Value) -> StreamConsumer {
    let mut consumer = consumer(name, spec);
    let template = consumer.spec.template.get_or_insert_default();
    template.spec.get_or_insert_default().scheduler_name.get_or_insert_with(|| STAND_IN_SCHEDULER.to_string());
    consumer
}

/// The condition `kind` of consumer `name` as (status, reason).
pub async fn condition(consumers: &Api<StreamConsumer>, name: &str, kind: &str) -> Option<(String, String)> {
    let current = consumers.get_opt(name).await.ok().flatten()?;
    let conditions = current.status?.conditions;
    conditions.into_iter().find(|c| c.type_ == kind).map(|c| (c.status, c.reason))
}

/// The status patch of a pod that runs and is ready (what a kubelet would report).
pub fn ready_pod_status() -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}
    ]}})
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the operator binary as a process watching `namespace`, with test AWS credentials.
pub fn spawn_operator(
    binary: &std::path::Path,
    namespace: &str,
    kubeconfig: &std::path::Path,
    poll: &str,
) -> KillOnDrop {
    start_operator(operator_command(binary, namespace, kubeconfig, poll, "127.0.0.1:0"))
}

/// Starts an [`operator_command`] (flags added or not), panicking with the binary's path if it cannot;
/// the process is killed when the test ends, passed or failed.
pub fn start_operator(mut command: std::process::Command) -> KillOnDrop {
    let child = command.spawn().unwrap_or_else(|e| panic!("start {}: {e}", command.get_program().to_string_lossy()));
    KillOnDrop::new(child)
}

/// The operator's command line and environment for the tests (serving /metrics, /healthz and /readyz
/// on `metrics_addr`), output discarded; callers add flags.
pub fn operator_command(
    binary: &std::path::Path,
    namespace: &str,
    kubeconfig: &std::path::Path,
    poll: &str,
    metrics_addr: &str,
) -> std::process::Command {
    let mut command = std::process::Command::new(binary);
    command
        .args(["--namespace", namespace, "--metrics-addr", metrics_addr, "--shard-poll-interval", poll])
        .env("KUBECONFIG", kubeconfig)
        .env("AWS_ACCESS_KEY_ID", "leasehold-test")
        .env("AWS_SECRET_ACCESS_KEY", "leasehold-test")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    command
}

/// Waits until the controller-manager has made `namespace`'s default ServiceAccount, without which no
/// pod is admitted.
pub async fn wait_for_default_service_account(client: &Client, namespace: &str, timeout: Duration) {
    wait("default service account", timeout, async || {
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), namespace)
            .get_opt("default")
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await;
}

/// Endpoints of the emulators for `spec.aws`.
pub fn aws() -> serde_json::Value {
    json!({
        "region": "us-east-1",
        "kinesisEndpoint": leasehold_testkit::endpoint(leasehold_testkit::Service::Kinesis),
        "dynamodbEndpoint": leasehold_testkit::endpoint(leasehold_testkit::Service::DynamoDb),
    })
}

/// The tests' one polling helper, by its name here: `wait(what, timeout, async || condition).await`.
pub use leasehold_testkit::process::wait_for as wait;

/// A free loopback port (bound then released: good enough for a test process started right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}
