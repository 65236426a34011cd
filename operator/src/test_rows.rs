//! The one builder of lease rows for the operator's unit tests: [`row`] starts from a free row
//! ([`Lease::unheld`] at TRIM_HORIZON, counter 0) and each setter changes one field.

use leasehold_worker::lease::{Checkpoint, Lease, LeaseKey};

/// A free row of `stream`'s `shard`, at TRIM_HORIZON, counter 0.
pub(crate) fn row(stream: &str, shard: &str) -> Row {
    Row(Lease::unheld(LeaseKey::new(stream, shard), Checkpoint::TrimHorizon))
}

/// A lease row being built; [`Row::lease`] gives it.
pub(crate) struct Row(Lease);

impl Row {
    /// Held by `owner` (None: free).
    pub(crate) fn owner(mut self, owner: Option<&str>) -> Self {
        self.0.owner = owner.map(String::from);
        self
    }

    /// With the counter at `counter`.
    pub(crate) fn counter(mut self, counter: u64) -> Self {
        self.0.counter = counter;
        self
    }

    /// At `checkpoint`.
    pub(crate) fn checkpoint(mut self, checkpoint: Checkpoint) -> Self {
        self.0.checkpoint = checkpoint;
        self
    }

    /// With the holder's lease running out at `expiry_ms` (None: no expiry written).
    pub(crate) fn expiry_ms(mut self, expiry_ms: Option<i64>) -> Self {
        self.0.expiry_ms = expiry_ms;
        self
    }

    /// With the holder's measured lag.
    pub(crate) fn lag_ms(mut self, lag_ms: Option<u64>) -> Self {
        self.0.lag_ms = lag_ms;
        self
    }

    /// With a window consumer's count of records handed to the processor.
    pub(crate) fn window_records(mut self, records: Option<u64>) -> Self {
        self.0.window_records = records;
        self
    }

    /// The row.
    pub(crate) fn lease(self) -> Lease {
        self.0
    }
}
