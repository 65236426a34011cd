//! Pieces of the chaos suite: a seeded random source the nemesis draws every choice from, and a proxy
//! in front of an emulator whose faults (cut, throttle, delay) can be switched while it runs and which
//! records every successful lease-table write it forwards, as an account of the lease history kept
//! independently of the workers' own logs.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::server::LocalServer;

/// SplitMix64: small, fast and the same on every platform and version, so a seed printed by one run
/// replays the same choices in another.
#[derive(Debug, Clone)]
pub struct SeededRng {
    state: u64,
}

impl SeededRng {
    /// A source seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// A duration in `low..=high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.between(low, high))
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// An independent source for a sub-task (a nemesis lane), derived from this one.
    pub fn fork(&mut self) -> Self {
        Self::new(self.next_u64())
    }
}

/// A seed for a run that was not given one: from the clock and the process id.
pub fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let mut rng = SeededRng::new((nanos as u64) ^ (u64::from(std::process::id()) << 32));
    rng.next_u64()
}

/// The faults a [`ChaosProxy`] applies now; switched by the nemesis while traffic flows.
#[derive(Debug, Default)]
pub struct Faults {
    cut: AtomicBool,
    throttle_permille: AtomicU32,
    delay_ms: AtomicU64,
    record_delay_us: AtomicU64,
}

impl Faults {
    /// Cut off: every request is answered `ServiceUnavailable` after a short hang, none forwarded.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// This share (in thousandths) of requests is answered with a throttling error, not forwarded.
    pub fn set_throttle_permille(&self, permille: u32) {
        self.throttle_permille.store(permille.min(1000), Ordering::SeqCst);
    }

    /// Every forwarded request waits this long before it goes upstream.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Every answer is held back this long per record it carries (`Records` of a GetRecords answer):
    /// a page's size sets its latency, as on a loaded Kinesis, so a big page can outlast a client's
    /// attempt timeout where a small one does not.
    pub fn set_record_delay(&self, per_record: Duration) {
        self.record_delay_us.store(per_record.as_micros() as u64, Ordering::SeqCst);
    }

    /// No faults.
    pub fn heal(&self) {
        self.set_cut(false);
        self.set_throttle_permille(0);
        self.set_delay(Duration::ZERO);
        self.set_record_delay(Duration::ZERO);
    }
}

/// One write the lease table accepted (HTTP 200), as it passed through a proxy.
#[derive(Debug, Clone)]
pub struct LeaseWrite {
    /// Which process sent it (the tag its proxy was started with).
    pub by: String,
    /// `UpdateItem`, `PutItem` or `DeleteItem`.
    pub operation: String,
    /// The request body.
    pub request: serde_json::Value,
    /// The response body (`Attributes` holds the row after an UpdateItem with `ALL_NEW`).
    pub response: serde_json::Value,
    /// When the request reached the proxy (no later than when the worker sent it, plus loopback).
    pub arrived: Instant,
    /// When the proxy sent it upstream (after any injected delay): the write cannot have taken effect
    /// before this.
    pub forwarded: Instant,
    /// When the answer came back.
    pub answered: Instant,
}

/// Every accepted lease write, shared by the proxies of all processes of one run.
pub type WriteLog = Arc<Mutex<Vec<LeaseWrite>>>;

struct Shared {
    upstream: String,
    client: Client<HttpConnector, Body>,
    faults: Arc<Faults>,
    tag: String,
    log: Option<WriteLog>,
    requests: AtomicU64,
    // A per-proxy sequence for throttling decisions: deterministic in the share, not in which request.
    throttle_counter: AtomicU64,
}

/// A proxy to an emulator with switchable faults and, for DynamoDB, a log of accepted writes; stops
/// when dropped.
pub struct ChaosProxy {
    server: LocalServer,
    shared: Arc<Shared>,
}

impl ChaosProxy {
    /// Starts a proxy to `upstream` (`http://host:port`) for the process tagged `tag`; when `log` is
    /// given, every accepted UpdateItem, PutItem and DeleteItem is appended to it.
    pub async fn start(upstream: &str, tag: &str, faults: Arc<Faults>, log: Option<WriteLog>) -> Self {
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_string(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            faults,
            tag: tag.to_string(),
            log,
            requests: AtomicU64::new(0),
            throttle_counter: AtomicU64::new(0),
        });
        let app = Router::new().fallback(forward).with_state(shared.clone());
        Self { server: LocalServer::start(app).await, shared }
    }

    /// The endpoint URL to give a client.
    pub fn endpoint(&self) -> String {
        self.server.endpoint()
    }

    /// The faults this proxy applies.
    pub fn faults(&self) -> Arc<Faults> {
        self.shared.faults.clone()
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }
}

fn aws_error(status: StatusCode, error_type: &str) -> Response {
    let body = format!(r#"{{"__type":"{error_type}","message":"injected by the chaos proxy"}}"#);
    let mut response = (status, body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.0"));
    response
}

async fn forward(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let arrived = Instant::now();
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let operation = crate::proxy::operation(&request);
    if shared.faults.cut.load(Ordering::SeqCst) {
        // A partition looks like a slow failure, not an instant one.
        tokio::time::sleep(Duration::from_millis(200)).await;
        return aws_error(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable");
    }
    let permille = u64::from(shared.faults.throttle_permille.load(Ordering::SeqCst));
    if permille > 0 {
        // Spread throttled requests evenly: request n is refused when the running share crosses a step.
        let n = shared.throttle_counter.fetch_add(1, Ordering::SeqCst);
        if (n + 1) * permille / 1000 != n * permille / 1000 {
            return aws_error(StatusCode::BAD_REQUEST, "ProvisionedThroughputExceededException");
        }
    }
    let delay = shared.faults.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let (mut parts, body) = request.into_parts();
    let bytes = match to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    parts.uri = match format!("{}{path}", shared.upstream).parse::<Uri>() {
        Ok(uri) => uri,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let recorded = shared.log.is_some() && matches!(operation.as_str(), "UpdateItem" | "PutItem" | "DeleteItem");
    let request_body = recorded.then(|| serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null));
    let upstream = axum::http::Request::from_parts(parts, Body::from(bytes));
    let forwarded = Instant::now();
    match shared.client.request(upstream).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            match body.collect().await {
                Ok(collected) => {
                    let bytes = collected.to_bytes();
                    let per_record = shared.faults.record_delay_us.load(Ordering::SeqCst);
                    if per_record > 0 && operation == "GetRecords" {
                        let records = serde_json::from_slice::<serde_json::Value>(&bytes)
                            .ok()
                            .and_then(|v| v.get("Records").and_then(|r| r.as_array()).map(Vec::len))
                            .unwrap_or(0) as u64;
                        tokio::time::sleep(Duration::from_micros(per_record * records)).await;
                    }
                    let answered = Instant::now();
                    if let (Some(log), Some(request)) = (&shared.log, request_body)
                        && parts.status == StatusCode::OK
                    {
                        let response = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
                        let write = LeaseWrite {
                            by: shared.tag.clone(),
                            operation,
                            request,
                            response,
                            arrived,
                            forwarded,
                            answered,
                        };
                        log.lock().expect("write log").push(write);
                    }
                    Response::from_parts(parts, Body::from(bytes))
                }
                Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
            }
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
