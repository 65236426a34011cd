//! Credentials that stop working mid-run, for longer than a lease: DynamoDB answers
//! `ExpiredTokenException` and Kinesis `UnrecognizedClientException` to every call for a while, then
//! accepts them again. Each worker reports it (a few log lines with a count,
//! `leasehold_aws_credential_failures_total`), loses its leases by the ordinary rules (nothing is
//! processed past their deadlines), and recovers by itself once the calls are accepted: every shard
//! leased and read again, every record processed exactly once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use leasehold_testkit::Service;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{WorkerProcess, wait_for};
use leasehold_testkit::proxy::FaultProxy;
use leasehold_testkit::server::http_get;

const LEASE: Duration = Duration::from_secs(2);
const REFUSED_FOR: Duration = Duration::from_secs(7);

async fn credential_failures(worker: &WorkerProcess) -> u64 {
    let address = worker.metrics_addr().expect("metrics address");
    let (_, text) = http_get(&address, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix("leasehold_aws_credential_failures_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no credential failure counter in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_reported_leases_run_out_and_the_group_recovers_with_nothing_lost() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "creds", 2).await;
    let table = leasehold_testkit::unique_name("creds");
    let refused = Arc::new(AtomicBool::new(false));
    let (on_dynamo, on_kinesis) = (refused.clone(), refused.clone());
    let dynamo = FaultProxy::start(
        &leasehold_testkit::endpoint(Service::DynamoDb),
        Arc::new(move |_, _| on_dynamo.load(Ordering::SeqCst).then_some("ExpiredTokenException")),
    )
    .await;
    let kinesis_proxy = FaultProxy::start(
        &leasehold_testkit::endpoint(Service::Kinesis),
        Arc::new(move |_, _| on_kinesis.load(Ordering::SeqCst).then_some("UnrecognizedClientException")),
    )
    .await;
    let yaml = config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let yaml = with_endpoint(&yaml, Service::DynamoDb, &dynamo.endpoint());
    let yaml = with_endpoint(&yaml, Service::Kinesis, &kinesis_proxy.endpoint());
    let mut workers = [spawn(&yaml, "creds-a"), spawn(&yaml, "creds-b")];
    let before = records(10, 0, 5);
    put_records(&kinesis, &stream, &before).await;
    {
        let refs: Vec<_> = workers.iter().collect();
        wait_for("the first records processed", Duration::from_secs(30), async || {
            distinct(&all_deliveries(&refs)).len() == before.len()
        })
        .await;
    }
    wait_for("one shard each", Duration::from_secs(20), async || workers.iter().all(|w| w.held_shards().len() == 1))
        .await;
    // Every record done is checkpointed before the credentials stop working.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for worker in &workers {
        assert_eq!(credential_failures(worker).await, 0, "{}", worker.owner);
    }

    let refused_at = Instant::now();
    refused.store(true, Ordering::SeqCst);
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    let during = records(10, 100, 3);
    put_records(&kinesis, &stream, &during).await;
    let quiet_from = Instant::now();
    tokio::time::sleep(REFUSED_FOR.saturating_sub(refused_at.elapsed())).await;
    {
        let refs: Vec<_> = workers.iter().collect();
        let processed: Vec<_> = all_deliveries(&refs).into_iter().filter(|d| d.seen_at >= quiet_from).collect();
        assert!(processed.is_empty(), "records processed past the lease deadline: {:?}", &processed[..1]);
    }
    for worker in &workers {
        assert!(credential_failures(worker).await > 0, "{}: refusals counted", worker.owner);
        let lines =
            worker.events("AWS refused the worker's credentials; calls are retried until they are accepted again");
        assert!(
            (1..=2).contains(&lines.len()),
            "{}: {} report lines in {REFUSED_FOR:?}:\n{}",
            worker.owner,
            lines.len(),
            worker.stderr_text()
        );
        assert!(worker.held_shards().is_empty(), "{}: leases lost by the ordinary rules", worker.owner);
    }

    refused.store(false, Ordering::SeqCst);
    wait_for("both shards leased again", Duration::from_secs(30), async || {
        workers.iter().map(|w| w.held_shards().len()).sum::<usize>() == 2
    })
    .await;
    let after = records(10, 200, 3);
    put_records(&kinesis, &stream, &after).await;
    let expected: Vec<_> = before.iter().chain(&during).chain(&after).cloned().collect();
    let refs: Vec<_> = workers.iter().collect();
    wait_for("every record processed", Duration::from_secs(60), async || {
        distinct(&all_deliveries(&refs)).len() == expected.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_exactly_once(&all_deliveries(&refs), &expected);
    assert_per_key_order(&refs);
    let mut running: Vec<&mut WorkerProcess> = workers.iter_mut().collect();
    assert_running(&mut running);
}
