//! The `http` processor against a local server that fails some requests: the CloudEvents headers, how
//! each answer is classified, and a worker process delivering a stream through it; then the same with
//! batching: batches fill from concurrent calls, per-event failures and failing batches are retried
//! with nothing lost, 4xx follow the policy, outputs reach their event, and a worker delivers a stream
//! in batches.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::wait_for;
use leasehold_testkit::server::LocalServer;
use leasehold_worker::processor::{
    BATCH_CONTENT_TYPE, HttpBatching, HttpProcessor, Outputs, ProcessError, Record, ShardProcessor,
};

/// One request the server saw, and what it answered.
#[derive(Debug, Clone)]
struct Seen {
    headers: HashMap<String, String>,
    body: String,
    status: StatusCode,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Processes `record` as the worker does, dropping any outputs.
async fn ack(processor: &HttpProcessor, record: &Record) -> Result<(), ProcessError> {
    processor.process(record, &mut Outputs::default()).await
}

fn remember(log: &Log, headers: &HeaderMap, body: &Bytes, status: StatusCode) -> StatusCode {
    let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string())).collect();
    log.lock().unwrap().push(Seen { headers, body: String::from_utf8_lossy(body).into_owned(), status });
    status
}

fn record(data: &'static str) -> Record {
    Record {
        stream: Arc::from("orders"),
        shard_id: Arc::from("shardId-000000000003"),
        sequence_number: "49590000000000000000000000000000000000000000000000000042".into(),
        partition_key: "customer 7/é".into(),
        data: bytes::Bytes::from_static(data.as_bytes()),
        arrival_ms: Some(1_700_000_000_123),
        explicit_hash_key: None,
        sub_sequence_number: None,
    }
}

/// Writes keys `key-0` to `key-7`, records 0 to 9 each, to a fresh 2-shard stream, and runs a worker over
/// it with `processor.http` = `http` (`ordering: key`, `concurrency: 4`, `max_attempts` 10 ms apart,
/// then skip) until `acknowledged()` counts every record but `key-1:4`, which the server refuses, and
/// the worker has skipped that one.
async fn run_http_worker(
    prefix: &str,
    http: &str,
    max_attempts: u32,
    acknowledged: impl Fn() -> usize,
) -> leasehold_testkit::process::WorkerProcess {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, 2).await;
    let written = records(8, 0, 10);
    put_records(&kinesis, &stream, &written).await;
    let table = leasehold_testkit::unique_name(prefix);
    let config = config(
        &stream,
        Some(&table),
        &format!(
            "startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 4\n\
             retry: {{maxAttempts: {max_attempts}, backoff: 10ms, onExhausted: skip}}\n"
        ),
    )
    .replace("processor: {stdout: {}}", &format!("processor: {{http: {http}}}"));
    let worker = spawn(&config, &format!("{prefix}-1"));
    wait_for("every record but one acknowledged", Duration::from_secs(60), async || {
        acknowledged() >= written.len() - 1
    })
    .await;
    wait_for("the refused record skipped", Duration::from_secs(10), async || {
        worker.stderr_text().contains("record skipped after its attempts ran out")
    })
    .await;
    worker
}

/// Each key's acknowledged records (`key-k:n` data, by partition key) are all of them but `key-1:4`,
/// once each, in order.
fn assert_acknowledged_once_in_key_order(per_key: &HashMap<String, Vec<String>>) {
    for k in 0..8 {
        let key = format!("key-{k}");
        let expected: Vec<String> = (0..10).map(|n| format!("{key}:{n}")).filter(|d| d != "key-1:4").collect();
        assert_eq!(per_key[&key], expected, "{key}: acknowledged once each, in order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_a_cloudevent_and_classifies_every_answer() {
    let log: Log = Arc::default();
    let answer = |status: StatusCode| {
        move |State(log): State<Log>, headers: HeaderMap, body: Bytes| async move { remember(&log, &headers, &body, status) }
    };
    let router = Router::new()
        .route("/ok", post(answer(StatusCode::NO_CONTENT)))
        .route("/unavailable", post(answer(StatusCode::SERVICE_UNAVAILABLE)))
        .route("/bad", post(answer(StatusCode::UNPROCESSABLE_ENTITY)))
        .route("/busy", post(answer(StatusCode::TOO_MANY_REQUESTS)))
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                StatusCode::OK
            }),
        )
        .with_state(log.clone());
    let server = LocalServer::start(router).await;
    let base = server.endpoint();
    let timeout = Duration::from_millis(300);
    let processor = |path: &str| HttpProcessor::new(&format!("{base}{path}"), timeout).expect("processor");

    ack(&processor("/ok"), &record("{\"total\":7}")).await.expect("2xx acknowledges");
    let seen = log.lock().unwrap()[0].clone();
    assert_eq!(seen.body, "{\"total\":7}", "raw data as the body");
    let h = |name: &str| seen.headers.get(name).cloned().unwrap_or_else(|| panic!("no {name} header"));
    assert_eq!(h("ce-specversion"), "1.0");
    assert_eq!(h("ce-id"), "shardId-000000000003-49590000000000000000000000000000000000000000000000000042");
    assert_eq!(h("ce-source"), "kinesis:orders");
    assert_eq!(h("ce-type"), "io.leasehold.kinesis.record");
    assert_eq!(h("ce-time"), "2023-11-14T22:13:20.123Z");
    assert_eq!(h("ce-partitionkey"), "customer%207/%C3%A9");
    assert_eq!(h("ce-shardid"), "shardId-000000000003");
    assert_eq!(h("ce-sequencenumber"), "49590000000000000000000000000000000000000000000000000042");
    assert_eq!(h("content-type"), "application/octet-stream");

    let error = ack(&processor("/unavailable"), &record("x")).await.expect_err("5xx fails");
    assert!(error.retryable && error.message.contains("503"), "{error:?}");
    let error = ack(&processor("/busy"), &record("x")).await.expect_err("429 fails");
    assert!(error.retryable, "429 is retried: {error:?}");
    let error = ack(&processor("/bad"), &record("x")).await.expect_err("4xx fails");
    assert!(!error.retryable && error.message.contains("422"), "other 4xx reject the record: {error:?}");
    let started = std::time::Instant::now();
    let error = ack(&processor("/slow"), &record("x")).await.expect_err("timeout fails");
    assert!(error.retryable && started.elapsed() < Duration::from_secs(2), "{error:?}");
    // A port nobody listens on: connection refused.
    let refused = HttpProcessor::new(&format!("{}/", leasehold_testkit::closed_endpoint().await), timeout).unwrap();
    let error = ack(&refused, &record("x")).await.expect_err("no server");
    assert!(error.retryable, "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_delivers_a_stream_through_a_failing_server_in_key_order() {
    let log: Log = Arc::default();
    let router = Router::new()
        .route(
            "/records",
            post(|State(log): State<Log>, headers: HeaderMap, body: Bytes| async move {
                let text = String::from_utf8_lossy(&body).into_owned();
                let n: u64 = text.rsplit(':').next().and_then(|n| n.parse().ok()).unwrap_or(0);
                let tried = log.lock().unwrap().iter().any(|s| s.body == text);
                let status = if text == "key-1:4" {
                    StatusCode::BAD_REQUEST
                } else if n.is_multiple_of(3) && !tried {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                };
                remember(&log, &headers, &body, status)
            }),
        )
        .with_state(log.clone());
    let server = LocalServer::start(router).await;
    let http = format!("{{url: '{}/records', timeout: 2s}}", server.endpoint());
    let acknowledged = || log.lock().unwrap().iter().filter(|s| s.status.is_success()).count();
    let _worker = run_http_worker("http", &http, 3, acknowledged).await;
    let seen = log.lock().unwrap().clone();
    let mut per_key: HashMap<String, Vec<String>> = HashMap::new();
    for s in seen.iter().filter(|s| s.status.is_success()) {
        per_key.entry(s.headers["ce-partitionkey"].clone()).or_default().push(s.body.clone());
    }
    assert_acknowledged_once_in_key_order(&per_key);
    let unavailable = seen.iter().filter(|s| s.status == StatusCode::SERVICE_UNAVAILABLE).count();
    assert_eq!(unavailable, 8 * 4, "the first attempt of every record numbered 0, 3, 6, 9 failed and was retried");
    let rejected = seen.iter().filter(|s| s.body == "key-1:4").count();
    assert_eq!(rejected, 1, "a 400 is not retried: the policy (skip) applies at once");
}

/// One batch the server saw: its events, what it answered, and the ids it reported failed.
#[derive(Debug, Clone)]
struct SeenBatch {
    content_type: String,
    events: Vec<serde_json::Value>,
    status: StatusCode,
    failed: Vec<String>,
}

impl SeenBatch {
    fn ids(&self) -> Vec<String> {
        self.events.iter().map(|e| e["id"].as_str().unwrap_or_default().to_string()).collect()
    }

    /// The events this answer acknowledged: all of a 2xx batch but the failed ones.
    fn acknowledged(&self) -> Vec<serde_json::Value> {
        let ok = |e: &&serde_json::Value| !self.failed.iter().any(|f| e["id"] == **f);
        if self.status.is_success() { self.events.iter().filter(ok).cloned().collect() } else { Vec::new() }
    }

    /// An event's data, decoded.
    fn data(event: &serde_json::Value) -> String {
        let data = base64::engine::general_purpose::STANDARD.decode(event["data_base64"].as_str().unwrap()).unwrap();
        String::from_utf8(data).unwrap()
    }
}

type Batches = Arc<Mutex<Vec<SeenBatch>>>;

/// How the batch server answers: given the request's number (from 0), its events and every batch seen
/// before, a status and a JSON body.
type Answer = Arc<dyn Fn(usize, &[serde_json::Value], &[SeenBatch]) -> (StatusCode, serde_json::Value) + Send + Sync>;

/// A local server taking batches at `/batch`, answering with `answer` and remembering each batch.
async fn batch_server(answer: Answer) -> (LocalServer, Batches) {
    let batches: Batches = Arc::default();
    let seen = batches.clone();
    let router = Router::new().route(
        "/batch",
        post(move |headers: HeaderMap, body: Bytes| {
            let (answer, seen) = (answer.clone(), seen.clone());
            async move {
                let events: Vec<serde_json::Value> = serde_json::from_slice(&body).expect("a JSON array of events");
                let mut seen = seen.lock().unwrap();
                let (status, reply) = answer(seen.len(), &events, &seen);
                let mut failed: Vec<String> = reply["failed"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|f| f["id"].as_str().unwrap().to_string())
                    .collect();
                // Lambda's shape names sequence numbers: every event of the batch with that number.
                for item in reply["batchItemFailures"].as_array().into_iter().flatten() {
                    let sequence = &item["itemIdentifier"];
                    let named = events.iter().filter(|e| e["sequencenumber"] == *sequence);
                    failed.extend(named.map(|e| e["id"].as_str().unwrap().to_string()));
                }
                seen.push(SeenBatch {
                    content_type: headers["content-type"].to_str().unwrap().to_string(),
                    failed,
                    events,
                    status,
                });
                (status, reply.to_string())
            }
        }),
    );
    let server = LocalServer::start(router).await;
    (server, batches)
}

fn batched(server: &LocalServer, max_records: usize) -> Arc<HttpProcessor> {
    batched_with(server, max_records, Duration::from_millis(50), false)
}

fn batched_with(server: &LocalServer, max_records: usize, max_delay: Duration, bisect: bool) -> Arc<HttpProcessor> {
    let processor = HttpProcessor::new(&format!("{}/batch", server.endpoint()), Duration::from_secs(2)).unwrap();
    Arc::new(processor.with_batching(HttpBatching { max_records, max_delay, bisect }))
}

fn numbered(n: usize) -> Record {
    Record {
        stream: Arc::from("orders"),
        shard_id: Arc::from(format!("shardId-{:012}", n % 4)),
        sequence_number: format!("{:056}", n),
        partition_key: format!("key-{}", n % 16),
        data: bytes::Bytes::from(format!("record {n}")),
        arrival_ms: Some(1_700_000_000_000),
        explicit_hash_key: None,
        sub_sequence_number: None,
    }
}

fn id(record: &Record) -> String {
    format!("{}-{}", record.shard_id, record.sequence_number)
}

/// Processes `records` with `in_flight` calls at once, as the dispatcher does; each record is retried
/// (up to 20 attempts, 10 ms apart) while its error is retryable. Returns each record's last result and
/// how many attempts failed.
async fn deliver(
    processor: Arc<HttpProcessor>,
    records: &[Record],
    in_flight: usize,
) -> (Vec<Result<(), ProcessError>>, usize) {
    use futures::StreamExt;
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let results = futures::stream::iter(records.iter().cloned())
        .map(|record| {
            let (processor, failures) = (processor.clone(), failures.clone());
            async move {
                let mut result = ack(&processor, &record).await;
                for _ in 1..20 {
                    match &result {
                        Err(e) if e.retryable => {
                            failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            result = ack(&processor, &record).await;
                        }
                        _ => break,
                    }
                }
                result
            }
        })
        .buffered(in_flight)
        .collect()
        .await;
    (results, failures.load(std::sync::atomic::Ordering::SeqCst))
}

/// Every event acknowledged over all batches, by id, with how often.
fn acknowledged_counts(batches: &[SeenBatch]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for event in batches.iter().flat_map(SeenBatch::acknowledged) {
        *counts.entry(event["id"].as_str().unwrap().to_string()).or_default() += 1;
    }
    counts
}

use base64::Engine;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_records_go_out_in_batches_and_each_is_acknowledged_once() {
    let (server, batches) = batch_server(Arc::new(|_, _, _| (StatusCode::OK, serde_json::Value::Null))).await;
    let records: Vec<Record> = (0..400).map(numbered).collect();
    let (results, failures) = deliver(batched(&server, 16), &records, 32).await;
    assert!(results.iter().all(Result::is_ok) && failures == 0, "{results:?}");

    let batches = batches.lock().unwrap().clone();
    let sizes: Vec<usize> = batches.iter().map(|b| b.events.len()).collect();
    assert!(sizes.iter().all(|n| (1..=16).contains(n)), "at most maxRecords per batch: {sizes:?}");
    assert!(
        sizes.iter().filter(|n| **n == 16).count() >= sizes.len() / 2,
        "32 in flight fill batches of 16: {sizes:?}"
    );
    assert!(batches.iter().all(|b| b.content_type == BATCH_CONTENT_TYPE));
    let counts = acknowledged_counts(&batches);
    assert_eq!(counts.len(), records.len(), "every record sent");
    assert!(counts.values().all(|n| *n == 1), "each record acknowledged exactly once");

    let event = batches.iter().flat_map(|b| b.events.iter()).find(|e| e["id"] == id(&records[5])).unwrap();
    assert_eq!(event["specversion"], "1.0");
    assert_eq!(event["type"], "io.leasehold.kinesis.record");
    assert_eq!(event["source"], "kinesis:orders");
    assert_eq!(event["partitionkey"], "key-5");
    assert_eq!(event["shardid"], "shardId-000000000001");
    assert_eq!(event["sequencenumber"], records[5].sequence_number.as_str());
    assert_eq!(event["time"], "2023-11-14T22:13:20.000Z");
    assert_eq!(SeenBatch::data(event), "record 5", "data_base64 holds the raw data");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_events_and_failing_batches_are_retried_until_every_record_is_delivered() {
    // Every third batch answers 503; in the others, each event whose number is a multiple of 4 fails the
    // first time it is answered 2xx.
    let answer: Answer = Arc::new(|n, events, before| {
        if n % 3 == 0 {
            return (StatusCode::SERVICE_UNAVAILABLE, serde_json::Value::Null);
        }
        let failed: Vec<serde_json::Value> = events
            .iter()
            .filter(|e| {
                let number: usize = SeenBatch::data(e).trim_start_matches("record ").parse().unwrap();
                let answered = before.iter().filter(|b| b.status.is_success()).flat_map(SeenBatch::ids);
                number.is_multiple_of(4)
                    && !answered.collect::<Vec<_>>().contains(&e["id"].as_str().unwrap().to_string())
            })
            .map(|e| serde_json::json!({"id": e["id"], "error": "not yet"}))
            .collect();
        (StatusCode::OK, serde_json::json!({ "failed": failed }))
    });
    let (server, batches) = batch_server(answer).await;
    let records: Vec<Record> = (0..200).map(numbered).collect();
    let (results, failures) = deliver(batched(&server, 8), &records, 32).await;
    assert!(results.iter().all(Result::is_ok), "every record delivered in the end: {results:?}");

    let batches = batches.lock().unwrap().clone();
    let unavailable = batches.iter().filter(|b| b.status == StatusCode::SERVICE_UNAVAILABLE).count();
    let failed_events: usize = batches.iter().map(|b| b.failed.len()).sum();
    assert!(unavailable > 0 && failed_events == 50, "503 batches: {unavailable}, failed events: {failed_events}");
    let in_503: usize = batches.iter().filter(|b| !b.status.is_success()).map(|b| b.events.len()).sum();
    assert_eq!(failures, in_503 + failed_events, "each failure reached its record's caller as retryable");
    let counts = acknowledged_counts(&batches);
    assert_eq!(counts.len(), records.len(), "nothing lost");
    assert!(counts.values().all(|n| *n == 1), "each record acknowledged exactly once: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_reject_the_whole_batch_and_failed_events_follow_their_flag() {
    let records: Vec<Record> = (0..6).map(numbered).collect();
    for (status, retryable) in [(StatusCode::UNPROCESSABLE_ENTITY, false), (StatusCode::TOO_MANY_REQUESTS, true)] {
        let (server, batches) = batch_server(Arc::new(move |_, _, _| (status, serde_json::Value::Null))).await;
        let processor = batched(&server, 6);
        let results = futures::future::join_all(records.iter().map(|r| ack(&processor, r))).await;
        for result in &results {
            let error = result.as_ref().expect_err("the whole batch fails");
            assert_eq!(error.retryable, retryable, "{status}: {error:?}");
            assert!(error.message.contains(status.as_str()), "{error:?}");
        }
        assert_eq!(batches.lock().unwrap().len(), 1, "{status}: one request for the six records");
    }

    // A 2xx naming one event as failed, not retryable: only that record is rejected.
    let rejected = id(&records[2]);
    let answer: Answer = Arc::new(move |_, _, _| {
        (StatusCode::OK, serde_json::json!({"failed": [{"id": rejected, "retryable": false, "error": "bad payload"}]}))
    });
    let (server, _batches) = batch_server(answer).await;
    let processor = batched(&server, 6);
    let results = futures::future::join_all(records.iter().map(|r| ack(&processor, r))).await;
    for (n, result) in results.iter().enumerate() {
        match n {
            2 => {
                assert!(result.as_ref().is_err_and(|e| !e.retryable && e.message.contains("bad payload")), "{result:?}")
            }
            _ => assert!(result.is_ok(), "{n}: {result:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_in_a_batch_answer_reach_the_event_they_name() {
    // Each event gets two outputs: its id under its own key, and its data under a fixed key.
    let answer: Answer = Arc::new(|_, events, _| {
        let outputs: Vec<serde_json::Value> = events
            .iter()
            .flat_map(|e| {
                let id = base64::engine::general_purpose::STANDARD.encode(e["id"].as_str().unwrap());
                [
                    serde_json::json!({"id": e["id"], "data": id, "carryPartitionKey": true}),
                    serde_json::json!({"id": e["id"], "data": e["data_base64"], "partitionKey": "fixed"}),
                ]
            })
            .collect();
        (StatusCode::OK, serde_json::json!({ "outputs": outputs }))
    });
    let (server, batches) = batch_server(answer).await;
    let processor = batched(&server, 8);
    let records: Vec<Record> = (0..8).map(numbered).collect();
    let emitted = futures::future::join_all(records.iter().map(|r| {
        let processor = processor.clone();
        async move {
            let mut outputs = Outputs::default();
            processor.process(r, &mut outputs).await.expect("acknowledged");
            outputs.into_vec()
        }
    }))
    .await;
    assert!(batches.lock().unwrap().iter().any(|b| b.events.len() > 1), "sent in batches");
    for (record, outputs) in records.iter().zip(emitted) {
        assert_eq!(outputs.len(), 2, "{record:?}");
        assert_eq!(outputs[0].data, id(record).into_bytes(), "the first output, in order");
        assert_eq!(outputs[0].key(None), record.partition_key, "carries its own event's key");
        assert_eq!(outputs[1].data, record.data);
        assert_eq!(outputs[1].key(None), "fixed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_delivers_a_stream_in_batches_through_a_failing_server_in_key_order() {
    // A batch made only of records never sent before answers 503 every other time; in a 2xx answer,
    // records numbered 0, 3, 6, 9 fail (retryable) the first time, and key-1:4 is refused for good.
    let answer: Answer = Arc::new(|n, events, before| {
        let sent_before = |id: &serde_json::Value| before.iter().any(|b| b.events.iter().any(|e| e["id"] == *id));
        if n % 2 == 0 && !events.iter().any(|e| sent_before(&e["id"])) {
            return (StatusCode::SERVICE_UNAVAILABLE, serde_json::Value::Null);
        }
        let answered = |id: &serde_json::Value| {
            before.iter().filter(|b| b.status.is_success()).any(|b| b.events.iter().any(|e| e["id"] == *id))
        };
        let mut failed = Vec::new();
        for e in events {
            let data = SeenBatch::data(e);
            let number: u64 = data.rsplit(':').next().and_then(|n| n.parse().ok()).unwrap_or(0);
            if data == "key-1:4" {
                failed.push(serde_json::json!({"id": e["id"], "retryable": false, "error": "refused"}));
            } else if number.is_multiple_of(3) && !answered(&e["id"]) {
                failed.push(serde_json::json!({"id": e["id"]}));
            }
        }
        (StatusCode::OK, serde_json::json!({ "failed": failed }))
    });
    let (server, batches) = batch_server(answer).await;
    let http = format!("{{url: '{}/batch', timeout: 2s, batch: {{maxRecords: 8, maxDelay: 20ms}}}}", server.endpoint());
    let acknowledged = || batches.lock().unwrap().iter().map(|b| b.acknowledged().len()).sum::<usize>();
    let _worker = run_http_worker("http-batch", &http, 5, acknowledged).await;

    let batches = batches.lock().unwrap().clone();
    let mut per_key: HashMap<String, Vec<String>> = HashMap::new();
    for event in batches.iter().flat_map(SeenBatch::acknowledged) {
        per_key.entry(event["partitionkey"].as_str().unwrap().to_string()).or_default().push(SeenBatch::data(&event));
    }
    assert_acknowledged_once_in_key_order(&per_key);
    assert!(batches.iter().any(|b| b.events.len() > 1), "records went out in batches");
    assert!(batches.iter().any(|b| b.status == StatusCode::SERVICE_UNAVAILABLE), "some batches failed whole");
    let refusals = batches.iter().flat_map(|b| &b.failed).filter(|id| {
        batches.iter().flat_map(|b| &b.events).any(|e| e["id"] == **id && SeenBatch::data(e) == "key-1:4")
    });
    assert_eq!(refusals.count(), 1, "a refused event is not retried: the policy (skip) applies at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_batch_item_failures_fail_only_the_records_they_name() {
    // Lambda's partial batch response: the first time they are answered, records numbered 0, 5, 10, ...
    // are named by sequence number; every other record is acknowledged the first time.
    let answer: Answer = Arc::new(|_, events, before| {
        let answered = |id: &serde_json::Value| {
            before.iter().filter(|b| b.status.is_success()).any(|b| b.events.iter().any(|e| e["id"] == *id))
        };
        let failures: Vec<serde_json::Value> = events
            .iter()
            .filter(|e| {
                let number: usize = SeenBatch::data(e).trim_start_matches("record ").parse().unwrap();
                number.is_multiple_of(5) && !answered(&e["id"])
            })
            .map(|e| serde_json::json!({"itemIdentifier": e["sequencenumber"]}))
            .collect();
        (StatusCode::OK, serde_json::json!({ "batchItemFailures": failures }))
    });
    let (server, batches) = batch_server(answer).await;
    let records: Vec<Record> = (0..100).map(numbered).collect();
    let (results, failures) = deliver(batched(&server, 10), &records, 20).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(failures, 20, "exactly the named records failed, once each");
    let batches = batches.lock().unwrap().clone();
    assert!(batches.iter().any(|b| b.events.len() > 1), "sent in batches");
    let sent = |n: usize| batches.iter().flat_map(|b| b.ids()).filter(|i| *i == id(&records[n])).count();
    for n in 0..records.len() {
        assert_eq!(sent(n), if n.is_multiple_of(5) { 2 } else { 1 }, "record {n}");
    }
    let counts = acknowledged_counts(&batches);
    assert_eq!(counts.len(), records.len(), "nothing lost");
    assert!(counts.values().all(|n| *n == 1), "each record acknowledged exactly once");

    // An identifier naming no record of the batch fails the whole batch, retryable (as Lambda does).
    let answer: Answer =
        Arc::new(|_, _, _| (StatusCode::OK, serde_json::json!({"batchItemFailures": [{"itemIdentifier": "nope"}]})));
    let (server, _) = batch_server(answer).await;
    let processor = batched(&server, 4);
    let results = futures::future::join_all(records[..4].iter().map(|r| ack(&processor, r))).await;
    for result in results {
        assert!(result.is_err_and(|e| e.retryable && e.message.contains("not in the batch")));
    }
}

/// 64 records at once, in one batch of 64; the server answers 500 to every request holding record 37.
/// Returns every batch seen, each record's result, and how many attempts failed.
async fn poisoned_batches(bisect: bool) -> (Vec<SeenBatch>, Vec<Result<(), ProcessError>>, usize) {
    let poison = id(&numbered(37));
    let answer: Answer = Arc::new(move |_, events, _| {
        if events.iter().any(|e| e["id"] == poison.as_str()) {
            (StatusCode::INTERNAL_SERVER_ERROR, serde_json::Value::Null)
        } else {
            (StatusCode::OK, serde_json::Value::Null)
        }
    });
    let (server, batches) = batch_server(answer).await;
    let records: Vec<Record> = (0..64).map(numbered).collect();
    let (results, failures) =
        deliver(batched_with(&server, 64, Duration::from_millis(300), bisect), &records, 64).await;
    let batches = batches.lock().unwrap().clone();
    assert_eq!(batches[0].events.len(), 64, "the first request carries all 64");
    (batches, results, failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bisect_isolates_a_poison_record_within_log2_rounds() {
    let (batches, results, _) = poisoned_batches(true).await;
    let records: Vec<Record> = (0..64).map(numbered).collect();
    for (n, result) in results.iter().enumerate() {
        match n {
            37 => assert!(result.as_ref().is_err_and(|e| e.retryable), "the poison record fails: {result:?}"),
            _ => assert!(result.is_ok(), "record {n}: {result:?}"),
        }
    }
    // Each of the other 63 is sent in at most log2(64) + 1 = 7 requests (the halves it is in) and
    // acknowledged exactly once.
    for record in records.iter().filter(|r| id(r) != id(&records[37])) {
        let rounds = batches.iter().filter(|b| b.ids().contains(&id(record))).count();
        assert!((1..=7).contains(&rounds), "{}: {rounds} requests", id(record));
    }
    let counts = acknowledged_counts(&batches);
    assert_eq!(counts.len(), 63);
    assert!(counts.values().all(|n| *n == 1), "each acknowledged exactly once");
    // The first attempt's split: 64, then two halves at each of 6 levels (13 requests); after it the
    // poison record goes alone, once per attempt (20 attempts in `deliver`).
    let first: Vec<usize> = batches.iter().take(13).map(|b| b.events.len()).collect();
    assert_eq!(first.iter().filter(|n| **n == 1).count(), 2, "{first:?}");
    assert_eq!(batches.len(), 13 + 19, "{:?}", batches.iter().map(|b| b.events.len()).collect::<Vec<_>>());
    assert!(batches[13..].iter().all(|b| b.ids() == vec![id(&records[37])]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_bisect_a_poison_record_fails_the_whole_batch() {
    // Today's behaviour, kept without `retry.bisect`: every record of a request holding the poison record
    // fails that attempt and is retried in place; records re-batched with it fail again, so neighbours
    // may run out of attempts with it.
    let (batches, results, failures) = poisoned_batches(false).await;
    assert_eq!(batches[0].status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(failures >= 64, "the first answer failed all 64: {failures}");
    assert!(results[37].as_ref().is_err_and(|e| e.retryable));
    let counts = acknowledged_counts(&batches);
    assert!(counts.values().all(|n| *n == 1), "nothing acknowledged twice");
    assert!(batches.iter().all(|b| !b.status.is_success() || b.events.iter().all(|e| e["id"] != id(&numbered(37)))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_retries_only_the_batch_item_failures_in_key_order() {
    // Lambda's answer shape from the sidecar: records numbered 0, 3, 6, 9 are named the first time they
    // are answered; key-1:4 is named every time (it fails all 5 attempts, then the policy skips it).
    let answer: Answer = Arc::new(|_, events, before| {
        let answered = |id: &serde_json::Value| {
            before.iter().filter(|b| b.status.is_success()).any(|b| b.events.iter().any(|e| e["id"] == *id))
        };
        let mut failures = Vec::new();
        for e in events {
            let data = SeenBatch::data(e);
            let number: u64 = data.rsplit(':').next().and_then(|n| n.parse().ok()).unwrap_or(0);
            if data == "key-1:4" || (number.is_multiple_of(3) && !answered(&e["id"])) {
                failures.push(serde_json::json!({"itemIdentifier": e["sequencenumber"]}));
            }
        }
        (StatusCode::OK, serde_json::json!({ "batchItemFailures": failures }))
    });
    let (server, batches) = batch_server(answer).await;
    let http = format!("{{url: '{}/batch', timeout: 2s, batch: {{maxRecords: 8, maxDelay: 20ms}}}}", server.endpoint());
    let acknowledged = || batches.lock().unwrap().iter().map(|b| b.acknowledged().len()).sum::<usize>();
    let _worker = run_http_worker("http-lambda", &http, 5, acknowledged).await;

    let batches = batches.lock().unwrap().clone();
    let mut per_key: HashMap<String, Vec<String>> = HashMap::new();
    for event in batches.iter().flat_map(SeenBatch::acknowledged) {
        per_key.entry(event["partitionkey"].as_str().unwrap().to_string()).or_default().push(SeenBatch::data(&event));
    }
    assert_acknowledged_once_in_key_order(&per_key);
    assert!(batches.iter().any(|b| b.events.len() > 1), "records went out in batches");
    let sent = |data: &str| batches.iter().flat_map(|b| &b.events).filter(|e| SeenBatch::data(e) == data).count();
    for k in 0..8 {
        for n in 0..10 {
            let data = format!("key-{k}:{n}");
            let expected = match (data.as_str(), n % 3) {
                ("key-1:4", _) => 5,
                (_, 0) => 2,
                _ => 1,
            };
            assert_eq!(sent(&data), expected, "{data}: only named records are sent again");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_bisect_isolates_a_poison_record_which_meets_its_policy() {
    // One shard, 64 keys, 64 records in flight at once: the first request holds all 64. Every request
    // holding key-37:0 answers 500.
    let answer: Answer = Arc::new(|_, events, _| {
        if events.iter().any(|e| SeenBatch::data(e) == "key-37:0") {
            (StatusCode::INTERNAL_SERVER_ERROR, serde_json::Value::Null)
        } else {
            (StatusCode::OK, serde_json::Value::Null)
        }
    });
    let (server, batches) = batch_server(answer).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "http-bisect", 1).await;
    let written = records(64, 0, 1);
    put_records(&kinesis, &stream, &written).await;
    let table = leasehold_testkit::unique_name("http-bisect");
    let http =
        format!("{{url: '{}/batch', timeout: 2s, batch: {{maxRecords: 64, maxDelay: 500ms}}}}", server.endpoint());
    let config = config(
        &stream,
        Some(&table),
        "startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 64\n\
         retry: {maxAttempts: 3, backoff: 10ms, onExhausted: skip, bisect: true}\n",
    )
    .replace("processor: {stdout: {}}", &format!("processor: {{http: {http}}}"));
    let worker = spawn(&config, "http-bisect-1");
    let acknowledged = || batches.lock().unwrap().iter().map(|b| b.acknowledged().len()).sum::<usize>();
    wait_for("the 63 others acknowledged", Duration::from_secs(60), async || acknowledged() >= 63).await;
    wait_for("the poison record skipped", Duration::from_secs(20), async || {
        worker.stderr_text().contains("record skipped after its attempts ran out")
    })
    .await;
    let batches = batches.lock().unwrap().clone();
    assert_eq!(batches[0].events.len(), 64, "one batch of 64 first");
    let mut acknowledged: Vec<String> =
        batches.iter().flat_map(SeenBatch::acknowledged).map(|e| SeenBatch::data(&e)).collect();
    acknowledged.sort();
    let mut expected: Vec<String> = (0..64).map(|k| format!("key-{k}:0")).filter(|d| d != "key-37:0").collect();
    expected.sort();
    assert_eq!(acknowledged, expected, "the other 63 acknowledged exactly once");
    for data in &expected {
        let rounds = batches.iter().filter(|b| b.events.iter().any(|e| SeenBatch::data(e) == *data)).count();
        assert!(rounds <= 7, "{data}: in {rounds} requests, more than log2(64) + 1");
    }
    let alone = batches.iter().filter(|b| b.events.len() == 1 && SeenBatch::data(&b.events[0]) == "key-37:0");
    assert_eq!(alone.count(), 3, "the poison record failed alone once per attempt (maxAttempts 3), then skip");
}
