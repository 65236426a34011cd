//! End to end: the real control plane, the emulators, the operator as a process, and the worker pods
//! run as local processes by a stand-in kubelet. Apply a consumer -> table -> workers -> records
//! processed; split the stream -> a worker is added -> leases rebalance, nothing lost; delete -> the
//! workers stop, the table is kept or deleted by policy.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, PostParams};
use leasehold_testkit::kinesis::{numbered, put_records, split};
use serde_json::json;
use support::kubelet::Kubelet;
use support::{aws, wait};

const SLOW: Duration = Duration::from_secs(60);

fn operator_binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_leasehold-operator"))
}

fn deliveries(kubelet: &Kubelet) -> (usize, HashSet<String>) {
    let running = kubelet.running.lock().expect("running");
    let all: Vec<_> = running.values().flat_map(|w| w.deliveries()).collect();
    (all.len(), all.into_iter().map(|d| d.data).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_process_split_rebalance_delete() {
    let client = support::client().await;
    support::install_crd(&client).await;
    let ns = support::create_namespace(&client, "e2e", false).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "e2e", 2).await;
    let table = leasehold_testkit::unique_name("e2e");

    let mut operator = support::spawn_operator(&operator_binary(), &ns, &support::kubeconfig_path(), "1s");
    let kubelet = Kubelet::start(client.clone(), &ns, "app.kubernetes.io/name=leasehold-worker");

    // kubectl apply
    let consumer = support::stand_in_consumer(
        "orders",
        json!({
            "streams": [{"name": stream}], "aws": aws(),
            "leaseTable": {"name": table, "deletionPolicy": "Delete"},
            "workers": {"autoscaling": {"shardsPerWorker": 1, "minReplicas": 1, "maxReplicas": 5}},
            "startPosition": "TRIM_HORIZON",
            "lease": {"duration": "2s", "renewInterval": "500ms", "scanInterval": "250ms", "shardSyncInterval": "1s"},
            "processor": {"stdout": {}}
        }),
    );
    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns);
    consumers.create(&PostParams::default(), &consumer).await.expect("apply");

    wait("two worker processes", SLOW, async || kubelet.pods().len() == 2).await;
    wait("Ready", SLOW, async || {
        support::condition(&consumers, "orders", "Ready").await.is_some_and(|c| c.0 == "True")
    })
    .await;
    let first: Vec<_> = (0..30).flat_map(|n| (0..20).map(move |k| numbered(&format!("key-{k}"), n))).collect();
    put_records(&kinesis, &stream, &first).await;
    wait("first records processed", SLOW, async || deliveries(&kubelet).1.len() >= first.len()).await;

    // Split: 3 open shards -> 3 workers; leases rebalance, nothing is lost.
    split(&kinesis, &stream, "shardId-000000000000").await;
    let second: Vec<_> = (30..60).flat_map(|n| (0..20).map(move |k| numbered(&format!("key-{k}"), n))).collect();
    put_records(&kinesis, &stream, &second).await;
    wait("a third worker", SLOW, async || kubelet.pods().len() == 3).await;
    wait("every record processed", SLOW, async || deliveries(&kubelet).1.len() >= first.len() + second.len()).await;
    let expected: HashSet<String> =
        first.iter().chain(&second).map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    let (_, seen) = deliveries(&kubelet);
    assert!(expected.is_subset(&seen), "{} records lost", expected.difference(&seen).count());
    wait("the three open shards spread one per worker", SLOW, async || {
        let running = kubelet.running.lock().expect("running");
        let held: Vec<usize> =
            running.values().map(|w| w.held_shards().iter().filter(|s| !s.ends_with("000000000000")).count()).collect();
        held.len() == 3 && held.iter().all(|h| *h == 1)
    })
    .await;

    // Delete: the garbage collector removes the Deployment's pods, so the workers stop; the table goes
    // (deletionPolicy Delete, created by this resource).
    consumers.delete("orders", &DeleteParams::default()).await.unwrap();
    wait("workers stopped", SLOW, async || kubelet.pods().is_empty()).await;
    wait("table deleted", SLOW, async || dynamodb.describe_table().table_name(&table).send().await.is_err()).await;
    let _ = operator.kill();
    let _ = operator.wait();
}
