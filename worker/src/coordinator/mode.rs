//! The coordinator's modes as types: what a worker is in its group decides how it reads the lease
//! table, whether it is a member (beats, balances, leaves) and who lists the shards. Code that only
//! one mode runs reaches that mode's state through [`Role`], so it cannot run in another.

use tokio::time::Instant;

use super::segmented::SegmentedScan;
use crate::lease::LeaseKey;

/// How a worker takes part in its group: `lease.scan`, or manual assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// A member that reads the whole table at every scan and lists the shards itself: reads grow
    /// with workers x shards.
    Full,
    /// A member that reads its segments of the table at every scan (each segment is read by two
    /// workers), the whole table when a change calls for it and otherwise rarely; one worker (the
    /// discovery term's holder) lists the shards for the group. See `segmented/mod.rs`.
    Segmented {
        /// About how many rows one segment holds.
        rows_per_segment: usize,
    },
    /// Manual assignment: exactly these shards, with no membership and no balancing; the table is
    /// read whole.
    Assigned(Vec<LeaseKey>),
}

/// A mode with what it keeps while the coordinator runs.
#[derive(Debug)]
pub(super) enum Role {
    /// See [`Mode::Full`].
    Full,
    /// See [`Mode::Segmented`]; the state it keeps between scans.
    Segmented {
        /// About how many rows one segment holds.
        rows_per_segment: usize,
        /// The view, the segments read, the discovery term.
        scan: Box<SegmentedScan>,
    },
    /// See [`Mode::Assigned`].
    Assigned(Vec<LeaseKey>),
}

impl Role {
    /// The role of `mode`, nothing read yet at `now`.
    pub(super) fn new(mode: Mode, now: Instant) -> Self {
        match mode {
            Mode::Full => Self::Full,
            Mode::Segmented { rows_per_segment } => {
                Self::Segmented { rows_per_segment, scan: Box::new(SegmentedScan::new(now)) }
            }
            Mode::Assigned(keys) => Self::Assigned(keys),
        }
    }

    /// What `scan: segmented` keeps, in that mode.
    pub(super) fn segmented(&self) -> Option<&SegmentedScan> {
        match self {
            Self::Segmented { scan, .. } => Some(scan),
            Self::Full | Self::Assigned(_) => None,
        }
    }

    /// What `scan: segmented` keeps, in that mode, to change.
    pub(super) fn segmented_mut(&mut self) -> Option<&mut SegmentedScan> {
        match self {
            Self::Segmented { scan, .. } => Some(scan),
            Self::Full | Self::Assigned(_) => None,
        }
    }

    /// True for a member of the group: it writes a membership row, balances and takes notices.
    pub(super) fn is_member(&self) -> bool {
        !matches!(self, Self::Assigned(_))
    }

    /// Tells `scan: segmented` to read the whole table at `at` at the latest; nothing in other modes,
    /// which read it whole at every scan.
    pub(super) fn want_whole_at(&mut self, at: Instant) {
        if let Some(scan) = self.segmented_mut() {
            scan.want_whole_at(at);
        }
    }
}

/// This worker's fair share as the last plan computed it, logged when it changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Share {
    /// How many leases this worker should hold.
    pub(super) target: usize,
    /// The live workers the share was computed over, this one included.
    pub(super) workers: usize,
    /// True while this worker is draining: it takes nothing new.
    pub(super) draining: bool,
}
