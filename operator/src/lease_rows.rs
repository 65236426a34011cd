//! The lease rows of each consumer, read at most once per reconcile interval: the lease spread and the
//! lag both come from one read, and reconciles that watch events bring in between (a Deployment's
//! status, the operator's own status write) reuse it instead of scanning the table again. A failed
//! read waits the interval too, so a broken table is not scanned in a loop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use leasehold_worker::lease::{DynamoLeaseStore, Lease, LeaseSettings, LeaseStore};
use tokio::time::Instant;

use crate::FIELD_MANAGER;
use crate::metrics::Metrics;

/// What one read of a lease table showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRows {
    /// The shard leases (membership and term rows left out).
    pub leases: Vec<Lease>,
    /// When the read was made (the operator's clock).
    pub read_at: Timestamp,
}

/// When a consumer's rows were last read, and what the read gave (`None`: it failed).
type LastRead = (Instant, Option<Arc<LeaseRows>>);

/// Per-consumer cache of the last read.
#[derive(Debug)]
pub struct LeaseReads {
    interval: Duration,
    entries: Mutex<HashMap<String, LastRead>>,
}

impl LeaseReads {
    /// A cache keeping each read for `interval` (the reconcile interval).
    pub fn new(interval: Duration) -> Self {
        Self { interval, entries: Mutex::default() }
    }

    /// The rows of `table` for the consumer `key`: the last read while it is younger than the interval,
    /// else a fresh read; `None` when the read failed (the failure is logged).
    pub async fn get(
        &self,
        key: &str,
        dynamodb: aws_sdk_dynamodb::Client,
        table: &str,
        metrics: &Metrics,
    ) -> Option<Arc<LeaseRows>> {
        if let Some((read, rows)) = self.lock().get(key)
            && read.elapsed() < self.interval
        {
            return rows.clone();
        }
        let started = Instant::now();
        let rows = read(dynamodb, table, metrics).await.map(Arc::new);
        self.lock().insert(key.to_string(), (started, rows.clone()));
        rows
    }

    /// Drops the consumer's last read (it was deleted).
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, LastRead>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One consistent read of `table` through the worker's own listing, so malformed rows are skipped and
/// reported as the worker and the CLI skip and report them.
async fn read(dynamodb: aws_sdk_dynamodb::Client, table: &str, metrics: &Metrics) -> Option<LeaseRows> {
    metrics.lease_table_reads.inc();
    let reader = DynamoLeaseStore::new(dynamodb, table.to_string(), LeaseSettings::new(FIELD_MANAGER));
    let read_at = Timestamp::now();
    match reader.list().await {
        Ok(page) => {
            for row in &page.malformed {
                tracing::warn!(table, key = row.key, reason = row.reason, "malformed lease row skipped");
            }
            Some(LeaseRows { leases: page.leases, read_at })
        }
        Err(e) => {
            tracing::debug!(table, error = %e, "lease table not read");
            None
        }
    }
}
