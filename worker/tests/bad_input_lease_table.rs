//! The lease table deleted under running workers: each worker reports it (one error line, the
//! `leasehold_lease_table_missing` gauge), stops processing once its leases' deadlines pass (nothing is
//! read without a lease), does not recreate the table (that would restart every shard from its start
//! position), and resumes when an operator recreates it: a fresh start, every shard read again from
//! `TRIM_HORIZON`, so the records from before the deletion come exactly once more and every other
//! record exactly once.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{WorkerProcess, wait_for};
use leasehold_testkit::server::http_get;
use leasehold_worker::lease::{TableBilling, create_table};

const LEASE: Duration = Duration::from_secs(2);

async fn table_missing_gauge(worker: &WorkerProcess) -> Option<String> {
    let address = worker.metrics_addr()?;
    let (_, text) = http_get(&address, "/metrics").await;
    text.lines().find(|l| l.starts_with("leasehold_lease_table_missing ")).map(str::to_string)
}

async fn table_exists(client: &aws_sdk_dynamodb::Client, table: &str) -> bool {
    client.describe_table().table_name(table).send().await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_table_stops_processing_is_reported_and_recreating_it_resumes() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "tablegone", 2).await;
    let table = leasehold_testkit::unique_name("tablegone");
    let yaml = config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let workers = [spawn(&yaml, "tablegone-a"), spawn(&yaml, "tablegone-b")];
    let refs: Vec<_> = workers.iter().collect();
    let before = records(10, 0, 5);
    put_records(&kinesis, &stream, &before).await;
    wait_for("the first records processed", Duration::from_secs(30), async || {
        distinct(&all_deliveries(&refs)).len() == before.len()
    })
    .await;
    wait_for("one shard each", Duration::from_secs(20), async || workers.iter().all(|w| w.held_shards().len() == 1))
        .await;
    for worker in &workers {
        assert_eq!(table_missing_gauge(worker).await.as_deref(), Some("leasehold_lease_table_missing 0"));
    }

    dynamodb.delete_table().table_name(&table).send().await.expect("delete the lease table");
    for _ in 0..100 {
        if !table_exists(&dynamodb, &table).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!table_exists(&dynamodb, &table).await, "the table is gone");
    // Past every deadline (a lease duration after the last renewal sent) nothing is processed.
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    let during = records(10, 100, 3);
    put_records(&kinesis, &stream, &during).await;
    let quiet_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let processed: Vec<_> = all_deliveries(&refs).into_iter().filter(|d| d.seen_at >= quiet_from).collect();
    assert!(
        processed.is_empty(),
        "records processed without a lease table: {:?}",
        &processed[..processed.len().min(3)]
    );
    assert!(!table_exists(&dynamodb, &table).await, "no worker recreated the table");
    for worker in &workers {
        let reports = worker.events(
            "the lease table does not exist (deleted?): leases run out and processing stops; the worker does not \
             recreate it; recreate or restore it to resume",
        );
        assert_eq!(reports.len(), 1, "{}: reported once:\n{}", worker.owner, worker.stderr_text());
        assert_eq!(
            table_missing_gauge(worker).await.as_deref(),
            Some("leasehold_lease_table_missing 1"),
            "{}",
            worker.owner
        );
        assert!(worker.held_shards().is_empty(), "{}: every lease given up as lost", worker.owner);
    }

    // An operator recreates the table: the workers resume on their own, from the start position.
    create_table(&dynamodb, &table, TableBilling::OnDemand, &[]).await.expect("recreate the table");
    wait_for("both shards leased again", Duration::from_secs(30), async || {
        workers.iter().map(|w| w.held_shards().len()).sum::<usize>() == 2
    })
    .await;
    let after = records(10, 200, 3);
    put_records(&kinesis, &stream, &after).await;
    let expected: Vec<_> = before.iter().chain(&during).chain(&after).cloned().collect();
    // At least as many deliveries, not exactly: a record processed once too often then fails below with
    // its count instead of as a timeout.
    wait_for("every record processed, the first ones twice", Duration::from_secs(60), async || {
        let deliveries = all_deliveries(&refs);
        deliveries.len() >= expected.len() + before.len() && distinct(&deliveries).len() == expected.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let deliveries = all_deliveries(&refs);
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for d in &deliveries {
        *counts.entry(d.data.as_str()).or_default() += 1;
    }
    // On a failure, the workers' lease lines say who read what when.
    let lease_lines = || -> String {
        let lines = workers.iter().flat_map(|w| {
            w.stderr_text()
                .lines()
                .filter(|l| l.contains("lease"))
                .map(|l| format!("{}: {l}", w.owner))
                .collect::<Vec<_>>()
        });
        lines.collect::<Vec<_>>().join("\n")
    };
    for (_, data) in &before {
        let data = String::from_utf8_lossy(data);
        assert_eq!(
            counts.get(data.as_ref()),
            Some(&2),
            "{data}: read again once after the fresh start\n{}",
            lease_lines()
        );
    }
    for (_, data) in during.iter().chain(&after) {
        let data = String::from_utf8_lossy(data);
        assert_eq!(
            counts.get(data.as_ref()),
            Some(&1),
            "{data}: written after the deletion, processed once\n{}",
            lease_lines()
        );
    }
    // A worker that got no shard back may still be in its backoff (at most 10 s): it clears the gauge
    // at its next scan.
    for worker in &workers {
        let until = Instant::now() + Duration::from_secs(15);
        while table_missing_gauge(worker).await.as_deref() != Some("leasehold_lease_table_missing 0") {
            assert!(Instant::now() < until, "{}: the gauge stays set after the table is back", worker.owner);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let mut workers = workers;
    let mut running: Vec<&mut WorkerProcess> = workers.iter_mut().collect();
    assert_running(&mut running);
}
