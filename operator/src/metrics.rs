//! Prometheus metrics of the operator and the HTTP endpoints that serve them with health checks.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// The operator's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Reconciles run.
    pub reconciles: Counter,
    /// Reconciles that failed.
    pub failures: Counter,
    /// Reconcile duration in seconds.
    pub duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("leasehold_operator");
        let reconciles = Counter::default();
        let failures = Counter::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register("reconcile_failures", "Reconciles that failed", failures.clone());
        registry.register("reconcile_duration_seconds", "Reconcile duration", duration.clone());
        Self { registry: Arc::new(registry), reconciles, failures, duration }
    }
}

async fn metrics(State(metrics): State<Metrics>) -> impl IntoResponse {
    let mut body = String::new();
    match encode(&mut body, &metrics.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
            body,
        ),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], e.to_string()),
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics_state: Metrics,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(metrics_state);
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}
