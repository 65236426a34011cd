//! `leasehold redrive` end to end (issue 33, item 3): letters written by a real worker whose processor
//! fails, then is fixed, are put back on the source stream and processed by the live consumer; from
//! the dead-letter stream (kinesalite, the lease table on dynalite), the SQS queue and the S3 bucket
//! (moto: `tests/ground/moto.sh start`).
//!
//! Each scenario: a dry run that changes nothing; an `--execute` run crashed after a few puts (the
//! process aborts right after a put, before marking its letter); a re-run that returns the rest, the
//! crashed put's record once more and nothing else; every record then processed once in its key's
//! original order (the one in flight at the crash twice); a second run that finds nothing to do; and
//! the letters of another consumer (another lease table) and letters naming none refused.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{Run, run, wait_for};
use leasehold_testkit::kinesis::{open_shards, put_records, read_shard};
use leasehold_worker::processor::{Outputs, ProcessError, Record, ShardProcessor, shared};
use leasehold_worker::{Metrics, WorkerConfig, runtime};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const KEYS: usize = 4;
const PER_KEY: u64 = 6;
/// Records numbered 1, 3 and 4 of each key fail while the processor is broken.
const FAILING: [u64; 3] = [1, 3, 4];
const CRASH_AFTER: usize = 5;

/// Runs `test` on a runtime of its own, with the emulators' credentials in the environment for the
/// in-process worker (the CLI's runs get them from `common::leasehold`).
fn run_test(test: impl std::future::Future<Output = ()>) {
    static ENV: std::sync::Once = std::sync::Once::new();
    // SAFETY: every test calls this before anything reads the environment, and the Once makes the
    // other tests wait until the variables are set, so no read runs alongside the write.
    ENV.call_once(|| unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "leasehold-test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "leasehold-test");
    });
    common::run_test(test);
}

/// Fails records ending in `:fail` while broken; keeps the data of every record it processed.
#[derive(Default)]
struct Fixable {
    broken: AtomicBool,
    done: Mutex<Vec<String>>,
}

#[async_trait]
impl ShardProcessor for Fixable {
    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        let data = String::from_utf8_lossy(&record.data).into_owned();
        if data.ends_with(":fail") && self.broken.load(Ordering::SeqCst) {
            return Err(ProcessError::retryable("the bug"));
        }
        self.done.lock().unwrap().push(data);
        Ok(())
    }
}

impl Fixable {
    /// The failing records processed, in order.
    fn redriven(&self) -> Vec<String> {
        self.done.lock().unwrap().iter().filter(|d| d.ends_with(":fail")).cloned().collect()
    }
}

struct Worker {
    processor: Arc<Fixable>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), runtime::RuntimeError>>,
}

impl Worker {
    fn start(yaml: &str) -> Self {
        let config = WorkerConfig::parse(yaml, Path::new("test.yaml")).expect("valid config");
        let processor = Arc::new(Fixable { broken: AtomicBool::new(true), done: Mutex::default() });
        let metrics = Arc::new(Metrics::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(runtime::run_worker(runtime::Worker {
            config,
            owner: "redrive-worker".into(),
            processors: Arc::new(shared(processor.clone())),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
        }));
        Self { processor, metrics, shutdown, task }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task).await.expect("stops").expect("task").expect("runtime");
    }
}

fn counted(metrics: &Metrics, series: &str) -> u64 {
    let text = metrics.encode();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// `key-<k>:<n>`, with `:fail` for the failing ones, in key-interleaved order.
fn written() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for n in 0..PER_KEY {
        for k in 0..KEYS {
            let fail = if FAILING.contains(&n) { ":fail" } else { "" };
            out.push((format!("key-{k}"), format!("key-{k}:{n}{fail}").into_bytes()));
        }
    }
    out
}

/// Runs the CLI off the runtime's threads (the worker keeps running meanwhile).
async fn cli(args: Vec<String>) -> Run {
    tokio::task::spawn_blocking(move || run(&args.iter().map(String::as_str).collect::<Vec<_>>())).await.expect("cli")
}

/// What a scenario reads its letters from.
struct Destination {
    /// The `retry:` line's destination fields.
    spec: String,
    /// The CLI flags naming it.
    flags: Vec<String>,
    /// `stream`, `sqs` or `s3`.
    name: &'static str,
    /// Extra flags of the crashed run.
    crash_flags: Vec<String>,
    /// Waited before the re-run (an SQS message hidden by the crashed run comes back only then).
    before_rerun: Duration,
}

/// The worker's config for `stream` and `table` (on moto too) sending letters to `destination`.
fn worker_config(stream: &str, table: &str, destination: &str) -> String {
    let base = common::config(
        stream,
        table,
        &format!(
            "startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 4\n\
             retry: {{maxAttempts: 2, backoff: 10ms, onExhausted: deadLetter, {destination}}}\n"
        ),
    );
    match std::env::var("LEASEHOLD_MOTO_ENDPOINT").ok().or_else(moto_from_file) {
        Some(moto) => base.replacen(
            "dynamodbEndpoint: '",
            &format!("sqsEndpoint: '{moto}', s3Endpoint: '{moto}', dynamodbEndpoint: '"),
            1,
        ),
        None => base,
    }
}

fn moto_from_file() -> Option<String> {
    let text = std::fs::read_to_string(leasehold_testkit::state_dir().join("moto.env")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("LEASEHOLD_MOTO_ENDPOINT=")).map(str::to_string)
}

/// moto's endpoint; fails the test when moto is not running.
fn moto() -> String {
    let endpoint = std::env::var("LEASEHOLD_MOTO_ENDPOINT")
        .ok()
        .or_else(moto_from_file)
        .unwrap_or_else(|| panic!("moto's endpoint is unknown: start it with tests/ground/moto.sh start"));
    assert!(
        std::net::TcpStream::connect(endpoint.trim_start_matches("http://")).is_ok(),
        "moto is not answering at {endpoint}: start it with tests/ground/moto.sh start"
    );
    endpoint
}

async fn moto_clients(endpoint: &str) -> (aws_sdk_sqs::Client, aws_sdk_s3::Client) {
    let sdk = leasehold_testkit::sdk_config(endpoint.to_string()).await;
    let s3 = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build();
    (aws_sdk_sqs::Client::new(&sdk), aws_sdk_s3::Client::from_conf(s3))
}

/// A letter like the worker's but naming lease table `table` (`None`: no table), for record number
/// `n` of a made-up shard.
fn planted_letter(stream: &str, table: Option<&str>, n: u64) -> String {
    let mut letter = serde_json::json!({
        "stream": stream, "shardId": "shardId-000000000009", "sequenceNumber": format!("{}", 1000 + n),
        "partitionKey": "planted", "data": "cGxhbnRlZA==", "attempts": 2, "requeues": 0, "error": "e", "owner": "x",
    });
    if let Some(table) = table {
        letter["leaseTable"] = Value::from(table);
    }
    letter.to_string()
}

/// The redrive command for this scenario.
fn redrive(table: &str, destination: &Destination, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> =
        ["redrive", "--table", table, "--from", destination.name, "-o", "json"].iter().map(|s| s.to_string()).collect();
    args.extend(destination.flags.iter().cloned());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The scenario for one destination; `plant` writes a letter of another consumer and one naming no
/// table where the destination keeps letters.
async fn scenario<P, F>(prefix: &str, destination: Destination, plant: P)
where
    P: FnOnce(String) -> F,
    F: std::future::Future<Output = ()>,
{
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, 2).await;
    let table = leasehold_testkit::create_lease_table(&dynamodb, prefix).await;
    let written = written();
    let failing = written.iter().filter(|(_, d)| d.ends_with(b":fail")).count();
    let worker = Worker::start(&worker_config(&stream, &table, &destination.spec));
    put_records(&kinesis, &stream, &written).await;
    let (metrics, total) = (worker.metrics.clone(), written.len() as u64);
    wait_for("every record processed or dead-lettered", Duration::from_secs(90), async || {
        counted(&metrics, "leasehold_records_processed_total")
            + counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#)
            >= total
    })
    .await;
    assert_eq!(counted(&worker.metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#), failing as u64);
    // The bug is fixed; the live consumer keeps running.
    worker.processor.broken.store(false, Ordering::SeqCst);
    assert!(worker.processor.redriven().is_empty());
    plant(stream.clone()).await;

    let dry = cli(redrive(&table, &destination, &[])).await.expect_code(0).json();
    let counts = &dry["destinations"][destination.name];
    assert_eq!(dry["executed"], false);
    assert_eq!(dry["records"], failing, "{dry:#}");
    assert_eq!(dry["put"], 0);
    assert_eq!(counts["refusedOtherConsumer"], 1, "{dry:#}");
    assert_eq!(counts["refusedUnnamed"], 1, "{dry:#}");
    let per_shard: u64 = dry["shards"].as_array().unwrap().iter().map(|s| s["letters"].as_u64().unwrap()).sum();
    assert_eq!(per_shard, failing as u64);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(worker.processor.redriven().is_empty(), "a dry run puts nothing");

    // A crash right after a put, before its letter is marked.
    let mut crash_args = redrive(&table, &destination, &["--execute", "--crash-after-puts", &CRASH_AFTER.to_string()]);
    crash_args.extend(destination.crash_flags.iter().cloned());
    let crashed = cli(crash_args).await;
    assert_ne!(crashed.code, 0, "the run crashed: {crashed:?}");
    assert!(crashed.stderr.contains("crashing after 5 put(s)"), "{}", crashed.stderr);
    tokio::time::sleep(destination.before_rerun).await;

    let rerun = cli(redrive(&table, &destination, &["--execute"])).await.expect_code(0).json();
    assert_eq!(rerun["executed"], true);
    assert_eq!(
        rerun["put"],
        failing - (CRASH_AFTER - 1),
        "the rest, and the crashed put's record once more: {rerun:#}"
    );
    assert_eq!(rerun["destinations"][destination.name]["marked"], failing - (CRASH_AFTER - 1));
    let processor = worker.processor.clone();
    wait_for("every redriven record processed", Duration::from_secs(60), async || processor.redriven().len() > failing)
        .await;

    let again = cli(redrive(&table, &destination, &["--execute"])).await.expect_code(0).json();
    assert_eq!(again["records"], 0, "a second run finds nothing to do: {again:#}");
    assert_eq!(again["put"], 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let redriven = worker.processor.redriven();
    worker.stop().await;

    // Exactly once each, but for the one put when the run crashed: twice.
    let mut times: BTreeMap<&str, usize> = BTreeMap::new();
    for data in &redriven {
        *times.entry(data.as_str()).or_default() += 1;
    }
    assert_eq!(times.len(), failing, "every dead letter came back: {redriven:?}");
    assert_eq!(times.values().filter(|&&n| n == 2).count(), 1, "the crashed put's record twice: {redriven:?}");
    assert!(times.values().all(|&n| n <= 2), "{redriven:?}");
    // In each key's original order (the repeat left out).
    for k in 0..KEYS {
        let key = format!("key-{k}:");
        let mut seen: Vec<u64> = Vec::new();
        for data in redriven.iter().filter(|d| d.starts_with(&key)) {
            let n: u64 = data[key.len()..].trim_end_matches(":fail").parse().unwrap();
            if !seen.contains(&n) {
                seen.push(n);
            }
        }
        assert_eq!(seen, FAILING, "key-{k} in its order: {redriven:?}");
    }
}

#[test]
fn dead_letters_return_from_the_dead_letter_stream_once_in_key_order() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dead = leasehold_testkit::create_stream(&kinesis, "redrive-dlq", 2).await;
        let destination = Destination {
            spec: format!("deadLetterStream: {dead}"),
            flags: vec!["--dead-letter-stream".into(), dead.clone()],
            name: "stream",
            crash_flags: Vec::new(),
            before_rerun: Duration::ZERO,
        };
        let planted = dead.clone();
        scenario("redrive-stream", destination, |stream| async move {
            let letters = [
                ("planted".to_string(), planted_letter(&stream, Some("another-consumers-table"), 1).into_bytes()),
                ("planted".to_string(), planted_letter(&stream, None, 2).into_bytes()),
            ];
            put_records(&kinesis, &planted, &letters).await;
        })
        .await;
        let shards = open_shards(&leasehold_testkit::kinesis_client().await, &dead).await;
        let mut letters = 0;
        for (shard, _, _) in &shards {
            letters += read_shard(&leasehold_testkit::kinesis_client().await, &dead, shard).await.len();
        }
        assert_eq!(letters, KEYS * FAILING.len() + 2, "the stream keeps its letters (a stream cannot delete)");
    });
}

#[test]
fn dead_letters_return_from_the_queue_once_in_key_order() {
    run_test(async {
        let moto = moto();
        let (sqs, _) = moto_clients(&moto).await;
        let name = leasehold_testkit::unique_name("redrive-q");
        let url = sqs.create_queue().queue_name(&name).send().await.expect("queue").queue_url.expect("url");
        let destination = Destination {
            spec: format!("deadLetterQueue: '{url}'"),
            flags: vec!["--queue".into(), url.clone(), "--sqs-endpoint".into(), moto.clone()],
            name: "sqs",
            // The messages the crashed run received come back when their visibility runs out.
            crash_flags: vec!["--visibility-timeout".into(), "4s".into()],
            before_rerun: Duration::from_secs(6),
        };
        let (queue, client) = (url.clone(), sqs.clone());
        scenario("redrive-sqs", destination, |stream| async move {
            for (n, table) in [(1, Some("another-consumers-table")), (2, None)] {
                client
                    .send_message()
                    .queue_url(&queue)
                    .message_body(planted_letter(&stream, table, n))
                    .send()
                    .await
                    .unwrap();
            }
        })
        .await;
        let left = sqs
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .unwrap();
        let left =
            left.attributes.unwrap()[&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages].clone();
        assert_eq!(left, "2", "only the refused letters are left in the queue");
    });
}

#[test]
fn dead_letters_return_from_the_bucket_once_in_key_order() {
    run_test(async {
        let moto = moto();
        let (_, s3) = moto_clients(&moto).await;
        let bucket = leasehold_testkit::unique_name("redrive-b").to_lowercase().replace('_', "-");
        s3.create_bucket().bucket(&bucket).send().await.expect("bucket");
        let destination = Destination {
            spec: format!("deadLetterBucket: {{name: {bucket}, prefix: dl/}}"),
            flags: vec![
                "--bucket".into(),
                bucket.clone(),
                "--prefix".into(),
                "dl/".into(),
                "--s3-endpoint".into(),
                moto,
            ],
            name: "s3",
            crash_flags: Vec::new(),
            before_rerun: Duration::ZERO,
        };
        let (name, client) = (bucket.clone(), s3.clone());
        scenario("redrive-s3", destination, |stream| async move {
            for (n, table) in [(1, Some("another-consumers-table")), (2, None)] {
                let body = aws_sdk_s3::primitives::ByteStream::from(planted_letter(&stream, table, n).into_bytes());
                client.put_object().bucket(&name).key(format!("dl/planted-{n}.json")).body(body).send().await.unwrap();
            }
        })
        .await;
        let listed = s3.list_objects_v2().bucket(&bucket).prefix("dl/").send().await.unwrap();
        let mut tagged = 0;
        for object in listed.contents.unwrap_or_default() {
            let tags = s3.get_object_tagging().bucket(&bucket).key(object.key.unwrap()).send().await.unwrap();
            tagged += usize::from(tags.tag_set.iter().any(|t| t.key == "leasehold.io/redriven"));
        }
        assert_eq!(tagged, KEYS * FAILING.len(), "every letter of ours tagged, the refused ones not");
    });
}

/// A queue taking 1 KiB gets cut letters pointing at the bucket's whole ones: redrive reads both, puts
/// each record once with its whole payload (from the bucket) and marks both copies; a cut letter
/// without a whole copy is counted and left in the queue.
#[test]
fn a_cut_letter_is_redriven_once_from_its_whole_copy() {
    run_test(async {
        let moto = moto();
        let (sqs, s3) = moto_clients(&moto).await;
        let name = leasehold_testkit::unique_name("redrive-cut");
        let url = sqs
            .create_queue()
            .queue_name(&name)
            .attributes(aws_sdk_sqs::types::QueueAttributeName::MaximumMessageSize, "1024")
            .send()
            .await
            .expect("queue")
            .queue_url
            .expect("url");
        let bucket = name.to_lowercase().replace('_', "-");
        s3.create_bucket().bucket(&bucket).send().await.expect("bucket");
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "redrive-cut", 1).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "redrive-cut").await;
        let big = |k: usize| format!("key-{k}:{}:fail", "x".repeat(3000 + k));
        let written: Vec<(String, Vec<u8>)> = (0..3).map(|k| (format!("key-{k}"), big(k).into_bytes())).collect();
        let worker = Worker::start(&worker_config(
            &stream,
            &table,
            &format!("deadLetterQueue: '{url}', deadLetterBucket: {{name: {bucket}}}"),
        ));
        put_records(&kinesis, &stream, &written).await;
        let metrics = worker.metrics.clone();
        wait_for("every record dead-lettered", Duration::from_secs(60), async || {
            counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#) >= 3
        })
        .await;
        worker.processor.broken.store(false, Ordering::SeqCst);
        let orphan = serde_json::json!({
            "stream": stream, "shardId": "shardId-000000000000", "sequenceNumber": "1", "partitionKey": "k",
            "data": "", "truncated": true, "dataBytes": 9000, "dataSha256": "00", "leaseTable": table,
            "attempts": 2, "requeues": 0, "error": "e", "owner": "x",
        });
        sqs.send_message().queue_url(&url).message_body(orphan.to_string()).send().await.unwrap();
        let flags = ["--queue", &url, "--bucket", &bucket, "--sqs-endpoint", &moto, "--s3-endpoint", &moto];
        let mut args = vec!["redrive", "--table", &table, "--execute", "-o", "json"];
        args.extend(flags);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let out = cli(args.clone()).await.expect_code(0).json();
        assert_eq!(out["records"], 3, "{out:#}");
        assert_eq!(out["put"], 3);
        assert_eq!(out["destinations"]["sqs"]["duplicates"], 3, "the queue's cut letters are the bucket's records");
        assert_eq!(out["destinations"]["sqs"]["cutWithoutRecord"], 1);
        assert_eq!(out["destinations"]["sqs"]["marked"], 3);
        assert_eq!(out["destinations"]["s3"]["marked"], 3);
        let processor = worker.processor.clone();
        wait_for("the redriven records processed", Duration::from_secs(60), async || processor.redriven().len() >= 3)
            .await;
        let again = cli(args).await.expect_code(0).json();
        assert_eq!(again["records"], 0, "{again:#}");
        assert_eq!(again["destinations"]["s3"]["alreadyRedriven"], 3);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut redriven = worker.processor.redriven();
        worker.stop().await;
        redriven.sort();
        let mut expected: Vec<String> = (0..3).map(big).collect();
        expected.sort();
        assert_eq!(redriven, expected, "each record once, its whole payload");
    });
}
