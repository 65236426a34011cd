//! A fault-injecting proxy in front of an emulator: forwards AWS requests, except those a policy picks,
//! which get an AWS error instead. Lets a test throttle every n-th GetRecords or expire iterators while
//! the rest of the traffic is real.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Decides, from the operation name (`GetRecords`, ...) and how many of that operation came before,
/// whether to answer with an AWS error type (`Some("ProvisionedThroughputExceededException")`).
pub type FaultPolicy = Arc<dyn Fn(&str, u64) -> Option<&'static str> + Send + Sync>;

struct Shared {
    upstream: String,
    client: Client<HttpConnector, Body>,
    policy: FaultPolicy,
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
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_string(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            policy,
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

async fn forward(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let operation = request
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit('.').next())
        .unwrap_or("")
        .to_string();
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
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    parts.uri = match format!("{}{path}", shared.upstream).parse::<Uri>() {
        Ok(uri) => uri,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let upstream = axum::http::Request::from_parts(parts, Body::from(bytes));
    match shared.client.request(upstream).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            match body.collect().await {
                Ok(collected) => Response::from_parts(parts, Body::from(collected.to_bytes())),
                Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
            }
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
