//! SIGTERM and SIGINT for both binaries (the worker and the operator): listened for from the moment
//! [`Signals::listen`] is called, so a signal that comes while the process is still starting ends it
//! cleanly rather than by the signal's default action.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM and SIGINT, listened for from the moment this is made.
pub struct Signals {
    term: Option<Signal>,
    int: Option<Signal>,
}

impl Signals {
    /// Starts listening; a signal that cannot be listened for is logged and never received.
    pub fn listen() -> Self {
        let listen = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(stream) => Some(stream),
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for {name}");
                None
            }
        };
        Self { term: listen(SignalKind::terminate(), "SIGTERM"), int: listen(SignalKind::interrupt(), "SIGINT") }
    }

    /// Returns once SIGTERM or SIGINT has been received (and logged).
    pub async fn received(mut self) {
        tokio::select! {
            _ = received(&mut self.term) => tracing::info!("SIGTERM received"),
            _ = received(&mut self.int) => tracing::info!("SIGINT received"),
        }
    }
}

/// Waits for one of `signal` (never, when it could not be listened for).
async fn received(signal: &mut Option<Signal>) {
    match signal {
        Some(stream) => {
            stream.recv().await;
        }
        None => std::future::pending().await,
    }
}
