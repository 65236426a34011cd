//! `make demo`: the whole loop on a real Kubernetes node. The local control plane, the emulators, the
//! real node (kubelet + containerd in a network namespace, tests/ground/node.sh) with the project's own
//! images (`make images`), and the operator. Applies a StreamConsumer, shows `kubectl get scon,pods`,
//! the table and who holds which shard, produces orders, reads them back from the pods' logs, deletes a
//! pod (SIGTERM: its shards move at once) and kills a worker's process (the kubelet restarts the
//! container, which takes its own shards back), then deletes everything.

mod narration;
#[path = "../tests/node/mod.rs"]
mod node;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use leasehold_testkit::kinesis::put_records;
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, LeaseStore};
use narration::{orders, say, show_leases};
use node::{Logs, Node, kubectl, missing_and_repeats, ready};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const SELECTOR: &str = "leasehold.io/consumer=orders";

fn indent(text: &str) {
    for line in text.lines() {
        println!("    {line}");
    }
}

/// Owner of each shard lease.
async fn owners(store: &DynamoLeaseStore) -> BTreeMap<String, String> {
    let Ok(page) = store.list().await else { return BTreeMap::new() };
    page.leases.into_iter().map(|l| (l.key.shard_id().to_string(), l.owner.unwrap_or_default())).collect()
}

async fn live_pods(pods: &Api<Pod>) -> Vec<Pod> {
    let list = pods.list(&ListParams::default().labels(SELECTOR)).await.map(|l| l.items).unwrap_or_default();
    list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
}

/// Polls `done` every 100 ms for at most `limit`; returns how long it took (or `limit`).
async fn wait_until<F, Fut>(limit: Duration, mut done: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() < limit && !done().await {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

fn show_flow(logs: &Logs, pods: &[String], seen: &mut BTreeMap<String, usize>) {
    for pod in pods {
        let deliveries = logs.deliveries_of_pod(pod);
        let before = seen.insert(pod.clone(), deliveries.len()).unwrap_or(0);
        let mut shards: Vec<String> =
            deliveries[before.min(deliveries.len())..].iter().map(|d| d.shard_id.clone()).collect();
        shards.sort();
        shards.dedup();
        println!("    {pod:<36} printed {:>5} new orders from {shards:?}", deliveries.len().saturating_sub(before));
    }
}

#[tokio::main]
async fn main() {
    let Some(operator_bin) = std::env::var_os("LEASEHOLD_OPERATOR_BIN") else {
        eprintln!("run `make demo`: it builds the images, starts the stack and the node first");
        std::process::exit(2);
    };
    let node = Node::get();
    node.assert_image(&node::worker_image());
    say("The stack: kube-apiserver + etcd + kube-controller-manager, kinesalite, dynalite, and a real node");
    indent(&kubectl(&["get", "nodes", "-o", "wide"]));
    let client = support::client().await;
    support::install_crd(&client).await;
    let ns = support::create_namespace(&client, "demo", true).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "orders", 4).await;
    let table = leasehold_testkit::unique_name("orders-leases");
    println!("    namespace {ns} (Pod Security: restricted), Kinesis stream {stream} with 4 shards");

    say(&format!("Starting the operator; worker pods run the image {}", node::worker_image()));
    let mut operator = node::spawn_operator(std::path::Path::new(&operator_bin), &ns, "2s");
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let stop = CancellationToken::new();
    let logs = Logs::follow(pods.clone(), SELECTOR, stop.clone());

    let spec = json!({
        "streams": [{"name": stream}], "aws": node.aws(),
        "leaseTable": {"name": table},
        "workers": {"autoscaling": {"shardsPerWorker": 2, "minReplicas": 1, "maxReplicas": 4}},
        "startPosition": "TRIM_HORIZON",
        "lease": {"duration": "4s", "renewInterval": "1s", "scanInterval": "500ms"},
        "processor": {"stdout": {}},
        "template": {"spec": {"containers": [{"name": "worker", "imagePullPolicy": "Never", "env": [
            {"name": "AWS_ACCESS_KEY_ID", "value": "leasehold-test"},
            {"name": "AWS_SECRET_ACCESS_KEY", "value": "leasehold-test"}]}]}}
    });
    say("kubectl apply -f orders.yaml (lease shortened to 4 s for the demo; the images are local, never pulled):");
    let manifest = json!({"apiVersion": "leasehold.io/v1alpha1", "kind": "StreamConsumer",
        "metadata": {"name": "orders"}, "spec": spec});
    indent(&serde_yaml_ng::to_string(&manifest).unwrap_or_default());
    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns);
    consumers.create(&PostParams::default(), &support::consumer("orders", spec)).await.expect("apply");

    say("The operator creates the lease table and a Deployment: 4 shards / 2 per worker = 2 worker pods");
    let started = wait_until(Duration::from_secs(90), || async {
        let list = live_pods(&pods).await;
        list.len() == 2 && list.iter().all(ready)
    })
    .await;
    let viewer = DynamoLeaseStore::new(dynamodb.clone(), table.clone(), LeaseSettings::new("demo-viewer"));
    wait_until(Duration::from_secs(30), || async {
        let now = owners(&viewer).await;
        now.len() == 4 && now.values().all(|o| !o.is_empty())
    })
    .await;
    println!("    both pods Running and Ready {:.1} s after the apply", started.as_secs_f64());
    indent(&kubectl(&["-n", &ns, "get", "scon,pods", "-o", "wide"]));
    say("The lease table: each shard held by exactly one worker pod (the owner id is the pod name)");
    show_leases(&viewer).await;

    say("Producing 2,000 orders for 40 customers (partition key = customer); the pods print them to stdout");
    let mut expected: HashSet<String> = HashSet::new();
    let first = orders(0, 50);
    expected.extend(first.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()));
    put_records(&kinesis, &stream, &first).await;
    wait_until(Duration::from_secs(30), || async { missing_and_repeats(&expected, &logs.deliveries()).0 == 0 }).await;
    let mut seen = BTreeMap::new();
    let names: Vec<String> = live_pods(&pods).await.iter().map(|p| p.name_any()).collect();
    show_flow(&logs, &names, &mut seen);
    println!("    (read with `kubectl logs -f` through the API server)");

    let victim = names.first().cloned().unwrap_or_default();
    say(&format!("kubectl delete pod {victim}: SIGTERM, it checkpoints and hands its shards over at once"));
    let deleted = Instant::now();
    let _ = pods.delete(&victim, &DeleteParams::default()).await;
    let moved = wait_until(Duration::from_secs(20), || async {
        let now = owners(&viewer).await;
        now.len() == 4 && now.values().all(|o| !o.is_empty() && *o != victim)
    })
    .await;
    println!("    its shards held by the other pods {:.2} s after the delete (no lease expiry)", moved.as_secs_f64());
    show_leases(&viewer).await;
    let second = orders(50, 60);
    expected.extend(second.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()));
    put_records(&kinesis, &stream, &second).await;
    wait_until(Duration::from_secs(90), || async {
        let list = live_pods(&pods).await;
        list.len() == 2 && list.iter().all(ready)
    })
    .await;
    println!("    the Deployment replaced the pod ({:.1} s after the delete):", deleted.elapsed().as_secs_f64());
    indent(&kubectl(&["-n", &ns, "get", "pods"]));

    // Let the group settle so the killed container has shards to take back.
    wait_until(Duration::from_secs(20), || async {
        let live: HashSet<String> = live_pods(&pods).await.iter().filter(|p| ready(p)).map(|p| p.name_any()).collect();
        let now = owners(&viewer).await;
        let holders: HashSet<&String> = now.values().collect();
        now.len() == 4 && now.values().all(|o| live.contains(o)) && live.iter().all(|p| holders.contains(p))
    })
    .await;
    let target = live_pods(&pods).await.into_iter().find(ready);
    if let Some(target) = target {
        let name = target.name_any();
        let container = target
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.iter().find(|c| c.name == "worker"))
            .and_then(|c| c.container_id.clone())
            .unwrap_or_default();
        say(&format!("kill -9 the worker process of pod {name}: the kubelet restarts its container"));
        let killed = Instant::now();
        node.kill_container(&container);
        let third = orders(60, 70);
        expected.extend(third.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()));
        put_records(&kinesis, &stream, &third).await;
        let back = wait_until(Duration::from_secs(30), || async {
            pods.get(&name).await.ok().is_some_and(|p| {
                ready(&p)
                    && p.status
                        .as_ref()
                        .and_then(|s| s.container_statuses.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.name == "worker" && c.restart_count > 0))
            })
        })
        .await;
        println!(
            "    restarted under the same pod name and Ready {:.1} s after the kill; with the same owner id it \
             takes its own shards back at once instead of waiting for them to expire",
            back.as_secs_f64().min(killed.elapsed().as_secs_f64())
        );
        show_leases(&viewer).await;
    }
    wait_until(Duration::from_secs(30), || async { missing_and_repeats(&expected, &logs.deliveries()).0 == 0 }).await;
    let names: Vec<String> = live_pods(&pods).await.iter().map(|p| p.name_any()).collect();
    show_flow(&logs, &names, &mut seen);
    let (missing, repeats) = missing_and_repeats(&expected, &logs.deliveries());
    say(&format!(
        "{} orders written, {} processed, {missing} missing, {repeats} repeated (a kill -9 may repeat a few: \
         at-least-once)",
        expected.len(),
        expected.len() - missing
    ));

    say("kubectl delete scon orders: the pods stop; deletionPolicy Retain keeps the lease table");
    let _ = consumers.delete("orders", &DeleteParams::default()).await;
    wait_until(Duration::from_secs(60), || async { live_pods(&pods).await.is_empty() }).await;
    indent(&kubectl(&["-n", &ns, "get", "scon,pods"]));

    say("Cleaning up");
    stop.cancel();
    let _ = operator.kill();
    let _ = operator.wait();
    let _ = Api::<Namespace>::all(client).delete(&ns, &DeleteParams::default()).await;
    let _ = dynamodb.delete_table().table_name(&table).send().await;
    let _ = kinesis.delete_stream().stream_name(&stream).send().await;
    println!("    namespace, stream and table deleted. Done.");
    if missing > 0 {
        eprintln!("demo failed: {missing} orders were not processed");
        std::process::exit(1);
    }
}
