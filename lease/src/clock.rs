//! Time sources for leases: wall-clock time to write `lease_expiry`, a monotonic clock to judge expiry.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The two clocks a lease store reads.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Wall-clock time, epoch milliseconds. Only ever written for operators to read, never trusted to
    /// agree between workers.
    fn wall_ms(&self) -> i64;
    /// Time since an arbitrary fixed start, never going backwards. Expiry is judged on this clock.
    fn monotonic(&self) -> Duration;
}

/// The machine's clocks.
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    /// The machine's clocks, with the monotonic clock starting now.
    pub fn new() -> Self {
        Self { start: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn wall_ms(&self) -> i64 {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
    }

    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A clock moved by hand: the monotonic clock advances only when told; the wall clock is the machine's
/// plus a fixed skew. For tests of expiry and clock skew.
#[derive(Debug, Default)]
pub struct ManualClock {
    monotonic: Mutex<Duration>,
    skew_ms: i64,
}

impl ManualClock {
    /// A clock whose wall time runs `skew_ms` ahead of the machine's (negative: behind).
    pub fn with_skew_ms(skew_ms: i64) -> Self {
        Self { monotonic: Mutex::new(Duration::ZERO), skew_ms }
    }

    /// Moves the monotonic clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.monotonic.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *now += by;
    }
}

impl Clock for ManualClock {
    fn wall_ms(&self) -> i64 {
        SystemClock::new().wall_ms() + self.skew_ms
    }

    fn monotonic(&self) -> Duration {
        *self.monotonic.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
