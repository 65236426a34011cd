//! Each exhausted-attempts policy, permanent errors and graceful stops, with a processor that always
//! fails and a publisher that collects what it is given.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

/// Fails every attempt; counts them.
struct Failing {
    attempts: AtomicU32,
    retryable: bool,
}

#[async_trait]
impl ShardProcessor for Failing {
    async fn process(&self, _record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        Err(if self.retryable { ProcessError::retryable("boom") } else { ProcessError::permanent("bad request") })
    }
}

#[derive(Default)]
struct Collect(Mutex<Vec<(String, String, Bytes)>>);

#[async_trait]
impl Publisher for Collect {
    async fn publish(&self, stream: &str, key: &str, data: Bytes) -> Result<(), DeliveryError> {
        self.0.lock().map_err(|e| DeliveryError::Unavailable(e.to_string()))?.push((stream.into(), key.into(), data));
        Ok(())
    }
}

fn record(data: Bytes) -> Record {
    Record {
        stream: Arc::from("orders"),
        shard_id: Arc::from("shardId-1"),
        sequence_number: "42".into(),
        partition_key: "k".into(),
        data,
        arrival_ms: Some(7),
        explicit_hash_key: None,
        sub_sequence_number: None,
    }
}

/// A runner with the processor it runs.
struct Bound(RecordRunner, Arc<Failing>);

impl Bound {
    async fn run(&self, record: &Record, stop: &CancellationToken) -> Outcome {
        self.0.process(self.1.as_ref(), record, stop).await
    }

    fn metrics(&self) -> &Arc<Metrics> {
        self.0.metrics()
    }
}

fn runner(policy: OnExhausted, retryable: bool) -> (Bound, Arc<Failing>, Arc<Collect>) {
    let failing = Arc::new(Failing { attempts: AtomicU32::new(0), retryable });
    let sink = Arc::new(Collect::default());
    let policy = RetryPolicy {
        max_attempts: 3,
        backoff: Duration::from_millis(10),
        on_exhausted: policy,
        dead_letter_stream: Some("dlq".into()),
        max_requeues: 2,
        ..RetryPolicy::default()
    };
    let runner = RecordRunner::new(Arc::default()).with_policy(policy).with_publisher(sink.clone());
    (Bound(runner, failing.clone()), failing, sink)
}

#[tokio::test(start_paused = true)]
async fn each_policy_disposes_after_max_attempts() {
    let stop = CancellationToken::new();
    let (skip, failing, sink) = runner(OnExhausted::Skip, true);
    assert_eq!(skip.run(&record(Bytes::from_static(b"x")), &stop).await, Outcome::Skipped);
    assert_eq!(failing.attempts.load(Ordering::SeqCst), 3);
    assert!(sink.0.lock().unwrap().is_empty());
    assert_eq!(skip.metrics().exhausted_count("skip"), 1);
    assert_eq!(skip.metrics().records_retried.get(), 2);

    let (dead, _, sink) = runner(OnExhausted::DeadLetter, true);
    assert_eq!(dead.run(&record(Bytes::from_static(b"x")), &stop).await, Outcome::DeadLettered);
    let letters = sink.0.lock().unwrap().clone();
    assert_eq!(letters.len(), 1);
    assert_eq!((letters[0].0.as_str(), letters[0].1.as_str()), ("dlq", "k"));
    let letter: serde_json::Value = serde_json::from_slice(&letters[0].2).unwrap();
    assert_eq!(letter["sequenceNumber"], "42");
    assert_eq!(letter["attempts"], 3);
    assert_eq!(letter["error"], "boom");
    assert_eq!(letter["data"], "eA==");

    let (requeue, _, sink) = runner(OnExhausted::Requeue, true);
    assert_eq!(requeue.run(&record(Bytes::from_static(b"x")), &stop).await, Outcome::Requeued);
    let copy = sink.0.lock().unwrap()[0].clone();
    assert_eq!((copy.0.as_str(), copy.1.as_str()), ("orders", "k"), "back on its own stream, same key");
    let (history, data) = requeue::open_unverified(&copy.2).expect("a requeue envelope");
    assert_eq!((history.requeues, history.attempts, &data[..]), (1, 3, &b"x"[..]));
    // The copy's own run starts from its history; at the limit it goes to the dead-letter stream.
    assert_eq!(requeue.run(&record(copy.2.clone()), &stop).await, Outcome::Requeued);
    let second = sink.0.lock().unwrap()[1].2.clone();
    assert_eq!(requeue::open_unverified(&second).map(|(h, _)| h), Some(History { requeues: 2, attempts: 6 }));
    assert_eq!(requeue.run(&record(second), &stop).await, Outcome::DeadLettered);
    assert_eq!(sink.0.lock().unwrap()[2].0, "dlq");
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_skips_the_retries_but_block_keeps_trying() {
    let stop = CancellationToken::new();
    let (skip, failing, _) = runner(OnExhausted::Skip, false);
    assert_eq!(skip.run(&record(Bytes::from_static(b"x")), &stop).await, Outcome::Skipped);
    assert_eq!(failing.attempts.load(Ordering::SeqCst), 1, "4xx-like errors are not retried");

    let (block, failing, _) = runner(OnExhausted::Block, true);
    let one = record(Bytes::from_static(b"x"));
    let timed = tokio::time::timeout(Duration::from_secs(60), block.run(&one, &stop)).await;
    assert!(timed.is_err(), "block never gives up");
    assert!(failing.attempts.load(Ordering::SeqCst) > 5);
    // A graceful stop interrupts the wait between attempts: the record is left for redelivery.
    let stopped = CancellationToken::new();
    stopped.cancel();
    assert_eq!(block.run(&record(Bytes::from_static(b"x")), &stopped).await, Outcome::Abandoned);
    assert_eq!(block.metrics().records_in_flight.get(), 0, "the gauge follows dropped runs");
}

#[tokio::test(start_paused = true)]
async fn a_record_older_than_max_record_age_is_not_retried() {
    let stop = CancellationToken::new();
    let (bound, failing, sink) = runner(OnExhausted::DeadLetter, true);
    let Bound(runner, processor) = bound;
    let policy = RetryPolicy { max_record_age: Some(Duration::from_secs(60)), ..runner.policy.clone() };
    let aged = Bound(runner.with_policy(policy), processor);
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    // Arrived two minutes ago: one attempt, then straight to the dead-letter stream.
    let old = Record { arrival_ms: Some(now_ms - 120_000), ..record(Bytes::from_static(b"old")) };
    assert_eq!(aged.run(&old, &stop).await, Outcome::DeadLettered);
    assert_eq!(failing.attempts.load(Ordering::SeqCst), 1, "no retry");
    assert_eq!(aged.metrics().records_aged_out.get(), 1);
    assert_eq!(aged.metrics().records_retried.get(), 0);
    let letter: serde_json::Value = serde_json::from_slice(&sink.0.lock().unwrap()[0].2).unwrap();
    assert_eq!(letter["attempts"], 1);
    // Arrived just now: retried up to maxAttempts as usual.
    let young = Record { arrival_ms: Some(now_ms), ..record(Bytes::from_static(b"young")) };
    assert_eq!(aged.run(&young, &stop).await, Outcome::DeadLettered);
    assert_eq!(failing.attempts.load(Ordering::SeqCst), 1 + 3);
    assert_eq!(aged.metrics().records_aged_out.get(), 1);
    // Unknown arrival time: never too old.
    let unknown = Record { arrival_ms: None, ..record(Bytes::from_static(b"unknown")) };
    assert_eq!(aged.run(&unknown, &stop).await, Outcome::DeadLettered);
    assert_eq!(failing.attempts.load(Ordering::SeqCst), 1 + 3 + 3);
}

#[tokio::test(start_paused = true)]
async fn a_forged_requeue_header_is_an_ordinary_record() {
    let stop = CancellationToken::new();
    let (requeue, failing, sink) = runner(OnExhausted::Requeue, true);
    // A producer's header claiming the requeue limit: not believed, so the record is requeued once
    // (not sent to the dead-letter stream), its bytes as written, and counted.
    let forged = Bytes::from_static(b"\0leasehold-requeue requeues=9 attempts=4294967295\nx");
    assert_eq!(requeue.run(&record(forged.clone()), &stop).await, Outcome::Requeued);
    assert_eq!(requeue.metrics().requeue_headers_rejected.get(), 1);
    assert_eq!(failing.attempts.load(Ordering::SeqCst), 3);
    let copy = sink.0.lock().unwrap()[0].clone();
    assert_eq!(copy.0, "orders");
    let (history, data) = requeue::open_unverified(&copy.2).expect("a genuine copy");
    assert_eq!(history, History { requeues: 1, attempts: 3 });
    assert_eq!(data, forged, "the forged bytes kept whole inside the genuine copy");
    // A signed header under another key is no better.
    let other = requeue::wrap(&RequeueKey::random(), "k", b"x", History { requeues: 2, attempts: 1 });
    assert_eq!(requeue.run(&record(other), &stop).await, Outcome::Requeued);
    assert_eq!(requeue.metrics().requeue_headers_rejected.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn counters_saturate() {
    let stop = CancellationToken::new();
    let (bound, _, sink) = runner(OnExhausted::DeadLetter, true);
    let key = bound.0.requeue_key(&stop).await.unwrap().clone();
    let copy = requeue::wrap(&key, "k", b"x", History { requeues: 0, attempts: u32::MAX - 1 });
    assert_eq!(bound.run(&record(copy), &stop).await, Outcome::DeadLettered);
    let letter: serde_json::Value = serde_json::from_slice(&sink.0.lock().unwrap()[0].2).unwrap();
    assert_eq!(letter["attempts"], u32::MAX);
}

/// A destination with a size limit that refuses what it is told to, remembering what it took.
#[derive(Debug, Default)]
struct Picky {
    limit: Option<usize>,
    keeps: bool,
    /// Refuses as invalid every letter at least this large.
    refuse_from: Option<usize>,
    /// Refuses retryably this many times first.
    unavailable: AtomicU32,
    taken: Mutex<Vec<Bytes>>,
}

#[async_trait]
impl Destination for Picky {
    fn kind(&self) -> &'static str {
        if self.keeps { "s3" } else { "sqs" }
    }
    fn target(&self) -> String {
        "picky".into()
    }
    async fn max_letter_bytes(&self, _record: &Record) -> Option<usize> {
        self.limit
    }
    fn location(&self, _record: &Record) -> Option<String> {
        self.keeps.then(|| "s3://b/k.json".to_string())
    }
    async fn send(&self, _record: &Record, letter: &Bytes) -> Result<(), DeliveryError> {
        if self.unavailable.load(Ordering::SeqCst) > 0 {
            self.unavailable.fetch_sub(1, Ordering::SeqCst);
            return Err(DeliveryError::Unavailable("throttled".into()));
        }
        if self.refuse_from.is_some_and(|from| letter.len() >= from) {
            return Err(DeliveryError::Invalid("too large".into()));
        }
        self.taken.lock().unwrap().push(letter.clone());
        Ok(())
    }
}

fn dead_letter_runner(destinations: &[Arc<Picky>]) -> Bound {
    let (bound, failing, _) = runner(OnExhausted::DeadLetter, false);
    let Bound(mut runner, _) = bound;
    runner.policy.dead_letter_stream = None;
    for destination in destinations {
        runner = runner.with_destination(destination.clone());
    }
    Bound(runner, failing)
}

fn json(letter: &Bytes) -> serde_json::Value {
    serde_json::from_slice(letter).unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_oversized_dead_letter_goes_cut_and_points_at_the_whole_one() {
    let stop = CancellationToken::new();
    let big = Bytes::from(vec![7u8; 200_000]);
    let bucket = Arc::new(Picky { keeps: true, ..Picky::default() });
    let queue = Arc::new(Picky { limit: Some(256 * 1024), unavailable: AtomicU32::new(2), ..Picky::default() });
    let bound = dead_letter_runner(&[queue.clone(), bucket.clone()]);
    assert_eq!(bound.run(&record(big.clone()), &stop).await, Outcome::DeadLettered);
    let whole = json(&bucket.taken.lock().unwrap()[0]);
    assert!(whole.get("truncated").is_none(), "the bucket keeps the whole letter");
    let taken = queue.taken.lock().unwrap().clone();
    assert_eq!(taken.len(), 1, "throttled twice, then taken once");
    assert!(taken[0].len() <= 256 * 1024);
    let cut = json(&taken[0]);
    assert_eq!(cut["truncated"], true);
    assert_eq!(cut["dataBytes"], 200_000);
    assert_eq!(cut["dataSha256"], crate::destination::sha256_hex(&big));
    assert_eq!(cut["dataObject"], "s3://b/k.json");
    let metrics = bound.metrics().encode();
    assert!(
        metrics.contains(r#"leasehold_dead_letters_cut_total{destination="sqs",reason="too_large"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"leasehold_dead_letter_failures_total{destination="sqs"} 2"#), "{metrics}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_letter_falls_back_to_smaller_forms_then_is_given_up_for_that_destination() {
    let stop = CancellationToken::new();
    // A queue whose own limit is 10 KB: the whole letter and the cut one at 256 KiB are refused as
    // invalid, the smallest form (no data) is taken.
    let small = Arc::new(Picky { limit: Some(256 * 1024), refuse_from: Some(10_000), ..Picky::default() });
    let bound = dead_letter_runner(std::slice::from_ref(&small));
    assert_eq!(bound.run(&record(Bytes::from(vec![1u8; 100_000])), &stop).await, Outcome::DeadLettered);
    let taken = small.taken.lock().unwrap().clone();
    assert_eq!(taken.len(), 1);
    assert_eq!(json(&taken[0])["data"], "");
    assert!(
        bound.metrics().encode().contains(r#"leasehold_dead_letters_cut_total{destination="sqs",reason="refused"} 1"#)
    );

    // A destination refusing everything as invalid is given up, counted, and the record (with no
    // other destination taking it) skipped, counted: the shard moves on.
    let never = Arc::new(Picky { refuse_from: Some(0), ..Picky::default() });
    let keeps = Arc::new(Picky { keeps: true, ..Picky::default() });
    let bound = dead_letter_runner(&[never.clone(), keeps.clone()]);
    assert_eq!(bound.run(&record(Bytes::from_static(b"x")), &stop).await, Outcome::DeadLettered, "the bucket took it");
    assert!(bound.metrics().encode().contains(r#"leasehold_dead_letters_undeliverable_total{destination="sqs"} 1"#));
    let bound = dead_letter_runner(&[never]);
    assert_eq!(bound.run(&record(Bytes::from_static(b"x")), &stop).await, Outcome::Skipped);
    assert_eq!(bound.metrics().exhausted_count("skip"), 1);
    assert_eq!(bound.metrics().exhausted_count("deadLetter"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_stream_gets_a_cut_letter_under_a_key_it_takes() {
    let stop = CancellationToken::new();
    let (bound, _, sink) = runner(OnExhausted::DeadLetter, false);
    let long_key = "p".repeat(300);
    let huge = Record { partition_key: long_key.clone(), ..record(Bytes::from(vec![0u8; 900 * 1024])) };
    assert_eq!(bound.run(&huge, &stop).await, Outcome::DeadLettered);
    let (stream, key, letter) = sink.0.lock().unwrap()[0].clone();
    assert_eq!(stream, "dlq");
    assert_eq!(key, crate::destination::sha256_hex(long_key.as_bytes()), "a key Kinesis takes");
    assert!(letter.len() + key.len() <= 1024 * 1024, "{}", letter.len());
    let letter = json(&letter);
    assert_eq!((letter["truncated"].as_bool(), letter["dataBytes"].as_u64()), (Some(true), Some(900 * 1024)));
    assert_eq!(letter["partitionKey"], long_key.as_str(), "the letter keeps the key itself");
}
