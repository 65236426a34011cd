//! The HTTP endpoints every Leasehold binary serves: `/metrics` (OpenMetrics text), `/healthz` (the
//! process answers) and `/readyz` (what the binary's readiness source says, and never once shutdown
//! began). One module for the worker and the operator, so probes and scrapes behave the same.
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use leasehold_worker::health::{self, Health};
//! use prometheus_client::registry::Registry;
//! use tokio_util::sync::CancellationToken;
//!
//! let registry = Arc::new(Registry::with_prefix("my_app"));
//! let ready = Arc::new(AtomicBool::new(false));
//! let readiness = ready.clone();
//! let health = Health::from_registry(registry, move || readiness.load(Ordering::SeqCst));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9090").await?;
//! let shutdown = CancellationToken::new();
//! tokio::spawn(health::serve(listener, health, shutdown.clone()));
//! ready.store(true, Ordering::SeqCst);
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Content type of the OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Encoder = dyn Fn(&mut String) -> fmt::Result + Send + Sync;
type ReadinessSource = dyn Fn() -> bool + Send + Sync;

/// What the endpoints answer: the metrics text and whether the binary is ready.
#[derive(Clone)]
pub struct Health {
    encode: Arc<Encoder>,
    ready: Arc<ReadinessSource>,
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health").field("ready", &(self.ready)()).finish_non_exhaustive()
    }
}

impl Health {
    /// Endpoints whose `/metrics` writes with `encode` and whose `/readyz` asks `ready`.
    pub fn new(
        encode: impl Fn(&mut String) -> fmt::Result + Send + Sync + 'static,
        ready: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Self {
        Self { encode: Arc::new(encode), ready: Arc::new(ready) }
    }

    /// Endpoints serving every metric of `registry`.
    pub fn from_registry(registry: Arc<Registry>, ready: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self::new(move |out| prometheus_client::encoding::text::encode(out, &registry), ready)
    }
}

#[derive(Clone)]
struct Shared {
    health: Health,
    shutdown: CancellationToken,
}

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    let mut body = String::new();
    match (shared.health.encode)(&mut body) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], e.to_string()),
    }
}

async fn ready(State(shared): State<Shared>) -> impl IntoResponse {
    // A process that is stopping must leave its Service's endpoints at once, whatever the source says.
    if !shared.shutdown.is_cancelled() && (shared.health.ready)() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// The router of the three endpoints; `/readyz` fails once `shutdown` is cancelled.
pub fn router(health: Health, shutdown: CancellationToken) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(Shared { health, shutdown })
}

/// Serves the endpoints on `listener` until `stop` is cancelled. `/readyz` answers 503 from the moment
/// `stop` is cancelled; to keep answering (503) during a graceful shutdown, pass a `stop` cancelled later
/// and make the readiness source say false first.
pub async fn serve(listener: tokio::net::TcpListener, health: Health, stop: CancellationToken) -> std::io::Result<()> {
    serve_router(listener, router(health, stop.clone()), stop).await
}

/// Serves `app` (the endpoints' [`router`], perhaps with routes of the binary's own merged in) on
/// `listener` until `stop` is cancelled.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, app).with_graceful_shutdown(async move { stop.cancelled().await }).await
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use prometheus_client::metrics::counter::Counter;

    use super::*;

    /// One GET over a fresh connection: (status code, content type, body).
    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        let (head, body) = response.split_once("\r\n\r\n").expect("a response");
        let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status code");
        let content_type = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_string))
            .unwrap_or_default();
        (code, content_type, body.to_string())
    }

    async fn start(health: Health, stop: CancellationToken) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move { serve(listener, health, stop).await.expect("serve") });
        (addr, task)
    }

    #[tokio::test]
    async fn metrics_come_from_the_registry_and_readiness_from_its_source() {
        let mut registry = Registry::with_prefix("test");
        let counter = Counter::<u64>::default();
        registry.register("things", "Things counted", counter.clone());
        counter.inc_by(7);
        let ready = Arc::new(AtomicBool::new(false));
        let source = ready.clone();
        let stop = CancellationToken::new();
        let (addr, task) =
            start(Health::from_registry(Arc::new(registry), move || source.load(Ordering::SeqCst)), stop.clone()).await;

        let (code, content_type, body) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert_eq!(content_type, OPENMETRICS_CONTENT_TYPE);
        assert!(body.contains("test_things_total 7") && body.ends_with("# EOF\n"), "{body}");
        assert_eq!(get(addr, "/healthz").await.0, 200);
        assert_eq!(get(addr, "/readyz").await.0, 503, "not ready until the source says so");
        ready.store(true, Ordering::SeqCst);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        ready.store(false, Ordering::SeqCst);
        assert_eq!(get(addr, "/readyz").await.0, 503, "the source is asked on every probe");

        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops when cancelled").expect("task");
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "no longer listening");
    }

    #[tokio::test]
    async fn readiness_fails_once_shutdown_began_whatever_the_source_says() {
        let shutdown = CancellationToken::new();
        let app = router(Health::new(|out| out.write_str("x 1\n"), || true), shutdown.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Served independently of `shutdown`, as a binary does that keeps answering while it stops.
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        assert_eq!(get(addr, "/readyz").await.0, 200);
        shutdown.cancel();
        assert_eq!(get(addr, "/readyz").await.0, 503);
        assert_eq!(get(addr, "/healthz").await.0, 200, "still alive while stopping");
        let (code, _, body) = get(addr, "/metrics").await;
        assert_eq!((code, body.as_str()), (200, "x 1\n"), "a closure encoder is served as written");
        server.abort();
    }

    #[tokio::test]
    async fn an_encoding_failure_is_a_500() {
        let stop = CancellationToken::new();
        let (addr, _task) = start(Health::new(|_| Err(fmt::Error), || true), stop.clone()).await;
        assert_eq!(get(addr, "/metrics").await.0, 500);
        stop.cancel();
    }
}
