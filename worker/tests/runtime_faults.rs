//! Bad input and faults around a worker process: throttling and expired iterators injected in front
//! of kinesalite, missing streams, malformed lease rows, bad configs, and manual assignment.

mod common;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::wait_for;
use leasehold_testkit::proxy::FaultProxy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_and_expired_iterators_lose_and_repeat_nothing() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "faults", 4).await;
    let written = records(20, 0, 30);
    put_records(&kinesis, &stream, &written).await;
    let upstream = leasehold_testkit::endpoint(leasehold_testkit::Service::Kinesis);
    let proxy = FaultProxy::start(
        &upstream,
        Arc::new(|operation, n| match operation {
            // Runs of ten, longer than the SDK's own three attempts, so the worker's backoff is exercised.
            "GetRecords" if (n / 10) % 3 == 1 => Some("ProvisionedThroughputExceededException"),
            "GetRecords" if n % 7 == 0 => Some("ExpiredIteratorException"),
            "ListShards" if n % 2 == 0 => Some("LimitExceededException"),
            _ => None,
        }),
    )
    .await;
    let table = leasehold_testkit::unique_name("faults");
    let config = with_endpoint(
        &config(&stream, Some(&table), "startPosition: TRIM_HORIZON\nreader: {idleTime: 100ms, maxRecords: 25}\n"),
        leasehold_testkit::Service::Kinesis,
        &proxy.endpoint(),
    );
    let worker = spawn(&config, "faults-1");
    wait_for("every record delivered", Duration::from_secs(60), async || {
        distinct(&worker.deliveries()).len() >= written.len()
    })
    .await;
    let deliveries = worker.deliveries();
    // A throttled or expired read must not repeat records.
    assert_exactly_once(&deliveries, &written);
    assert_per_key_order(&[&worker]);
    assert_eq!(deliveries.len(), written.len());
    assert!(proxy.injected() >= 10, "only {} faults injected", proxy.injected());
    let logs = worker.stderr_text();
    assert!(logs.contains("read failed; backing off"), "throttling not logged");
    assert!(logs.contains("shard iterator expired"), "expired iterators not logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_is_reported_and_picked_up_once_created() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let present = leasehold_testkit::create_stream(&kinesis, "present", 1).await;
    let missing = leasehold_testkit::unique_name("missing");
    let table = leasehold_testkit::unique_name("missing");
    let config = config(&present, Some(&table), "startPosition: TRIM_HORIZON\n").replace(
        &format!("streams: [{{name: {present}}}]"),
        &format!("streams: [{{name: {present}}}, {{name: {missing}}}]"),
    );
    let worker = spawn(&config, "missing-1");
    let first = records(5, 0, 5);
    put_records(&kinesis, &present, &first).await;
    wait_for("present stream read", Duration::from_secs(30), async || {
        distinct(&worker.deliveries()).len() >= first.len()
    })
    .await;
    wait_for("missing stream reported", Duration::from_secs(10), async || {
        worker.stderr_text().contains("cannot list shards") && worker.stderr_text().contains(&missing)
    })
    .await;
    // Create it under the awaited name: the next shard sync picks it up.
    leasehold_testkit::create_named_stream(&kinesis, &missing, 1).await;
    let later = records(5, 100, 5);
    put_records(&kinesis, &missing, &later).await;
    wait_for("new stream read", Duration::from_secs(30), async || {
        worker.deliveries().iter().filter(|d| d.stream == missing).count() >= later.len()
    })
    .await;
    let expected: Vec<_> = first.iter().chain(&later).cloned().collect();
    assert_exactly_once(&worker.deliveries(), &expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_matching_a_pattern_are_read_including_new_ones() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let prefix = leasehold_testkit::unique_name("pattern");
    let a = format!("{prefix}-a");
    leasehold_testkit::create_named_stream(&kinesis, &a, 1).await;
    let table = leasehold_testkit::unique_name("pattern");
    let config = config("unused", Some(&table), "startPosition: TRIM_HORIZON\n")
        .replace("streams: [{name: unused}]", &format!("streamPattern: '^{prefix}-'"));
    let worker = spawn(&config, "pattern-1");
    put_records(&kinesis, &a, &records(3, 0, 3)).await;
    wait_for("first stream read", Duration::from_secs(30), async || worker.deliveries().iter().any(|d| d.stream == a))
        .await;
    let b = format!("{prefix}-b");
    leasehold_testkit::create_named_stream(&kinesis, &b, 1).await;
    put_records(&kinesis, &b, &records(3, 10, 3)).await;
    wait_for("new matching stream read", Duration::from_secs(30), async || {
        worker.deliveries().iter().filter(|d| d.stream == b).count() >= 9
    })
    .await;
    let expected: Vec<_> = records(3, 0, 3).into_iter().chain(records(3, 10, 3)).collect();
    assert_exactly_once(&worker.deliveries(), &expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_lease_rows_are_reported_and_skipped() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "malformed", 1).await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let table = leasehold_testkit::create_lease_table(&dynamodb, "malformed").await;
    dynamodb
        .put_item()
        .table_name(&table)
        .item("lease_key", AttributeValue::S(format!("{stream}:shardId-999")))
        .item("lease_counter", AttributeValue::S("not a number".into()))
        .send()
        .await
        .expect("put malformed row");
    let worker = spawn(&config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n"), "malformed-1");
    let written = records(4, 0, 5);
    put_records(&kinesis, &stream, &written).await;
    wait_for("records delivered", Duration::from_secs(30), async || {
        distinct(&worker.deliveries()).len() >= written.len()
    })
    .await;
    let logs = worker.stderr_text();
    assert!(logs.contains("malformed lease row skipped") && logs.contains("shardId-999"), "not reported:\n{logs}");
    assert_eq!(logs.matches("malformed lease row skipped").count(), 1, "reported once, not every scan");
    assert_exactly_once(&worker.deliveries(), &written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_assignment_reads_only_the_listed_shards_without_a_table() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "assigned", 2).await;
    let written = records(20, 0, 5);
    put_records(&kinesis, &stream, &written).await;
    let config = config(
        &stream,
        None,
        &format!("startPosition: TRIM_HORIZON\nassignment: {{shards: ['{stream}:shardId-000000000001']}}\n"),
    )
    .replace(&format!("streams: [{{name: {stream}}}]\n"), "");
    let worker = spawn(&config, "assigned-1");
    wait_for("assigned shard read", Duration::from_secs(30), async || !worker.deliveries().is_empty()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let shards: std::collections::HashSet<String> = worker.deliveries().into_iter().map(|d| d.shard_id).collect();
    assert_eq!(shards, ["shardId-000000000001".to_string()].into_iter().collect());
    let on_shard: Vec<(String, Vec<u8>)> =
        leasehold_testkit::kinesis::read_shard(&kinesis, &stream, "shardId-000000000001")
            .await
            .into_iter()
            .map(|r| (r.partition_key, r.data.into_inner()))
            .collect();
    assert_exactly_once(&worker.deliveries(), &on_shard);
    assert_eq!(worker.held_shards(), vec![format!("{stream}:shardId-000000000001")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_exits_with_code_2_naming_the_field() {
    for (yaml, field) in [
        (
            "streams: [{name: a}]\nprocessor: {stdout: {}}\nlease: {duration: 2s, renewInterval: 5s}\n",
            "spec.lease.renewInterval",
        ),
        ("streams: [{name: a}, {name: a}]\nprocessor: {stdout: {}}\n", "spec.streams[1].name"),
        ("streams: [{name: a}]\nprocessor: {stdout: {}}\nworkers: {replicas: many}\n", "spec.workers.replicas"),
        ("streams: [{name: a}]\n", "spec.processor"),
    ] {
        let mut worker = spawn(yaml, "bad");
        let status = worker.wait_exit(Duration::from_secs(10)).expect("exits");
        assert_eq!(status.code(), Some(2), "{yaml}");
        assert!(worker.stderr_text().contains(field), "stderr should name {field}:\n{}", worker.stderr_text());
    }
}
