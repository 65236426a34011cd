//! Each `retry.onExhausted` policy end to end on the emulators: a worker run in-process through the
//! library API with a Rust processor that fails deterministically for some records. Every policy runs
//! twice: on plain records and on the same records packed into KPL aggregates by AWS's aggregation
//! library, where retries, policies and ordering apply to each user record.

mod common;

use leasehold_testkit::process::wait_for;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use leasehold_testkit::kinesis::{open_shards, put_records, read_shard};
use leasehold_testkit::kpl::{library_aggregates, put_aggregates};
use leasehold_worker::Metrics;
use leasehold_worker::WorkerConfig;
use leasehold_worker::internals::dispatch::open_requeued;
use leasehold_worker::processor::{Outputs, ProcessError, Record, ShardProcessor, shared};
use leasehold_worker::runtime;
use tokio_util::sync::CancellationToken;

/// Fails every attempt on records whose data ends in `:3` (one per key) until healed; remembers every
/// attempt in order.
#[derive(Default)]
struct Flaky {
    healed: AtomicBool,
    attempts: Mutex<Vec<(String, String)>>,
}

impl Flaky {
    fn failing(data: &str) -> bool {
        data.ends_with(":3")
    }

    fn attempts_on(&self, data: &str) -> usize {
        self.attempts.lock().unwrap().iter().filter(|(_, d)| d == data).count()
    }

    /// Successful or not, the data of every attempt on `key`, in order.
    fn key_attempts(&self, key: &str) -> Vec<String> {
        self.attempts.lock().unwrap().iter().filter(|(k, _)| k == key).map(|(_, d)| d.clone()).collect()
    }

    fn distinct(&self) -> usize {
        let attempts = self.attempts.lock().unwrap();
        attempts.iter().map(|(_, d)| d.as_str()).collect::<std::collections::HashSet<_>>().len()
    }
}

#[async_trait]
impl ShardProcessor for Flaky {
    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        let data = String::from_utf8_lossy(&record.data).into_owned();
        self.attempts.lock().unwrap().push((record.partition_key.clone(), data.clone()));
        if Self::failing(&data) && !self.healed.load(Ordering::SeqCst) {
            return Err(ProcessError::retryable(format!("cannot handle {data}")));
        }
        Ok(())
    }
}

/// A worker running in this process until dropped or stopped.
struct InProcess {
    flaky: Arc<Flaky>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    fn start(stream: &str, extra: &str) -> Self {
        let yaml = config(stream, None, &format!("startPosition: TRIM_HORIZON\n{extra}"));
        let config = WorkerConfig::parse(&yaml, Path::new("test.yaml")).expect("valid config");
        let flaky = Arc::new(Flaky::default());
        let metrics = Arc::new(Metrics::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(runtime::run_worker(runtime::Worker {
            config,
            owner: "retry-test".into(),
            processors: Arc::new(shared(flaky.clone())),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
        }));
        let task = tokio::spawn(async move { task.await.expect("runtime task").expect("runtime") });
        Self { flaky, metrics, shutdown, task }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task).await.expect("stops").expect("runtime task");
    }
}

/// Every record on `stream`'s first shard: (partition key, data).
async fn read_stream(client: &aws_sdk_kinesis::Client, stream: &str) -> Vec<(String, Vec<u8>)> {
    let (shard, _, _) = open_shards(client, stream).await.remove(0);
    read_shard(client, stream, &shard).await.into_iter().map(|r| (r.partition_key, r.data.into_inner())).collect()
}

const KEYS: usize = 5;
const PER_KEY: u64 = 6;

/// How the test's records reach the stream.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Input {
    /// One Kinesis record per record.
    Plain,
    /// KPL aggregates of up to 7 user records (made by aws-kinesis-agg), so aggregates mix keys and a
    /// failing user record sits between others of its aggregate.
    Aggregated,
}

/// A stream holding the test's records, how they were written, and how many Kinesis records that took.
struct Written {
    kinesis: aws_sdk_kinesis::Client,
    stream: String,
    records: Vec<(String, Vec<u8>)>,
    kinesis_records: usize,
    /// The aggregates' sequence numbers (empty for plain input).
    aggregate_sequences: Vec<String>,
}

async fn stream_with_records(prefix: &str, input: Input) -> Written {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, 1).await;
    let records = records(KEYS, 0, PER_KEY);
    let (kinesis_records, aggregate_sequences) = match input {
        Input::Plain => {
            put_records(&kinesis, &stream, &records).await;
            (records.len(), Vec::new())
        }
        Input::Aggregated => {
            let aggregates = library_aggregates(&records, 7);
            assert!(aggregates.len() > 1 && aggregates.len() < records.len(), "several aggregates of several records");
            let sequences = put_aggregates(&kinesis, &stream, &aggregates).await;
            (aggregates.len(), sequences)
        }
    };
    Written { kinesis, stream, records, kinesis_records, aggregate_sequences }
}

/// No failure but the injected ones: every record that does not fail was attempted exactly once.
fn assert_others_once(flaky: &Flaky, written: &[(String, Vec<u8>)]) {
    for (_, data) in written {
        let data = String::from_utf8_lossy(data);
        if !Flaky::failing(&data) {
            assert_eq!(flaky.attempts_on(&data), 1, "{data} processed more than once");
        }
    }
}

/// Each key's successful records came in the order written (failing ones excepted).
fn assert_key_order(flaky: &Flaky, keep_failing: bool) {
    for k in 0..KEYS {
        let key = format!("key-{k}");
        let mut seen: Vec<String> = flaky.key_attempts(&key);
        // A failing record is attempted again and again in a row; any other record comes once.
        seen.dedup_by(|later, earlier| later == earlier && Flaky::failing(later));
        if !keep_failing {
            seen.retain(|d| !Flaky::failing(d));
        }
        let expected: Vec<String> =
            (0..PER_KEY).map(|n| format!("{key}:{n}")).filter(|d| keep_failing || !Flaky::failing(d)).collect();
        assert_eq!(seen, expected, "{key} out of order");
    }
}

#[test]
fn skip_counts_logs_and_moves_on() {
    run_test(skip_case(Input::Plain));
}

#[test]
fn skip_applies_to_each_user_record_of_an_aggregate() {
    run_test(skip_case(Input::Aggregated));
}

async fn skip_case(input: Input) {
    let Written { stream, records: written, .. } = stream_with_records("skip", input).await;
    let worker = InProcess::start(
        &stream,
        "ordering: key\nconcurrency: 4\nretry: {maxAttempts: 3, backoff: 10ms, onExhausted: skip}\n",
    );
    let metrics = worker.metrics.clone();
    wait_for("every record processed or skipped", Duration::from_secs(30), async || {
        counted(&metrics, "leasehold_records_processed_total")
            + counted(&metrics, r#"leasehold_records_exhausted_total{policy="skip"}"#)
            >= written.len() as u64
    })
    .await;
    let flaky = worker.flaky.clone();
    worker.stop().await;
    assert_eq!(
        counted(&metrics, r#"leasehold_records_exhausted_total{policy="skip"}"#),
        KEYS as u64,
        "one failing record per key"
    );
    assert_eq!(counted(&metrics, "leasehold_records_processed_total"), written.len() as u64 - KEYS as u64);
    assert_eq!(counted(&metrics, "leasehold_records_failed_total"), 3 * KEYS as u64);
    assert_eq!(counted(&metrics, "leasehold_records_retried_total"), 2 * KEYS as u64);
    for k in 0..KEYS {
        assert_eq!(flaky.attempts_on(&format!("key-{k}:3")), 3, "exactly maxAttempts attempts");
    }
    // The skipped record kept its place: the key's next record came only after its last attempt.
    assert_key_order(&flaky, true);
    assert_others_once(&flaky, &written);
}

#[test]
fn dead_letter_publishes_the_record_with_its_metadata_and_error() {
    run_test(dead_letter_case(Input::Plain));
}

#[test]
fn dead_letter_publishes_a_user_record_with_its_sub_sequence() {
    run_test(dead_letter_case(Input::Aggregated));
}

async fn dead_letter_case(input: Input) {
    let Written { kinesis, stream, records: written, aggregate_sequences, .. } =
        stream_with_records("deadletter", input).await;
    let dead = leasehold_testkit::create_stream(&kinesis, "dlq", 1).await;
    let worker = InProcess::start(
        &stream,
        &format!(
            "ordering: none\nconcurrency: 8\nretry: {{maxAttempts: 2, backoff: 10ms, onExhausted: deadLetter, \
         deadLetterStream: {dead}}}\n"
        ),
    );
    let metrics = worker.metrics.clone();
    wait_for("every record processed or dead-lettered", Duration::from_secs(30), async || {
        counted(&metrics, "leasehold_records_processed_total")
            + counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#)
            >= written.len() as u64
    })
    .await;
    let flaky = worker.flaky.clone();
    worker.stop().await;
    assert_others_once(&flaky, &written);
    assert_eq!(counted(&metrics, "leasehold_records_processed_total"), written.len() as u64 - KEYS as u64);
    let letters = read_stream(&kinesis, &dead).await;
    assert_eq!(letters.len(), KEYS, "one dead letter per failing record");
    let mut seen = Vec::new();
    for (key, body) in letters {
        let letter: serde_json::Value = serde_json::from_slice(&body).expect("JSON dead letter");
        let data =
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, letter["data"].as_str().expect("data"))
                .expect("base64");
        let data = String::from_utf8(data).expect("utf8");
        assert_eq!(letter["partitionKey"], key.as_str(), "keyed by the original partition key");
        assert_eq!(data, format!("{key}:3"));
        assert_eq!(letter["stream"], stream.as_str());
        assert_eq!(letter["shardId"], "shardId-000000000000");
        assert!(letter["sequenceNumber"].as_str().is_some_and(|s| !s.is_empty()));
        match input {
            Input::Plain => assert!(letter.get("subSequenceNumber").is_none(), "{letter}"),
            Input::Aggregated => {
                let sequence = letter["sequenceNumber"].as_str().expect("sequence");
                assert!(aggregate_sequences.iter().any(|s| s == sequence), "the aggregate's sequence: {letter}");
                assert!(letter["subSequenceNumber"].as_u64().is_some_and(|n| n < 7), "{letter}");
            }
        }
        assert_eq!(letter["attempts"], 2);
        assert_eq!(letter["error"], format!("cannot handle {data}"));
        assert_eq!(letter["owner"], "retry-test");
        seen.push(data);
    }
    seen.sort();
    assert_eq!(seen, (0..KEYS).map(|k| format!("key-{k}:3")).collect::<Vec<_>>());
}

#[test]
fn requeue_puts_copies_at_the_tail_until_the_limit_then_skips() {
    run_test(requeue_case(Input::Plain));
}

#[test]
fn requeue_puts_a_user_record_back_as_a_plain_copy_under_its_own_key() {
    run_test(requeue_case(Input::Aggregated));
}

async fn requeue_case(input: Input) {
    let Written { kinesis, stream, records: written, kinesis_records, .. } =
        stream_with_records("requeue", input).await;
    let worker = InProcess::start(
        &stream,
        "ordering: key\nconcurrency: 4\nretry: {maxAttempts: 2, backoff: 10ms, onExhausted: requeue}\n",
    );
    let metrics = worker.metrics.clone();
    // Each failing record: put back three times (the limit), then skipped as no dead-letter stream is set.
    wait_for("every copy exhausted", Duration::from_secs(60), async || {
        counted(&metrics, r#"leasehold_records_exhausted_total{policy="skip"}"#) >= KEYS as u64
    })
    .await;
    let flaky = worker.flaky.clone();
    worker.stop().await;
    assert_eq!(counted(&metrics, r#"leasehold_records_exhausted_total{policy="requeue"}"#), 3 * KEYS as u64);
    assert_eq!(counted(&metrics, "leasehold_records_processed_total"), written.len() as u64 - KEYS as u64);
    for k in 0..KEYS {
        let data = format!("key-{k}:3");
        assert_eq!(flaky.attempts_on(&data), 2 * 4, "{data}: 2 attempts on the original and on each of 3 copies");
    }
    assert_eq!(flaky.distinct(), written.len(), "the processor saw the original data, never the envelope");
    assert_others_once(&flaky, &written);
    // The copies are on the stream, keyed like the original, carrying their history.
    let on_stream = read_stream(&kinesis, &stream).await;
    let mut copies: HashMap<String, Vec<(u32, u32)>> = HashMap::new();
    assert_eq!(on_stream.len(), kinesis_records + 3 * KEYS, "the records as written, then the copies");
    for (key, data) in &on_stream[kinesis_records..] {
        let (history, original) = open_requeued(&bytes::Bytes::from(data.clone())).expect("a requeued copy");
        assert_eq!(original, format!("{key}:3").as_bytes());
        copies.entry(key.clone()).or_default().push((history.requeues, history.attempts));
    }
    for k in 0..KEYS {
        assert_eq!(copies[&format!("key-{k}")], vec![(1, 2), (2, 4), (3, 6)]);
    }
}

#[test]
fn block_holds_the_key_back_and_keeps_its_order() {
    run_test(block_case(Input::Plain));
}

#[test]
fn block_holds_a_key_back_inside_an_aggregate() {
    run_test(block_case(Input::Aggregated));
}

async fn block_case(input: Input) {
    let Written { stream, records: written, .. } = stream_with_records("block", input).await;
    let worker = InProcess::start(
        &stream,
        // More slots than keys: a blocked record holds its slot, so each key needs one of its own.
        "ordering: key\nconcurrency: 8\nretry: {maxAttempts: 2, backoff: 10ms, onExhausted: block}\n",
    );
    let metrics = worker.metrics.clone();
    let flaky = worker.flaky.clone();
    // Records before the failing one of each key go through; nothing after it does.
    wait_for("each key blocked on its failing record", Duration::from_secs(30), async || {
        (0..KEYS).all(|k| flaky.attempts_on(&format!("key-{k}:3")) >= 4)
    })
    .await;
    assert_eq!(
        counted(&metrics, "leasehold_records_processed_total"),
        3 * KEYS as u64,
        "only records 0..2 of each key"
    );
    for k in 0..KEYS {
        assert_eq!(flaky.attempts_on(&format!("key-{k}:4")), 0, "key-{k}: a later record ran past a blocked one");
    }
    flaky.healed.store(true, Ordering::SeqCst);
    wait_for("everything processed once healed", Duration::from_secs(30), async || {
        counted(&metrics, "leasehold_records_processed_total") >= written.len() as u64
    })
    .await;
    worker.stop().await;
    assert_eq!(
        counted(&metrics, r#"leasehold_records_exhausted_total{policy="skip"}"#)
            + counted(&metrics, r#"leasehold_records_exhausted_total{policy="requeue"}"#),
        0
    );
    assert_key_order(&flaky, true);
    assert_others_once(&flaky, &written);
    assert_eq!(
        counted(&metrics, "leasehold_records_processed_total"),
        written.len() as u64,
        "each record processed once"
    );
}

/// `retry.maxRecordAge`: records written, then eight seconds later more records; with a 5 s limit the
/// failing records of the first batch are past it when they fail and go to the dead-letter stream
/// after their one attempt, while the failing records of the second batch are retried up to
/// `maxAttempts` first.
#[test]
fn max_record_age_dead_letters_an_old_failing_record_without_retrying() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "maxage", 1).await;
        let dead = leasehold_testkit::create_stream(&kinesis, "maxage-dlq", 1).await;
        let numbered = |keys: std::ops::Range<usize>| -> Vec<(String, Vec<u8>)> {
            (0..PER_KEY)
                .flat_map(|n| keys.clone().map(move |k| leasehold_testkit::kinesis::numbered(&format!("key-{k}"), n)))
                .collect()
        };
        let old = numbered(0..3);
        let young = numbered(3..KEYS);
        put_records(&kinesis, &stream, &old).await;
        // The young records have 5 s to be read and fail (a loaded machine included); the old ones are
        // 8 s old at least when they fail.
        tokio::time::sleep(Duration::from_secs(8)).await;
        put_records(&kinesis, &stream, &young).await;
        let worker = InProcess::start(
            &stream,
            &format!(
                "ordering: key\nconcurrency: 8\nretry: {{maxAttempts: 3, backoff: 10ms, onExhausted: deadLetter, \
                 deadLetterStream: {dead}, maxRecordAge: 5s}}\n"
            ),
        );
        let metrics = worker.metrics.clone();
        let total = (old.len() + young.len()) as u64;
        wait_for("every record processed or dead-lettered", Duration::from_secs(30), async || {
            counted(&metrics, "leasehold_records_processed_total")
                + counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#)
                >= total
        })
        .await;
        let flaky = worker.flaky.clone();
        worker.stop().await;
        let written: Vec<_> = old.iter().chain(&young).cloned().collect();
        assert_others_once(&flaky, &written);
        assert_eq!(counted(&metrics, "leasehold_records_processed_total"), total - KEYS as u64);
        assert_eq!(counted(&metrics, "leasehold_records_aged_out_total"), 3, "the old failing records");
        assert_eq!(
            counted(&metrics, "leasehold_records_retried_total"),
            2 * 2,
            "two retries for each young failing record"
        );
        for k in 0..KEYS {
            let expected = if k < 3 { 1 } else { 3 };
            assert_eq!(flaky.attempts_on(&format!("key-{k}:3")), expected, "key-{k}");
        }
        assert_key_order(&flaky, true);
        let mut letters: Vec<(String, u64)> = read_stream(&kinesis, &dead)
            .await
            .into_iter()
            .map(|(key, body)| {
                let letter: serde_json::Value = serde_json::from_slice(&body).expect("JSON dead letter");
                (key, letter["attempts"].as_u64().expect("attempts"))
            })
            .collect();
        letters.sort();
        let expected: Vec<(String, u64)> = (0..KEYS).map(|k| (format!("key-{k}"), if k < 3 { 1 } else { 3 })).collect();
        assert_eq!(letters, expected, "each failing record dead-lettered once");
    });
}
