//! A GetRecords page too big to arrive within the SDK's 3 s attempt timeout (chaos seed
//! 4491231873834608077: a loaded, delayed Kinesis took 28 s for a page of 1000) must not stall its
//! shard: the reader halves its page limit after a timed-out call and reads on with smaller pages. The
//! testkit's Kinesis proxy holds each GetRecords answer back 4 ms per record it carries, so a page of
//! 1000 takes 4 s (always cut) and one of 500 takes 2 s.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use leasehold_testkit::Service;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::nemesis::{ChaosProxy, Faults};
use leasehold_testkit::process::wait_for;
use leasehold_testkit::server::http_get;

async fn metric(address: &str, name: &str) -> Option<f64> {
    let (_, text) = http_get(address, "/metrics").await;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_times_out_is_asked_for_again_smaller_and_the_shard_moves_on() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "pacing", 1).await;
    let backlog = records(10, 0, 100);
    put_records(&kinesis, &stream, &backlog).await;
    let faults = Arc::new(Faults::default());
    faults.set_record_delay(Duration::from_millis(4));
    let proxy = ChaosProxy::start(&leasehold_testkit::endpoint(Service::Kinesis), "pacing", faults.clone(), None).await;
    let config = with_endpoint(
        &config(&stream, None, "startPosition: TRIM_HORIZON\nreader: {idleTime: 100ms, maxRecords: 1000}\n"),
        Service::Kinesis,
        &proxy.endpoint(),
    );
    let mut worker = spawn(&config, "pacing");
    // Generous: a loaded shared kinesalite is slow for every page, and each timed-out call costs 3 s.
    wait_for("the backlog processed with smaller pages", Duration::from_secs(120), async || {
        distinct(&worker.deliveries()).len() == backlog.len()
    })
    .await;
    let limits: Vec<i64> = worker
        .logs()
        .into_iter()
        .filter(|(_, v)| {
            v.get("message").and_then(|m| m.as_str()) == Some("GetRecords timed out; asking for smaller pages")
        })
        .filter_map(|(_, v)| v.get("limit").and_then(|l| l.as_i64()))
        .collect();
    assert_eq!(limits.first(), Some(&500), "the first timeout halves the page: {limits:?}");
    assert!(limits.iter().all(|l| *l >= 10), "never below the floor: {limits:?}");
    let address = worker.metrics_addr().expect("metrics address");
    let timeouts = metric(&address, "leasehold_get_records_timeouts_total").await.expect("timeouts counted");
    assert!(timeouts >= 1.0, "timeouts counted: {timeouts}");
    // Healed and written again: the page grows back and new records arrive as before.
    faults.heal();
    let more = records(10, 100, 20);
    put_records(&kinesis, &stream, &more).await;
    let expected: Vec<_> = backlog.iter().chain(&more).cloned().collect();
    wait_for("the later records processed", Duration::from_secs(30), async || {
        distinct(&worker.deliveries()).len() == expected.len()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_exactly_once(&worker.deliveries(), &expected);
    assert_running(&mut [&mut worker]);
}
