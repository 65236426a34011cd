//! On-failure destinations of `onExhausted: deadLetter` beside the dead-letter stream: an SQS queue and
//! an S3 bucket, on moto's server mode (`tests/ground/moto.sh start`; moto is fine for these, never for
//! lease tables). A worker runs in-process with a processor failing one record per key: each
//! destination receives each failed record once, as the dead-letter JSON document; a destination that
//! does not exist blocks the record (and its key) with a metric until it exists, losing nothing.

mod common;

use leasehold_testkit::process::wait_for;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use common::moto::moto_endpoint;
use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_worker::Metrics;
use leasehold_worker::WorkerConfig;
use leasehold_worker::processor::{Outputs, ProcessError, Record, ShardProcessor, shared};
use leasehold_worker::runtime;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const KEYS: usize = 5;
const PER_KEY: u64 = 6;

async fn clients(endpoint: &str) -> (aws_sdk_sqs::Client, aws_sdk_s3::Client) {
    let sdk = leasehold_testkit::sdk_config(endpoint.to_string()).await;
    let s3 = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build();
    (aws_sdk_sqs::Client::new(&sdk), aws_sdk_s3::Client::from_conf(s3))
}

/// Fails every attempt on records whose data ends in `:3` (one per key); remembers every attempt.
#[derive(Default)]
struct Flaky(Mutex<Vec<String>>);

impl Flaky {
    fn attempts_on(&self, data: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|d| *d == data).count()
    }
}

#[async_trait]
impl ShardProcessor for Flaky {
    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        let data = String::from_utf8_lossy(&record.data).into_owned();
        self.0.lock().unwrap().push(data.clone());
        if data.ends_with(":3") {
            return Err(ProcessError::retryable(format!("cannot handle {data}")));
        }
        Ok(())
    }
}

struct Running {
    flaky: Arc<Flaky>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), runtime::RuntimeError>>,
    stream: String,
    written: usize,
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task).await.expect("stops").expect("task").expect("runtime");
    }
}

async fn start(prefix: &str, moto: &str, retry: &str) -> Running {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, 1).await;
    let written = records(KEYS, 0, PER_KEY);
    put_records(&kinesis, &stream, &written).await;
    let yaml = config(&stream, None, &format!("startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 8\n{retry}\n"))
        .replacen(
            "dynamodbEndpoint: '",
            &format!("sqsEndpoint: '{moto}', s3Endpoint: '{moto}', dynamodbEndpoint: '"),
            1,
        );
    let config = WorkerConfig::parse(&yaml, Path::new("test.yaml")).expect("valid config");
    let flaky = Arc::new(Flaky::default());
    let metrics = Arc::new(Metrics::default());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(runtime::run_worker(runtime::Worker {
        config,
        owner: "destination-test".into(),
        processors: Arc::new(shared(flaky.clone())),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
    }));
    Running { flaky, metrics, shutdown, task, stream, written: written.len() }
}

/// Every message on the queue, read until it stays empty.
async fn drain(sqs: &aws_sdk_sqs::Client, queue: &str) -> Vec<String> {
    let mut bodies = Vec::new();
    let mut empty = 0;
    while empty < 2 {
        let got = sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("receive");
        let messages = got.messages.unwrap_or_default();
        if messages.is_empty() {
            empty += 1;
        }
        for message in messages {
            bodies.push(message.body.clone().expect("body"));
            let handle = message.receipt_handle.expect("receipt handle");
            sqs.delete_message().queue_url(queue).receipt_handle(handle).send().await.expect("delete");
        }
    }
    bodies
}

/// Every object in the bucket: key and body.
async fn objects(s3: &aws_sdk_s3::Client, bucket: &str) -> HashMap<String, Vec<u8>> {
    let listed = s3.list_objects_v2().bucket(bucket).send().await.expect("list");
    let mut out = HashMap::new();
    for object in listed.contents.unwrap_or_default() {
        let key = object.key.expect("key");
        let body = s3.get_object().bucket(bucket).key(&key).send().await.expect("get").body;
        out.insert(key, body.collect().await.expect("body").into_bytes().to_vec());
    }
    out
}

/// Checks one dead-letter document of the test: the failing record of its key, two attempts.
fn check_letter(letter: &Value, stream: &str) -> String {
    let data =
        base64::engine::general_purpose::STANDARD.decode(letter["data"].as_str().expect("data")).expect("base64");
    let data = String::from_utf8(data).expect("utf8");
    let key = letter["partitionKey"].as_str().expect("partitionKey");
    assert_eq!(data, format!("{key}:3"), "{letter}");
    assert_eq!(letter["stream"], stream);
    assert_eq!(letter["shardId"], "shardId-000000000000");
    assert!(letter["sequenceNumber"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(letter["attempts"], 2);
    assert_eq!(letter["error"], format!("cannot handle {data}"));
    assert_eq!(letter["owner"], "destination-test");
    data
}

#[test]
fn each_destination_receives_each_failed_record_once() {
    run_test(async {
        let moto = moto_endpoint();
        let (sqs, s3) = clients(&moto).await;
        let name = leasehold_testkit::unique_name("dlq").to_lowercase();
        let queue = sqs.create_queue().queue_name(&name).send().await.expect("queue").queue_url.expect("url");
        s3.create_bucket().bucket(&name).send().await.expect("bucket");
        let running = start(
            "dest",
            &moto,
            &format!(
                "retry: {{maxAttempts: 2, backoff: 10ms, onExhausted: deadLetter, deadLetterQueue: '{queue}', \
                 deadLetterBucket: {{name: {name}, prefix: failed/}}}}"
            ),
        )
        .await;
        let metrics = running.metrics.clone();
        let total = running.written as u64;
        wait_for("every record processed or dead-lettered", Duration::from_secs(30), async || {
            counted(&metrics, "leasehold_records_processed_total")
                + counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#)
                >= total
        })
        .await;
        let stream = running.stream.clone();
        let flaky = running.flaky.clone();
        running.stop().await;
        assert_eq!(counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#), KEYS as u64);
        assert_eq!(
            counted(&metrics, "leasehold_records_processed_total"),
            total - KEYS as u64,
            "each other record once"
        );
        assert_eq!(
            counted(&metrics, r#"leasehold_dead_letter_failures_total{destination="sqs"}"#)
                + counted(&metrics, r#"leasehold_dead_letter_failures_total{destination="s3"}"#),
            0
        );
        for k in 0..KEYS {
            assert_eq!(flaky.attempts_on(&format!("key-{k}:3")), 2);
        }

        let messages = drain(&sqs, &queue).await;
        assert_eq!(messages.len(), KEYS, "one message per failed record: {messages:?}");
        let mut by_sequence = HashMap::new();
        let mut seen: Vec<String> = messages
            .iter()
            .map(|body| {
                let letter: Value = serde_json::from_str(body).expect("a JSON message");
                by_sequence.insert(letter["sequenceNumber"].as_str().unwrap().to_string(), letter.clone());
                check_letter(&letter, &stream)
            })
            .collect();
        seen.sort();
        assert_eq!(seen, (0..KEYS).map(|k| format!("key-{k}:3")).collect::<Vec<_>>());

        let stored = objects(&s3, &name).await;
        assert_eq!(stored.len(), KEYS, "one object per failed record: {:?}", stored.keys());
        for (key, body) in stored {
            let letter: Value = serde_json::from_slice(&body).expect("a JSON object");
            check_letter(&letter, &stream);
            let sequence = letter["sequenceNumber"].as_str().unwrap();
            assert_eq!(key, format!("failed/{stream}/shardId-000000000000/{sequence}.json"), "the documented key");
            assert_eq!(by_sequence[sequence], letter, "the same document as the queue's");
        }
    });
}

/// A destination that does not exist yet: the failing records wait (their keys' later records too),
/// counted, until it is created; then each is delivered once and nothing is lost.
async fn missing_destination_blocks(missing: &'static str) {
    let moto = moto_endpoint();
    let (sqs, s3) = clients(&moto).await;
    let name = leasehold_testkit::unique_name("dlq-missing").to_lowercase();
    let account = "123456789012";
    let queue = format!("{moto}/{account}/{name}");
    if missing != "sqs" {
        sqs.create_queue().queue_name(&name).send().await.expect("queue");
    }
    if missing != "s3" {
        s3.create_bucket().bucket(&name).send().await.expect("bucket");
    }
    let running = start(
        "dest-missing",
        &moto,
        &format!(
            "retry: {{maxAttempts: 2, backoff: 10ms, onExhausted: deadLetter, deadLetterQueue: '{queue}', \
             deadLetterBucket: {{name: {name}}}}}"
        ),
    )
    .await;
    let metrics = running.metrics.clone();
    wait_for(
        "the destination refusing, every record before the failing ones done",
        Duration::from_secs(30),
        async || {
            counted(&metrics, &format!(r#"leasehold_dead_letter_failures_total{{destination="{missing}"}}"#)) >= 3
                && counted(&metrics, "leasehold_records_processed_total") >= 3 * KEYS as u64
        },
    )
    .await;
    // Refused for a while longer: still nothing passes the failing records.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = running.written as u64;
    assert_eq!(
        counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#),
        0,
        "nothing counted as dead-lettered"
    );
    assert_eq!(counted(&metrics, r#"leasehold_records_exhausted_total{policy="skip"}"#), 0, "nothing skipped");
    assert_eq!(
        counted(&metrics, "leasehold_records_processed_total"),
        3 * KEYS as u64,
        "only the records before each failing one"
    );
    for k in 0..KEYS {
        assert_eq!(running.flaky.attempts_on(&format!("key-{k}:4")), 0, "key-{k} waits behind its failing record");
    }
    match missing {
        "sqs" => {
            let url = sqs.create_queue().queue_name(&name).send().await.expect("queue").queue_url.expect("url");
            assert_eq!(url, queue, "moto's queue URL is the one configured");
        }
        _ => {
            s3.create_bucket().bucket(&name).send().await.expect("bucket");
        }
    }
    wait_for("everything done once the destination exists", Duration::from_secs(30), async || {
        counted(&metrics, "leasehold_records_processed_total")
            + counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#)
            >= total
    })
    .await;
    running.stop().await;
    assert_eq!(counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#), KEYS as u64);
    assert_eq!(drain(&sqs, &queue).await.len(), KEYS, "each failed record once on the queue");
    assert_eq!(objects(&s3, &name).await.len(), KEYS, "each failed record once in the bucket");
}

#[test]
fn a_missing_queue_blocks_the_record_until_it_exists() {
    run_test(missing_destination_blocks("sqs"));
}

#[test]
fn a_missing_bucket_blocks_the_record_until_it_exists() {
    run_test(missing_destination_blocks("s3"));
}
