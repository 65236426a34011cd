//! A shard's lag as its holder writes it into the lease row (`lag_ms`, docs/lease-protocol.md "Lag"), on
//! every ground (kinesalite, kinesis-mock, and both with enhanced fan-out): it rises while the processor
//! is slower than the producer (kinesalite reports `millisBehindLatest` 0, so this is the worker's own
//! measure), drains when the processor speeds up and is 0 once every record is done; every record is
//! processed exactly once; and the attribute rides on the renewals and checkpoints the holder makes
//! anyway, counted on a DynamoDB proxy: no write of its own.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use common::*;
use leasehold_testkit::Service;
use leasehold_testkit::process::wait_for;
use leasehold_testkit::proxy::{FaultProxy, Tap};
use leasehold_testkit::server::LocalServer;
use serde_json::Value;

/// Renewal interval of [`FAST_TIMING`].
const RENEW_INTERVAL: Duration = Duration::from_millis(500);
/// Checkpoint interval of [`FAST_TIMING`].
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// An http processor whose speed the test sets: each record waits `delay_ms` before it is acknowledged.
struct SlowProcessor {
    server: LocalServer,
    delay_ms: Arc<AtomicU64>,
    /// The `ce-id` of every record acknowledged, in order.
    acknowledged: Arc<Mutex<Vec<String>>>,
}

type ProcessorState = (Arc<AtomicU64>, Arc<Mutex<Vec<String>>>);

async fn acknowledge(State((delay_ms, acknowledged)): State<ProcessorState>, headers: HeaderMap) -> StatusCode {
    tokio::time::sleep(Duration::from_millis(delay_ms.load(Ordering::SeqCst))).await;
    let id = headers.get("ce-id").and_then(|v| v.to_str().ok()).unwrap_or("?").to_string();
    acknowledged.lock().expect("log").push(id);
    StatusCode::OK
}

impl SlowProcessor {
    async fn start(delay: Duration) -> Self {
        let delay_ms = Arc::new(AtomicU64::new(delay.as_millis() as u64));
        let acknowledged = Arc::new(Mutex::new(Vec::new()));
        let router =
            Router::new().route("/records", post(acknowledge)).with_state((delay_ms.clone(), acknowledged.clone()));
        Self { server: LocalServer::start(router).await, delay_ms, acknowledged }
    }

    fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    fn acknowledged(&self) -> Vec<String> {
        self.acknowledged.lock().expect("log").clone()
    }
}

/// One UpdateItem on a shard row, as sent.
#[derive(Debug, Clone)]
struct RowWrite {
    key: String,
    expression: String,
}

impl RowWrite {
    fn carries_lag(&self) -> bool {
        self.expression.contains("lag_ms")
    }
    fn is_renewal(&self) -> bool {
        self.expression.contains("lease_expiry") && !self.expression.contains("lease_owner")
    }
    fn is_checkpoint(&self) -> bool {
        self.expression.contains("checkpoint =") && !self.expression.contains("lease_owner")
    }
}

/// Counts the UpdateItem requests a worker sends to its lease table, row by row.
#[derive(Default)]
struct WriteLog {
    writes: Mutex<Vec<RowWrite>>,
}

impl Tap for WriteLog {
    fn request(&self, operation: &str, body: Bytes) -> Bytes {
        if operation == "UpdateItem"
            && let Ok(request) = serde_json::from_slice::<Value>(&body)
        {
            let key = request["Key"]["lease_key"]["S"].as_str().unwrap_or_default().to_string();
            let expression = request["UpdateExpression"].as_str().unwrap_or_default().to_string();
            self.writes.lock().expect("log").push(RowWrite { key, expression });
        }
        body
    }

    fn response(&self, _: &str, _: &[u8], _: &[u8], _: StatusCode, response: Bytes) -> Bytes {
        response
    }
}

impl WriteLog {
    fn on(&self, key: &str) -> Vec<RowWrite> {
        self.writes.lock().expect("log").iter().filter(|w| w.key == key).cloned().collect()
    }
}

/// The shard row's `lag_ms`, read strongly consistent from dynalite itself (not through the counting
/// proxy).
async fn row_lag(dynamodb: &aws_sdk_dynamodb::Client, table: &str, key: &str) -> Option<u64> {
    let out = dynamodb
        .get_item()
        .table_name(table)
        .key("lease_key", AttributeValue::S(key.into()))
        .consistent_read(true)
        .send()
        .await
        .ok()?;
    out.item?.get("lag_ms")?.as_n().ok()?.parse().ok()
}

/// Polls the row's `lag_ms` until `done` holds for it, for at most `limit`; returns the value seen, or
/// panics with the last one.
async fn wait_for_lag(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
    key: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(u64) -> bool,
) -> u64 {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < limit {
        last = row_lag(dynamodb, table, key).await;
        if let Some(lag) = last
            && done(lag)
        {
            println!("{what}: lag_ms {lag} after {:?}", started.elapsed());
            return lag;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within {limit:?}; last lag_ms {last:?}");
}

async fn lag_rises_drains_and_rides_on_lease_writes(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag", 1).await;
    let table = leasehold_testkit::unique_name("lag");
    let writes = Arc::new(WriteLog::default());
    let tap: Arc<dyn Tap> = writes.clone();
    let meter =
        FaultProxy::start_with_tap(&leasehold_testkit::endpoint(Service::DynamoDb), Arc::new(|_, _| None), Some(tap))
            .await;
    // 5 records/s against 20 written per second: a backlog that ages.
    let processor = SlowProcessor::start(Duration::from_millis(200)).await;
    let config = emulator.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\nordering: shard\n").replace(
        "processor: {stdout: {}}",
        &format!("processor: {{http: {{url: '{}/records'}}}}", processor.server.endpoint()),
    );
    let config = with_endpoint(&config, Service::DynamoDb, &meter.endpoint());
    let spawned = Instant::now();
    let mut worker = spawn(&config, "lagging");
    wait_for("the shard held", Duration::from_secs(30), async || worker.held_shards().len() == 1).await;
    let key = worker.held_shards().into_iter().next().expect("one shard");
    let producer = Producer::start(kinesis.clone(), &stream, 2, Duration::from_millis(100));

    // Slow: the oldest unfinished record ages, and the row shows it at the next renewal.
    let rising = wait_for_lag(&dynamodb, &table, &key, "lag rising", Duration::from_secs(30), |lag| lag >= 1_000).await;
    let risen =
        wait_for_lag(&dynamodb, &table, &key, "lag still rising", Duration::from_secs(30), |lag| lag >= rising + 1_500)
            .await;
    assert!(
        metric(&worker, &format!("leasehold_shard_lag_seconds{{stream=\"{stream}\",shard=\"{}\"}}", shard_id(&key)))
            .await
            >= 1.0,
        "the worker's own series shows the lag too"
    );

    // Fast: the backlog drains while the producer goes on.
    processor.set_delay(Duration::ZERO);
    let drained =
        wait_for_lag(&dynamodb, &table, &key, "lag drained", Duration::from_secs(30), |lag| lag < 1_500).await;
    assert!(drained < risen, "drained {drained} ms, from {risen} ms");

    // Caught up: nothing pending, and the service says the tip is reached.
    let written = producer.stop().await;
    wait_for("every record acknowledged", Duration::from_secs(30), async || {
        processor.acknowledged().len() >= written.len()
    })
    .await;
    wait_for_lag(&dynamodb, &table, &key, "lag back to 0", Duration::from_secs(10), |lag| lag == 0).await;
    let elapsed = spawned.elapsed();
    let acknowledged = processor.acknowledged();
    let distinct: HashSet<&String> = acknowledged.iter().collect();
    assert_eq!(distinct.len(), acknowledged.len(), "a record acknowledged twice");
    assert_eq!(acknowledged.len(), written.len(), "every record exactly once");

    // No write of its own: every write that carries the lag is a renewal or a checkpoint, renewals keep
    // their interval, and checkpoints are the worker's own count of them.
    let on_row = writes.on(&key);
    let lag_writes: Vec<&RowWrite> = on_row.iter().filter(|w| w.carries_lag()).collect();
    assert!(!lag_writes.is_empty(), "the lag was never written");
    assert!(
        lag_writes.iter().all(|w| w.is_renewal() || w.is_checkpoint()),
        "a write for the lag alone: {lag_writes:?}"
    );
    let renewals = on_row.iter().filter(|w| w.is_renewal()).count();
    let checkpoints = on_row.iter().filter(|w| w.is_checkpoint()).count();
    let others = on_row.len() - renewals - checkpoints;
    println!(
        "{} writes on {key} in {elapsed:?}: {renewals} renewals, {checkpoints} checkpoints, {others} others",
        on_row.len()
    );
    assert!(others <= 1, "beside renewals and checkpoints only the acquire: {on_row:?}");
    let renewal_bound = (elapsed.as_millis() / RENEW_INTERVAL.as_millis()) as usize + 2;
    assert!(renewals <= renewal_bound, "{renewals} renewals, one per {RENEW_INTERVAL:?} allows {renewal_bound}");
    let checkpoints_written = metric(&worker, "leasehold_checkpoints_written_total").await as usize;
    // The proxy logs a write when it is sent, the worker counts it when answered: one may be in flight.
    assert!(
        checkpoints.abs_diff(checkpoints_written) <= 1,
        "{checkpoints} checkpoint writes beside the worker's own count {checkpoints_written}"
    );
    let checkpoint_bound = (elapsed.as_millis() / CHECKPOINT_INTERVAL.as_millis()) as usize + 2;
    assert!(checkpoints <= checkpoint_bound, "{checkpoints} checkpoints, one per {CHECKPOINT_INTERVAL:?}");
    assert_running(&mut [&mut worker]);
}

/// The shard id of a lease key `<stream>:<shardId>`.
fn shard_id(key: &str) -> &str {
    key.rsplit(':').next().unwrap_or(key)
}

on_every_ground!(lag_rises_drains_and_rides_on_lease_writes);
