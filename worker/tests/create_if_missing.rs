//! `createIfMissing` without the operator: a worker run in-process creates the streams its spec asks
//! for (the consumed stream, the output stream and the dead-letter stream), waits for ACTIVE and reads;
//! on kinesalite with `shards: N`, on kinesis-mock with `onDemand: true`. An existing stream of another
//! shape is left as it is.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_kinesis::types::{StreamMode, StreamStatus};
use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_worker::Metrics;
use leasehold_worker::WorkerConfig;
use leasehold_worker::processor::{Outputs, ProcessError, Record, ShardProcessor, shared};
use leasehold_worker::runtime;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Recording(Mutex<Vec<String>>);

#[async_trait]
impl ShardProcessor for Recording {
    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        self.0.lock().unwrap().push(String::from_utf8_lossy(&record.data).into_owned());
        Ok(())
    }
}

/// (status, on demand, open shards) of `stream`, None while it does not exist.
async fn shape(client: &aws_sdk_kinesis::Client, stream: &str) -> Option<(StreamStatus, bool, i32)> {
    let summary = client.describe_stream_summary().stream_name(stream).send().await.ok()?.stream_description_summary?;
    let on_demand = summary.stream_mode_details.is_some_and(|m| m.stream_mode == StreamMode::OnDemand);
    Some((summary.stream_status, on_demand, summary.open_shard_count))
}

async fn until_active(client: &aws_sdk_kinesis::Client, stream: &str) -> (bool, i32) {
    let started = std::time::Instant::now();
    loop {
        if let Some((StreamStatus::Active, on_demand, shards)) = shape(client, stream).await {
            return (on_demand, shards);
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{stream} never became ACTIVE");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a worker over `stream` with `create` as the consumed stream's createIfMissing and `others` as
/// the output's and dead-letter stream's; writes 40 records once the stream is ACTIVE and checks each is
/// processed once. Returns the consumed stream's (on demand, open shards).
async fn run(emulator: Emulator, stream: &str, create: &str, others: Option<(&str, &str, &str)>) -> (bool, i32) {
    let client = emulator.client().await;
    let mut extra = "startPosition: TRIM_HORIZON\n".to_string();
    if let Some((output, dead, shape)) = others {
        extra.push_str(&format!(
            "output: {{stream: {output}, createIfMissing: {shape}}}\nretry: {{onExhausted: deadLetter, \
             deadLetterStream: {dead}, deadLetterStreamCreateIfMissing: {shape}}}\n"
        ));
    }
    let yaml = emulator.config(stream, None, &extra).replacen(
        &format!("streams: [{{name: {stream}}}]"),
        &format!("streams: [{{name: {stream}, createIfMissing: {create}}}]"),
        1,
    );
    assert!(yaml.contains("createIfMissing"), "{yaml}");
    let config = WorkerConfig::parse(&yaml, Path::new("test.yaml")).expect("valid config");
    let recording = Arc::new(Recording::default());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(runtime::run_worker(runtime::Worker {
        config,
        owner: "create-test".into(),
        processors: Arc::new(shared(recording.clone())),
        metrics: Arc::new(Metrics::default()),
        shutdown: shutdown.clone(),
    }));
    let created = until_active(&client, stream).await;
    if let Some((output, dead, _)) = others {
        until_active(&client, output).await;
        until_active(&client, dead).await;
    }
    let written = records(4, 0, 10);
    put_records(&client, stream, &written).await;
    let started = std::time::Instant::now();
    while recording.0.lock().unwrap().len() < written.len() {
        assert!(!task.is_finished(), "the worker stopped");
        assert!(started.elapsed() < Duration::from_secs(30), "records not delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), task).await.expect("stops").expect("task").expect("runtime");
    let mut seen = recording.0.lock().unwrap().clone();
    seen.sort();
    let mut expected: Vec<String> = written.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    expected.sort();
    assert_eq!(seen, expected, "each record once");
    created
}

#[test]
fn a_worker_creates_missing_streams_with_shards_on_kinesalite() {
    run_test(async {
        let stream = leasehold_testkit::unique_name("created");
        let output = leasehold_testkit::unique_name("created-out");
        let dead = leasehold_testkit::unique_name("created-dlq");
        let client = Emulator::Kinesalite.client().await;
        assert!(shape(&client, &stream).await.is_none(), "missing before");
        let (on_demand, shards) =
            run(Emulator::Kinesalite, &stream, "{shards: 3}", Some((&output, &dead, "{shards: 1}"))).await;
        assert_eq!((on_demand, shards), (false, 3), "created with the shards asked for");
        assert_eq!(shape(&client, &output).await.map(|s| s.2), Some(1), "the output stream created");
        assert_eq!(shape(&client, &dead).await.map(|s| s.2), Some(1), "the dead-letter stream created");
    });
}

#[test]
fn a_worker_creates_a_missing_on_demand_stream_on_kinesis_mock() {
    run_test(async {
        let stream = leasehold_testkit::unique_name("created-od");
        let output = leasehold_testkit::unique_name("created-od-out");
        let dead = leasehold_testkit::unique_name("created-od-dlq");
        let client = Emulator::KinesisMock.client().await;
        assert!(shape(&client, &stream).await.is_none(), "missing before");
        let (on_demand, _) =
            run(Emulator::KinesisMock, &stream, "{onDemand: true}", Some((&output, &dead, "{onDemand: true}"))).await;
        assert!(on_demand, "created on demand");
        assert_eq!(shape(&client, &output).await.map(|s| s.1), Some(true));
        assert_eq!(shape(&client, &dead).await.map(|s| s.1), Some(true));
    });
}

#[test]
fn an_existing_stream_is_left_as_it_is() {
    run_test(async {
        for (emulator, create) in [(Emulator::Kinesalite, "{shards: 4}"), (Emulator::KinesisMock, "{onDemand: true}")] {
            let client = emulator.client().await;
            let stream = leasehold_testkit::create_stream(&client, "existing", 1).await;
            let (on_demand, shards) = run(emulator, &stream, create, None).await;
            assert_eq!((on_demand, shards), (false, 1), "{emulator:?}: one provisioned shard, as it was");
        }
    });
}
