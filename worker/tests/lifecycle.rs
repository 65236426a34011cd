//! A shard processor's lifecycle, in a worker run in-process through the library API: one processor
//! per shard made by the factory, `initialize` with the lease's checkpoint, exactly one closing hook
//! per shard, the shutdown hooks of every shard run together under `lease.gracefulTimeout`, and a
//! shard that fails (its stream deleted) closing its processor too.

mod common;

use leasehold_testkit::process::wait_for;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_worker::Metrics;
use leasehold_worker::{LeaseKey, Outputs, ProcessError, Record, ShardProcessor, ShardStart, WorkerConfig, runtime};
use tokio_util::sync::CancellationToken;

/// What every shard's processor did, by shard id, in order.
#[derive(Default)]
struct Journal(Mutex<HashMap<String, Vec<String>>>);

impl Journal {
    fn note(&self, shard: &LeaseKey, what: String) {
        self.0.lock().unwrap().entry(shard.shard_id().to_string()).or_default().push(what);
    }

    fn of(&self, shard: &str) -> Vec<String> {
        self.0.lock().unwrap().get(shard).cloned().unwrap_or_default()
    }

    fn count(&self, what: &str) -> usize {
        self.0.lock().unwrap().values().flatten().filter(|w| w.starts_with(what)).count()
    }
}

/// One shard's processor: notes its calls; its shutdown hook takes `shutdown_delay`.
struct Noting {
    shard: LeaseKey,
    journal: Arc<Journal>,
    shutdown_delay: Duration,
}

#[async_trait]
impl ShardProcessor for Noting {
    async fn initialize(&self, start: &ShardStart) {
        assert_eq!(start.shard, self.shard, "the factory's shard is the one initialized");
        self.journal.note(&self.shard, format!("initialize {}", start.checkpoint));
    }

    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        assert_eq!(&*record.shard_id, self.shard.shard_id(), "records reach their own shard's processor");
        self.journal.note(&self.shard, format!("record {}", String::from_utf8_lossy(&record.data)));
        Ok(())
    }

    async fn shard_ended(&self) {
        self.journal.note(&self.shard, "shard_ended".into());
    }

    async fn shutdown_requested(&self) {
        tokio::time::sleep(self.shutdown_delay).await;
        self.journal.note(&self.shard, "shutdown_requested".into());
    }

    async fn lease_lost(&self) {
        self.journal.note(&self.shard, "lease_lost".into());
    }
}

/// Starts a worker on `stream` whose shard processors note into `journal`.
fn start(
    stream: &str,
    table: &str,
    timing: &str,
    journal: &Arc<Journal>,
    shutdown_delay: Duration,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let yaml =
        config_with_timing(stream, Some(table), timing, "startPosition: TRIM_HORIZON\nprocessor: {custom: {}}\n")
            .replace("processor: {stdout: {}}\n", "");
    let config = WorkerConfig::parse(&yaml, Path::new("lifecycle.yaml")).expect("valid config");
    let shutdown = CancellationToken::new();
    let journal = journal.clone();
    let factory = move |shard: &LeaseKey| Noting { shard: shard.clone(), journal: journal.clone(), shutdown_delay };
    let processors = runtime::processors(&config, "lifecycle", Some(Arc::new(factory))).expect("custom processor");
    let task = tokio::spawn(runtime::run_worker(runtime::Worker {
        config,
        owner: "lifecycle".into(),
        processors,
        metrics: Arc::new(Metrics::default()),
        shutdown: shutdown.clone(),
    }));
    (shutdown, tokio::spawn(async move { task.await.expect("runtime task").expect("runtime") }))
}

const TIMING: &str = "lease: {duration: 2s, renewInterval: 500ms, scanInterval: 250ms, shardSyncInterval: 1s, \
                      checkpointInterval: 200ms, gracefulTimeout: 3s}\n";

#[test]
fn shutdown_hooks_of_every_shard_run_together_within_the_graceful_timeout() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "hooks", 4).await;
        let table = leasehold_testkit::unique_name("hooks");
        let journal = Arc::new(Journal::default());
        // Each hook takes 2 s: one after another, four would need 8 s; together they fit in 3 s.
        let (shutdown, task) = start(&stream, &table, TIMING, &journal, Duration::from_secs(2));
        let records: Vec<_> = (0..10)
            .flat_map(|n| (0..8).map(move |k| leasehold_testkit::kinesis::numbered(&format!("k{k}"), n)))
            .collect();
        put_records(&kinesis, &stream, &records).await;
        wait_for("every record processed", Duration::from_secs(30), async || journal.count("record ") == records.len())
            .await;
        assert_eq!(journal.count("initialize "), 4, "one processor per shard, initialized once");
        let asked = Instant::now();
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("stops").expect("runtime task");
        let took = asked.elapsed();
        assert_eq!(journal.count("shutdown_requested"), 4, "every shard's processor told once");
        assert!(took < Duration::from_millis(3500), "hooks ran one after another: shutdown took {took:?}");
        for shard in 0..4 {
            let calls = journal.of(&format!("shardId-00000000000{shard}"));
            assert!(calls.first().is_some_and(|c| c == "initialize TRIM_HORIZON"), "{calls:?}");
            assert_eq!(calls.last().map(String::as_str), Some("shutdown_requested"), "{calls:?}");
        }

        // A restart: each processor is initialized at the checkpoint the previous run left.
        let again = Arc::new(Journal::default());
        let (shutdown, task) = start(&stream, &table, TIMING, &again, Duration::ZERO);
        wait_for("four shards initialized", Duration::from_secs(20), async || again.count("initialize ") == 4).await;
        assert_eq!(again.count("record "), 0, "nothing is repeated after a clean shutdown");
        for shard in 0..4 {
            let calls = again.of(&format!("shardId-00000000000{shard}"));
            assert!(calls[0].starts_with("initialize ") && calls[0] != "initialize TRIM_HORIZON", "{calls:?}");
        }
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("stops").expect("runtime task");
    });
}

#[test]
fn a_hook_slower_than_the_graceful_timeout_does_not_hold_the_shutdown() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "slowhook", 2).await;
        let table = leasehold_testkit::unique_name("slowhook");
        let journal = Arc::new(Journal::default());
        let (shutdown, task) = start(&stream, &table, TIMING, &journal, Duration::from_secs(60));
        wait_for("both shards initialized", Duration::from_secs(20), async || journal.count("initialize ") == 2).await;
        let asked = Instant::now();
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("stops").expect("runtime task");
        let took = asked.elapsed();
        assert!(took < Duration::from_secs(5), "gracefulTimeout 3s bounds the shutdown: took {took:?}");
    });
}

#[test]
fn a_shard_that_fails_closes_its_processor() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "failing", 1).await;
        let table = leasehold_testkit::unique_name("failing");
        let journal = Arc::new(Journal::default());
        let (shutdown, task) = start(&stream, &table, TIMING, &journal, Duration::ZERO);
        wait_for("the shard initialized", Duration::from_secs(20), async || journal.count("initialize ") == 1).await;
        kinesis.delete_stream().stream_name(&stream).send().await.expect("delete stream");
        wait_for("the failed shard's processor closed", Duration::from_secs(30), async || {
            journal.count("shutdown_requested") >= 1
        })
        .await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("stops").expect("runtime task");
        // The row may be taken again (and fail again) before the shutdown: every processor made for it
        // was closed exactly once, after its initialize.
        let calls = journal.of("shardId-000000000000");
        let lifetimes: Vec<&[String]> =
            calls.split_inclusive(|c| c == "shutdown_requested" || c == "lease_lost").collect();
        for lifetime in &lifetimes {
            assert!(lifetime[0].starts_with("initialize "), "{calls:?}");
            let closing = lifetime.iter().filter(|c| *c == "shutdown_requested" || *c == "lease_lost").count();
            assert_eq!(closing, 1, "one closing hook per processor: {calls:?}");
        }
    });
}
