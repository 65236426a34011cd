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
    async fn publish(&self, stream: &str, key: &str, data: Bytes) -> Result<(), String> {
        self.0.lock().map_err(|e| e.to_string())?.push((stream.into(), key.into(), data));
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
struct Bound(Runner, Arc<Failing>);

impl Bound {
    async fn run(&self, record: &Record, stop: &CancellationToken) -> Outcome {
        self.0.run(self.1.as_ref(), record, stop).await
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
    let runner = Runner::new(Arc::default()).with_policy(policy).with_publisher(sink.clone());
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
    let (history, data) = requeue::open(&copy.2).expect("a requeue envelope");
    assert_eq!((history.requeues, history.attempts, &data[..]), (1, 3, &b"x"[..]));
    // The copy's own run starts from its history; at the limit it goes to the dead-letter stream.
    assert_eq!(requeue.run(&record(copy.2.clone()), &stop).await, Outcome::Requeued);
    let second = sink.0.lock().unwrap()[1].2.clone();
    assert_eq!(requeue::open(&second).map(|(h, _)| h), Some(History { requeues: 2, attempts: 6 }));
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
async fn attempt_counts_carried_in_a_header_saturate_instead_of_overflowing() {
    // A copy's header carries the attempts of earlier copies; a count near u32::MAX (a header written by
    // someone else) must not overflow when this copy's attempts are added.
    let stop = CancellationToken::new();
    let (dead, failing, sink) = runner(OnExhausted::DeadLetter, true);
    let data = requeue::wrap(b"x", History { requeues: 0, attempts: u32::MAX - 1 });
    assert_eq!(dead.run(&record(data), &stop).await, Outcome::DeadLettered);
    assert_eq!(failing.attempts.load(Ordering::SeqCst), 3, "its own attempts still run");
    let letter: serde_json::Value = serde_json::from_slice(&sink.0.lock().unwrap()[0].2).expect("a JSON letter");
    assert_eq!(letter["attempts"], u32::MAX, "saturated");
}
