//! Progress rows: a tool's place in a stream, kept in the lease table beside the leases (the rows of
//! `leasehold redrive`, `#term:redrive/STREAM/SHARD`): a checkpoint and the sequence numbers done
//! beyond it. Every write is conditioned on the counter of the read or write before, so of two runs
//! advancing one row only one succeeds.

use std::collections::BTreeSet;

use async_trait::async_trait;

use super::error::Result;
use super::key::LeaseKey;
use super::row::{AttrValue, Attributes, Malformed, attr, raw_key};

/// A progress row as read, or as it is to be written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// `lease_counter` as last read or written; `None` while the row does not exist.
    pub counter: Option<u64>,
    /// Everything up to this sequence number is done (`None`: from the shard's start).
    pub checkpoint: Option<String>,
    /// Sequence numbers done beyond the checkpoint.
    pub done: BTreeSet<String>,
}

/// The checkpoint stored for "from the start".
const FROM_START: &str = "TRIM_HORIZON";

/// Reads a progress row.
pub fn decode_progress(attrs: &Attributes) -> std::result::Result<Progress, Malformed> {
    let malformed = |reason: &str| Malformed { key: raw_key(attrs), reason: reason.to_string() };
    let counter = match attrs.get(attr::LEASE_COUNTER) {
        Some(AttrValue::N(n)) => n.parse::<u64>().map_err(|_| malformed("lease_counter is not a number"))?,
        _ => return Err(malformed("lease_counter is missing")),
    };
    let checkpoint = match attrs.get(attr::CHECKPOINT) {
        Some(AttrValue::S(s)) if s == FROM_START => None,
        Some(AttrValue::S(s)) => Some(s.clone()),
        _ => return Err(malformed("checkpoint is missing")),
    };
    let done = match attrs.get(attr::PROGRESS_DONE) {
        None => BTreeSet::new(),
        Some(AttrValue::Ss(set)) => set.iter().cloned().collect(),
        Some(_) => return Err(malformed("redrive_done is not a string set")),
    };
    Ok(Progress { counter: Some(counter), checkpoint, done })
}

/// The whole row of `progress` under `key`, with counter `counter`.
pub fn encode_progress(key: &LeaseKey, progress: &Progress, counter: u64) -> Attributes {
    let checkpoint = progress.checkpoint.clone().unwrap_or_else(|| FROM_START.into());
    let mut attrs = Attributes::from([
        (attr::LEASE_KEY.to_string(), AttrValue::S(key.to_string())),
        (attr::LEASE_COUNTER.to_string(), AttrValue::N(counter.to_string())),
        (attr::CHECKPOINT.to_string(), AttrValue::S(checkpoint)),
    ]);
    if !progress.done.is_empty() {
        attrs.insert(attr::PROGRESS_DONE.into(), AttrValue::Ss(progress.done.iter().cloned().collect()));
    }
    attrs
}

/// Progress rows of a lease table.
#[async_trait]
pub trait ProgressRows: Send + Sync {
    /// Reads the row `key` (strongly consistent); an absent row is [`Progress::default`].
    async fn read_progress(&self, key: &LeaseKey) -> Result<Progress>;

    /// Writes the whole row `key`, only if its counter is still `progress.counter` (absent for
    /// `None`); returns the counter written. [`LeaseError::ConditionFailed`](super::LeaseError::ConditionFailed)
    /// when the row changed.
    async fn write_progress(&self, key: &LeaseKey, progress: &Progress) -> Result<u64>;
}
