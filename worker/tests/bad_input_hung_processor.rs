//! A Rust processor whose call never returns: the shard waits for it (the call is never cancelled),
//! keeping its lease; after `lease.gracefulTimeout` the record counts in `leasehold_records_stuck`; a
//! shutdown abandons it at the graceful deadline and releases the lease at the last record done, so the
//! next holder (here a `leasehold-worker` process) processes the stuck record and everything after it:
//! every record exactly once, nothing lost.

mod common;

use leasehold_testkit::process::wait_for;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_worker::Metrics;
use leasehold_worker::{LeaseKey, Outputs, ProcessError, Record, ShardProcessor, WorkerConfig, runtime};
use tokio_util::sync::CancellationToken;

/// Notes what it processed; never returns from the record whose data is `hang_on`.
struct Hanging {
    hang_on: String,
    done: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl ShardProcessor for Hanging {
    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        let data = String::from_utf8_lossy(&record.data).into_owned();
        if data == self.hang_on {
            std::future::pending::<()>().await;
        }
        self.done.lock().unwrap().push(data);
        Ok(())
    }
}

const GRACEFUL: Duration = Duration::from_secs(2);
const TIMING: &str = "lease: {duration: 2s, renewInterval: 500ms, scanInterval: 250ms, shardSyncInterval: 1s, \
                      checkpointInterval: 200ms, gracefulTimeout: 2s}\n";

#[test]
fn a_hung_processor_is_reported_stuck_keeps_its_lease_and_is_abandoned_at_shutdown() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "hung", 1).await;
        let table = leasehold_testkit::unique_name("hung");
        let yaml = config_with_timing(&stream, Some(&table), TIMING, "startPosition: TRIM_HORIZON\n");
        let custom = WorkerConfig::parse(
            &yaml.replace("processor: {stdout: {}}", "processor: {custom: {}}"),
            Path::new("hung.yaml"),
        )
        .expect("valid config");
        let done = Arc::new(Mutex::new(Vec::new()));
        let hanging = Arc::new(Hanging { hang_on: "key-0:3".into(), done: done.clone() });
        let factory = move |_: &LeaseKey| hanging.clone();
        let processors = runtime::processors(&custom, "hung-a", Some(Arc::new(factory))).expect("custom processor");
        let metrics = Arc::new(Metrics::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(runtime::run_worker(runtime::Worker {
            config: custom,
            owner: "hung-a".into(),
            processors,
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
        }));

        let written = records(1, 0, 10);
        put_records(&kinesis, &stream, &written).await;
        wait_for("the records before the hung one", Duration::from_secs(30), async || done.lock().unwrap().len() == 3)
            .await;
        let hung_since = Instant::now();
        wait_for("the hung record counted as stuck", GRACEFUL * 3, async || {
            counted(&metrics, "leasehold_records_stuck") == 1
        })
        .await;
        assert!(hung_since.elapsed() >= GRACEFUL - Duration::from_millis(500), "stuck only after gracefulTimeout");
        // The shard waits with its lease kept (renewals go on): several lease durations later it is still held.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(counted(&metrics, "leasehold_leases_held"), 1, "the lease is kept while the record is stuck");
        assert_eq!(
            done.lock().unwrap().clone(),
            vec!["key-0:0", "key-0:1", "key-0:2"],
            "nothing after the hung record"
        );

        let asked = Instant::now();
        shutdown.cancel();
        tokio::time::timeout(GRACEFUL + Duration::from_secs(3), task)
            .await
            .expect("the shutdown does not wait for the hung call past gracefulTimeout")
            .expect("runtime task")
            .expect("runtime");
        assert!(asked.elapsed() < GRACEFUL + Duration::from_secs(2), "stopped in {:?}", asked.elapsed());
        assert_eq!(counted(&metrics, "leasehold_records_stuck"), 0, "the abandoned call no longer counts");

        // The lease was released at the last record done: the next holder takes it at once (no expiry
        // wait) and processes the stuck record and the rest, once each.
        let next = spawn(&yaml, "hung-b");
        wait_for("the rest processed by the next holder", Duration::from_secs(20), async || {
            next.deliveries().len() >= written.len() - 3
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let deliveries = next.deliveries();
        assert_eq!(deliveries.first().map(|d| d.data.as_str()), Some("key-0:3"), "resumes at the stuck record");
        assert_no_repeats(&deliveries);
        let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for data in done.lock().unwrap().iter().cloned().chain(deliveries.iter().map(|d| d.data.clone())) {
            *counts.entry(data).or_default() += 1;
        }
        for (_, data) in &written {
            let data = String::from_utf8_lossy(data).into_owned();
            assert_eq!(counts.get(&data), Some(&1), "{data}: processed exactly once over both holders");
        }
        assert_eq!(counts.len(), written.len());
    });
}
