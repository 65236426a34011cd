//! A stream deleted and recreated under the same name while workers read it: shard ids repeat
//! (`shardId-000000000000`), but the rows' checkpoints are about the former stream. Every row carries
//! the stream's creation time (`stream_created`); rows of the former incarnation are replaced, never
//! applied, and the new stream is read from TRIM_HORIZON even with `startPosition: LATEST` (every
//! record in it was written after the consumer began reading that name): records written to the new
//! stream at once, before any worker noticed, are all processed exactly once. The stream comes back
//! the moment its old readers have given their shards up, while the rows are still the former
//! incarnation's (docs/lease-protocol.md, "Streams deleted and recreated under the same name").

mod common;

use std::time::Duration;

use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{WorkerProcess, wait_for};

async fn stream_created(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> i64 {
    let out = kinesis.describe_stream_summary().stream_name(stream).send().await.expect("describe");
    out.stream_description_summary.expect("summary").stream_creation_timestamp.to_millis().expect("millis")
}

/// `stream_created` of every shard row of the table.
async fn stamps(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> Vec<(String, Option<i64>)> {
    let out = dynamodb.scan().table_name(table).consistent_read(true).send().await.expect("scan");
    let mut rows: Vec<(String, Option<i64>)> = out
        .items
        .unwrap_or_default()
        .into_iter()
        .filter_map(|item| {
            let key = item.get("lease_key")?.as_s().ok()?.clone();
            let created = item.get("stream_created").and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok());
            (!key.starts_with('#')).then_some((key, created))
        })
        .collect();
    rows.sort();
    rows
}

/// The shards whose readers logged giving them up because the stream was gone.
fn given_up(workers: &[&WorkerProcess]) -> std::collections::BTreeSet<String> {
    workers
        .iter()
        .flat_map(|w| w.logs())
        .filter(|(_, v)| v.get("message").and_then(|m| m.as_str()) == Some("stream gone; giving the shard up"))
        .filter_map(|(_, v)| v.get("shard").and_then(|s| s.as_str()).map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_stream_is_read_from_its_start_and_no_old_checkpoint_is_applied() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "recreated", 2).await;
    let table = leasehold_testkit::unique_name("recreated");
    let yaml = config(&stream, Some(&table), "startPosition: LATEST\n");
    let mut workers = [spawn(&yaml, "recreated-a"), spawn(&yaml, "recreated-b")];
    wait_for("one shard each", Duration::from_secs(20), async || workers.iter().all(|w| w.held_shards().len() == 1))
        .await;
    // LATEST is pinned and checkpointed when a reader starts; give both readers that moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = records(10, 0, 5);
    put_records(&kinesis, &stream, &before).await;
    {
        let refs: Vec<_> = workers.iter().collect();
        wait_for("the first stream's records processed", Duration::from_secs(30), async || {
            distinct(&all_deliveries(&refs)).len() == before.len()
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let first = stream_created(&kinesis, &stream).await;
    assert!(stamps(&dynamodb, &table).await.iter().all(|(_, c)| *c == Some(first)), "rows stamped with the stream");

    kinesis.delete_stream().stream_name(&stream).send().await.expect("delete stream");
    for _ in 0..100 {
        if kinesis.describe_stream_summary().stream_name(&stream).send().await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each shard's reader gives it up at its first read of the missing stream. Waiting for that (not
    // for a time) keeps the test deterministic: on kinesalite an iterator taken before the deletion
    // reads the new incarnation, so a reader that never polled while the name was missing (the gap is
    // ~50 ms here) would read it under its old lease (docs/lease-protocol.md names this limit).
    {
        let refs: Vec<_> = workers.iter().collect();
        wait_for("both shards given up", Duration::from_secs(20), async || given_up(&refs).len() == 2).await;
    }
    // Recreated at once: rows of the former incarnation are still in the table (some perhaps taken
    // again meanwhile); the sync replaces them only once the new stream is ACTIVE, keeping any owner,
    // and a reader checks the stream's creation time before every new iterator.
    leasehold_testkit::create_named_stream(&kinesis, &stream, 2).await;
    let second = stream_created(&kinesis, &stream).await;
    assert_ne!(first, second, "a new incarnation");
    // Written at once: no worker has seen the new stream yet.
    let after = records(10, 100, 5);
    put_records(&kinesis, &stream, &after).await;

    let refs: Vec<_> = workers.iter().collect();
    let expected: Vec<_> = before.iter().chain(&after).cloned().collect();
    wait_for("every record of both streams processed", Duration::from_secs(60), async || {
        distinct(&all_deliveries(&refs)).len() == expected.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_exactly_once(&all_deliveries(&refs), &expected);
    let rows = stamps(&dynamodb, &table).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|(_, c)| *c == Some(second)), "every row is the new stream's: {rows:?}");
    let reported = workers.iter().any(|w| {
        !w.events(
            "the stream was deleted and recreated: the rows of its former incarnation are replaced, never applied; \
             the new stream is read from TRIM_HORIZON",
        )
        .is_empty()
    });
    assert!(reported, "the recreation is logged");
    let mut running: Vec<&mut WorkerProcess> = workers.iter_mut().collect();
    assert_running(&mut running);
}
