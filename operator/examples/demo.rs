//! `make demo`: the whole loop on this machine. A local control plane (etcd, kube-apiserver,
//! kube-controller-manager), the emulators, the operator as a process, and, since no container runtime
//! runs here, the worker pods run as local processes by a stand-in kubelet. Applies a StreamConsumer,
//! shows the table, the workers and who holds which shard, produces records, kills a worker and shows
//! its shards move, then deletes everything.

mod narration;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use leasehold_testkit::kinesis::put_records;
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings};
use narration::{orders, say, show_leases};
use serde_json::json;
use support::kubelet::Kubelet;

fn show_flow(kubelet: &Kubelet, seen: &mut BTreeMap<String, usize>) {
    let running = kubelet.running.lock().expect("running");
    for (pod, worker) in running.iter() {
        let deliveries = worker.deliveries();
        let before = seen.insert(pod.clone(), deliveries.len()).unwrap_or(0);
        let mut shards: Vec<String> =
            deliveries[before.min(deliveries.len())..].iter().map(|d| d.shard_id.clone()).collect();
        shards.sort();
        shards.dedup();
        println!("    {pod:<33} processed {:>5} new records from {shards:?}", deliveries.len().saturating_sub(before));
    }
}

async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while started.elapsed() < limit && !done() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

#[tokio::main]
async fn main() {
    let Some(operator_bin) = std::env::var_os("LEASEHOLD_OPERATOR_BIN") else {
        eprintln!("run `make demo`: it builds the binaries and starts the local stack first");
        std::process::exit(2);
    };
    say("The local stack: kube-apiserver + etcd + kube-controller-manager, kinesalite, dynalite (all on loopback)");
    let client = support::client().await;
    support::install_crd(&client).await;
    println!("    CRD streamconsumers.leasehold.io installed");
    let ns = support::create_namespace(&client, "demo", false).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "orders", 4).await;
    let table = leasehold_testkit::unique_name("orders-leases");
    println!("    namespace {ns}, Kinesis stream {stream} with 4 shards");

    say("Starting the operator (leasehold-operator) and a stand-in kubelet that runs worker pods as processes");
    let mut operator =
        support::spawn_operator(std::path::Path::new(&operator_bin), &ns, &support::kubeconfig_path(), "2s");
    let kubelet = Kubelet::start(client.clone(), &ns, "app.kubernetes.io/name=leasehold-worker");

    let spec = json!({
        "streams": [{"name": stream}], "aws": support::aws(),
        "leaseTable": {"name": table},
        "workers": {"autoscaling": {"shardsPerWorker": 2, "minReplicas": 1, "maxReplicas": 4}},
        "startPosition": "TRIM_HORIZON",
        "lease": {"duration": "4s", "renewInterval": "1s", "scanInterval": "500ms"},
        "processor": {"stdout": {}}
    });
    say("kubectl apply -f orders.yaml (lease shortened to 4 s for the demo):");
    for line in serde_yaml_ng::to_string(&json!({"apiVersion": "leasehold.io/v1alpha1", "kind": "StreamConsumer",
        "metadata": {"name": "orders"}, "spec": spec}))
    .unwrap_or_default()
    .lines()
    {
        println!("      {line}");
    }
    let consumer = support::stand_in_consumer("orders", spec);
    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns);
    consumers.create(&PostParams::default(), &consumer).await.expect("apply");

    say("The operator creates the lease table and a Deployment: 4 shards / 2 per worker = 2 workers");
    wait_until(Duration::from_secs(60), || kubelet.pods().len() == 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    if let Ok(current) = consumers.get("orders").await
        && let Some(status) = current.status
    {
        println!("    kubectl get scon: shards {:?}, replicas {:?}", status.open_shards, status.replicas);
        for condition in status.conditions {
            println!(
                "      {:<13} {:<6} {:<16} {}",
                condition.type_, condition.status, condition.reason, condition.message
            );
        }
    }
    println!("    worker pods: {:?}", kubelet.pods());
    let viewer = DynamoLeaseStore::new(dynamodb.clone(), table.clone(), LeaseSettings::new("demo-viewer"));
    say("The lease table: each shard held by exactly one worker pod");
    show_leases(&viewer).await;

    say("Producing 2,000 orders for 40 customers (partition key = customer)");
    put_records(&kinesis, &stream, &orders(0, 50)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut seen = BTreeMap::new();
    show_flow(&kubelet, &mut seen);

    let victim = kubelet.pods().first().cloned().unwrap_or_default();
    say(&format!("kill -9 the worker of pod {victim}: its leases must expire (4 s) before the other takes them"));
    let killed = Instant::now();
    if let Some(worker) = kubelet.running.lock().expect("running").get(&victim) {
        worker.signal("KILL");
    }
    put_records(&kinesis, &stream, &orders(50, 60)).await;
    let moved = wait_until(Duration::from_secs(20), || {
        let running = kubelet.running.lock().expect("running");
        running.iter().filter(|(pod, _)| **pod != victim).map(|(_, w)| w.held_shards().len()).sum::<usize>() == 4
    })
    .await;
    println!(
        "    all 4 shards held by the surviving pod {:.1} s after the kill",
        moved.min(killed.elapsed()).as_secs_f64()
    );
    show_leases(&viewer).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    show_flow(&kubelet, &mut seen);
    let delivered: HashSet<String> =
        kubelet.running.lock().expect("running").values().flat_map(|w| w.deliveries()).map(|d| d.data).collect();
    say(&format!("2,400 orders written, {} of them processed (at least once, in order per customer)", delivered.len()));

    say("kubectl delete scon orders: the workers stop; deletionPolicy Retain keeps the lease table");
    let _ = consumers.delete("orders", &DeleteParams::default()).await;
    wait_until(Duration::from_secs(30), || kubelet.pods().is_empty()).await;
    println!("    worker pods left: {:?}", kubelet.pods());

    say("Cleaning up");
    drop(kubelet);
    let _ = operator.kill();
    let _ = operator.wait();
    let _ = Api::<Namespace>::all(client).delete(&ns, &DeleteParams::default()).await;
    let _ = dynamodb.delete_table().table_name(&table).send().await;
    let _ = kinesis.delete_stream().stream_name(&stream).send().await;
    println!("    namespace, stream and table deleted. Done.");
}
