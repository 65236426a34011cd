//! The lease rows of each consumer, read at most once per reconcile interval: the lease spread and the
//! lag both come from one read, and reconciles that watch events bring in between (a Deployment's
//! status, the operator's own status write) reuse it instead of scanning the table again. A failed
//! read waits the interval too, so a broken table is not scanned in a loop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use leasehold_worker::lease::{DynamoLeaseStore, Lease, LeasePage, LeaseSettings, LeaseStore, PageToken};
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

/// Most rows the operator reads of one lease table (a row per shard, plus one per worker): far above any
/// group's, and a bound on the operator's memory (a lease is a few hundred bytes) whatever table a spec
/// names. A larger table is not read: status shows no lease spread or lag for it, and a warning says why.
pub const MAX_ROWS: usize = 20_000;

/// Rows asked for per Scan page (DynamoDB also stops a page at 1 MB).
const PAGE_ROWS: i32 = 1_000;

/// One consistent read of `table` through the worker's own listing, page by page and at most
/// [`MAX_ROWS`] rows, so malformed rows are skipped and reported as the worker and the CLI skip and
/// report them.
async fn read(dynamodb: aws_sdk_dynamodb::Client, table: &str, metrics: &Metrics) -> Option<LeaseRows> {
    metrics.lease_table_reads.inc();
    let reader = DynamoLeaseStore::new(dynamodb, table.to_string(), LeaseSettings::new(FIELD_MANAGER));
    let read_at = Timestamp::now();
    match read_bounded(&reader, MAX_ROWS).await {
        Ok(Bounded::Whole(page)) => {
            for row in &page.malformed {
                tracing::warn!(table, key = row.key, reason = row.reason, "malformed lease row skipped");
            }
            Some(LeaseRows { leases: page.leases, read_at })
        }
        Ok(Bounded::TooLarge) => {
            tracing::warn!(
                table,
                max_rows = MAX_ROWS,
                "lease table has more rows than the operator reads; lease spread and lag not reported"
            );
            None
        }
        Err(e) => {
            tracing::debug!(table, error = %e, "lease table not read");
            None
        }
    }
}

/// What a bounded read of a lease table gave.
#[derive(Debug)]
enum Bounded {
    /// Every row, at most the bound.
    Whole(LeasePage),
    /// More rows than the bound: the read stopped there.
    TooLarge,
}

/// Reads `store` page by page, stopping as soon as more than `max_rows` rows have been seen.
async fn read_bounded(store: &dyn LeaseStore, max_rows: usize) -> leasehold_worker::lease::Result<Bounded> {
    let mut all = LeasePage::default();
    let mut start: Option<PageToken> = None;
    loop {
        let page = store.list_page(start.as_ref(), PAGE_ROWS).await?;
        let rows = page.leases.len() + page.malformed.len() + page.members.len() + page.terms.len();
        let seen = all.leases.len() + all.malformed.len() + all.members.len() + all.terms.len() + rows;
        if seen > max_rows {
            return Ok(Bounded::TooLarge);
        }
        all.leases.extend(page.leases);
        all.malformed.extend(page.malformed);
        all.members.extend(page.members);
        all.terms.extend(page.terms);
        match page.next {
            Some(next) => start = Some(next),
            None => return Ok(Bounded::Whole(all)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_worker::lease::{Checkpoint, LeaseKey, MemoryLeaseStore, NewLease, ShardLeases};

    #[tokio::test]
    async fn a_table_over_the_bound_is_not_read_whole() {
        let store = MemoryLeaseStore::new(LeaseSettings::new("test"));
        for i in 0..30 {
            let lease = NewLease {
                key: LeaseKey::new("orders", format!("shardId-{i:012}")),
                checkpoint: Checkpoint::TrimHorizon,
                parent_shard_ids: Vec::new(),
                stream_created: None,
            };
            assert!(store.create_if_absent(&lease).await.unwrap());
        }
        assert!(matches!(read_bounded(&store, 30).await.unwrap(), Bounded::Whole(page) if page.leases.len() == 30));
        assert!(matches!(read_bounded(&store, 29).await.unwrap(), Bounded::TooLarge));
    }
}
