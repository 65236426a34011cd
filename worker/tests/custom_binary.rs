//! A worker binary of a user's own (`worker/examples/custom_processor.rs`, one `main_with_processor`
//! call) behaves as `leasehold-worker` does: the same flags, `/metrics` `/healthz` `/readyz`, SIGTERM
//! with a clean exit, exit code 2 naming the field of a bad config; and `leasehold-worker` itself
//! refuses `processor.custom`, which only a binary with a processor of its own can run.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{WorkerProcess, wait_for};
use leasehold_testkit::server::http_get;

/// The example binary, built by `cargo test` (examples are built with the tests).
fn custom_binary() -> PathBuf {
    let worker = Path::new(env!("CARGO_BIN_EXE_leasehold-worker"));
    let binary = worker.parent().expect("target dir").join("examples/custom_processor");
    assert!(
        binary.exists(),
        "{} is missing: `cargo build -p leasehold-worker --example custom_processor` (make test builds it)",
        binary.display()
    );
    binary
}

/// `<stream>/<shard> #<sequence>` of every record the example printed, with how often.
fn processed(worker: &WorkerProcess) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for line in worker.stdout_lines() {
        if let Some((record, _)) = line.split_once(": ").filter(|(_, rest)| rest.contains(" bytes (shard ")) {
            *seen.entry(record.to_string()).or_default() += 1;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_binary_processes_serves_metrics_and_stops_on_sigterm() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "custombin", 2).await;
    let table = leasehold_testkit::unique_name("custombin");
    let yaml = config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n")
        .replace("processor: {stdout: {}}", "processor: {custom: {}}");
    let mut worker = WorkerProcess::spawn(&custom_binary(), &yaml, "custom-1");
    let records = records(10, 0, 10);
    put_records(&kinesis, &stream, &records).await;
    wait_for("every record processed", Duration::from_secs(30), async || processed(&worker).len() == records.len())
        .await;
    assert!(processed(&worker).values().all(|n| *n == 1), "no record twice: {:?}", processed(&worker));
    let lines = worker.stdout_lines();
    for shard in ["shardId-000000000000", "shardId-000000000001"] {
        assert!(
            lines.iter().any(|l| *l == format!("initialize {stream}:{shard} after TRIM_HORIZON")),
            "each shard's processor initialized at its checkpoint: {lines:?}"
        );
    }

    let address = worker.metrics_addr().expect("the metrics address is logged");
    assert_eq!(http_get(&address, "/healthz").await.0, 200);
    assert_eq!(http_get(&address, "/readyz").await.0, 200);
    let (status, metrics) = http_get(&address, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.lines().any(|l| l == format!("leasehold_records_processed_total {}", records.len())),
        "the records counted:\n{metrics}"
    );

    worker.signal("TERM");
    let exit = worker.wait_exit(Duration::from_secs(15)).expect("exits after SIGTERM");
    assert_eq!(exit.code(), Some(0), "a clean shutdown exits 0:\n{}", worker.stderr_text());
    let lines = worker.stdout_lines();
    for shard in ["shardId-000000000000", "shardId-000000000001"] {
        assert!(lines.contains(&format!("shutdown requested for {stream}:{shard}")), "{lines:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configs_exit_2_naming_the_field_in_both_binaries() {
    let custom_without_one = "streams: [{name: a}]\nprocessor: {custom: {}}\n";
    let mut worker = spawn(custom_without_one, "no-custom");
    let status = worker.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(2));
    assert!(worker.stderr_text().contains("spec.processor.custom"), "{}", worker.stderr_text());

    let mut custom =
        WorkerProcess::spawn(&custom_binary(), "streams: [{name: a}]\nconcurency: 3\nprocessor: {custom: {}}\n", "bad");
    let status = custom.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(2));
    assert!(custom.stderr_text().contains("concurency"), "{}", custom.stderr_text());
}
