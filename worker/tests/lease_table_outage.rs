//! DynamoDB unreachable for several lease durations while Kinesis still answers: the workers stop
//! processing once their leases' deadlines pass (nothing is read without a lease), back off instead of
//! spinning (bounded CPU and log lines), and when the table answers again the group recovers by itself:
//! every shard leased and read again, nothing lost, the records written during the outage processed
//! exactly once.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use leasehold_testkit::Service;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{cpu_time, wait_for};
use leasehold_testkit::proxy::FaultProxy;

const OUTAGE: Duration = Duration::from_secs(10);
const LEASE: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_table_outage_stops_processing_costs_little_and_heals() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "outage", 4).await;
    let table = leasehold_testkit::unique_name("outage");
    let cut = Arc::new(AtomicBool::new(false));
    let cutting = cut.clone();
    let proxy = FaultProxy::start(
        &leasehold_testkit::endpoint(Service::DynamoDb),
        Arc::new(move |_, _| cutting.load(Ordering::SeqCst).then_some("ServiceUnavailable")),
    )
    .await;
    let yaml = with_endpoint(
        &config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n"),
        Service::DynamoDb,
        &proxy.endpoint(),
    );
    let workers = [spawn(&yaml, "outage-a"), spawn(&yaml, "outage-b")];
    let refs: Vec<_> = workers.iter().collect();
    let before = records(20, 0, 10);
    put_records(&kinesis, &stream, &before).await;
    wait_for("the first records processed", Duration::from_secs(30), async || {
        distinct(&all_deliveries(&refs)).len() == before.len()
    })
    .await;
    wait_for("two shards each", Duration::from_secs(20), async || workers.iter().all(|w| w.held_shards().len() == 2))
        .await;

    let cpu_before: Vec<Duration> = workers.iter().map(|w| cpu_time(w.pid())).collect();
    let logs_before: Vec<usize> = workers.iter().map(|w| w.stderr_text().lines().count()).collect();
    let cut_at = Instant::now();
    cut.store(true, Ordering::SeqCst);
    // Past every deadline (a lease duration after the last renewal sent) the workers process nothing.
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    let during = records(20, 100, 5);
    put_records(&kinesis, &stream, &during).await;
    let quiet_from = Instant::now();
    tokio::time::sleep(OUTAGE.saturating_sub(cut_at.elapsed())).await;
    let processed_in_outage: Vec<_> = all_deliveries(&refs).into_iter().filter(|d| d.seen_at >= quiet_from).collect();
    assert!(
        processed_in_outage.is_empty(),
        "records processed without a lease: {:?}",
        &processed_in_outage[..processed_in_outage.len().min(3)]
    );
    for (n, worker) in workers.iter().enumerate() {
        let cpu = cpu_time(worker.pid()) - cpu_before[n];
        assert!(cpu < OUTAGE / 5, "{}: {cpu:?} of CPU in a {OUTAGE:?} outage (bounded backoff expected)", worker.owner);
        let text = worker.stderr_text();
        let lines: Vec<&str> = text.lines().skip(logs_before[n]).collect();
        let table_lines = lines.iter().filter(|l| l.contains("cannot use the lease table")).count();
        assert!((1..=3).contains(&table_lines), "{}: {table_lines} outage lines in {OUTAGE:?}", worker.owner);
        assert!(lines.len() < 300, "{}: {} log lines in {OUTAGE:?}", worker.owner, lines.len());
        assert_eq!(worker.held_shards().len(), 0, "{}: every lease given up as lost", worker.owner);
    }

    cut.store(false, Ordering::SeqCst);
    let healed = Instant::now();
    wait_for("every shard leased again", Duration::from_secs(30), async || {
        workers.iter().map(|w| w.held_shards().len()).sum::<usize>() == 4
    })
    .await;
    let after = records(20, 200, 5);
    put_records(&kinesis, &stream, &after).await;
    let expected: Vec<_> = before.iter().chain(&during).chain(&after).cloned().collect();
    wait_for("every record processed", Duration::from_secs(60), async || {
        distinct(&all_deliveries(&refs)).len() == expected.len()
    })
    .await;
    let deliveries = all_deliveries(&refs);
    assert_complete(&deliveries, &expected);
    assert_per_key_order(&refs);
    // Only records processed before the outage and not yet checkpointed may come again.
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for d in &deliveries {
        *counts.entry(d.data.as_str()).or_default() += 1;
    }
    for (_, data) in during.iter().chain(&after) {
        let data = String::from_utf8_lossy(data);
        assert_eq!(counts.get(data.as_ref()), Some(&1), "{data}: written during or after the outage, processed once");
    }
    // A worker whose shards the other took may still be in its backoff (at most 5 s, doubled by jitter).
    wait_for("both workers see the table again", Duration::from_secs(20), async || {
        workers.iter().all(|w| w.stderr_text().contains("lease table reachable again"))
    })
    .await;
    println!("healed {:?} ago", healed.elapsed());
}

/// A worker started while the lease table answers ServiceUnavailable waits for it (counted, backing
/// off) instead of exiting, reads every record once it answers, and a SIGTERM while it still waits
/// ends it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_during_an_outage_waits_for_the_table() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "outage-start", 2).await;
    let table = leasehold_testkit::unique_name("outage-start");
    let cut = Arc::new(AtomicBool::new(true));
    let cutting = cut.clone();
    let proxy = FaultProxy::start(
        &leasehold_testkit::endpoint(Service::DynamoDb),
        Arc::new(move |_, _| cutting.load(Ordering::SeqCst).then_some("ServiceUnavailable")),
    )
    .await;
    let yaml = with_endpoint(
        &config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n"),
        Service::DynamoDb,
        &proxy.endpoint(),
    );
    let mut waiting = spawn(&yaml, "outage-start-a");
    let mut stopped = spawn(&yaml, "outage-start-b");
    wait_for("both workers see the table out of reach", Duration::from_secs(30), async || {
        [&waiting, &stopped].iter().all(|w| w.stderr_text().contains("cannot reach the lease table at start"))
    })
    .await;
    assert_running(&mut [&mut waiting, &mut stopped]);
    stopped.signal("TERM");
    let status = stopped.wait_exit(Duration::from_secs(10)).expect("exits on SIGTERM");
    assert!(status.success(), "a SIGTERM while waiting for the table is a clean exit: {status:?}");
    let written = records(10, 0, 5);
    put_records(&kinesis, &stream, &written).await;
    cut.store(false, Ordering::SeqCst);
    wait_for("every record processed once the table answers", Duration::from_secs(60), async || {
        distinct(&waiting.deliveries()).len() >= written.len()
    })
    .await;
    assert_exactly_once(&waiting.deliveries(), &written);
    assert!(metric(&waiting, "leasehold_lease_table_failures_total").await >= 1.0, "the waits are counted");
}
