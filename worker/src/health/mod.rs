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

use prometheus_client::registry::Registry;

#[cfg(feature = "cli")]
mod server;
#[cfg(feature = "cli")]
pub use server::{router, serve, serve_router};

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

    /// The metrics text `/metrics` serves (for a program serving it with its own HTTP server).
    pub fn metrics_text(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        (self.encode)(&mut text)?;
        Ok(text)
    }

    /// What the readiness source says now (`/readyz` also fails once shutdown began).
    pub fn is_ready(&self) -> bool {
        (self.ready)()
    }

    /// Endpoints serving every metric of `registry`.
    pub fn from_registry(registry: Arc<Registry>, ready: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self::new(move |out| prometheus_client::encoding::text::encode(out, &registry), ready)
    }
}
