//! Rows near DynamoDB's 400 KB item limit, written by another tool into a running consumer's table:
//! a lease row with a huge extra attribute (the worker's acquire would push it over the limit), a lease
//! row whose checkpoint is a huge string (malformed), and a huge row that is no lease at all. Together
//! they exceed the 1 MB a scan page may carry, so the listing pages mid-way. None breaks the scan: each
//! is skipped and reported once (not at every scan), the worker keeps running, and the other shards'
//! records are processed exactly once.

mod common;

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{WorkerProcess, wait_for};

/// Just under 400 KB with its key and other attributes.
const HUGE: usize = 399 * 1024;

async fn put(dynamodb: &aws_sdk_dynamodb::Client, table: &str, item: Vec<(&str, AttributeValue)>) {
    let mut request = dynamodb.put_item().table_name(table);
    for (name, value) in item {
        request = request.item(name, value);
    }
    request.send().await.expect("put a large row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_near_the_item_limit_are_skipped_and_reported_once_and_the_rest_is_processed() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "largerows", 4).await;
    let table = leasehold_testkit::create_lease_table(&dynamodb, "largerows").await;
    let n = |v: &str| AttributeValue::N(v.into());
    let s = |v: String| AttributeValue::S(v);
    let filler = "x".repeat(HUGE - 200);
    // A lease row another tool annotated: readable, but as close to the limit as DynamoDB accepts, so
    // taking it (owner and expiry added) would exceed it.
    let key = format!("{stream}:shardId-000000000000");
    let overhead = "lease_key".len() + key.len() + "lease_counter".len() + 2 + "checkpoint".len() + 12 + "notes".len();
    let stamp = created(&kinesis, &stream).await.to_string();
    let mut size = 400 * 1024 - overhead - "stream_created".len();
    loop {
        let mut request = dynamodb.put_item().table_name(&table);
        for (name, value) in [
            ("lease_key", s(key.clone())),
            ("lease_counter", n("0")),
            ("checkpoint", s("TRIM_HORIZON".into())),
            ("stream_created", n(&stamp)),
            ("notes", s("x".repeat(size))),
        ] {
            request = request.item(name, value);
        }
        match request.send().await {
            Ok(_) => break,
            Err(_) if size > HUGE - 4096 => size -= 4,
            Err(e) => panic!("cannot write a row near the limit: {e:?}"),
        }
    }
    // A lease row whose checkpoint is a huge string: malformed.
    put(
        &dynamodb,
        &table,
        vec![
            ("lease_key", s(format!("{stream}:shardId-000000000001"))),
            ("lease_counter", n("0")),
            ("checkpoint", s(filler.clone())),
        ],
    )
    .await;
    // A row that is no lease at all (another tool's), and another huge one past it.
    put(&dynamodb, &table, vec![("lease_key", s("other-tool-state".into())), ("blob", s(filler.clone()))]).await;
    put(&dynamodb, &table, vec![("lease_key", s("other-tool-state-2".into())), ("blob", s(filler))]).await;
    let pages = dynamodb.scan().table_name(&table).consistent_read(true).send().await.expect("scan");
    assert!(pages.last_evaluated_key.is_some(), "the rows fill more than one scan page");

    let yaml = config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let mut worker = spawn(&yaml, "largerows-a");
    let written = records(20, 0, 5);
    put_records(&kinesis, &stream, &written).await;
    // Records of shards 0 and 1 wait in the stream until an operator trims the rows; the rest is read.
    let readable = |d: &leasehold_testkit::process::Delivery| {
        d.shard_id != "shardId-000000000000" && d.shard_id != "shardId-000000000001"
    };
    wait_for("shards 2 and 3 leased", Duration::from_secs(20), async || worker.held_shards().len() == 2).await;
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    for shard in ["shardId-000000000002", "shardId-000000000003"] {
        let stored = leasehold_testkit::kinesis::read_shard(&kinesis, &stream, shard).await;
        expected.extend(stored.into_iter().map(|r| (r.partition_key, r.data.into_inner())));
    }
    assert!(!expected.is_empty());
    wait_for("the readable shards' records processed", Duration::from_secs(30), async || {
        worker.deliveries().iter().filter(|d| readable(d)).count() >= expected.len()
    })
    .await;
    // Many scans later, each bad row is still reported exactly once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let deliveries = worker.deliveries();
    let unexpected: Vec<_> = deliveries.iter().filter(|d| !readable(d)).map(|d| d.shard_id.clone()).collect();
    assert!(unexpected.is_empty(), "read from a row that was to be skipped: {unexpected:?}");
    assert_exactly_once(&deliveries, &expected);
    let too_large = worker.events("lease row too large to take; skipped");
    assert_eq!(too_large.len(), 1, "reported once:\n{}", worker.stderr_text());
    let malformed: Vec<String> = worker
        .logs()
        .into_iter()
        .filter(|(_, v)| v.get("message").and_then(|m| m.as_str()) == Some("malformed lease row skipped"))
        .filter_map(|(_, v)| v.get("row").and_then(|r| r.as_str()).map(str::to_string))
        .collect();
    let mut sorted = malformed.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(malformed.len(), sorted.len(), "each malformed row reported once: {malformed:?}");
    assert_eq!(sorted.len(), 3, "the huge checkpoint and the two foreign rows: {sorted:?}");
    let lines = worker.stderr_text().lines().count();
    assert!(lines < 200, "{lines} log lines: bad rows are not logged at every scan");
    let mut running: Vec<&mut WorkerProcess> = vec![&mut worker];
    assert_running(&mut running);
}

async fn created(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> i64 {
    let out = kinesis.describe_stream_summary().stream_name(stream).send().await.expect("describe");
    out.stream_description_summary.expect("summary").stream_creation_timestamp.to_millis().expect("millis")
}

#[test]
fn an_owner_id_too_long_for_a_lease_row_is_refused_at_start() {
    let yaml = config("any-stream", Some("any-table"), &format!("ownerId: {}\n", "w".repeat(300)));
    let dir = std::env::temp_dir().join("leasehold-tests");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{}.yaml", leasehold_testkit::unique_name("long-owner")));
    std::fs::write(&path, yaml).expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold-worker"))
        .arg("--config")
        .arg(&path)
        .arg("--metrics-addr")
        .arg("127.0.0.1:0")
        .env("AWS_ACCESS_KEY_ID", "leasehold-test")
        .env("AWS_SECRET_ACCESS_KEY", "leasehold-test")
        .output()
        .expect("run the worker");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("owner id is 300 bytes; at most 256 are allowed"), "{stderr}");
}
