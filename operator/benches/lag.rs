//! Lag in the operator, on the local control plane with the emulators (`make bench`):
//! - lease table reads per consumer-hour: consumers with a lease table reconciled for a while, the
//!   operator's `leasehold_operator_lease_table_reads_total` against its reconciles;
//! - time from the lag crossing the target to the first new worker holding leases: real workers (the
//!   stand-in kubelet runs the pods as processes), the lag written into their rows by the bench (as a
//!   slow processor's holder would write it; rewritten every 200 ms so a holder's own measure does not
//!   hide it), `scaleUpAfter` 1 s and the operator polling every second.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::kubelet::Kubelet;

const CONSUMERS: usize = 10;
const READ_WINDOW: Duration = Duration::from_secs(30);
const POLL: &str = "1s";
const POLL_SECONDS: f64 = 1.0;
const TRIALS: usize = 3;

/// A counter's value on the operator's `/metrics` at `addr`.
async fn counter(addr: &str, name: &str) -> f64 {
    let text = metrics_page(addr).await;
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// GET /metrics over a plain TCP connection (the bench needs no HTTP client beyond this).
async fn metrics_page(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else { return String::new() };
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body).await;
    body
}

async fn reads_per_consumer_hour(client: &kube::Client, stream: &str) -> String {
    let ns = support::create_namespace(client, "bench-lag-reads", false).await;
    let addr = format!("127.0.0.1:{}", support::free_port());
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_leasehold-operator"));
    let mut operator =
        support::start_operator(support::operator_command(binary, &ns, &support::kubeconfig_path(), POLL, &addr));
    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns);
    for i in 0..CONSUMERS {
        let table = leasehold_testkit::unique_name("bench-lag-reads");
        let consumer = support::stand_in_consumer(
            &format!("c{i:02}"),
            json!({"streams": [{"name": stream}], "aws": support::aws(), "leaseTable": {"name": table},
                   "workers": {"replicas": 1}, "processor": {"stdout": {}}}),
        );
        consumers.create(&PostParams::default(), &consumer).await.expect("create consumer");
    }
    support::wait("every consumer's table read", Duration::from_secs(120), || async {
        let list = consumers.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
        list.len() == CONSUMERS && list.iter().all(|c| c.status.as_ref().is_some_and(|s| s.lag.is_some()))
    })
    .await;
    let reads_before = counter(&addr, "leasehold_operator_lease_table_reads_total").await;
    let reconciles_before = counter(&addr, "leasehold_operator_reconciles_total").await;
    tokio::time::sleep(READ_WINDOW).await;
    let reads = counter(&addr, "leasehold_operator_lease_table_reads_total").await - reads_before;
    let reconciles = counter(&addr, "leasehold_operator_reconciles_total").await - reconciles_before;
    let _ = operator.kill();
    let _ = operator.wait();
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &Default::default()).await;
    let intervals = READ_WINDOW.as_secs_f64() / POLL_SECONDS;
    let per_interval = reads / CONSUMERS as f64 / intervals;
    format!(
        "- lease table reads: {CONSUMERS} consumers for {:.0} s at --shard-poll-interval {POLL}: {reads:.0} reads in {reconciles:.0} reconciles = {per_interval:.2} per consumer per interval (bound: 1) -> {:.0} per consumer-hour at the default 30 s (bound: 120)",
        READ_WINDOW.as_secs_f64(),
        per_interval * 120.0
    )
}

/// Sets `lag_ms` on every row of `table` without touching what the holder's conditions check.
async fn write_lag(dynamodb: &aws_sdk_dynamodb::Client, table: &str, lag_ms: u64) {
    let Ok(scan) = dynamodb.scan().table_name(table).consistent_read(true).send().await else { return };
    for item in scan.items() {
        let Some(key) = item.get("lease_key").and_then(|k| k.as_s().ok()) else { continue };
        if key.starts_with('#') {
            continue;
        }
        let _ = dynamodb
            .update_item()
            .table_name(table)
            .key("lease_key", AttributeValue::S(key.clone()))
            .update_expression("SET lag_ms = :l")
            .condition_expression("attribute_exists(lease_key)")
            .expression_attribute_values(":l", AttributeValue::N(lag_ms.to_string()))
            .send()
            .await;
    }
}

async fn lag_to_new_worker(client: &kube::Client, stream: &str) -> Duration {
    let ns = support::create_namespace(client, "bench-lag-scale", false).await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let table = leasehold_testkit::unique_name("bench-lag-scale");
    let addr = format!("127.0.0.1:{}", support::free_port());
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_leasehold-operator"));
    let mut operator =
        support::start_operator(support::operator_command(binary, &ns, &support::kubeconfig_path(), POLL, &addr));
    let kubelet = Kubelet::start(client.clone(), &ns, "app.kubernetes.io/name=leasehold-worker");
    let consumer = support::stand_in_consumer(
        "orders",
        json!({"streams": [{"name": stream}], "aws": support::aws(), "leaseTable": {"name": table},
               "workers": {"autoscaling": {"shardsPerWorker": 4, "minReplicas": 1, "maxReplicas": 4,
                           "lag": {"target": "5s", "scaleUpAfter": "1s", "scaleDownAfter": "10m"}}},
               "startPosition": "LATEST",
               "lease": {"duration": "2s", "renewInterval": "500ms", "scanInterval": "250ms", "shardSyncInterval": "1s"},
               "processor": {"stdout": {}}}),
    );
    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns);
    consumers.create(&PostParams::default(), &consumer).await.expect("create consumer");
    support::wait("one worker holding the four shards", Duration::from_secs(120), || async {
        let running = kubelet.running.lock().expect("running");
        running.len() == 1 && running.values().all(|w| w.held_shards().len() == 4)
    })
    .await;
    let crossed = Instant::now();
    let writer = {
        let (dynamodb, table) = (dynamodb.clone(), table.clone());
        tokio::spawn(async move {
            loop {
                write_lag(&dynamodb, &table, 60_000).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    support::wait("a second worker holding leases", Duration::from_secs(120), || async {
        let running = kubelet.running.lock().expect("running");
        running.values().filter(|w| !w.held_shards().is_empty()).count() >= 2
    })
    .await;
    let elapsed = crossed.elapsed();
    writer.abort();
    let _ = consumers.delete("orders", &Default::default()).await;
    let _ = operator.kill();
    let _ = operator.wait();
    drop(kubelet);
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &Default::default()).await;
    elapsed
}

#[tokio::main]
async fn main() {
    let client = support::client().await;
    support::install_crd(&client).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "bench-lag", 4).await;

    let reads = reads_per_consumer_hour(&client, &stream).await;
    let mut times = Vec::new();
    for _ in 0..TRIALS {
        times.push(lag_to_new_worker(&client, &stream).await);
    }
    times.sort();
    println!("## Lag in the operator (local control plane, emulators)\n");
    println!("{reads}");
    println!(
        "- lag above target -> first new worker holding leases (scaleUpAfter 1 s, poll {POLL}, lease scan 250 ms; {TRIALS} trials): {}",
        times.iter().map(|t| format!("{:.1} s", t.as_secs_f64())).collect::<Vec<_>>().join(", ")
    );
}
