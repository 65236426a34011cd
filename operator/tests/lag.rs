//! Lag on the real control plane with dynalite: the test plays the holders, writing lease rows with
//! `lag_ms` straight into the table the operator created (as workers write them at their renewals), and
//! watches what the operator makes of them: the status (`kubectl get scon` with its LAG column), the
//! operator's `/metrics`, and lag autoscaling — replicas rising one step at a time while the lag stays
//! above target, the `LagScaling` condition once every worker reads one shard, the fall back to the
//! shard-count rule only after the lag has stayed under half the target for `scaleDownAfter`, and
//! nothing at all when `lag` is unset.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use leasehold_crds::StreamConsumerStatus;
use serde_json::json;
use support::observability::{k8s_tool, run};
use support::{TestNamespace, aws, wait};

const SLOW: Duration = Duration::from_secs(60);
const HOUR_MS: i64 = 3_600_000;

fn now_ms() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_millisecond()
}

/// Writes the row of `shard` as its holder would: `owner` (none: a free row), a lease running out at
/// `expiry_ms`, and `lag_ms` when measured.
async fn write_row(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
    key: &str,
    owner: Option<&str>,
    expiry_ms: i64,
    lag_ms: Option<u64>,
) {
    let mut item = HashMap::from([
        ("lease_key".to_string(), AttributeValue::S(key.to_string())),
        ("lease_counter".to_string(), AttributeValue::N("1".into())),
        ("checkpoint".to_string(), AttributeValue::S("TRIM_HORIZON".into())),
    ]);
    if let Some(owner) = owner {
        item.insert("lease_owner".into(), AttributeValue::S(owner.into()));
        item.insert("lease_expiry".into(), AttributeValue::N(expiry_ms.to_string()));
    }
    if let Some(lag) = lag_ms {
        item.insert("lag_ms".into(), AttributeValue::N(lag.to_string()));
    }
    dynamodb.put_item().table_name(table).set_item(Some(item)).send().await.expect("put lease row");
}

async fn status(ns: &TestNamespace, name: &str) -> StreamConsumerStatus {
    ns.consumers().get(name).await.ok().and_then(|c| c.status).unwrap_or_default()
}

async fn table_ready(ns: &TestNamespace, name: &str) {
    wait("TableReady", SLOW, || async { ns.condition(name, "TableReady").await.is_some_and(|c| c.0 == "True") }).await;
}

fn key(stream: &str, shard: usize) -> String {
    format!("{stream}:shardId-{shard:012}")
}

#[tokio::test]
async fn status_printer_column_and_metrics_follow_the_lease_rows() {
    let ns = TestNamespace::new("lag-status").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag-status", 3).await;
    let table = leasehold_testkit::unique_name("lag-status");
    ns.create(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
               "workers": {"replicas": 2}, "processor": {"stdout": {}}}),
    )
    .await
    .expect("create consumer");
    table_ready(&ns, "orders").await;

    let live = now_ms() + HOUR_MS;
    write_row(&dynamodb, &table, &key(&stream, 0), Some("w1"), live, Some(1_500)).await;
    write_row(&dynamodb, &table, &key(&stream, 1), Some("w2"), live, Some(72_000)).await;
    // A free row's lag is nobody's current measure: the shard is unheld, its figure not trusted.
    write_row(&dynamodb, &table, &key(&stream, 2), None, 0, Some(900_000)).await;
    wait("status.lag from the rows", SLOW, || async {
        let lag = status(&ns, "orders").await.lag;
        lag.is_some_and(|l| l.largest.as_deref() == Some("1m12s") && l.unheld_shards == 1)
    })
    .await;
    let lag = status(&ns, "orders").await.lag.expect("lag");
    assert_eq!(lag.largest_ms, Some(72_000));
    assert_eq!(lag.slowest_shard, Some(key(&stream, 1)));
    let age = now_ms() - lag.read_at.0.as_millisecond();
    assert!((0..30_000).contains(&age), "read {age} ms ago");

    // kubectl get scon answers the question.
    let kubeconfig = support::kubeconfig_path();
    let table_text = run(std::process::Command::new(k8s_tool("kubectl"))
        .env("KUBECONFIG", &kubeconfig)
        .args(["get", "scon", "-n", &ns.name]));
    let header = table_text.lines().next().unwrap_or_default();
    let row = table_text.lines().find(|l| l.starts_with("orders")).unwrap_or_default();
    let columns: Vec<&str> = header.split_whitespace().collect();
    let at = columns.iter().position(|c| *c == "LAG").unwrap_or_else(|| panic!("no LAG column: {table_text}"));
    assert_eq!(row.split_whitespace().nth(at), Some("1m12s"), "{table_text}");

    let metrics = ns.ctx.metrics.text();
    let consumer = format!(r#"namespace="{}",name="orders""#, ns.name);
    for line in [
        format!("leasehold_consumer_lag_seconds{{{consumer}}} 72.0"),
        format!(r#"leasehold_consumer_shard_lag_seconds{{{consumer},shard="{}"}} 1.5"#, key(&stream, 0)),
        format!("leasehold_consumer_unheld_shards{{{consumer}}} 1"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing {line} in\n{metrics}");
    }

    // The slow shard catches up and its neighbour's holder dies: the status and the series follow.
    write_row(&dynamodb, &table, &key(&stream, 1), Some("w2"), live, Some(2_000)).await;
    write_row(&dynamodb, &table, &key(&stream, 0), Some("w1"), now_ms() - HOUR_MS, Some(1_500)).await;
    wait("status.lag follows", SLOW, || async {
        let lag = status(&ns, "orders").await.lag;
        lag.is_some_and(|l| l.largest.as_deref() == Some("2s") && l.unheld_shards == 2)
    })
    .await;
    let metrics = ns.ctx.metrics.text();
    assert!(!metrics.contains(&key(&stream, 0)), "the dead holder's shard lost its series:\n{metrics}");
    assert!(metrics.lines().any(|l| l == format!("leasehold_consumer_unheld_shards{{{consumer}}} 2")), "{metrics}");
    assert!(
        ns.condition("orders", "LagScaling").await.is_none(),
        "no LagScaling condition without workers.autoscaling.lag"
    );
}

/// Replicas of the worker Deployment, sampled every 100 ms until `until` holds or `timeout` passes: the
/// distinct values in the order seen.
async fn replicas_seen(ns: &TestNamespace, name: &str, timeout: Duration, until: impl Fn(i32) -> bool) -> Vec<i32> {
    let started = Instant::now();
    let mut seen: Vec<i32> = Vec::new();
    while started.elapsed() < timeout {
        if let Some(now) = ns.replicas(name).await {
            if seen.last() != Some(&now) {
                seen.push(now);
            }
            if until(now) {
                return seen;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out after {timeout:?}; replicas seen {seen:?}");
}

#[tokio::test]
async fn lag_autoscaling_steps_up_says_when_it_cannot_help_and_falls_back_after_the_window() {
    let ns = TestNamespace::new("lag-scale").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag-scale", 4).await;
    let table = leasehold_testkit::unique_name("lag-scale");
    // Four shards per worker: the shard-count rule asks for one worker; lag may add up to three.
    ns.create(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
               "workers": {"autoscaling": {"shardsPerWorker": 4, "minReplicas": 1, "maxReplicas": 10,
                           "lag": {"target": "5s", "scaleUpAfter": "2s", "scaleDownAfter": "8s"}}},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create consumer");
    table_ready(&ns, "orders").await;
    wait("one worker by shard count", SLOW, || async { ns.replicas("orders-workers").await == Some(1) }).await;

    // A slow processor: every shard 20 s behind.
    let live = now_ms() + HOUR_MS;
    for shard in 0..4 {
        write_row(&dynamodb, &table, &key(&stream, shard), Some("w1"), live, Some(20_000)).await;
    }
    let rising = Instant::now();
    let seen = replicas_seen(&ns, "orders-workers", SLOW * 2, |r| r == 4).await;
    assert_eq!(seen, [1, 2, 3, 4], "one step at a time, up to the open shards");
    // Three steps, each after the lag stayed above target for scaleUpAfter (2 s) since the last.
    assert!(rising.elapsed() >= Duration::from_secs(6), "three steps in {:?}", rising.elapsed());
    wait("LagScaling False: one shard per worker", SLOW, || async {
        ns.condition("orders", "LagScaling").await == Some(("False".into(), "OneShardPerWorker".into()))
    })
    .await;
    let scaling = status(&ns, "orders").await.lag_scaling.expect("lagScaling state");
    assert_eq!(scaling.extra_replicas, 3);
    // Steady above target at the ceiling: nothing more moves.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(ns.replicas("orders-workers").await, Some(4));

    let events = Api::<Event>::namespaced(ns.client.clone(), &ns.name);
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Scaled"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        notes.iter().filter(|n| n.contains("above target 5s")).count() >= 3,
        "an Event per step saying why: {notes:?}"
    );

    // The lag drains: under half the target (2.5 s). The workers stay for scaleDownAfter, then go at once.
    for shard in 0..4 {
        write_row(&dynamodb, &table, &key(&stream, shard), Some("w1"), live, Some(300)).await;
    }
    let drained = Instant::now();
    let seen = replicas_seen(&ns, "orders-workers", SLOW * 2, |r| r == 1).await;
    assert_eq!(seen, [4, 1], "back to the shard-count rule in one change");
    // The window is 8 s from the first read under half the target; reads come every second.
    assert!(drained.elapsed() >= Duration::from_secs(7), "fell after {:?}", drained.elapsed());
    wait("LagScaling True again", SLOW, || async {
        ns.condition("orders", "LagScaling").await.is_some_and(|c| c.0 == "True")
    })
    .await;
}

#[tokio::test]
async fn without_lag_settings_nothing_scales_on_lag() {
    let ns = TestNamespace::new("lag-off").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag-off", 4).await;
    let table = leasehold_testkit::unique_name("lag-off");
    ns.create(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
               "workers": {"autoscaling": {"shardsPerWorker": 4, "minReplicas": 1, "maxReplicas": 10}},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create consumer");
    table_ready(&ns, "orders").await;
    let live = now_ms() + HOUR_MS;
    for shard in 0..4 {
        write_row(&dynamodb, &table, &key(&stream, shard), Some("w1"), live, Some(600_000)).await;
    }
    wait("the lag is read", SLOW, || async {
        status(&ns, "orders").await.lag.is_some_and(|l| l.largest.as_deref() == Some("10m"))
    })
    .await;
    // Many reconciles (one a second) with a lag far above any target: the shard-count rule alone.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(ns.replicas("orders-workers").await, Some(1));
    let status = status(&ns, "orders").await;
    assert_eq!(status.replicas, Some(1));
    assert!(status.lag_scaling.is_none(), "no lag scaling state: {:?}", status.lag_scaling);
    assert!(status.conditions.iter().all(|c| c.type_ != "LagScaling"));
}

/// Sets `lag_ms` on every shard row of `table`, leaving what the holders' conditions check alone.
async fn set_lag(dynamodb: &aws_sdk_dynamodb::Client, table: &str, lag_ms: u64) {
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
            .update_expression("SET lag_ms = :lag")
            .condition_expression("attribute_exists(lease_key)")
            .expression_attribute_values(":lag", AttributeValue::N(lag_ms.to_string()))
            .send()
            .await;
    }
}

/// With real workers (the stand-in kubelet runs the pods as processes): a lag above target adds a worker
/// that takes leases, the lag draining takes it away after the window, and every record is processed
/// exactly once across both changes (no process fails; scaling down is a SIGTERM, which hands over).
/// The lag is written into the rows by the test, as a slow processor's holder would write it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_scaling_with_real_workers_processes_every_record_once() {
    use leasehold_testkit::kinesis::{numbered, put_records};
    use support::kubelet::Kubelet;

    let ns = TestNamespace::new("lag-workers").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag-workers", 2).await;
    let table = leasehold_testkit::unique_name("lag-workers");
    let kubelet = Kubelet::start(ns.client.clone(), &ns.name, "app.kubernetes.io/name=leasehold-worker");
    ns.create(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
               "workers": {"autoscaling": {"shardsPerWorker": 2, "minReplicas": 1, "maxReplicas": 2,
                           "lag": {"target": "5s", "scaleUpAfter": "1s", "scaleDownAfter": "3s"}}},
               "startPosition": "TRIM_HORIZON",
               "lease": {"duration": "2s", "renewInterval": "500ms", "scanInterval": "250ms", "shardSyncInterval": "1s"},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create consumer");
    let held = |kubelet: &Kubelet| -> Vec<usize> {
        let running = kubelet.running.lock().expect("running");
        running.values().map(|w| w.held_shards().len()).collect()
    };
    wait("one worker holding both shards", SLOW, || async { held(&kubelet) == [2] }).await;
    let first: Vec<_> = (0..20).flat_map(|n| (0..10).map(move |k| numbered(&format!("key-{k}"), n))).collect();
    put_records(&kinesis, &stream, &first).await;

    let writer = {
        let (dynamodb, table) = (dynamodb.clone(), table.clone());
        tokio::spawn(async move {
            loop {
                set_lag(&dynamodb, &table, 30_000).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    wait("a second worker holding a shard", SLOW, || async {
        let mut counts = held(&kubelet);
        counts.sort();
        counts == [1, 1]
    })
    .await;
    writer.abort();
    let second: Vec<_> = (20..40).flat_map(|n| (0..10).map(move |k| numbered(&format!("key-{k}"), n))).collect();
    put_records(&kinesis, &stream, &second).await;
    set_lag(&dynamodb, &table, 0).await;
    wait("back to one worker holding both shards", SLOW, || async {
        ns.replicas("orders-workers").await == Some(1) && held(&kubelet) == [2]
    })
    .await;
    let third: Vec<_> = (40..60).flat_map(|n| (0..10).map(move |k| numbered(&format!("key-{k}"), n))).collect();
    put_records(&kinesis, &stream, &third).await;

    let expected = first.len() + second.len() + third.len();
    let deliveries = || {
        let running = kubelet.running.lock().expect("running");
        let finished = kubelet.finished.lock().expect("finished");
        running.values().chain(finished.iter()).flat_map(|w| w.deliveries()).map(|d| d.data).collect::<Vec<String>>()
    };
    wait("every record processed", SLOW, || async { deliveries().len() >= expected }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = deliveries();
    let unique: std::collections::HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), expected, "every record processed");
    assert_eq!(all.len(), expected, "no record processed twice");
}
