//! The worker's HTTP endpoints: `/metrics` (Prometheus/OpenMetrics text), `/healthz` (the process
//! answers) and `/readyz` (the coordinator runs and no shutdown has begun).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], shared.metrics.encode())
}

async fn ready(State(shared): State<Shared>) -> impl IntoResponse {
    // Not ready before the lease store is reachable, nor once a shutdown began (the pod is leaving).
    if shared.metrics.is_ready() && !shared.shutdown.is_cancelled() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// Serves the endpoints on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics_state: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(Shared { metrics: metrics_state, shutdown: shutdown.clone() });
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}
