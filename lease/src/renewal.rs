//! Keeping a held lease alive: one renewal every interval, retried soon after a failure, until the
//! lease is lost (the table refuses a write or the deadline passes first) or released.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::HeldLease;

/// Renews `held` every `interval` until it is lost or released; `on_failure` is called for every
/// renewal that failed without losing the lease (it is retried after a quarter interval, at most 500 ms).
pub async fn renew_until_lost(held: Arc<HeldLease>, interval: Duration, on_failure: impl Fn() + Send) {
    let retry = (interval / 4).min(Duration::from_millis(500));
    let mut wait = interval;
    loop {
        let wake = (Instant::now() + wait).min(held.deadline());
        tokio::select! {
            _ = held.lost().cancelled() => return,
            _ = tokio::time::sleep_until(wake) => {}
        }
        match held.renew().await {
            Ok(_) => wait = interval,
            Err(_) if held.lost().is_cancelled() => return,
            Err(e) => {
                on_failure();
                tracing::warn!(shard = %held.key(), error = %e, "renewal failed; retrying");
                wait = retry;
            }
        }
    }
}
