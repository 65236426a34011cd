//! kinesalite behind the fan-out server: our own JSON calls to it (GetRecords, ...) and the requests
//! the server does not answer itself, forwarded unchanged.

use axum::body::{Body, Bytes, to_bytes};
use axum::extract::Request;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A call to kinesalite that did not succeed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// kinesalite answered with an AWS error.
    #[error("{error_type}: {message}")]
    Service { status: StatusCode, error_type: String, message: String },
    /// No usable answer (connection refused, broken body, not JSON).
    #[error("kinesalite unreachable or unreadable: {0}")]
    Transport(String),
}

/// A client for kinesalite's JSON API.
pub(crate) struct Upstream {
    endpoint: String,
    client: Client<HttpConnector, Body>,
}

impl Upstream {
    pub(crate) fn new(endpoint: &str) -> Self {
        Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Calls `operation` (`GetRecords`, ...) with `input`; kinesalite checks only that a signature is
    /// present, not what it signs.
    pub(crate) async fn call(&self, operation: &str, input: &Value) -> Result<Value, UpstreamError> {
        let request = axum::http::Request::post(format!("{}/", self.endpoint))
            .header("content-type", "application/x-amz-json-1.1")
            .header("x-amz-target", format!("Kinesis_20131202.{operation}"))
            .header("x-amz-date", "20260101T000000Z")
            .header(
                "authorization",
                "AWS4-HMAC-SHA256 Credential=leasehold-test/20260101/us-east-1/kinesis/aws4_request, \
                 SignedHeaders=host;x-amz-date, Signature=0",
            )
            .body(Body::from(input.to_string()))
            .map_err(|e| UpstreamError::Transport(e.to_string()))?;
        let response = self.client.request(request).await.map_err(|e| UpstreamError::Transport(e.to_string()))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| UpstreamError::Transport(e.to_string()))?;
        let value: Value =
            serde_json::from_slice(&body.to_bytes()).map_err(|e| UpstreamError::Transport(e.to_string()))?;
        if status.is_success() {
            return Ok(value);
        }
        let error_type = value["__type"].as_str().unwrap_or("InternalFailure");
        Err(UpstreamError::Service {
            status,
            error_type: error_type.rsplit('#').next().unwrap_or(error_type).to_string(),
            message: value["message"].as_str().unwrap_or_default().to_string(),
        })
    }

    /// Sends `request` to kinesalite as it came and returns kinesalite's answer, with the request body
    /// it sent (the caller may want to know which stream a put went to).
    pub(crate) async fn forward(&self, request: Request) -> (Response, Bytes) {
        let (mut parts, body) = request.into_parts();
        let bytes = match to_bytes(body, usize::MAX).await {
            Ok(bytes) => bytes,
            Err(e) => return ((StatusCode::BAD_GATEWAY, e.to_string()).into_response(), Bytes::new()),
        };
        let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        parts.uri = match format!("{}{path}", self.endpoint).parse::<Uri>() {
            Ok(uri) => uri,
            Err(e) => return ((StatusCode::BAD_GATEWAY, e.to_string()).into_response(), bytes),
        };
        let upstream = axum::http::Request::from_parts(parts, Body::from(bytes.clone()));
        let response = match self.client.request(upstream).await {
            Ok(response) => {
                let (parts, body) = response.into_parts();
                match body.collect().await {
                    Ok(collected) => Response::from_parts(parts, Body::from(collected.to_bytes())),
                    Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
                }
            }
            Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
        };
        (response, bytes)
    }
}

/// An AWS JSON error answer, as the service sends one.
pub(crate) fn aws_error(status: StatusCode, error_type: &str, message: &str) -> Response {
    let body = serde_json::json!({ "__type": error_type, "message": message }).to_string();
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/x-amz-json-1.1"));
    response
}

/// A successful AWS JSON answer.
pub(crate) fn aws_ok(value: &Value) -> Response {
    let mut response = (StatusCode::OK, value.to_string()).into_response();
    response
        .headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/x-amz-json-1.1"));
    response
}

impl UpstreamError {
    /// The answer to give a client for this failure.
    pub(crate) fn into_response(self) -> Response {
        match self {
            UpstreamError::Service { status, error_type, message } => aws_error(status, &error_type, &message),
            UpstreamError::Transport(message) => aws_error(StatusCode::BAD_GATEWAY, "InternalFailure", &message),
        }
    }
}
