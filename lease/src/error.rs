//! Errors of lease operations, typed so callers can tell "you do not hold this" from "try again".

use std::time::Duration;

use super::key::LeaseKey;
use super::row::Malformed;

/// Result of a lease operation.
pub type Result<T, E = LeaseError> = std::result::Result<T, E>;

/// What went wrong with a lease operation.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The conditional write was refused: the row changed since this worker read or wrote it, so the
    /// caller does not hold the lease (or lost the race for it). Not retryable as is: re-read first.
    #[error(
        "lease {key}: {operation} refused: the row changed since this worker last saw it (another worker holds it or took it)"
    )]
    ConditionFailed {
        /// The row.
        key: LeaseKey,
        /// The refused operation.
        operation: &'static str,
    },
    /// Acquire refused without writing: another worker holds the lease and this worker has not yet
    /// watched its counter stay unchanged for a whole lease duration.
    #[error(
        "lease {key} is held by {owner}; it counts as expired only after its counter stays unchanged for another {remaining:?}"
    )]
    HeldByOther {
        /// The row.
        key: LeaseKey,
        /// Its current holder.
        owner: String,
        /// How much longer the counter must stay unchanged before the lease may be taken.
        remaining: Duration,
    },
    /// Acquire refused without writing: the given copy of the row is not the one this worker last read
    /// (never read, or the counter differs); read the row again first.
    #[error("lease {key}: acquire needs a fresh read of the row (counter {counter} was not the last one seen)")]
    NotObserved {
        /// The row.
        key: LeaseKey,
        /// The counter of the copy given.
        counter: u64,
    },
    /// This worker has lost the lease: a renewal was refused, or its own deadline passed with a renewal
    /// still in flight. Nothing more may be written or processed for it.
    #[error("lease {key} is lost: {reason}")]
    Lost {
        /// The row.
        key: LeaseKey,
        /// Why.
        reason: &'static str,
    },
    /// Renew, checkpoint or release asked for a lease that this copy shows held by someone else.
    #[error("lease {key} is not held by {owner}")]
    NotOwner {
        /// The row.
        key: LeaseKey,
        /// The worker that asked.
        owner: String,
    },
    /// The row exists but cannot be read as a lease. Callers skip it and report it.
    #[error("malformed lease row {key}: {reason}")]
    Malformed {
        /// The row's `lease_key` as stored.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The write would make the row larger than DynamoDB's 400 KB item limit: something other than
    /// the worker made it that large (the worker's own attributes stay under 1 KB). Not retryable: the
    /// row is skipped and reported until an operator trims it.
    #[error(
        "lease {key}: {operation} refused: the row would exceed DynamoDB's 400 KB item limit (remove the \
         attributes another tool added to it)"
    )]
    ItemTooLarge {
        /// The row.
        key: LeaseKey,
        /// The refused operation.
        operation: &'static str,
    },
    /// The lease table does not exist.
    #[error("lease table {table} does not exist")]
    TableNotFound {
        /// The table name.
        table: String,
    },
    /// The service throttled the request. Retryable after a backoff.
    #[error("lease table {table} throttled the request: {message}")]
    Throttled {
        /// The table name.
        table: String,
        /// The service's message.
        message: String,
    },
    /// The request did not complete in time; it may or may not have been applied. Retryable.
    #[error("lease table {table}: request timed out")]
    Timeout {
        /// The table name.
        table: String,
    },
    /// The request could not be sent or its response not read; it may or may not have been applied.
    /// Retryable.
    #[error("lease table {table}: transport error: {message}")]
    Transport {
        /// The table name.
        table: String,
        /// What the transport said.
        message: String,
    },
    /// Any other error from the service.
    #[error("lease table {table}: {code}: {message}")]
    Service {
        /// The table name.
        table: String,
        /// The service's error code.
        code: String,
        /// The service's message.
        message: String,
        /// Whether the service marks it as worth retrying (5xx).
        retryable: bool,
    },
}

impl From<Malformed> for LeaseError {
    fn from(malformed: Malformed) -> Self {
        LeaseError::Malformed { key: malformed.key, reason: malformed.reason }
    }
}

impl LeaseError {
    /// True for failures worth retrying as they are (throttling, timeouts, transport, 5xx).
    pub fn is_retryable(&self) -> bool {
        match self {
            LeaseError::Throttled { .. } | LeaseError::Timeout { .. } | LeaseError::Transport { .. } => true,
            LeaseError::Service { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// True when the answer means "this worker does not hold (or cannot take) the lease".
    pub fn is_not_held(&self) -> bool {
        matches!(
            self,
            LeaseError::ConditionFailed { .. }
                | LeaseError::HeldByOther { .. }
                | LeaseError::NotOwner { .. }
                | LeaseError::Lost { .. }
        )
    }
}
