//! A fault-injecting proxy in front of an emulator: forwards AWS requests, except those a policy picks,
//! which get an AWS error instead. Lets a test throttle every n-th GetRecords or expire iterators while
//! the rest of the traffic is real. A [`Tap`] sees (and may rewrite) every forwarded request and its
//! answer: the DynamoDB meter ([`crate::dynamo_meter`]) is one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::server::LocalServer;

/// Decides, from the operation name (`GetRecords`, ...) and how many of that operation came before,
/// whether to answer with an AWS error type (`Some("ProvisionedThroughputExceededException")`).
pub type FaultPolicy = Arc<dyn Fn(&str, u64) -> Option<&'static str> + Send + Sync>;

/// Sees every request the proxy forwards and the answer it got, and may rewrite both bodies (e.g. ask
/// for more in the request than the client did, and take it out of the answer again).
pub trait Tap: Send + Sync {
    /// The body to send upstream instead of `body`, for operation `operation`.
    fn request(&self, operation: &str, body: Bytes) -> Bytes {
        let _ = operation;
        body
    }

    /// The body to give the client instead of `response`: upstream's answer to `sent`, which
    /// [`request`](Self::request) made of the client's `original`.
    fn response(&self, operation: &str, original: &[u8], sent: &[u8], status: StatusCode, response: Bytes) -> Bytes;
}

struct Shared {
    upstream: String,
    client: Client<HttpConnector, Body>,
    policy: FaultPolicy,
    tap: Option<Arc<dyn Tap>>,
    counts: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    injected: AtomicU64,
}

/// A running proxy on a free loopback port; stops when dropped.
pub struct FaultProxy {
    server: LocalServer,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (an `http://host:port` endpoint) applying `policy`.
    pub async fn start(upstream: &str, policy: FaultPolicy) -> Self {
        Self::start_with_tap(upstream, policy, None).await
    }

    /// Starts a proxy to `upstream` applying `policy`, showing what it forwards to `tap`.
    pub async fn start_with_tap(upstream: &str, policy: FaultPolicy, tap: Option<Arc<dyn Tap>>) -> Self {
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_string(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            policy,
            tap,
            counts: Default::default(),
            injected: AtomicU64::new(0),
        });
        let app = Router::new().fallback(forward).with_state(shared.clone());
        Self { server: LocalServer::start(app).await, shared }
    }

    /// The endpoint URL to give a client.
    pub fn endpoint(&self) -> String {
        self.server.endpoint()
    }

    /// Requests seen per operation (including injected faults).
    pub fn counts(&self) -> std::collections::HashMap<String, u64> {
        self.shared.counts.lock().expect("counts").clone()
    }

    /// How many faults were injected.
    pub fn injected(&self) -> u64 {
        self.shared.injected.load(Ordering::SeqCst)
    }
}

/// The API operation a request calls: the last part of its `X-Amz-Target` (`DynamoDB_20120810.Scan` ->
/// `Scan`), or empty when it has none.
pub fn operation(request: &Request) -> String {
    let target = request.headers().get("x-amz-target").and_then(|v| v.to_str().ok());
    target.and_then(|v| v.rsplit('.').next()).unwrap_or("").to_string()
}

async fn forward(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let operation = crate::proxy::operation(&request);
    let count = {
        let mut counts = shared.counts.lock().expect("counts");
        let n = counts.entry(operation.clone()).or_default();
        *n += 1;
        *n
    };
    if let Some(error_type) = (shared.policy)(&operation, count) {
        shared.injected.fetch_add(1, Ordering::SeqCst);
        let body = format!(r#"{{"__type":"{error_type}","message":"injected by the test proxy"}}"#);
        let mut response = (StatusCode::BAD_REQUEST, body).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.1"));
        return response;
    }
    let (mut parts, body) = request.into_parts();
    let bytes = match to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let original = bytes.clone();
    let bytes = match &shared.tap {
        Some(tap) => tap.request(&operation, bytes),
        None => bytes,
    };
    if shared.tap.is_some() {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    parts.uri = match format!("{}{path}", shared.upstream).parse::<Uri>() {
        Ok(uri) => uri,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let upstream = axum::http::Request::from_parts(parts, Body::from(bytes.clone()));
    match shared.client.request(upstream).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            match body.collect().await {
                Ok(collected) => {
                    let mut body = collected.to_bytes();
                    if let Some(tap) = &shared.tap {
                        body = tap.response(&operation, &original, &bytes, parts.status, body);
                        // The body may have changed: its length and checksum are recomputed or dropped.
                        parts.headers.remove(header::CONTENT_LENGTH);
                        parts.headers.remove("x-amz-crc32");
                    }
                    Response::from_parts(parts, Body::from(body))
                }
                Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
            }
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
