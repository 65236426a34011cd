//! Hostile input against the retry policy's outputs (issue 30, items 3 and 4), on the real emulators:
//! kinesalite for streams, dynalite for the lease table, moto for SQS and S3 (`tests/ground/moto.sh
//! start`).
//!
//! - A dead letter larger than its destination takes reaches it cut (payload prefix, size, SHA-256,
//!   marked `truncated`), or whole in the bucket with the cut letter pointing at it; the shard moves on
//!   and every other record is processed exactly once.
//! - A FIFO queue gets a letter whose partition key SQS would refuse as a group id under its SHA-256.
//! - A producer's record carrying a forged requeue header is an ordinary record (bytes intact); genuine
//!   copies written by one worker are believed by the next worker of the consumer (the key is the
//!   lease table's).

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use common::moto::{moto_clients, moto_endpoint, with_moto};
use common::*;
use leasehold_testkit::kinesis::{open_shards, put_records, read_shard};
use leasehold_testkit::process::wait_for;
use leasehold_worker::Metrics;
use leasehold_worker::WorkerConfig;
use leasehold_worker::internals::dispatch::open_requeued;
use leasehold_worker::processor::{Outputs, ProcessError, Record, ShardProcessor, shared};
use leasehold_worker::runtime;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

const KEYS: usize = 4;

/// Fails every attempt on records whose data starts with `poison` or ends in `:fail`; remembers the
/// data of every attempt (as text, cut to 64 bytes, with its length).
#[derive(Default)]
struct Picky(Mutex<Vec<(String, usize, Vec<u8>)>>);

impl Picky {
    fn failing(data: &[u8]) -> bool {
        data.starts_with(b"poison") || data.ends_with(b":fail")
    }

    fn attempts_on(&self, data: &[u8]) -> usize {
        self.0.lock().unwrap().iter().filter(|(_, _, d)| d == data).count()
    }
}

#[async_trait]
impl ShardProcessor for Picky {
    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        let text = String::from_utf8_lossy(&record.data[..record.data.len().min(64)]).into_owned();
        self.0.lock().unwrap().push((text, record.data.len(), record.data.to_vec()));
        if Self::failing(&record.data) {
            return Err(ProcessError::retryable("poison"));
        }
        Ok(())
    }
}

struct Running {
    picky: Arc<Picky>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), runtime::RuntimeError>>,
}

impl Running {
    fn start(yaml: &str, owner: &str) -> Self {
        let config = WorkerConfig::parse(yaml, Path::new("test.yaml")).expect("valid config");
        let picky = Arc::new(Picky::default());
        let metrics = Arc::new(Metrics::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(runtime::run_worker(runtime::Worker {
            config,
            owner: owner.into(),
            processors: Arc::new(shared(picky.clone())),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
        }));
        Self { picky, metrics, shutdown, task }
    }

    async fn stop(self) -> (Arc<Picky>, Arc<Metrics>) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task).await.expect("stops").expect("task").expect("runtime");
        (self.picky, self.metrics)
    }
}

/// A poison record of `bytes` bytes under `key` (recognisable, not all one byte).
fn poison(key: &str, bytes: usize) -> (String, Vec<u8>) {
    let mut data = b"poison:".to_vec();
    data.extend((0..bytes - data.len()).map(|i| b'a' + (i % 26) as u8));
    (key.to_string(), data)
}

/// Records of `KEYS` keys, then `poison`, then more records of the same keys.
fn around(poison: &(String, Vec<u8>)) -> Vec<(String, Vec<u8>)> {
    let mut written = records(KEYS, 0, 3);
    written.push(poison.clone());
    written.extend(records(KEYS, 3, 3));
    written
}

async fn stream_with(prefix: &str, written: &[(String, Vec<u8>)]) -> String {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, 1).await;
    put_records(&kinesis, &stream, written).await;
    stream
}

/// Waits until every record was processed or dead-lettered, stops the worker, and checks that each
/// record but the poison one was processed exactly once and the poison one dead-lettered once.
async fn finish(running: Running, written: &[(String, Vec<u8>)]) -> Arc<Metrics> {
    let metrics = running.metrics.clone();
    let total = written.len() as u64;
    wait_for("every record processed or dead-lettered", Duration::from_secs(60), async || {
        counted(&metrics, "leasehold_records_processed_total")
            + counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#)
            >= total
    })
    .await;
    let (picky, metrics) = running.stop().await;
    assert_eq!(counted(&metrics, r#"leasehold_records_exhausted_total{policy="deadLetter"}"#), 1);
    assert_eq!(counted(&metrics, r#"leasehold_records_exhausted_total{policy="skip"}"#), 0, "nothing skipped");
    assert_eq!(counted(&metrics, "leasehold_records_processed_total"), total - 1);
    for (_, data) in written {
        let expected = if Picky::failing(data) { 2 } else { 1 };
        assert_eq!(picky.attempts_on(data), expected, "{}", String::from_utf8_lossy(&data[..data.len().min(40)]));
    }
    metrics
}

/// Checks a cut letter of `record` of at most `max` bytes, pointing at `object` (if any).
fn check_cut(body: &[u8], max: usize, record: &(String, Vec<u8>), object: Option<&str>) -> Value {
    assert!(body.len() <= max, "the letter takes {} bytes, over {max}", body.len());
    let letter: Value = serde_json::from_slice(body).expect("a JSON letter");
    assert_eq!(letter["truncated"], true, "{}", &letter.to_string()[..300]);
    assert_eq!(letter["dataBytes"], record.1.len());
    assert_eq!(letter["dataSha256"], hex(&Sha256::digest(&record.1)));
    assert_eq!(letter["partitionKey"], record.0.as_str());
    assert_eq!(letter["shardId"], "shardId-000000000000");
    assert!(letter["sequenceNumber"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(letter["attempts"], 2);
    assert_eq!(letter["error"], "poison");
    let prefix = base64::engine::general_purpose::STANDARD.decode(letter["data"].as_str().expect("data")).expect("b64");
    assert!(record.1.starts_with(&prefix), "data holds the payload's first bytes");
    assert!(prefix.len() + 2048 >= max * 3 / 4, "as much of the payload as fits: {} of {max}", prefix.len());
    assert_eq!(letter.get("dataObject").and_then(Value::as_str), object);
    letter
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const RETRY: &str = "retry: {maxAttempts: 2, backoff: 10ms, onExhausted: deadLetter";

fn consumer(stream: &str, table: Option<&str>, retry: &str) -> String {
    config(stream, table, &format!("startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 4\n{retry}\n"))
}

/// A 900 KiB record: its whole letter (base64, about 1.2 MB) is over Kinesis's 1 MiB, so the
/// dead-letter stream gets the cut form.
#[test]
fn an_oversized_dead_letter_reaches_the_dead_letter_stream_cut() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let big = poison("key-1", 900 * 1024);
        let written = around(&big);
        let stream = stream_with("dl-big", &written).await;
        let dead = leasehold_testkit::create_stream(&kinesis, "dl-big-dlq", 1).await;
        let running = Running::start(&consumer(&stream, None, &format!("{RETRY}, deadLetterStream: {dead}}}")), "dl");
        let metrics = finish(running, &written).await;
        assert_eq!(
            counted(&metrics, r#"leasehold_dead_letters_cut_total{destination="kinesis",reason="too_large"}"#),
            1
        );
        assert_eq!(counted(&metrics, r#"leasehold_dead_letter_failures_total{destination="kinesis"}"#), 0);
        let (shard, _, _) = open_shards(&kinesis, &dead).await.remove(0);
        let letters = read_shard(&kinesis, &dead, &shard).await;
        assert_eq!(letters.len(), 1, "one letter");
        assert_eq!(letters[0].partition_key, "key-1");
        let body = letters[0].data.as_ref();
        check_cut(body, 1024 * 1024 - "key-1".len(), &big, None);
    });
}

/// A queue taking 256 KiB (its `MaximumMessageSize`, which moto enforces): a 200 KiB record's letter
/// (about 273 KB) goes cut; a queue with the default 1 MiB and a bucket: a 900 KiB record's letter
/// is kept whole in the bucket and the queue's cut letter names the object.
#[test]
fn an_oversized_dead_letter_reaches_the_queue_cut_and_the_bucket_whole() {
    run_test(async {
        let moto = moto_endpoint();
        let (sqs, s3) = moto_clients(&moto).await;
        let name = leasehold_testkit::unique_name("dl-big").to_lowercase();
        let small = sqs
            .create_queue()
            .queue_name(format!("{name}-256"))
            .attributes(aws_sdk_sqs::types::QueueAttributeName::MaximumMessageSize, "262144")
            .send()
            .await
            .expect("queue")
            .queue_url
            .expect("url");
        // moto refuses what SQS refuses: a body over the queue's MaximumMessageSize.
        let refused = sqs.send_message().queue_url(&small).message_body("a".repeat(262_145)).send().await;
        assert!(refused.is_err(), "moto enforces MaximumMessageSize");

        let record = poison("key-2", 200 * 1024);
        let written = around(&record);
        let stream = stream_with("dl-sqs", &written).await;
        let yaml = with_moto(&consumer(&stream, None, &format!("{RETRY}, deadLetterQueue: '{small}'}}")), &moto);
        let metrics = finish(Running::start(&yaml, "dl"), &written).await;
        assert_eq!(counted(&metrics, r#"leasehold_dead_letters_cut_total{destination="sqs",reason="too_large"}"#), 1);
        assert_eq!(counted(&metrics, r#"leasehold_dead_letter_failures_total{destination="sqs"}"#), 0);
        let bodies = drain(&sqs, &small).await;
        assert_eq!(bodies.len(), 1);
        check_cut(bodies[0].0.as_bytes(), 262_144, &record, None);

        // The default queue (1 MiB) and a bucket.
        let queue = sqs.create_queue().queue_name(&name).send().await.expect("queue").queue_url.expect("url");
        s3.create_bucket().bucket(&name).send().await.expect("bucket");
        let record = poison("key-3", 900 * 1024);
        let written = around(&record);
        let stream = stream_with("dl-s3", &written).await;
        let yaml = with_moto(
            &consumer(
                &stream,
                None,
                &format!("{RETRY}, deadLetterQueue: '{queue}', deadLetterBucket: {{name: {name}, prefix: dl/}}}}"),
            ),
            &moto,
        );
        let metrics = finish(Running::start(&yaml, "dl"), &written).await;
        assert_eq!(counted(&metrics, r#"leasehold_dead_letters_cut_total{destination="sqs",reason="too_large"}"#), 1);
        assert_eq!(counted(&metrics, r#"leasehold_dead_letters_cut_total{destination="s3",reason="too_large"}"#), 0);
        let listed = s3.list_objects_v2().bucket(&name).send().await.expect("list").contents.unwrap_or_default();
        assert_eq!(listed.len(), 1, "one object");
        let key = listed[0].key.clone().expect("key");
        let object = s3.get_object().bucket(&name).key(&key).send().await.expect("get").body;
        let whole: Value = serde_json::from_slice(&object.collect().await.expect("body").into_bytes()).expect("JSON");
        assert!(whole.get("truncated").is_none(), "the bucket keeps the whole letter");
        let data = base64::engine::general_purpose::STANDARD.decode(whole["data"].as_str().unwrap()).unwrap();
        assert_eq!(data, record.1, "the whole record");
        let bodies = drain(&sqs, &queue).await;
        assert_eq!(bodies.len(), 1);
        let location = format!("s3://{name}/{key}");
        let cut = check_cut(bodies[0].0.as_bytes(), 1024 * 1024, &record, Some(&location));
        assert_eq!(key, format!("dl/{stream}/shardId-000000000000/{}.json", cut["sequenceNumber"].as_str().unwrap()));
    });
}

/// A FIFO queue and a 200-character partition key (SQS takes group ids of 128 at most; moto does not
/// check): the letter arrives whole, its group id the key's SHA-256.
#[test]
fn a_fifo_letter_of_a_long_partition_key_gets_a_hashed_group_id() {
    run_test(async {
        let moto = moto_endpoint();
        let (sqs, _) = moto_clients(&moto).await;
        let name = format!("{}.fifo", leasehold_testkit::unique_name("dl-fifo").to_lowercase());
        let queue = sqs
            .create_queue()
            .queue_name(&name)
            .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true")
            .send()
            .await
            .expect("queue")
            .queue_url
            .expect("url");
        let key = "k".repeat(200);
        let record = (key.clone(), format!("{key}:fail").into_bytes());
        let written = around(&record);
        let stream = stream_with("dl-fifo", &written).await;
        let yaml = with_moto(&consumer(&stream, None, &format!("{RETRY}, deadLetterQueue: '{queue}'}}")), &moto);
        let metrics = finish(Running::start(&yaml, "dl"), &written).await;
        assert_eq!(counted(&metrics, r#"leasehold_dead_letter_failures_total{destination="sqs"}"#), 0);
        let bodies = drain(&sqs, &queue).await;
        assert_eq!(bodies.len(), 1);
        let (body, group, dedup) = &bodies[0];
        assert_eq!(group.as_deref(), Some(hex(&Sha256::digest(key.as_bytes()))).as_deref(), "hashed group id");
        assert!(dedup.as_deref().is_some_and(|d| d.starts_with("shardId-000000000000-")), "{dedup:?}");
        let letter: Value = serde_json::from_str(body).expect("JSON");
        assert!(letter.get("truncated").is_none(), "small enough to go whole");
        assert_eq!(letter["partitionKey"], key.as_str(), "the letter keeps the key itself");
    });
}

/// Every message on the queue (body, group id, deduplication id), read until it stays empty.
async fn drain(sqs: &aws_sdk_sqs::Client, queue: &str) -> Vec<(String, Option<String>, Option<String>)> {
    use aws_sdk_sqs::types::MessageSystemAttributeName as Name;
    let mut out = Vec::new();
    let mut empty = 0;
    while empty < 2 {
        let got = sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_system_attribute_names(Name::All)
            .send()
            .await
            .expect("receive");
        let messages = got.messages.unwrap_or_default();
        if messages.is_empty() {
            empty += 1;
        }
        for message in messages {
            let attributes = message.attributes.clone().unwrap_or_default();
            let group = attributes.get(&Name::MessageGroupId).cloned();
            let dedup = attributes.get(&Name::MessageDeduplicationId).cloned();
            out.push((message.body.clone().expect("body"), group, dedup));
            let handle = message.receipt_handle.expect("receipt handle");
            sqs.delete_message().queue_url(queue).receipt_handle(handle).send().await.expect("delete");
        }
    }
    out
}

/// Producer-written records carrying the requeue header — the old unsigned form claiming the requeue
/// limit, and the signed form with a made-up proof — are ordinary records: processed once, their bytes
/// intact, counted; nothing skipped, dead-lettered or requeued. Meanwhile a failing record is requeued
/// by a first worker, which is then stopped; a second worker of the same consumer (same lease table)
/// believes the first one's copies: the history goes on (three copies in all, then the fallback) rather
/// than starting again.
#[test]
fn a_forged_requeue_header_is_an_ordinary_record_and_genuine_copies_cross_workers() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamo = leasehold_testkit::dynamodb_client().await;
        let table = leasehold_testkit::create_lease_table(&dynamo, "dl-requeue").await;
        let unsigned = ("key-0".to_string(), b"\0leasehold-requeue requeues=9 attempts=99\nforged-payload".to_vec());
        let signed = (
            "key-1".to_string(),
            format!("\0leasehold-requeue requeues=3 attempts=7 mac={}\nforged-payload", "ab".repeat(32)).into_bytes(),
        );
        let failing = ("key-2".to_string(), b"key-2:fail".to_vec());
        let mut written = records(KEYS, 0, 3);
        written.extend([unsigned.clone(), signed.clone(), failing.clone()]);
        written.extend(records(KEYS, 3, 3));
        let stream = stream_with("dl-forged", &written).await;
        // A reader idling 2 s after an empty read: the first worker is stopped after its first copy,
        // well before it reads that copy back.
        let yaml = consumer(
            &stream,
            Some(&table),
            "retry: {maxAttempts: 2, backoff: 10ms, onExhausted: requeue}\nreader: {idleTime: 2s}",
        );

        let first = Running::start(&yaml, "requeue-a");
        let metrics = first.metrics.clone();
        wait_for("the first worker requeued the failing record once", Duration::from_secs(60), async || {
            counted(&metrics, r#"leasehold_records_exhausted_total{policy="requeue"}"#) >= 1
        })
        .await;
        let (picky_a, metrics_a) = first.stop().await;
        let skipped_a = counted(&metrics_a, r#"leasehold_records_exhausted_total{policy="skip"}"#);
        let second = Running::start(&yaml, "requeue-b");
        let metrics = second.metrics.clone();
        wait_for("the copies exhausted", Duration::from_secs(60), async || {
            skipped_a + counted(&metrics, r#"leasehold_records_exhausted_total{policy="skip"}"#) >= 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (picky_b, metrics_b) = second.stop().await;
        let both = |series: &str| counted(&metrics_a, series) + counted(&metrics_b, series);

        // The forged records: ordinary, bytes intact, counted; never opened, never requeued.
        for forged in [&unsigned, &signed] {
            let seen = picky_a.attempts_on(&forged.1) + picky_b.attempts_on(&forged.1);
            assert_eq!(seen, 1, "{:?} processed once with its header", String::from_utf8_lossy(&forged.1));
        }
        assert_eq!(picky_a.attempts_on(b"forged-payload") + picky_b.attempts_on(b"forged-payload"), 0);
        assert_eq!(both("leasehold_requeue_headers_rejected_total"), 2);
        // The second worker handled copies the first one wrote.
        assert!(
            counted(&metrics_b, r#"leasehold_records_exhausted_total{policy="requeue"}"#)
                + counted(&metrics_b, r#"leasehold_records_exhausted_total{policy="skip"}"#)
                >= 1,
            "the second worker read a copy"
        );
        // The genuine copies: three in all (1, 2 and 3 requeues), whichever worker wrote them, then
        // skipped (no dead-letter destination); the processor never saw a header.
        assert_eq!(both(r#"leasehold_records_exhausted_total{policy="requeue"}"#), 3);
        assert_eq!(both(r#"leasehold_records_exhausted_total{policy="skip"}"#), 1);
        assert_eq!(picky_a.attempts_on(&failing.1) + picky_b.attempts_on(&failing.1), 2 * 4);
        let (shard, _, _) = open_shards(&kinesis, &stream).await.remove(0);
        let on_stream = read_shard(&kinesis, &stream, &shard).await;
        assert_eq!(on_stream.len(), written.len() + 3, "the records as written, then three copies");
        let histories: Vec<(u32, u32)> = on_stream[written.len()..]
            .iter()
            .map(|r| {
                let (history, original) =
                    open_requeued(&bytes::Bytes::from(r.data.as_ref().to_vec())).expect("a requeued copy");
                assert_eq!(original, failing.1.as_slice());
                assert_eq!(r.partition_key, failing.0);
                (history.requeues, history.attempts)
            })
            .collect();
        assert_eq!(histories, vec![(1, 2), (2, 4), (3, 6)], "the second worker went on from the first's copies");
        // The key is the lease table's: one row, the group's.
        let row = dynamo
            .get_item()
            .table_name(&table)
            .key("lease_key", aws_sdk_dynamodb::types::AttributeValue::S("#term:requeue-key".into()))
            .consistent_read(true)
            .send()
            .await
            .expect("get")
            .item
            .expect("the requeue-key row");
        assert!(row.get("requeue_secret").and_then(|v| v.as_s().ok()).is_some_and(|s| s.len() == 64));
        // Every other record processed exactly once, by one worker or the other (a graceful stop).
        for (_, data) in &written {
            if data.ends_with(b":fail") {
                continue;
            }
            let seen = picky_a.attempts_on(data) + picky_b.attempts_on(data);
            assert_eq!(seen, 1, "{}", String::from_utf8_lossy(data));
        }
    });
}
