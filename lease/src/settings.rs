//! Who a lease store writes as, and how long its leases last.

use std::sync::Arc;
use std::time::Duration;

use super::clock::{Clock, SystemClock};

/// Default lease duration (`spec.lease.duration`'s default).
pub const DEFAULT_LEASE_DURATION: Duration = leasehold_crds::defaults::LEASE_DURATION;

/// The owner id, lease duration and clocks of one worker's lease store.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// The id written to `lease_owner`; unique per process unless a stable id was chosen.
    pub owner: String,
    /// How long a lease lasts without renewal.
    pub duration: Duration,
    /// Wall clock for `lease_expiry`, monotonic clock for judging expiry.
    pub clock: Arc<dyn Clock>,
    /// Where this worker takes handoff notices (`host:port`), written into its membership row so a
    /// peer that releases leases can tell it at once; `None`: peers find freed rows by scanning.
    pub address: Option<String>,
}

impl LeaseSettings {
    /// Settings for `owner` with the default duration and the machine's clocks.
    pub fn new(owner: impl Into<String>) -> Self {
        Self {
            owner: owner.into(),
            duration: DEFAULT_LEASE_DURATION,
            clock: Arc::new(SystemClock::new()),
            address: None,
        }
    }

    /// The same settings with another lease duration.
    pub fn with_duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// The same settings advertising `address` for handoff notices in the membership row.
    pub fn with_address(mut self, address: Option<String>) -> Self {
        self.address = address;
        self
    }

    /// The same settings with other clocks.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The `lease_expiry` to write now.
    pub fn expiry_ms(&self) -> i64 {
        let duration_ms = i64::try_from(self.duration.as_millis()).unwrap_or(i64::MAX);
        self.clock.wall_ms().saturating_add(duration_ms)
    }
}

/// A fresh owner id, unique per process: `<prefix>-<random>`. Two processes never share one.
pub fn unique_owner_id(prefix: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &random[..12])
}
