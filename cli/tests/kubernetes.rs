//! The CLI against a StreamConsumer on the local control plane (`tests/ground/control-plane.sh start`):
//! `namespace/name` resolution, pause and resume (this test stands in for the operator, stopping and
//! starting the worker when `spec.paused` changes), and errors for a consumer that does not exist.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt, ResourceExt};
use leasehold_crds::StreamConsumer;
use leasehold_testkit::{Service, endpoint};

fn kubeconfig() -> PathBuf {
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| leasehold_testkit::state_dir().join("control-plane/kubeconfig"))
}

async fn client() -> Client {
    let path = kubeconfig();
    let config = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
        panic!(
            "no kubeconfig at {} ({e}): start the local control plane with `tests/ground/control-plane.sh start` (or `make control-plane`)",
            path.display()
        )
    });
    let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await.expect("kubeconfig");
    let client = Client::try_from(config).expect("client");
    client.apiserver_version().await.unwrap_or_else(|e| panic!("kube-apiserver is not answering ({e})"));
    client
}

async fn install_crd(client: &Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd = StreamConsumer::crd();
    crds.patch(&crd.name_any(), &PatchParams::apply("leasehold-cli-tests").force(), &Patch::Apply(&crd))
        .await
        .expect("apply CRD");
    wait_for("the CRD is established", Duration::from_secs(20), async || {
        crds.get(&crd.name_any())
            .await
            .ok()
            .and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"))
    })
    .await;
}

fn kube_env() -> Vec<(&'static str, String)> {
    vec![("KUBECONFIG", kubeconfig().display().to_string())]
}

fn run_k(args: &[&str]) -> Run {
    let env = kube_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run_with_env(args, &env)
}

/// Starts `leasehold args...` in the background; its stderr lines arrive on the channel.
fn start_k(args: &[&str]) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut command = leasehold();
    command.args(args).env("KUBECONFIG", kubeconfig()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn leasehold");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

fn wait_child(child: &mut std::process::Child, timeout: Duration) -> i32 {
    let until = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < until {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code().unwrap_or(-1);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("leasehold did not finish within {timeout:?}");
}

#[test]
fn a_stream_consumer_is_described_paused_reset_and_resumed_by_name() {
    run_test(async {
        let kube = client().await;
        install_crd(&kube).await;
        let ns = leasehold_testkit::unique_name("cli").to_lowercase();
        let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns");
        Api::<Namespace>::all(kube.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-k8s", 2).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-k8s").await;
        let consumer: StreamConsumer = serde_json::from_value(serde_json::json!({
            "apiVersion": "leasehold.io/v1alpha1", "kind": "StreamConsumer",
            "metadata": {"name": "orders"},
            "spec": {
                "streams": [{"name": stream}],
                "aws": {"region": "us-east-1", "kinesisEndpoint": endpoint(Service::Kinesis), "dynamodbEndpoint": endpoint(Service::DynamoDb)},
                "leaseTable": {"name": table},
                "workers": {"replicas": 1},
                "lease": {"duration": "2s", "renewInterval": "500ms"},
                "processor": {"stdout": {}}
            }
        }))
        .expect("consumer");
        let consumers: Api<StreamConsumer> = Api::namespaced(kube.clone(), &ns);
        consumers.create(&PostParams::default(), &consumer).await.expect("create consumer");
        let name = format!("{ns}/orders");

        // Nothing but the kubeconfig and credentials: table, region and endpoints come from the spec.
        let mut worker = spawn_worker(&config(&stream, &table, "startPosition: TRIM_HORIZON\n"), "pod-a");
        wait_for("the worker reads both shards", Duration::from_secs(30), async || {
            run_k(&["describe", &name, "-o", "json"]).json()["summary"]["reading"] == 2
        })
        .await;
        let d = run_k(&["describe", &name, "-o", "json"]).expect_code(0).json();
        assert_eq!(d["consumer"], name.as_str());
        assert_eq!(d["table"], table.as_str());
        assert_eq!(d["summary"]["liveMembers"], 1);
        // The same through kubectl, which finds the plugin on PATH (control-plane.sh installs kubectl).
        let kubectl = leasehold_testkit::cache_dir().join("k8s-bin/kubectl");
        assert!(
            kubectl.exists(),
            "{} is missing: start the control plane with tests/ground/control-plane.sh start",
            kubectl.display()
        );
        let plugin_dir =
            std::path::Path::new(env!("CARGO_BIN_EXE_kubectl-leasehold")).parent().expect("bin dir").to_path_buf();
        let out = std::process::Command::new(&kubectl)
            .env("PATH", format!("{}:{}", plugin_dir.display(), std::env::var("PATH").unwrap_or_default()))
            .env("KUBECONFIG", kubeconfig())
            .env("AWS_ACCESS_KEY_ID", "leasehold-test")
            .env("AWS_SECRET_ACCESS_KEY", "leasehold-test")
            .args(["leasehold", "describe", &name, "-o", "json"])
            .output()
            .expect("kubectl leasehold");
        assert!(out.status.success(), "kubectl leasehold: {}", String::from_utf8_lossy(&out.stderr));
        let through: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(through["table"], table.as_str());
        run_k(&["reset", &name, "--to-earliest", "--execute"]).expect_code(4);

        // pause: spec.paused is set; the tool waits (with a progress line) until the worker has left.
        let (mut pause, lines) = start_k(&["pause", &name, "--timeout", "60s", "-o", "json"]);
        wait_for("spec.paused", Duration::from_secs(20), async || {
            consumers.get("orders").await.ok().and_then(|c| c.spec.paused) == Some(true)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        worker.signal("TERM");
        assert!(worker.wait_exit(Duration::from_secs(15)).is_some(), "worker did not stop");
        assert_eq!(wait_child(&mut pause, Duration::from_secs(30)), 0);
        let progress: Vec<String> = lines.try_iter().collect();
        assert!(progress.iter().any(|l| l.contains("waiting for 1 worker(s) to leave: pod-a")), "{progress:?}");

        // Paused: the reset applies.
        let reset = run_k(&["reset", &name, "--to-earliest", "--execute", "-o", "json"]).expect_code(0).json();
        assert_eq!(reset["written"].as_array().map(Vec::len), Some(2));

        // resume: spec.paused cleared; the tool waits until a worker is back.
        let (mut resume, _) = start_k(&["resume", &name, "--timeout", "60s"]);
        wait_for("spec.paused cleared", Duration::from_secs(20), async || {
            consumers.get("orders").await.ok().and_then(|c| c.spec.paused) == Some(false)
        })
        .await;
        let back = spawn_worker(&config(&stream, &table, ""), "pod-b");
        assert_eq!(wait_child(&mut resume, Duration::from_secs(30)), 0);
        drop(back);

        // A pause that cannot finish in time says who is still there.
        let stuck = spawn_worker(&config(&stream, &table, ""), "pod-c");
        wait_for("pod-c is a member", Duration::from_secs(20), async || {
            run_k(&["describe", &name, "-o", "json"]).json()["summary"]["liveMembers"] == 1
        })
        .await;
        let timeout = run_k(&["pause", &name, "--timeout", "2s"]).expect_code(8);
        assert!(timeout.stderr.contains("pod-c"), "{}", timeout.stderr);
        drop(stuck);

        // Errors name what is missing.
        let missing = run_k(&["describe", &format!("{ns}/nope")]).expect_code(3);
        assert!(missing.stderr.contains("no StreamConsumer nope"), "{}", missing.stderr);
        run_k(&["describe", "not-a-namespaced-name"]).expect_code(2);
        run_k(&["pause", "--table", &table]).expect_code(2);
        let _ = Api::<Namespace>::all(kube).delete(&ns, &Default::default()).await;
    });
}

#[test]
fn drain_with_delete_pod_moves_every_lease_without_repeats() {
    run_test(async {
        let kube = client().await;
        install_crd(&kube).await;
        let ns = leasehold_testkit::unique_name("cli-drain").to_lowercase();
        let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns");
        Api::<Namespace>::all(kube.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-drain-k8s", 4).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-drain-k8s").await;
        let consumer: StreamConsumer = serde_json::from_value(serde_json::json!({
            "apiVersion": "leasehold.io/v1alpha1", "kind": "StreamConsumer",
            "metadata": {"name": "orders"},
            "spec": {
                "streams": [{"name": stream}],
                "aws": {"region": "us-east-1", "kinesisEndpoint": endpoint(Service::Kinesis), "dynamodbEndpoint": endpoint(Service::DynamoDb)},
                "leaseTable": {"name": table},
                "processor": {"stdout": {}}
            }
        }))
        .expect("consumer");
        Api::<StreamConsumer>::namespaced(kube.clone(), &ns)
            .create(&PostParams::default(), &consumer)
            .await
            .expect("create");
        // The pod that stands for worker pod-a (no kubelet runs it: this test signals the process).
        wait_for("the default service account", Duration::from_secs(30), async || {
            Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(kube.clone(), &ns)
                .get_opt("default")
                .await
                .ok()
                .flatten()
                .is_some()
        })
        .await;
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(kube.clone(), &ns);
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pod-a"},
            "spec": {"containers": [{"name": "worker", "image": "example.invalid/leasehold-worker:dev"}]}
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &pod).await.expect("create pod");

        let config = config(&stream, &table, "startPosition: TRIM_HORIZON\n");
        let mut a = spawn_worker(&config, "pod-a");
        let b = spawn_worker(&config, "pod-b");
        let first: Vec<(String, Vec<u8>)> =
            (0..40).map(|n| leasehold_testkit::kinesis::numbered(&format!("key-{}", n % 8), n)).collect();
        leasehold_testkit::kinesis::put_records(&kinesis, &stream, &first).await;
        let name = format!("{ns}/orders");
        wait_for("both workers hold two leases and everything is processed", Duration::from_secs(40), async || {
            let d = run_k(&["describe", &name, "-o", "json"]).json();
            let held = |o: &str| d["shards"].as_array().map_or(0, |s| s.iter().filter(|s| s["owner"] == o).count());
            held("pod-a") == 2 && held("pod-b") == 2 && a.deliveries().len() + b.deliveries().len() >= 40
        })
        .await;

        let (mut drain, _) = start_k(&["drain", &name, "pod-a", "--timeout", "2s", "--delete-pod", "-o", "json"]);
        wait_for("the pod deleted", Duration::from_secs(30), async || {
            pods.get_opt("pod-a").await.ok().flatten().is_none()
        })
        .await;
        a.signal("TERM");
        assert!(a.wait_exit(Duration::from_secs(15)).is_some(), "pod-a did not stop");
        let code = wait_child(&mut drain, Duration::from_secs(30));
        let out = drain.wait_with_output().expect("output");
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stdout));
        let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(outcome["podDeleted"], true);

        let second: Vec<(String, Vec<u8>)> =
            (40..80).map(|n| leasehold_testkit::kinesis::numbered(&format!("key-{}", n % 8), n)).collect();
        leasehold_testkit::kinesis::put_records(&kinesis, &stream, &second).await;
        wait_for("pod-b processes the rest", Duration::from_secs(40), async || {
            a.deliveries().len() + b.deliveries().len() >= 80
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut seen = std::collections::HashSet::new();
        for d in a.deliveries().into_iter().chain(b.deliveries()) {
            assert!(seen.insert((d.shard_id.clone(), d.sequence_number.clone())), "processed twice: {d:?}");
        }
        assert_eq!(seen.len(), 80);
        let _ = Api::<Namespace>::all(kube).delete(&ns, &Default::default()).await;
    });
}
