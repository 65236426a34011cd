//! The `http` processor against a local server that fails some requests: the CloudEvents headers, how
//! each answer is classified, and a worker process delivering a stream through it.

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
use leasehold_worker::processor::{HttpProcessor, Record, RecordProcessor};

/// One request the server saw, and what it answered.
#[derive(Debug, Clone)]
struct Seen {
    headers: HashMap<String, String>,
    body: String,
    status: StatusCode,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Serves `router` on 127.0.0.1, port 0; returns its base URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    format!("http://{address}")
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
    let base = serve(router).await;
    let timeout = Duration::from_millis(300);
    let processor = |path: &str| HttpProcessor::new(&format!("{base}{path}"), timeout).expect("processor");

    processor("/ok").process(&record("{\"total\":7}")).await.expect("2xx acknowledges");
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

    let error = processor("/unavailable").process(&record("x")).await.expect_err("5xx fails");
    assert!(error.retryable && error.message.contains("503"), "{error:?}");
    let error = processor("/busy").process(&record("x")).await.expect_err("429 fails");
    assert!(error.retryable, "429 is retried: {error:?}");
    let error = processor("/bad").process(&record("x")).await.expect_err("4xx fails");
    assert!(!error.retryable && error.message.contains("422"), "other 4xx reject the record: {error:?}");
    let started = std::time::Instant::now();
    let error = processor("/slow").process(&record("x")).await.expect_err("timeout fails");
    assert!(error.retryable && started.elapsed() < Duration::from_secs(2), "{error:?}");
    // A port nobody listens on: connection refused.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let refused = HttpProcessor::new(&format!("http://{closed}/"), timeout).unwrap();
    let error = refused.process(&record("x")).await.expect_err("no server");
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
    let base = serve(router).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "http", 2).await;
    let written = records(8, 0, 10);
    put_records(&kinesis, &stream, &written).await;
    let table = leasehold_testkit::unique_name("http");
    let config = config(
        &stream,
        Some(&table),
        "startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 4\n\
         retry: {maxAttempts: 3, backoff: 10ms, onExhausted: skip}\n",
    )
    .replace("processor: {stdout: {}}", &format!("processor: {{http: {{url: '{base}/records', timeout: 2s}}}}"));
    let worker = spawn(&config, "http-1");
    let acknowledged = || log.lock().unwrap().iter().filter(|s| s.status.is_success()).count();
    wait_for("every record but one acknowledged", Duration::from_secs(60), || acknowledged() >= written.len() - 1);
    wait_for("the rejected record skipped", Duration::from_secs(10), || {
        worker.stderr_text().contains("record skipped after its attempts ran out")
    });
    let seen = log.lock().unwrap().clone();
    let mut per_key: HashMap<String, Vec<String>> = HashMap::new();
    for s in seen.iter().filter(|s| s.status.is_success()) {
        per_key.entry(s.headers["ce-partitionkey"].clone()).or_default().push(s.body.clone());
    }
    for k in 0..8 {
        let key = format!("key-{k}");
        let expected: Vec<String> = (0..10).map(|n| format!("{key}:{n}")).filter(|d| d != "key-1:4").collect();
        assert_eq!(per_key[&key], expected, "{key}: acknowledged once each, in order");
    }
    let unavailable = seen.iter().filter(|s| s.status == StatusCode::SERVICE_UNAVAILABLE).count();
    assert_eq!(unavailable, 8 * 4, "the first attempt of every record numbered 0, 3, 6, 9 failed and was retried");
    let rejected = seen.iter().filter(|s| s.body == "key-1:4").count();
    assert_eq!(rejected, 1, "a 400 is not retried: the policy (skip) applies at once");
}
