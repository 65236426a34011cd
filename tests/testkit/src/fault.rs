//! A stand-in AWS endpoint that answers every request with one chosen fault, for testing how our
//! clients classify and survive throttling, server errors and hung calls. The emulators cannot produce
//! these faults themselves.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;

use crate::server::LocalServer;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// What the fault server answers.
#[derive(Debug, Clone)]
pub enum Fault {
    /// An AWS JSON-protocol error: HTTP `status` with `__type` = `error_type`.
    Error {
        /// HTTP status, e.g. 400 for throttling, 500 for an internal error.
        status: u16,
        /// The error type, e.g. `ProvisionedThroughputExceededException`.
        error_type: &'static str,
    },
    /// Never answers (until the server is dropped), to make the client time out.
    Hang,
}

/// A running fault server on a free loopback port; stops when dropped.
pub struct FaultServer {
    server: LocalServer,
    requests: Arc<AtomicU64>,
}

impl FaultServer {
    /// Starts a server answering every request with `fault`.
    pub async fn start(fault: Fault) -> Self {
        let requests = Arc::new(AtomicU64::new(0));
        let counter = requests.clone();
        let app = Router::new().fallback(move || {
            let fault = fault.clone();
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                answer(fault).await
            }
        });
        Self { server: LocalServer::start(app).await, requests }
    }

    /// The endpoint URL to give a client.
    pub fn endpoint(&self) -> String {
        self.server.endpoint()
    }

    /// How many requests it has received.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn answer(fault: Fault) -> Response {
    match fault {
        Fault::Error { status, error_type } => {
            let body = format!(
                r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{error_type}","message":"injected {error_type}"}}"#
            );
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = (status, body).into_response();
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.0"));
            response
        }
        Fault::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
    }
}

/// An endpoint on which nothing listens (connection refused).
pub async fn closed_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    format!("http://{addr}")
}
