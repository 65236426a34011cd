//! End to end on the real node (tests/ground/node.sh): the worker image (`make images`) run as real pods
//! by a real kubelet and containerd, in a namespace that enforces the restricted Pod Security profile.
//! Apply a StreamConsumer -> worker pods Running and Ready (their probes pass), no API token, read-only
//! root -> records processed exactly once (read from the pods' logs through the API server) -> a spec
//! change rolls the pods, nothing repeated ->
//! `kubectl delete pod` -> SIGTERM -> its leases move within 1 s, nothing repeated -> kill -9 of a
//! worker's process -> the kubelet restarts the container, which retakes its own leases (crash ->
//! records flowing again, measured) -> delete the StreamConsumer -> pods gone, table deleted.

mod node;
mod support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use leasehold_testkit::kinesis::{numbered, put_records};
use node::{Logs, Node, missing_and_repeats};
use serde_json::json;
use support::wait;
use tokio_util::sync::CancellationToken;

const SLOW: Duration = Duration::from_secs(90);
const SELECTOR: &str = "leasehold.io/consumer=orders";

fn operator_binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_leasehold-operator"))
}

/// Shard -> owner of every shard lease in `table` (member rows left out).
async fn owners(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> HashMap<String, String> {
    let Ok(scan) = dynamodb.scan().table_name(table).consistent_read(true).send().await else {
        return HashMap::new();
    };
    let text = |item: &HashMap<String, aws_sdk_dynamodb::types::AttributeValue>, name: &str| {
        item.get(name).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
    };
    scan.items()
        .iter()
        .map(|item| (text(item, "lease_key"), text(item, "lease_owner")))
        .filter(|(key, _)| !key.starts_with('#'))
        .collect()
}

async fn worker_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(SELECTOR)).await.map(|l| l.items).unwrap_or_default()
}

fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && node::ready(pod)
}

fn worker_status(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == "worker")
}

fn batch(from: u64, to: u64) -> Vec<(String, Vec<u8>)> {
    (from..to).flat_map(|n| (0..10).map(move |k| numbered(&format!("key-{k}"), n))).collect()
}

fn texts(records: &[(String, Vec<u8>)]) -> HashSet<String> {
    records.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_pods_process_move_on_delete_and_restart_after_kill() {
    let node = Node::get();
    node.assert_image(&node::worker_image());
    let client = support::client().await;
    support::install_crd(&client).await;
    let ns = support::create_namespace(&client, "node", true).await;
    support::wait_for_default_service_account(&client, &ns, SLOW).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "node", 4).await;
    let table = leasehold_testkit::unique_name("node");

    let mut operator = node::spawn_operator(&operator_binary(), &ns, "1s");
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let stop = CancellationToken::new();
    let logs = Logs::follow(pods.clone(), SELECTOR, stop.clone());

    // kubectl apply: two workers as real pods from the image, the emulators reached over the veth.
    let consumer = support::consumer(
        "orders",
        json!({
            "streams": [{"name": stream}], "aws": node.aws(),
            "leaseTable": {"name": table, "deletionPolicy": "Delete"},
            "workers": {"replicas": 2},
            "startPosition": "TRIM_HORIZON",
            "lease": {"duration": "10s", "renewInterval": "1s", "scanInterval": "200ms", "shardSyncInterval": "1s",
                      "gracefulTimeout": "5s"},
            "processor": {"stdout": {}},
            "template": {"spec": {"containers": [{"name": "worker", "imagePullPolicy": "Never", "env": [
                {"name": "AWS_ACCESS_KEY_ID", "value": "leasehold-test"},
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "leasehold-test"}]}]}}
        }),
    );
    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns);
    let applied = Instant::now();
    consumers.create(&PostParams::default(), &consumer).await.expect("apply");
    wait("two worker pods Running and Ready", SLOW, async || {
        let list = worker_pods(&pods).await;
        list.len() == 2 && list.iter().all(ready)
    })
    .await;
    let pod_start = applied.elapsed();
    for pod in worker_pods(&pods).await {
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.automount_service_account_token, Some(false), "{}: workers get no API token", pod.name_any());
        let worker = spec.containers.iter().find(|c| c.name == "worker").expect("worker container");
        assert!(
            worker.volume_mounts.iter().flatten().all(|m| !m.mount_path.starts_with("/var/run/secrets")),
            "{}: a token is mounted",
            pod.name_any()
        );
        let security = worker.security_context.as_ref().expect("security context");
        assert_eq!(security.read_only_root_filesystem, Some(true), "read-only root filesystem");
        assert_eq!(worker_status(&pod).map(|s| s.restart_count), Some(0), "{}: restarted", pod.name_any());
    }
    eprintln!("figure: apply -> 2 worker pods Running and Ready: {:.1} s", pod_start.as_secs_f64());

    // Records processed exactly once, read from the pods' stdout through the API server's log endpoint.
    let first = batch(0, 40);
    put_records(&kinesis, &stream, &first).await;
    let mut expected = texts(&first);
    wait("the first records in the pods' logs", SLOW, async || {
        missing_and_repeats(&expected, &logs.deliveries()).0 == 0
    })
    .await;
    wait("all four shards held", SLOW, async || owners(&dynamodb, &table).await.values().all(|o| !o.is_empty())).await;
    let (_, repeats) = missing_and_repeats(&expected, &logs.deliveries());
    assert_eq!(repeats, 0, "records repeated with no pod stopped");

    // A spec change rolls the pods (new config hash) one at a time, records flowing, nothing repeated.
    let hash = |p: &Pod| p.labels().get("pod-template-hash").cloned().unwrap_or_default();
    let before: HashSet<String> = worker_pods(&pods).await.iter().map(hash).collect();
    let change = json!({"spec": {"lease": {"checkpointInterval": "500ms"}}});
    consumers.patch("orders", &PatchParams::default(), &Patch::Merge(&change)).await.expect("change the spec");
    let rolling = batch(40, 60);
    put_records(&kinesis, &stream, &rolling).await;
    expected.extend(texts(&rolling));
    wait("the pods rolled to the new spec", SLOW, async || {
        let list = worker_pods(&pods).await;
        list.len() == 2 && list.iter().all(|p| ready(p) && !before.contains(&hash(p)))
    })
    .await;
    let rolled = batch(60, 80);
    put_records(&kinesis, &stream, &rolled).await;
    expected.extend(texts(&rolled));
    wait("records across the roll in the logs", SLOW, async || {
        missing_and_repeats(&expected, &logs.deliveries()).0 == 0
    })
    .await;
    let (_, repeats) = missing_and_repeats(&expected, &logs.deliveries());
    assert_eq!(repeats, 0, "records repeated across a rolling update");
    wait("every lease held by a rolled pod", SLOW, async || {
        let live: HashSet<String> =
            worker_pods(&pods).await.iter().filter(|p| ready(p)).map(|p| p.name_any()).collect();
        let now = owners(&dynamodb, &table).await;
        now.len() == 4 && now.values().all(|o| live.contains(o))
    })
    .await;

    // kubectl delete pod: SIGTERM, the worker hands its leases over; they are taken elsewhere at once.
    let victim = worker_pods(&pods).await.into_iter().next().expect("a pod").name_any();
    let held: Vec<String> =
        owners(&dynamodb, &table).await.into_iter().filter(|(_, o)| *o == victim).map(|(s, _)| s).collect();
    assert!(!held.is_empty(), "{victim} holds no lease");
    let deleted = Instant::now();
    let deleted_at = k8s_openapi::jiff::Timestamp::now();
    pods.delete(&victim, &DeleteParams::default()).await.expect("delete pod");
    wait("the deleted pod's leases taken by another worker", SLOW, async || {
        let now = owners(&dynamodb, &table).await;
        held.iter().all(|s| now.get(s).is_some_and(|o| !o.is_empty() && *o != victim))
    })
    .await;
    let moved = deleted.elapsed();
    eprintln!("figure: kubectl delete pod -> its {} leases held elsewhere: {:.2} s", held.len(), moved.as_secs_f64());
    let second = batch(80, 120);
    put_records(&kinesis, &stream, &second).await;
    expected.extend(texts(&second));
    wait("records after the delete in the logs", SLOW, async || {
        missing_and_repeats(&expected, &logs.deliveries()).0 == 0
    })
    .await;
    let (_, repeats) = missing_and_repeats(&expected, &logs.deliveries());
    assert_eq!(repeats, 0, "records repeated across a graceful pod delete");
    // The kubelet's part (delete -> SIGTERM) and the worker's (SIGTERM -> leases held elsewhere), from
    // the worker's own log line.
    let victim_log = logs.text_of(&victim, 0);
    let sigterm_at = victim_log
        .lines()
        .filter(|l| l.contains("SIGTERM received"))
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?.get("timestamp")?.as_str()?.parse().ok())
        .map(|at: k8s_openapi::jiff::Timestamp| Duration::try_from(at.duration_since(deleted_at)).unwrap_or_default())
        .unwrap_or_else(|| panic!("{victim} logged no SIGTERM:\n{victim_log}"));
    let handover = moved.saturating_sub(sigterm_at);
    eprintln!(
        "figure: kubectl delete pod -> SIGTERM in the container {:.2} s; SIGTERM -> its leases held elsewhere {:.2} s",
        sigterm_at.as_secs_f64(),
        handover.as_secs_f64()
    );
    assert!(handover <= Duration::from_secs(1), "leases moved {handover:?} after SIGTERM, expected within 1 s");
    wait("two pods Ready again", SLOW, async || {
        let list = worker_pods(&pods).await;
        list.len() == 2 && list.iter().all(ready)
    })
    .await;

    // kill -9 of a worker's process: the kubelet restarts the container under the same pod name, which
    // (stable owner id) retakes its own leases at once instead of waiting ~10 s for them to expire.
    wait("every lease held by a running pod", SLOW, async || {
        let live: HashSet<String> =
            worker_pods(&pods).await.iter().filter(|p| ready(p)).map(|p| p.name_any()).collect();
        let now = owners(&dynamodb, &table).await;
        now.len() == 4 && now.values().all(|o| live.contains(o))
    })
    .await;
    let target = worker_pods(&pods).await.into_iter().find(ready).expect("a ready pod");
    let target_name = target.name_any();
    let status = worker_status(&target).expect("worker status").clone();
    let container_id = status.container_id.clone().expect("container id");
    let its_shards: HashSet<String> =
        owners(&dynamodb, &table).await.into_iter().filter(|(_, o)| *o == target_name).map(|(s, _)| s).collect();
    assert!(!its_shards.is_empty(), "{target_name} holds no lease");
    let before_kill = logs.deliveries().len();
    let killed = Instant::now();
    node.kill_container(&container_id);
    let third = batch(120, 160);
    put_records(&kinesis, &stream, &third).await;
    expected.extend(texts(&third));
    // Records put after the kill, on the killed container's shards, printed by the same pod: only its
    // restarted container can have printed them.
    let after_kill = texts(&third);
    // Lease keys are `<stream>:<shard id>`; the stdout processor prints the shard id.
    let its_shard_ids: HashSet<&str> = its_shards.iter().filter_map(|s| s.rsplit(':').next()).collect();
    let resumed_at = || {
        logs.deliveries_of_pod(&target_name)
            .into_iter()
            .filter(|d| its_shard_ids.contains(d.shard_id.as_str()) && after_kill.contains(&d.data))
            .map(|d| d.seen_at)
            .min()
    };
    wait("the restarted container processing its shards", SLOW, async || resumed_at().is_some()).await;
    let resumed = resumed_at().expect("a delivery") - killed;
    let restarted = pods.get(&target_name).await.expect("the killed pod is still there");
    assert_eq!(
        worker_status(&restarted).map(|s| s.restart_count),
        Some(status.restart_count + 1),
        "the kubelet restarted the container under the same pod name"
    );
    let now = owners(&dynamodb, &table).await;
    assert!(
        its_shards.iter().all(|s| now.get(s) == Some(&target_name)),
        "the restarted pod did not keep its own leases: {now:?}"
    );
    wait("every record after the kill", SLOW, async || missing_and_repeats(&expected, &logs.deliveries()).0 == 0).await;
    let (_, repeats) = missing_and_repeats(&expected, &logs.deliveries());
    eprintln!(
        "figure: kill -9 of a worker -> its shards' records flowing again from the restarted container: {:.2} s \
         ({} repeats, {} deliveries before the kill; lease duration 10 s)",
        resumed.as_secs_f64(),
        repeats,
        before_kill
    );
    assert!(resumed < Duration::from_secs(10), "crash -> resume took {resumed:?}, no better than a lease expiry");

    // Delete: the pods go, the table goes (deletionPolicy Delete).
    consumers.delete("orders", &DeleteParams::default()).await.expect("delete consumer");
    wait("worker pods gone", SLOW, async || worker_pods(&pods).await.is_empty()).await;
    wait("table deleted", SLOW, async || dynamodb.describe_table().table_name(&table).send().await.is_err()).await;
    stop.cancel();
    let _ = operator.kill();
    let _ = operator.wait();
}
