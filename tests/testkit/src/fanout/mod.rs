//! A stand-in for Kinesis enhanced fan-out in front of kinesalite, which has none.
//!
//! The server answers the consumer calls (RegisterStreamConsumer, DescribeStreamConsumer,
//! DeregisterStreamConsumer, ListStreamConsumers) and SubscribeToShard itself, the latter with the
//! event-stream framing the SDK decodes and records read from kinesalite; every other call is forwarded
//! to kinesalite unchanged, so a client points at this one endpoint for everything. The service's rules
//! on subscriptions (ResourceInUseException, LimitExceededException, the 5-minute lifetime) hold, with
//! their timings settable, and [`FanOutControls`] injects the faults a reader must survive.

mod connection;
mod consumers;
mod controls;
mod events;
mod position;
mod pump;
mod state;
mod subscribe;
mod upstream;

pub use controls::{FanOutControls, FanOutFault};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::to_bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use state::Shared;
use upstream::{Upstream, aws_error};

/// The fan-out server could not start.
#[derive(Debug, thiserror::Error)]
pub enum FanOutError {
    /// No loopback port to listen on.
    #[error("fan-out server: cannot listen on loopback: {0}")]
    Bind(#[from] std::io::Error),
    /// The kinesalite endpoint is not an `http://host:port` URL.
    #[error("fan-out server: kinesalite endpoint {0:?} is not http://host:port")]
    Endpoint(String),
}

/// A running fan-out server on a free loopback port; stops (and ends its subscriptions) when dropped.
pub struct FanOutServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    controls: FanOutControls,
}

impl FanOutServer {
    /// Starts a server in front of kinesalite at `kinesalite_endpoint` (`http://127.0.0.1:<port>`).
    pub async fn start(kinesalite_endpoint: &str) -> Result<FanOutServer, FanOutError> {
        if !kinesalite_endpoint.starts_with("http://") {
            return Err(FanOutError::Endpoint(kinesalite_endpoint.to_string()));
        }
        let shared = Arc::new(Shared {
            upstream: Upstream::new(kinesalite_endpoint),
            book: Mutex::new(Default::default()),
            shutdown: CancellationToken::new(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = connection::CuttableListener(listener);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app.into_make_service_with_connect_info::<connection::ConnectionCut>()).await;
        });
        Ok(FanOutServer { addr, task, controls: FanOutControls { shared } })
    }

    /// `http://127.0.0.1:<port>`: the endpoint for every Kinesis call of a client under test.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server's settings, faults and counters.
    pub fn controls(&self) -> FanOutControls {
        self.controls.clone()
    }
}

impl Drop for FanOutServer {
    fn drop(&mut self) {
        self.controls.shared.shutdown.cancel();
        self.task.abort();
    }
}

/// Routes by `X-Amz-Target`: the calls served here, everything else to kinesalite.
async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let operation = crate::proxy::operation(&request);
    let served = matches!(
        operation.as_str(),
        "RegisterStreamConsumer"
            | "DescribeStreamConsumer"
            | "DeregisterStreamConsumer"
            | "ListStreamConsumers"
            | "SubscribeToShard"
    );
    if !served {
        let (response, body) = shared.upstream.forward(request).await;
        if matches!(operation.as_str(), "PutRecord" | "PutRecords") && response.status().is_success() {
            wake_readers(&shared, &body);
        }
        return response;
    }
    let cut = request
        .extensions()
        .get::<axum::extract::ConnectInfo<connection::ConnectionCut>>()
        .map(|info| info.0.0.clone())
        .unwrap_or_default();
    let input: Value = match to_bytes(request.into_body(), 1 << 20).await.map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(input)) => input,
        _ => return aws_error(StatusCode::BAD_REQUEST, "SerializationException", "the body is not JSON"),
    };
    match operation.as_str() {
        "RegisterStreamConsumer" => consumers::register(&shared, &input).await,
        "DescribeStreamConsumer" => consumers::describe(&shared, &input).await,
        "DeregisterStreamConsumer" => consumers::deregister(&shared, &input).await,
        "ListStreamConsumers" => consumers::list(&shared, &input).await,
        _ => subscribe::subscribe(shared, input, cut).await,
    }
}

/// Wakes the subscriptions of the stream a put went to, so its records go out without waiting for
/// the next poll.
fn wake_readers(shared: &Shared, put_body: &[u8]) {
    let Ok(put) = serde_json::from_slice::<Value>(put_body) else { return };
    let stream = put["StreamName"].as_str().or_else(|| put["StreamARN"].as_str().and_then(consumers::stream_name_of));
    if let Some(stream) = stream {
        shared.wake_stream(stream);
    }
}
