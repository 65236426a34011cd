//! Scaling out and resharding under consumption.

mod common;

use std::time::{Duration, Instant};

use common::*;
use leasehold_testkit::holds::double_holds;
use leasehold_testkit::kinesis::{merge, open_shards, put_records, split};
use leasehold_testkit::process::wait_for;
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, LeaseStore};

const LEASE: Duration = Duration::from_secs(2);

async fn one_to_four_workers_on_sixteen_shards_converge_within_two_leases(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "scale", 16).await;
    let table = leasehold_testkit::unique_name("scale");
    let config = emulator.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let mut first = spawn(&config, "scale-1");
    wait_for("the first worker holds all 16", Duration::from_secs(30), async || first.held_shards().len() == 16).await;
    // Light load while shards move by handoff: a rebalance repeats nothing.
    let producer = Producer::start(kinesis.clone(), &stream, 32, Duration::from_millis(100));
    let joined_at = Instant::now();
    let mut others = [spawn(&config, "scale-2"), spawn(&config, "scale-3"), spawn(&config, "scale-4")];
    let all: Vec<_> = std::iter::once(&first).chain(others.iter()).collect();
    let converged = wait_for("4 each (+-1)", Duration::from_secs(20), async || {
        // Each worker's own view; whether two held a shard at once is judged at the end, from
        // complete logs (one worker's line may be read before another's earlier one).
        let held: Vec<Vec<String>> = all.iter().map(|w| w.held_shards()).collect();
        let flat: Vec<&String> = held.iter().flatten().collect();
        held.iter().all(|h| (3..=5).contains(&h.len())) && flat.len() == 16
    })
    .await;
    println!("converged {converged:?} after three workers joined");
    // Correctness, not speed (the runtime bench measures rebalance time on a quiet machine): the
    // joiners get their shares by handoff within a few lease durations even on a loaded machine.
    assert!(joined_at.elapsed() <= 5 * LEASE, "took {:?}", joined_at.elapsed());
    let written = producer.stop().await;
    wait_for("every record delivered", Duration::from_secs(30), async || {
        distinct(&all_deliveries(&all)).len() >= written.len()
    })
    .await;
    assert_exactly_once(&all_deliveries(&all), &written);
    assert_per_key_order(&all);
    // The joiners' shares came by handoff (counted by the giver), none by takeover.
    let handed: f64 = metric(&first, "leasehold_lease_handoffs_total").await;
    let received: usize = others.iter().map(|w| w.held_shards().len()).sum();
    assert!(handed >= received as f64, "{handed} handoffs counted for {received} leases moved to the joiners");
    for worker in &all {
        assert_eq!(metric(worker, "leasehold_lease_takeovers_total").await, 0.0, "{}: no takeover", worker.owner);
    }
    // No shard held by two workers at once, by the row's counters and the workers' own clocks, over
    // their whole logs (read after they stopped).
    for worker in std::iter::once(&mut first).chain(others.iter_mut()) {
        worker.signal("TERM");
    }
    for worker in std::iter::once(&mut first).chain(others.iter_mut()) {
        assert!(worker.wait_exit(Duration::from_secs(30)).is_some(), "{} did not stop", worker.owner);
    }
    let all: Vec<_> = std::iter::once(&first).chain(others.iter()).collect();
    let double_held = double_holds(&all);
    assert!(double_held.is_empty(), "a shard was held by two workers at once: {:?}", double_held.first());
}

async fn split_and_merge_keep_key_order_and_lose_nothing(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "reshard", 2).await;
    let table = leasehold_testkit::unique_name("reshard");
    let config = emulator.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let workers = [spawn(&config, "reshard-1"), spawn(&config, "reshard-2")];
    let refs: Vec<_> = workers.iter().collect();
    let producer = Producer::start(kinesis.clone(), &stream, 30, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_secs(2)).await;
    split(&kinesis, &stream, "shardId-000000000000").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Children of shard 0 are 2 (lower half) and 3 (upper half); 3 is adjacent to shard 1.
    let open: Vec<String> = open_shards(&kinesis, &stream).await.into_iter().map(|(id, _, _)| id).collect();
    assert!(open.contains(&"shardId-000000000003".to_string()), "open after split: {open:?}");
    merge(&kinesis, &stream, "shardId-000000000003", "shardId-000000000001").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let written = producer.stop().await;
    wait_for("every record delivered", Duration::from_secs(60), async || {
        distinct(&all_deliveries(&refs)).len() >= written.len()
    })
    .await;
    let deliveries = all_deliveries(&refs);
    assert_exactly_once(&deliveries, &written);

    // Per key, first deliveries in the order the workers processed them carry increasing numbers,
    // across the parent -> child change.
    assert_key_order_across_shards(&refs);
    // Children started only after their parents ended.
    assert_children_after_parents(
        &refs,
        &stream,
        &[
            ("shardId-000000000002", &["shardId-000000000000"]),
            ("shardId-000000000004", &["shardId-000000000003", "shardId-000000000001"]),
        ],
    );
    println!("{} deliveries for {} records", deliveries.len(), written.len());
    // Finished parents' rows are cleaned up once all their children have started.
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let viewer = DynamoLeaseStore::new(dynamodb, table.clone(), LeaseSettings::new("viewer"));
    let mut rows = Vec::new();
    for _ in 0..100 {
        rows = viewer
            .list()
            .await
            .expect("list")
            .leases
            .into_iter()
            .map(|l| l.key.shard_id().to_string())
            .collect::<Vec<_>>();
        rows.sort();
        if rows == ["shardId-000000000002", "shardId-000000000004"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(rows, ["shardId-000000000002", "shardId-000000000004"], "finished parents' rows must be cleaned up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_restarts_at_latest_unless_told_otherwise() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "memory", 2).await;
    let before = records(5, 0, 4);
    put_records(&kinesis, &stream, &before).await;
    let latest = config(&stream, None, "");

    let mut first = spawn(&latest, "mem-1");
    wait_for("holds both shards", Duration::from_secs(20), async || first.held_shards().len() == 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = records(5, 100, 2);
    put_records(&kinesis, &stream, &during).await;
    wait_for("new records delivered", Duration::from_secs(20), async || {
        distinct(&first.deliveries()).len() >= during.len()
    })
    .await;
    first.signal("TERM");
    first.wait_exit(Duration::from_secs(10)).expect("exits");
    let delivered = distinct(&first.deliveries());
    assert!(
        before.iter().all(|(_, d)| !delivered.contains(&String::from_utf8_lossy(d).into_owned())),
        "LATEST skips old records"
    );
    assert_exactly_once(&first.deliveries(), &during);

    // A restart remembers nothing: it starts at the tip again.
    let while_down = records(5, 200, 2);
    put_records(&kinesis, &stream, &while_down).await;
    let second = spawn(&latest, "mem-2");
    wait_for("holds both shards", Duration::from_secs(20), async || second.held_shards().len() == 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = records(5, 300, 2);
    put_records(&kinesis, &stream, &after).await;
    wait_for("new records delivered", Duration::from_secs(20), async || {
        distinct(&second.deliveries()).len() >= after.len()
    })
    .await;
    let delivered = distinct(&second.deliveries());
    assert!(while_down.iter().all(|(_, d)| !delivered.contains(&String::from_utf8_lossy(d).into_owned())));
    assert_exactly_once(&second.deliveries(), &after);

    // With startPosition TRIM_HORIZON a restart reads everything retained.
    let third = spawn(&config(&stream, None, "startPosition: TRIM_HORIZON\n"), "mem-3");
    let everything: Vec<_> = before.iter().chain(&during).chain(&while_down).chain(&after).cloned().collect();
    wait_for("everything delivered", Duration::from_secs(20), async || {
        distinct(&third.deliveries()).len() >= everything.len()
    })
    .await;
    assert_exactly_once(&third.deliveries(), &everything);
}

/// The shard ids of `stream`'s rows in `table`, sorted.
async fn shard_rows(viewer: &DynamoLeaseStore, stream: &str) -> Vec<String> {
    let mut rows: Vec<String> = viewer
        .list()
        .await
        .expect("list")
        .leases
        .into_iter()
        .filter(|l| l.key.stream() == stream)
        .map(|l| l.key.shard_id().to_string())
        .collect();
    rows.sort();
    rows
}

/// Waits until `stream`'s rows are exactly `expected` (the finished shards' rows cleaned up); on a
/// timeout, says what was seen instead.
async fn wait_for_rows(viewer: &DynamoLeaseStore, stream: &str, expected: &[&str]) -> Result<(), String> {
    let expected: Vec<String> = expected.iter().map(|s| format!("shardId-{s:0>12}")).collect();
    let started = Instant::now();
    let mut rows = Vec::new();
    while started.elapsed() < Duration::from_secs(30) {
        rows = shard_rows(viewer, stream).await;
        if rows == expected {
            println!("rows {expected:?} after {:?}", started.elapsed());
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("rows never became {expected:?}; last seen {rows:?}"))
}

async fn split_merge_split_with_cleanup_between_processes_every_record_exactly_once(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lineage", 2).await;
    let table = leasehold_testkit::unique_name("lineage");
    let config = emulator.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let mut workers = [spawn(&config, "lineage-1"), spawn(&config, "lineage-2")];
    wait_for("both workers hold a shard", Duration::from_secs(30), async || {
        workers.iter().all(|w| w.held_shards().len() == 1)
    })
    .await;
    let producer = Producer::start(kinesis.clone(), &stream, 20, Duration::from_millis(50));
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let viewer = DynamoLeaseStore::new(dynamodb, table.clone(), LeaseSettings::new("viewer"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // 0 -> 2 (lower half) + 3 (upper half); then 2 + 3 -> 4; then 4 -> 5 + 6. Shard 1 stays open. Each
    // step waits until the finished shards' rows are gone, so the next sync sees a lineage whose
    // older generations have no rows at all.
    // A wait that times out is reported after the repeats, which say more.
    split(&kinesis, &stream, "shardId-000000000000").await;
    let mut cleanups = vec![wait_for_rows(&viewer, &stream, &["1", "2", "3"]).await];
    merge(&kinesis, &stream, "shardId-000000000002", "shardId-000000000003").await;
    cleanups.push(wait_for_rows(&viewer, &stream, &["1", "4"]).await);
    split(&kinesis, &stream, "shardId-000000000004").await;
    cleanups.push(wait_for_rows(&viewer, &stream, &["1", "5", "6"]).await);
    // A few more syncs under load: a finished shard brought back would show up as a row and as repeats.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let written = producer.stop().await;
    let refs: Vec<&leasehold_testkit::process::WorkerProcess> = workers.iter().collect();
    wait_for("every record delivered", Duration::from_secs(60), async || {
        distinct(&all_deliveries(&refs)).len() >= written.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deliveries = all_deliveries(&refs);
    println!("{} deliveries for {} records", deliveries.len(), written.len());
    assert_exactly_once(&deliveries, &written);
    assert_per_key_order(&refs);
    for cleanup in cleanups {
        cleanup.unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(
        shard_rows(&viewer, &stream).await,
        ["shardId-000000000001", "shardId-000000000005", "shardId-000000000006"],
        "no finished shard got a row again"
    );
    let [a, b] = &mut workers;
    assert_running(&mut [a, b]);
}

on_both_emulators!(
    one_to_four_workers_on_sixteen_shards_converge_within_two_leases,
    split_merge_split_with_cleanup_between_processes_every_record_exactly_once
);
on_every_ground!(split_and_merge_keep_key_order_and_lose_nothing);
