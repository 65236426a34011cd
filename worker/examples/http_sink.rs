//! The receiving end of the `http` processor: an HTTP server that takes each record the worker posts
//! (a CloudEvent in binary mode: the data as the body, the metadata in `ce-` headers) and prints it as
//! one JSON line, the shape the `stdout` processor prints. The tests on a real node run it as a sidecar
//! of the worker pods (`spec.template`), with `processor: {http: {url: 'http://127.0.0.1:8080/records'}}`.
//!
//! ```sh
//! cargo run -p leasehold-worker --example http_sink -- 127.0.0.1:8080
//! ```
//!
//! It answers 200 with an empty body, so the worker publishes no outputs.

use std::process::ExitCode;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;

/// One printed line: the record's metadata from the CloudEvent headers and its data, base64.
fn line(headers: &HeaderMap, body: &[u8]) -> serde_json::Value {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let mut line = serde_json::json!({
        "shardId": header("ce-shardid"),
        "sequenceNumber": header("ce-sequencenumber"),
        "partitionKey": header("ce-partitionkey"),
        "data": base64::engine::general_purpose::STANDARD.encode(body),
    });
    if let Some(sub) = header("ce-subsequencenumber") {
        line["subSequenceNumber"] = serde_json::Value::String(sub);
    }
    line
}

/// How long it keeps answering after SIGTERM: longer than the worker needs to drain and release.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(3);

async fn receive(headers: HeaderMap, body: Bytes) -> StatusCode {
    println!("{}", line(&headers, &body));
    StatusCode::OK
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let address = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:8080".into());
    let listener = match tokio::net::TcpListener::bind(&address).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("http_sink: cannot listen on {address}: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!("http_sink: listening on {address}");
    let app = Router::new().fallback(receive);
    let stop = async {
        // SIGTERM reaches every container of the pod at once: keep answering while the worker beside
        // it finishes its in-flight records and checkpoints, or those would fail and be repeated.
        if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            term.recv().await;
            tokio::time::sleep(DRAIN).await;
        }
    };
    match axum::serve(listener, app).with_graceful_shutdown(stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http_sink: {e}");
            ExitCode::FAILURE
        }
    }
}
