//! Operator at scale on the local control plane: 200 StreamConsumers, then spec changes timed until the
//! Deployment carries them (p50/p99), and the operator's resident memory. Run with `make bench`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const CONSUMERS: usize = 200;
const SAMPLES: usize = 100;

fn hash(deployment: &Deployment) -> Option<String> {
    deployment.spec.as_ref()?.template.metadata.as_ref()?.annotations.as_ref()?.get("leasehold.io/config-hash").cloned()
}

#[tokio::main]
async fn main() {
    let client = support::client().await;
    support::install_crd(&client).await;
    let ns = support::create_namespace(&client, "bench-op", false).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "bench-op", 2).await;

    let mut operator = support::spawn_operator(
        std::path::Path::new(env!("CARGO_BIN_EXE_leasehold-operator")),
        &ns,
        &support::kubeconfig_path(),
        "30s",
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = leasehold_testkit::process::rss_mib(operator.id());

    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns);
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    let created = Instant::now();
    for i in 0..CONSUMERS {
        let consumer = support::stand_in_consumer(
            &format!("c{i:03}"),
            json!({"streams": [{"name": stream}], "aws": support::aws(), "workers": {"replicas": 1}, "processor": {"stdout": {}}}),
        );
        consumers.create(&PostParams::default(), &consumer).await.expect("create consumer");
    }
    support::wait("every Deployment", Duration::from_secs(300), || async {
        deployments.list(&Default::default()).await.map(|l| l.items.len()).unwrap_or(0) == CONSUMERS
    })
    .await;
    let all_reconciled = created.elapsed();
    let loaded_rss = leasehold_testkit::process::rss_mib(operator.id());

    let mut latencies = Vec::new();
    for i in 0..SAMPLES {
        let name = format!("c{:03}", i * (CONSUMERS / SAMPLES));
        let workers = format!("{name}-workers");
        let before = deployments.get(&workers).await.ok().as_ref().and_then(hash);
        let started = Instant::now();
        consumers
            .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"concurrency": 2 + i}})))
            .await
            .expect("patch");
        loop {
            let now = deployments.get(&workers).await.ok().as_ref().and_then(hash);
            if now != before {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{workers} never updated");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        latencies.push(started.elapsed());
    }
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let final_rss = leasehold_testkit::process::rss_mib(operator.id());
    let _ = operator.kill();
    let _ = operator.wait();
    let _ = Api::<Namespace>::all(client).delete(&ns, &Default::default()).await;

    println!("## Operator ({CONSUMERS} consumers on the local control plane)\n");
    println!(
        "- {CONSUMERS} consumers created and reconciled into Deployments in {:.1} s",
        all_reconciled.as_secs_f64()
    );
    println!(
        "- spec change -> Deployment updated ({SAMPLES} samples): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms — target p99 <= 1 s",
        pct(0.50).as_secs_f64() * 1000.0,
        pct(0.99).as_secs_f64() * 1000.0,
        latencies[latencies.len() - 1].as_secs_f64() * 1000.0
    );
    println!(
        "- operator RSS: {idle_rss:.1} MiB idle, {loaded_rss:.1} MiB with {CONSUMERS} consumers, {final_rss:.1} MiB after the changes"
    );
}
