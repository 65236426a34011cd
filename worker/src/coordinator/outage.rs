//! Reading the lease table while it cannot be reached: backing off with a cap and jitter instead of
//! retrying at every wake-up, and logging once per interval with a count instead of once per attempt,
//! so an outage of any length costs bounded CPU and log volume, and the group recovers by itself.

use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::{Backoff, Delays, Jitter};
use crate::lease::LeaseError;

/// Longest wait between two reads of an unreachable table.
const MAX_DELAY: Duration = Duration::from_secs(5);
/// At most one log line per this interval while the table stays unreachable.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Failures to use the lease table since it last answered.
pub(super) struct TableOutage {
    first_delay: Duration,
    delays: Delays,
    failures: u64,
    unlogged: u64,
    logged_at: Option<Instant>,
    retry_at: Option<Instant>,
    missing: bool,
}

impl TableOutage {
    /// An outage tracker whose first retry comes after `first_delay` (the scan interval).
    pub(super) fn new(first_delay: Duration) -> Self {
        Self {
            first_delay,
            delays: delays(first_delay),
            failures: 0,
            unlogged: 0,
            logged_at: None,
            retry_at: None,
            missing: false,
        }
    }

    /// True when the table may be tried now.
    pub(super) fn ready(&self, now: Instant) -> bool {
        self.retry_at.is_none_or(|at| now >= at)
    }

    /// Records a failed use of the table (`what`): the next try waits longer, up to [`MAX_DELAY`].
    pub(super) fn failed(&mut self, what: &'static str, error: &LeaseError, now: Instant) {
        self.failures += 1;
        self.unlogged += 1;
        let delay = self.delays.next().unwrap_or(MAX_DELAY);
        self.retry_at = Some(now + delay);
        if let LeaseError::TableNotFound { table } = error
            && !self.missing
        {
            self.missing = true;
            // Recreating it here would start every shard again from its start position (every
            // checkpoint is gone with the table): that is an operator's decision, not the worker's.
            tracing::error!(
                table,
                what,
                "the lease table does not exist (deleted?): leases run out and processing \
                stops; the worker does not recreate it; recreate or restore it to resume"
            );
        }
        if self.logged_at.is_none_or(|at| now.duration_since(at) >= LOG_EVERY) {
            tracing::warn!(what, error = %error, failures = self.unlogged, total = self.failures, retry_in = ?delay,
                "cannot use the lease table; backing off");
            self.unlogged = 0;
            self.logged_at = Some(now);
        }
    }

    /// True while the last failure said the table does not exist.
    pub(super) fn is_missing(&self) -> bool {
        self.missing
    }

    /// Records that the table answered: the outage, if any, is over.
    pub(super) fn recovered(&mut self) {
        if self.missing {
            tracing::warn!("the lease table exists again: shards without a row start again from their start position");
        }
        if self.failures > 0 {
            tracing::info!(failures = self.failures, "lease table reachable again");
            *self = Self::new(self.first_delay);
        }
    }
}

/// From `first` doubling to [`MAX_DELAY`], with up to as much again added at random (so a group does
/// not retry in step).
fn delays(first: Duration) -> Delays {
    Backoff::new(first.min(MAX_DELAY), MAX_DELAY).with_jitter(Jitter::Added(1.0)).delays()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error() -> LeaseError {
        LeaseError::Timeout { table: "t".into() }
    }

    #[test]
    fn retries_back_off_to_the_cap_and_reset_on_recovery() {
        let start = Instant::now();
        let mut outage = TableOutage::new(Duration::from_millis(250));
        assert!(outage.ready(start));
        let mut now = start;
        let mut waits = Vec::new();
        for _ in 0..12 {
            outage.failed("list", &error(), now);
            let at = outage.retry_at.expect("a retry time");
            assert!(!outage.ready(now), "no retry before the backoff");
            waits.push(at - now);
            now = at;
        }
        assert!(waits[0] >= Duration::from_millis(250) && waits[0] <= Duration::from_millis(500), "{waits:?}");
        assert!(waits.iter().all(|w| *w <= MAX_DELAY * 2), "capped (jitter at most doubles): {waits:?}");
        assert!(waits[11] >= MAX_DELAY, "reaches the cap: {waits:?}");
        let attempts_per_minute = Duration::from_secs(60).as_secs_f64() / waits[11].as_secs_f64();
        assert!(attempts_per_minute <= 12.0, "{attempts_per_minute} attempts a minute at the cap");
        outage.recovered();
        assert!(outage.ready(now) && outage.failures == 0);
    }

    #[test]
    fn logs_once_per_interval_with_a_count() {
        let start = Instant::now();
        let mut outage = TableOutage::new(Duration::from_millis(100));
        outage.failed("list", &error(), start);
        assert_eq!((outage.unlogged, outage.logged_at), (0, Some(start)), "the first failure is logged at once");
        for n in 1..=5u64 {
            outage.failed("list", &error(), start + Duration::from_secs(n));
        }
        assert_eq!(outage.unlogged, 5, "counted, not logged, within the interval");
        outage.failed("list", &error(), start + LOG_EVERY);
        assert_eq!(outage.unlogged, 0, "logged again after the interval, with the count");
    }
}
