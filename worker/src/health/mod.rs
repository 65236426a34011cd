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

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;

#[cfg(feature = "cli")]
mod server;
#[cfg(feature = "cli")]
pub use server::{ServerLimits, raise_fd_limit, router, serve, serve_router, serve_router_with};

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

/// At most one log line per reason and period: a flood of bad input (refused notices, refused
/// connections) is counted in full by its metric but logged once a period, with how many were left out.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    reasons: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl LogThrottle {
    /// A throttle letting one line per reason through every `every`.
    pub fn new(every: Duration) -> Self {
        Self { every, reasons: Mutex::new(HashMap::new()) }
    }

    /// `Some(left out since the last line)` when a line about `reason` may be written now, `None` when
    /// it is to be left out (and counted for the next line).
    pub fn allow(&self, reason: &'static str) -> Option<u64> {
        let now = Instant::now();
        let mut reasons = self.reasons.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match reasons.get_mut(reason) {
            Some((last, left_out)) if now.duration_since(*last) < self.every => {
                *left_out = left_out.saturating_add(1);
                None
            }
            Some((last, left_out)) => {
                *last = now;
                Some(std::mem::take(left_out))
            }
            None => {
                reasons.insert(reason, (now, 0));
                Some(0)
            }
        }
    }
}

/// At most the first `max` characters of foreign `text` (a sender's name, a key), with its length when
/// cut, for a log line.
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}... ({} bytes)", &text[..end], text.len()),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod throttle_tests {
    use super::*;

    #[test]
    fn one_line_per_reason_and_period_with_the_count_left_out() {
        let throttle = LogThrottle::new(Duration::from_millis(200));
        assert_eq!(throttle.allow("a"), Some(0));
        assert_eq!(throttle.allow("a"), None);
        assert_eq!(throttle.allow("a"), None);
        assert_eq!(throttle.allow("b"), Some(0), "each reason has its own period");
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(throttle.allow("a"), Some(2), "the next line says how many were left out");
    }

    #[test]
    fn foreign_text_is_cut() {
        let long = "x".repeat(10_000);
        let cut = clip(&long, 100);
        assert!(cut.len() < 130 && cut.ends_with("(10000 bytes)"), "{cut}");
        assert_eq!(clip("short", 100), "short");
    }
}
