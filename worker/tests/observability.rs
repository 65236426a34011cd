//! A worker process serves /metrics, /healthz and /readyz, and its counters follow what it did.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::wait_for;
use leasehold_testkit::server::http_get as get;

/// Sample lines of an exposition: series (name with labels) -> value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(series, value)| Some((series.to_string(), value.parse().ok()?))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_readiness_follow_the_work_done() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "metrics", 2).await;
    let written = records(10, 0, 5);
    put_records(&kinesis, &stream, &written).await;
    let table = leasehold_testkit::unique_name("metrics");
    let worker = spawn(&config(&stream, Some(&table), "startPosition: TRIM_HORIZON\nconcurrency: 4\n"), "metrics-1");
    wait_for("the metrics address logged", Duration::from_secs(20), async || worker.metrics_addr().is_some()).await;
    let address = worker.metrics_addr().expect("address");
    wait_for("every record delivered", Duration::from_secs(30), async || {
        distinct(&worker.deliveries()).len() >= written.len()
    })
    .await;
    assert_eq!(get(&address, "/healthz").await, (200, "ok".to_string()));
    assert_eq!(get(&address, "/readyz").await.0, 200);
    let mut values = HashMap::new();
    for _ in 0..50 {
        let (status, text) = get(&address, "/metrics").await;
        assert_eq!(status, 200);
        values = samples(&text);
        if values.get("leasehold_records_processed_total") == Some(&(written.len() as f64))
            && values.get("leasehold_checkpoints_written_total").is_some_and(|n| *n >= 2.0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(values.get("leasehold_records_processed_total"), Some(&(written.len() as f64)), "{values:?}");
    assert_eq!(values.get("leasehold_leases_held"), Some(&2.0), "{values:?}");
    assert_eq!(values.get("leasehold_records_in_flight"), Some(&0.0), "{values:?}");
    assert_eq!(values.get("leasehold_records_failed_total"), Some(&0.0), "{values:?}");
    assert!(values.get("leasehold_checkpoints_written_total").is_some_and(|n| *n >= 2.0), "{values:?}");
    for shard in ["shardId-000000000000", "shardId-000000000001"] {
        let series = format!("leasehold_millis_behind_latest{{shard=\"{stream}:{shard}\"}}");
        assert!(values.contains_key(&series), "no {series} in {values:?}");
    }
    assert_eq!(get(&address, "/nothing").await.0, 404);
}
