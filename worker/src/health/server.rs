//! The endpoints' HTTP server: axum's router on hyper's http1 server, bounded against slow and greedy
//! clients (`axum::serve` sets no timer: one slow client per file descriptor).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::timeout::TimeoutLayer;

use super::{Health, LogThrottle, OPENMETRICS_CONTENT_TYPE};

/// What one server allows a client: how long it may take to send a request's headers (also the
/// longest an idle keep-alive connection is kept), how long a request may take in all, how many
/// connections are open at once (more are accepted and closed at once, so the listen queue never
/// fills with clients nobody serves), how large a request body may be, and how long one connection
/// lives before it is closed gracefully.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Headers not complete within this are answered by closing the connection.
    pub header_read_timeout: Duration,
    /// A request not answered within this is answered 408.
    pub request_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Request bodies over this are refused (413) by the routes that read one (the others read none).
    pub max_body_bytes: usize,
    /// A connection older than this is closed once its request in progress is answered.
    pub max_connection_age: Duration,
}

impl Default for ServerLimits {
    /// The limits of `/metrics`, `/healthz` and `/readyz`: a scraper and the kubelet's probes need a
    /// few connections and no body; 2,048 connections leave room for 1,000 stalled clients beside them
    /// (each closed within the header timeout).
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            max_connections: 2048,
            max_body_bytes: 64 * 1024,
            max_connection_age: Duration::from_secs(300),
        }
    }
}

/// How long connections get to finish their requests once the server stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Raises this process's soft limit of open files to its hard limit, so connections (and shards) are
/// not refused for want of descriptors long before the machine runs short; the limit in force after.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

#[derive(Clone)]
struct Shared {
    health: Health,
    shutdown: CancellationToken,
}

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    match shared.health.metrics_text() {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], e.to_string()),
    }
}

async fn ready(State(shared): State<Shared>) -> impl IntoResponse {
    // A process that is stopping must leave its Service's endpoints at once, whatever the source says.
    if !shared.shutdown.is_cancelled() && shared.health.is_ready() {
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
/// `listener` until `stop` is cancelled, within the default [`ServerLimits`].
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    serve_router_with(listener, app, stop, ServerLimits::default()).await
}

/// [`serve_router`] within `limits`. On `stop` no connection is accepted any more, and those open
/// finish their requests (bounded by a few seconds).
pub async fn serve_router_with(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: CancellationToken,
    limits: ServerLimits,
) -> std::io::Result<()> {
    let app = app
        // Routes that set their own limit (the handoff notices') keep it: theirs is applied later.
        .layer(axum::extract::DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, limits.request_timeout));
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let throttle = LogThrottle::new(Duration::from_secs(10));
    let address = listener.local_addr().ok();
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (EMFILE) or the like: the listener is still good; waiting a
                    // little lets connections close rather than spinning on the same error.
                    if let Some(left_out) = throttle.allow("accept") {
                        tracing::warn!(?address, error = %e, left_out, "cannot accept a connection");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            if let Some(left_out) = throttle.allow("limit") {
                tracing::warn!(
                    ?address,
                    limit = limits.max_connections,
                    left_out,
                    "too many connections; closing new ones"
                );
            }
            drop(stream);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::trace!(error = %e, "TCP_NODELAY not set");
        }
        let service = TowerToHyperService::new(app.clone());
        let stop = stop.clone();
        connections.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).keep_alive(true);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                // Errors of one connection (a client gone, headers too slow) concern that client only.
                _ = connection.as_mut() => return,
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(limits.max_connection_age) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, connection).await;
        });
    }
    connections.close();
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, connections.wait()).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fmt::{self, Write as _};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::registry::Registry;

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
