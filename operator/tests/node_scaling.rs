//! Scaling on the real node (tests/ground/node.sh), with an http processor: every worker pod runs the
//! worker image beside an http sidecar (`worker/examples/http_sink.rs`, its own image) named in
//! `spec.template`, in a namespace enforcing the restricted Pod Security profile.
//! Autoscaling on (2 shards per worker): one pod -> split the stream -> a second pod, leases rebalanced
//! over both, records exactly once through the sidecar -> autoscaling off and `kubectl scale` to 3 ->
//! three pods, one shard each -> delete -> pods gone. `terminationGracePeriodSeconds` follows
//! `lease.gracefulTimeout`.

mod node;
mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use leasehold_testkit::kinesis::{numbered, open_shards, put_records, split};
use node::{HTTP_SINK_IMAGE, Logs, Node, kubectl, missing_and_repeats, ready};
use serde_json::json;
use support::wait;
use tokio_util::sync::CancellationToken;

const SLOW: Duration = Duration::from_secs(90);
const NAME: &str = "billing";
const SELECTOR: &str = "leasehold.io/consumer=billing";

fn operator_binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_leasehold-operator"))
}

async fn worker_pods(pods: &Api<Pod>) -> Vec<Pod> {
    let list = pods.list(&ListParams::default().labels(SELECTOR)).await.map(|l| l.items).unwrap_or_default();
    list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
}

async fn ready_pods(pods: &Api<Pod>) -> HashSet<String> {
    worker_pods(pods).await.iter().filter(|p| ready(p)).map(|p| p.name_any()).collect()
}

/// Owner of each open shard of `stream` (empty when the row has none yet).
async fn open_owners(
    kinesis: &aws_sdk_kinesis::Client,
    dynamodb: &aws_sdk_dynamodb::Client,
    stream: &str,
    table: &str,
) -> HashMap<String, String> {
    let open: Vec<String> = open_shards(kinesis, stream).await.into_iter().map(|(id, _, _)| id).collect();
    let Ok(scan) = dynamodb.scan().table_name(table).consistent_read(true).send().await else {
        return HashMap::new();
    };
    let text = |item: &HashMap<String, aws_sdk_dynamodb::types::AttributeValue>, name: &str| {
        item.get(name).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
    };
    let rows: HashMap<String, String> =
        scan.items().iter().map(|item| (text(item, "lease_key"), text(item, "lease_owner"))).collect();
    open.into_iter().map(|id| (id.clone(), rows.get(&format!("{stream}:{id}")).cloned().unwrap_or_default())).collect()
}

/// Every open shard held by a ready pod and every ready pod holding one: the group is balanced.
async fn balanced(
    pods: &Api<Pod>,
    kinesis: &aws_sdk_kinesis::Client,
    dynamodb: &aws_sdk_dynamodb::Client,
    stream: &str,
    table: &str,
    want_pods: usize,
) -> bool {
    let live = ready_pods(pods).await;
    let owners = open_owners(kinesis, dynamodb, stream, table).await;
    let holders: HashSet<&String> = owners.values().collect();
    live.len() == want_pods && owners.values().all(|o| live.contains(o)) && live.iter().all(|p| holders.contains(p))
}

fn batch(from: u64, to: u64) -> Vec<(String, Vec<u8>)> {
    (from..to).flat_map(|n| (0..10).map(move |k| numbered(&format!("key-{k}"), n))).collect()
}

fn texts(records: &[(String, Vec<u8>)]) -> HashSet<String> {
    records.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaled_pods_with_an_http_sidecar_follow_a_split_and_kubectl_scale() {
    let node = Node::get();
    node.assert_image(&node::worker_image());
    node.assert_image(HTTP_SINK_IMAGE);
    let client = support::client().await;
    support::install_crd(&client).await;
    let ns = support::create_namespace(&client, "scale", true).await;
    support::wait_for_default_service_account(&client, &ns, SLOW).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "scale", 2).await;
    let table = leasehold_testkit::unique_name("scale");

    let mut operator = node::spawn_operator(&operator_binary(), &ns, "1s");
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let stop = CancellationToken::new();
    let sink_logs = Logs::follow_container(pods.clone(), SELECTOR, "sink", stop.clone());

    let consumer = support::consumer(
        NAME,
        json!({
            "streams": [{"name": stream}], "aws": node.aws(),
            "leaseTable": {"name": table, "deletionPolicy": "Delete"},
            "workers": {"autoscaling": {"shardsPerWorker": 2, "minReplicas": 1, "maxReplicas": 4}},
            "startPosition": "TRIM_HORIZON",
            "lease": {"duration": "10s", "renewInterval": "1s", "scanInterval": "200ms", "shardSyncInterval": "1s",
                      "gracefulTimeout": "7s"},
            "processor": {"http": {"url": "http://127.0.0.1:8080/records"}},
            "template": {"spec": {"containers": [
                {"name": "worker", "imagePullPolicy": "Never", "env": [
                    {"name": "AWS_ACCESS_KEY_ID", "value": "leasehold-test"},
                    {"name": "AWS_SECRET_ACCESS_KEY", "value": "leasehold-test"}]},
                {"name": "sink", "image": HTTP_SINK_IMAGE, "imagePullPolicy": "Never", "args": ["127.0.0.1:8080"],
                 "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                     "capabilities": {"drop": ["ALL"]}}}]}}
        }),
    );
    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns);
    consumers.create(&PostParams::default(), &consumer).await.expect("apply");

    // Two shards at two per worker: one pod, both containers running, the worker's probes passing.
    wait("one worker pod Ready with its sidecar", SLOW, async || {
        balanced(&pods, &kinesis, &dynamodb, &stream, &table, 1).await
    })
    .await;
    let pod = worker_pods(&pods).await.into_iter().next().expect("a pod");
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(
        spec.termination_grace_period_seconds,
        Some(leasehold_operator::pipeline::build::termination_grace_period(Duration::from_secs(7))),
        "terminationGracePeriodSeconds follows lease.gracefulTimeout (7 s + the margin)"
    );
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["worker", "sink"], "the template's sidecar kept beside the worker");

    let first = batch(0, 30);
    put_records(&kinesis, &stream, &first).await;
    let mut expected = texts(&first);
    wait("the first records through the sidecar", SLOW, async || {
        missing_and_repeats(&expected, &sink_logs.deliveries()).0 == 0
    })
    .await;

    // Split one shard: three open shards -> ceil(3 / 2) = 2 pods, and the leases spread over both.
    let (to_split, _, _) = open_shards(&kinesis, &stream).await.remove(0);
    split(&kinesis, &stream, &to_split).await;
    let during = batch(30, 60);
    put_records(&kinesis, &stream, &during).await;
    expected.extend(texts(&during));
    wait("a second pod after the split, leases rebalanced", SLOW, async || {
        balanced(&pods, &kinesis, &dynamodb, &stream, &table, 2).await
    })
    .await;
    let after = batch(60, 90);
    put_records(&kinesis, &stream, &after).await;
    expected.extend(texts(&after));
    wait("records across the split and the scale-up", SLOW, async || {
        missing_and_repeats(&expected, &sink_logs.deliveries()).0 == 0
    })
    .await;
    let (_, repeats) = missing_and_repeats(&expected, &sink_logs.deliveries());
    assert_eq!(repeats, 0, "records repeated across a split and a scale-up");
    let status = consumers.get(NAME).await.expect("consumer").status.expect("status");
    assert_eq!(status.replicas, Some(2), "status.replicas follows the autoscaled count");

    // Autoscaling off, then `kubectl scale` through the scale subresource: three pods, one shard each.
    let manual = json!({"spec": {"workers": {"autoscaling": null, "replicas": 2}}});
    consumers.patch(NAME, &PatchParams::default(), &Patch::Merge(&manual)).await.expect("autoscaling off");
    kubectl(&["-n", &ns, "scale", "streamconsumer", NAME, "--replicas", "3"]);
    let scaled = consumers.get(NAME).await.expect("consumer");
    assert_eq!(scaled.spec.workers.replicas, Some(3), "kubectl scale wrote spec.workers.replicas");
    let more = batch(90, 120);
    put_records(&kinesis, &stream, &more).await;
    expected.extend(texts(&more));
    wait("three pods after kubectl scale, one shard each", SLOW, async || {
        balanced(&pods, &kinesis, &dynamodb, &stream, &table, 3).await
    })
    .await;
    let last = batch(120, 150);
    put_records(&kinesis, &stream, &last).await;
    expected.extend(texts(&last));
    wait("every record through the sidecars", SLOW, async || {
        missing_and_repeats(&expected, &sink_logs.deliveries()).0 == 0
    })
    .await;
    let (_, repeats) = missing_and_repeats(&expected, &sink_logs.deliveries());
    assert_eq!(repeats, 0, "records repeated across kubectl scale");

    consumers.delete(NAME, &DeleteParams::default()).await.expect("delete consumer");
    wait("worker pods gone", SLOW, async || worker_pods(&pods).await.is_empty()).await;
    stop.cancel();
    let _ = operator.kill();
    let _ = operator.wait();
}
