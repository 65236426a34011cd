//! The one builder of lease rows for the worker's unit tests: [`row`] starts from a free row of stream
//! `s` ([`Lease::unheld`] at TRIM_HORIZON, counter 0) and each setter changes one field.

use crate::lease::{Checkpoint, Lease, LeaseKey};

/// A free row of `shard` on stream `s`, at TRIM_HORIZON, counter 0.
pub(crate) fn row(shard: &str) -> Row {
    Row(Lease::unheld(LeaseKey::new("s", shard), Checkpoint::TrimHorizon))
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

    /// A child of `parents` (shard ids).
    pub(crate) fn parents(mut self, parents: &[&str]) -> Self {
        self.0.parent_shard_ids = parents.iter().map(|p| p.to_string()).collect();
        self
    }

    /// Stamped with the stream's creation time (`None`: unstamped).
    pub(crate) fn stream_created(mut self, created_ms: Option<i64>) -> Self {
        self.0.stream_created = created_ms;
        self
    }

    /// The row.
    pub(crate) fn lease(self) -> Lease {
        self.0
    }
}
