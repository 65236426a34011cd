//! A spec with every default applied: the defaults, once, and the settings the worker runs with and
//! the operator derives from. [`StreamConsumerSpec::validate`](crate::StreamConsumerSpec::validate)
//! makes a [`ResolvedSpec`] from a spec.

use std::time::Duration;

use crate::spec::{LeaseBalance, LeaseScan, OnExhausted, Ordering, ReaderMode};

/// Every default of a spec, once: the resolver applies them to a spec, and code that builds worker
/// settings without a spec (tests, embedders) starts from [`ResolvedSpec::default`], made of them.
pub mod defaults {
    use std::time::Duration;

    use crate::spec::{LeaseBalance, LeaseScan, OnExhausted, Ordering, ReaderMode};

    /// `lease.duration`.
    pub const LEASE_DURATION: Duration = Duration::from_secs(10);
    /// `lease.renewInterval`.
    pub const RENEW_INTERVAL: Duration = Duration::from_secs(3);
    /// `lease.scanInterval`.
    pub const SCAN_INTERVAL: Duration = Duration::from_millis(500);
    /// `lease.shardSyncInterval`.
    pub const SHARD_SYNC_INTERVAL: Duration = Duration::from_secs(10);
    /// `lease.scan`.
    pub const LEASE_SCAN: LeaseScan = LeaseScan::Segmented;
    /// `lease.segmentRows`.
    pub const SEGMENT_ROWS: usize = 80;
    /// `lease.balance`.
    pub const LEASE_BALANCE: LeaseBalance = LeaseBalance::Count;
    /// `lease.checkpointInterval`.
    pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
    /// `lease.gracefulTimeout`.
    pub const GRACEFUL_TIMEOUT: Duration = Duration::from_secs(5);
    /// `reader.idleTime`.
    pub const IDLE_TIME: Duration = Duration::from_millis(500);
    /// `reader.maxRecords` (records per GetRecords call).
    pub const MAX_RECORDS: i32 = 1000;
    /// `reader.deaggregate`.
    pub const DEAGGREGATE: bool = true;
    /// `reader.mode`.
    pub const READER_MODE: ReaderMode = ReaderMode::Polling;
    /// `reader.subscriptionIdleTimeout`: twice the service's 5 s heartbeat, so one late heartbeat does
    /// not drop a healthy subscription.
    pub const SUBSCRIPTION_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
    /// `retry.maxAttempts`.
    pub const MAX_ATTEMPTS: u32 = 5;
    /// `retry.backoff`.
    pub const RETRY_BACKOFF: Duration = Duration::from_secs(1);
    /// `retry.onExhausted`.
    pub const ON_EXHAUSTED: OnExhausted = OnExhausted::Block;
    /// `ordering`.
    pub const ORDERING: Ordering = Ordering::Key;
    /// `concurrency`.
    pub const CONCURRENCY: usize = 1;
    /// `processor.http.timeout`.
    pub const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
    /// `processor.http.batch.maxRecords` (one record per request).
    pub const HTTP_BATCH_RECORDS: usize = 1;
    /// `processor.http.batch.maxDelay`.
    pub const HTTP_BATCH_MAX_DELAY: Duration = Duration::from_millis(5);
    /// `processor.multilang.timeout`.
    pub const MULTILANG_TIMEOUT: Duration = Duration::from_secs(60);
    /// `workers.autoscaling.lag.scaleUpAfter`.
    pub const LAG_SCALE_UP_AFTER: Duration = Duration::from_secs(60);
    /// `workers.autoscaling.lag.scaleDownAfter`.
    pub const LAG_SCALE_DOWN_AFTER: Duration = Duration::from_secs(600);
}

/// A spec's settings with every default applied: what the worker runs with and the operator derives
/// from (for example the pods' termination grace period from `graceful_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedSpec {
    /// The durations.
    pub durations: ResolvedDurations,
    /// `reader.maxRecords`.
    pub max_records: i32,
    /// `reader.deaggregate`.
    pub deaggregate: bool,
    /// `reader.mode`.
    pub mode: ReaderMode,
    /// `ordering`.
    pub ordering: Ordering,
    /// `concurrency`.
    pub concurrency: usize,
    /// `retry.maxAttempts`.
    pub max_attempts: u32,
    /// `retry.onExhausted`.
    pub on_exhausted: OnExhausted,
    /// `retry.maxRecordAge` (no limit when absent).
    pub max_record_age: Option<Duration>,
    /// `retry.bisect`.
    pub bisect: bool,
    /// `processor.http.batch.maxRecords`.
    pub http_batch_records: usize,
    /// `lease.scan`.
    pub lease_scan: LeaseScan,
    /// `lease.segmentRows`.
    pub segment_rows: usize,
    /// `lease.balance`.
    pub lease_balance: LeaseBalance,
    /// `workers.autoscaling.lag`, when set.
    pub lag_scaling: Option<LagTarget>,
}

/// `workers.autoscaling.lag` with its defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LagTarget {
    /// `target`: the lag to stay under.
    pub target: Duration,
    /// `scaleUpAfter` (default 1 m).
    pub scale_up_after: Duration,
    /// `scaleDownAfter` (default 10 m).
    pub scale_down_after: Duration,
}

impl Default for ResolvedSpec {
    fn default() -> Self {
        Self {
            durations: ResolvedDurations::default(),
            max_records: defaults::MAX_RECORDS,
            deaggregate: defaults::DEAGGREGATE,
            mode: defaults::READER_MODE,
            ordering: defaults::ORDERING,
            concurrency: defaults::CONCURRENCY,
            max_attempts: defaults::MAX_ATTEMPTS,
            on_exhausted: defaults::ON_EXHAUSTED,
            max_record_age: None,
            bisect: false,
            http_batch_records: defaults::HTTP_BATCH_RECORDS,
            lease_scan: defaults::LEASE_SCAN,
            segment_rows: defaults::SEGMENT_ROWS,
            lease_balance: defaults::LEASE_BALANCE,
            lag_scaling: None,
        }
    }
}

/// The spec's durations, parsed, with defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedDurations {
    /// `lease.duration` (default 10 s).
    pub lease: Duration,
    /// `lease.renewInterval` (default 3 s).
    pub renew_interval: Duration,
    /// `lease.scanInterval` (default 500 ms).
    pub scan_interval: Duration,
    /// `lease.shardSyncInterval` (default 10 s).
    pub shard_sync_interval: Duration,
    /// `lease.checkpointInterval` (default 1 s).
    pub checkpoint_interval: Duration,
    /// `lease.gracefulTimeout` (default 5 s).
    pub graceful_timeout: Duration,
    /// `reader.idleTime` (default 500 ms).
    pub idle_time: Duration,
    /// `reader.subscriptionIdleTimeout` (default 10 s).
    pub subscription_idle_timeout: Duration,
    /// `retry.backoff` (default 1 s).
    pub retry_backoff: Duration,
    /// `processor.http.timeout` (default 5 s).
    pub http_timeout: Duration,
    /// `processor.http.batch.maxDelay` (default 5 ms).
    pub http_batch_max_delay: Duration,
    /// `processor.multilang.timeout` (default 60 s).
    pub multilang_timeout: Duration,
}

impl Default for ResolvedDurations {
    fn default() -> Self {
        Self {
            lease: defaults::LEASE_DURATION,
            renew_interval: defaults::RENEW_INTERVAL,
            scan_interval: defaults::SCAN_INTERVAL,
            shard_sync_interval: defaults::SHARD_SYNC_INTERVAL,
            checkpoint_interval: defaults::CHECKPOINT_INTERVAL,
            graceful_timeout: defaults::GRACEFUL_TIMEOUT,
            idle_time: defaults::IDLE_TIME,
            subscription_idle_timeout: defaults::SUBSCRIPTION_IDLE_TIMEOUT,
            retry_backoff: defaults::RETRY_BACKOFF,
            http_timeout: defaults::HTTP_TIMEOUT,
            http_batch_max_delay: defaults::HTTP_BATCH_MAX_DELAY,
            multilang_timeout: defaults::MULTILANG_TIMEOUT,
        }
    }
}
