//! The capacity of a PROVISIONED lease table. [`demand`] (pure) is what a group asks of the table per
//! second, from its open shards, workers and lease timings, derived from the requests the worker makes
//! (lease/dynamo, coordinator/segmented) and the operator's own reads; [`planned`] is what the table
//! should hold: `leaseTable.readCapacity` / `writeCapacity` when set, else the demand with headroom,
//! raised at once when the group grows and lowered only within DynamoDB's limits on decreases.
//! docs/capacity.md states the formula and the rules.

use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{BillingMode, ProvisionedThroughput, TableDescription, TableStatus};
use leasehold_crds::{LeaseScan, LeaseTableSpec, ResolvedSpec};

use crate::error::{Error, Result};

/// Bytes of a lease row as the worker writes it (key, owner id, expiry, counter, a 56-digit checkpoint,
/// `stream_created`; docs/architecture.md, "The arithmetic").
pub const LEASE_ROW_BYTES: f64 = 216.0;
/// Bytes of a worker's membership row `#worker:<owner>`.
pub const MEMBER_ROW_BYTES: f64 = 154.0;
/// Bytes of each of the small group rows (`#term:discovery`, `#term:changes`, the requeue key row).
pub const GROUP_ROW_BYTES: f64 = 140.0;
/// How many small group rows a table holds.
pub const GROUP_ROWS: f64 = 3.0;
/// Bytes a strongly consistent read unit covers (an eventually consistent read costs half).
pub const READ_UNIT_BYTES: f64 = 4096.0;
/// Rows per page of a whole-table read (the worker's `DEFAULT_PAGE_SIZE`; the operator reads alike).
pub const WHOLE_PAGE_ROWS: f64 = 100.0;
/// Rows per page of a segment read (the worker's `SEGMENT_PAGE_SIZE`).
pub const SEGMENT_PAGE_ROWS: f64 = leasehold_worker::lease::SEGMENT_PAGE_SIZE as f64;
/// Sized capacity over demand: room for takeovers, handoffs, releases and the rows of new shards,
/// which come in bursts the steady-state formula leaves out.
pub const HEADROOM: f64 = 1.25;
/// The most units the operator sizes a table to (DynamoDB's default per-table quota).
pub const MAX_UNITS: i64 = 40_000;
/// A decrease is made once DynamoDB allows one: 4 a day at any time, then one per hour without one.
pub const FREE_DECREASES_PER_DAY: i64 = 4;
/// See [`FREE_DECREASES_PER_DAY`].
pub const DECREASE_SPACING: Duration = Duration::from_secs(3600);

/// What sizes the demand: the group and its timings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Group {
    /// Open shards (one active lease each).
    pub shards: u32,
    /// Workers (at least one is counted).
    pub workers: u32,
    /// `lease.renewInterval`.
    pub renew_interval: Duration,
    /// `lease.checkpointInterval`.
    pub checkpoint_interval: Duration,
    /// `lease.scanInterval`.
    pub scan_interval: Duration,
    /// `lease.shardSyncInterval`.
    pub shard_sync_interval: Duration,
    /// `lease.scan`.
    pub scan: LeaseScan,
    /// `lease.segmentRows`.
    pub segment_rows: usize,
    /// How often the operator reads the whole table (its `--shard-poll-interval`).
    pub operator_interval: Duration,
}

impl Group {
    /// The group of `resolved`'s timings with `shards` open shards and `workers` workers.
    pub fn of(resolved: &ResolvedSpec, shards: u32, workers: u32, operator_interval: Duration) -> Self {
        let d = &resolved.durations;
        Self {
            shards,
            workers,
            renew_interval: d.renew_interval,
            checkpoint_interval: d.checkpoint_interval,
            scan_interval: d.scan_interval,
            shard_sync_interval: d.shard_sync_interval,
            scan: resolved.lease_scan,
            segment_rows: resolved.segment_rows,
            operator_interval,
        }
    }
}

/// Capacity units per second a group uses, by what uses them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Demand {
    /// Writes: one renewal per shard every renew interval.
    pub renewals: f64,
    /// Writes: one checkpoint per busy shard every checkpoint interval (every shard counted busy).
    pub checkpoints: f64,
    /// Writes: one heartbeat per worker every renew interval.
    pub heartbeats: f64,
    /// Writes: the discovery term's renewal every renew interval.
    pub term: f64,
    /// Reads: the segments, each by its readers every scan interval (with `scan: full`, none).
    pub segment_reads: f64,
    /// Reads: the whole-table reads the workers make (rare at rest when segmented; every scan with `full`).
    pub whole_reads: f64,
    /// Reads: the discovery term holder's whole read every shard sync interval.
    pub shard_sync: f64,
    /// Reads: every worker's eventually consistent read of the change row every renew interval.
    pub change_row: f64,
    /// Reads: the operator's whole read every poll interval (lease spread and lag).
    pub operator_reads: f64,
}

impl Demand {
    /// Write units per second.
    pub fn writes(&self) -> f64 {
        self.writes_at_rest() + self.checkpoints
    }

    /// Write units per second with no record flowing (no checkpoints).
    pub fn writes_at_rest(&self) -> f64 {
        self.renewals + self.heartbeats + self.term
    }

    /// Read units per second.
    pub fn reads(&self) -> f64 {
        self.segment_reads + self.whole_reads + self.shard_sync + self.change_row + self.operator_reads
    }
}

fn per_second(interval: Duration) -> f64 {
    1.0 / interval.as_secs_f64().max(0.001)
}

/// What `group` asks of its table per second (docs/capacity.md, "The formula").
pub fn demand(group: &Group) -> Demand {
    let shards = f64::from(group.shards);
    let workers = f64::from(group.workers.max(1));
    let rows = shards + workers + GROUP_ROWS;
    let bytes = shards * LEASE_ROW_BYTES + workers * MEMBER_ROW_BYTES + GROUP_ROWS * GROUP_ROW_BYTES;
    // A Scan page is billed on its rows' total size rounded up: at most one unit of rounding per page.
    let whole = (bytes / READ_UNIT_BYTES).ceil() + (rows / WHOLE_PAGE_ROWS).ceil();
    let scans = per_second(group.scan_interval);
    let (segment_reads, whole_reads) = match group.scan {
        LeaseScan::Full => (0.0, workers * whole * scans),
        LeaseScan::Segmented => {
            let segment_rows = (group.segment_rows.max(1) as f64).min(f64::from(u32::MAX));
            let segments = (rows / segment_rows).ceil().clamp(1.0, workers);
            let readers = workers.min(2.0);
            let per_segment =
                (bytes / segments / READ_UNIT_BYTES).ceil() + (rows / segments / SEGMENT_PAGE_ROWS).ceil() - 1.0;
            // At rest each worker reads the whole table every max(shardSync, 4 x scan x workers).
            let whole_every =
                group.shard_sync_interval.as_secs_f64().max(4.0 * group.scan_interval.as_secs_f64() * workers);
            (segments * readers * per_segment * scans, workers * whole / whole_every.max(0.001))
        }
    };
    let renew = per_second(group.renew_interval);
    Demand {
        renewals: shards * renew,
        checkpoints: shards * per_second(group.checkpoint_interval),
        heartbeats: workers * renew,
        term: renew,
        segment_reads,
        whole_reads,
        shard_sync: whole * per_second(group.shard_sync_interval),
        change_row: workers * 0.5 * renew,
        operator_reads: whole * per_second(group.operator_interval),
    }
}

/// Provisioned capacity units of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Read capacity units.
    pub read: i64,
    /// Write capacity units.
    pub write: i64,
}

fn units(per_second: f64) -> i64 {
    // Clamped to 1..=MAX_UNITS first, so the cast cannot truncate.
    per_second.ceil().clamp(1.0, MAX_UNITS as f64) as i64
}

impl Capacity {
    /// The least capacity that serves `demand` (rounded up, no headroom): below it the group throttles.
    pub fn floor(demand: &Demand) -> Self {
        Self { read: units(demand.reads()), write: units(demand.writes()) }
    }

    /// The capacity the operator sizes a table to for `demand`: with [`HEADROOM`].
    pub fn sized(demand: &Demand) -> Self {
        Self { read: units(demand.reads() * HEADROOM), write: units(demand.writes() * HEADROOM) }
    }

    /// True when it holds at least `other` on both sides.
    pub fn covers(&self, other: &Capacity) -> bool {
        self.read >= other.read && self.write >= other.write
    }
}

impl std::fmt::Display for Capacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} RCU / {} WCU", self.read, self.write)
    }
}

/// What the spec asks: its own figures where set, the sized ones otherwise.
pub fn target(spec: &LeaseTableSpec, sized: Capacity) -> Capacity {
    Capacity { read: spec.read_capacity.unwrap_or(sized.read), write: spec.write_capacity.unwrap_or(sized.write) }
}

/// A provisioned table's capacity and its decreases, as DescribeTable shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provisioned {
    /// The capacity now.
    pub capacity: Capacity,
    /// Decreases made today (UTC).
    pub decreases_today: i64,
    /// When the last decrease was made.
    pub last_decrease: Option<SystemTime>,
}

impl Provisioned {
    /// The provisioned capacity of `table`; `None` for an on-demand table.
    pub fn of(table: &TableDescription) -> Option<Self> {
        let on_demand =
            table.billing_mode_summary().and_then(|b| b.billing_mode()) == Some(&BillingMode::PayPerRequest);
        let throughput = table.provisioned_throughput()?;
        let capacity = Capacity {
            read: throughput.read_capacity_units().unwrap_or(0),
            write: throughput.write_capacity_units().unwrap_or(0),
        };
        if on_demand || (capacity.read == 0 && capacity.write == 0) {
            return None;
        }
        let last_decrease = throughput.last_decrease_date_time().and_then(|t| SystemTime::try_from(*t).ok());
        Some(Self { capacity, decreases_today: throughput.number_of_decreases_today().unwrap_or(0), last_decrease })
    }

    /// Whether DynamoDB allows a decrease at `now`: one of the day's first four, or an hour after the last.
    pub fn may_decrease(&self, now: SystemTime) -> bool {
        self.decreases_today < FREE_DECREASES_PER_DAY
            || self.last_decrease.is_none_or(|t| now.duration_since(t).is_ok_and(|d| d >= DECREASE_SPACING))
    }
}

/// The capacity to set on a table holding `current`, for `want`: a side below `want` is raised at once;
/// a side above is lowered to `want` when DynamoDB allows a decrease and either the figure is the
/// spec's own (`explicit`) or the table holds more than twice `want` (sized figures move with every
/// reshard; halving keeps one split-then-merge from spending a decrease). `None`: leave it as it is.
pub fn planned(current: &Provisioned, want: Capacity, explicit: (bool, bool), now: SystemTime) -> Option<Capacity> {
    let may_decrease = current.may_decrease(now);
    let side = |have: i64, want: i64, explicit: bool| {
        if have < want || (have > want && may_decrease && (explicit || have > 2 * want)) { want } else { have }
    };
    let next = Capacity {
        read: side(current.capacity.read, want.read, explicit.0),
        write: side(current.capacity.write, want.write, explicit.1),
    };
    (next != current.capacity).then_some(next)
}

fn failed(table: &str, error: impl std::fmt::Display) -> Error {
    Error::Table { table: table.into(), message: error.to_string() }
}

/// The table's description, if it exists and is ACTIVE.
pub async fn describe_active(client: &Client, table: &str) -> Result<Option<TableDescription>> {
    let out = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|e| failed(table, crate::aws::error_message(&e)))?;
    Ok(out.table.filter(|t| t.table_status == Some(TableStatus::Active)))
}

/// Sets the table's provisioned capacity to `capacity` (UpdateTable; the table stays usable while
/// UPDATING).
pub async fn update(client: &Client, table: &str, capacity: Capacity) -> Result<()> {
    let throughput = ProvisionedThroughput::builder()
        .read_capacity_units(capacity.read)
        .write_capacity_units(capacity.write)
        .build()
        .map_err(|e| failed(table, e))?;
    client
        .update_table()
        .table_name(table)
        .provisioned_throughput(throughput)
        .send()
        .await
        .map_err(|e| failed(table, crate::aws::error_message(&e)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults(shards: u32, workers: u32) -> Group {
        Group {
            shards,
            workers,
            renew_interval: Duration::from_secs(3),
            checkpoint_interval: Duration::from_secs(1),
            scan_interval: Duration::from_millis(500),
            shard_sync_interval: Duration::from_secs(10),
            scan: LeaseScan::Segmented,
            segment_rows: 80,
            operator_interval: Duration::from_secs(30),
        }
    }

    #[test]
    fn the_default_group_resolves_to_the_default_timings() {
        let spec: leasehold_crds::StreamConsumerSpec =
            serde_json::from_value(serde_json::json!({"streams": [{"name": "s"}], "processor": {"stdout": {}}}))
                .expect("spec");
        let resolved = spec.validate().expect("valid");
        assert_eq!(Group::of(&resolved, 16, 2, Duration::from_secs(30)), defaults(16, 2));
    }

    #[test]
    fn sixteen_busy_shards_at_default_timings_need_more_than_the_old_fixed_ten_units() {
        // 16 renewals / 3 s + 16 checkpoints / 1 s + heartbeats and the term: 1.33 WCU per shard.
        let one = demand(&defaults(16, 1));
        assert!((one.writes() - (16.0 / 3.0 + 16.0 + 1.0 / 3.0 + 1.0 / 3.0)).abs() < 1e-9);
        assert_eq!(Capacity::floor(&one), Capacity { read: 3, write: 22 });
        assert_eq!(Capacity::sized(&one), Capacity { read: 4, write: 28 });
        let four = demand(&defaults(16, 4));
        assert_eq!(Capacity::sized(&four), Capacity { read: 13, write: 29 });
        // The old fixed 10 WCU served 7 busy shards at most: 7 x 1.33 + 2 x 0.33 = 10 < 8 x 1.33 + 0.67.
        assert!(demand(&defaults(7, 1)).writes() <= 10.0 + 1e-9 && demand(&defaults(8, 1)).writes() > 10.0);
    }

    #[test]
    fn the_formula_bounds_what_the_scale_bench_measured_at_rest() {
        // docs/benchmarks.md, "Scale and cost" (segmented, at rest): read and write units per shard-hour.
        for (workers, shards, read, write) in
            [(10, 100, 923.0, 1329.0), (50, 500, 1007.0, 1310.0), (100, 1000, 953.0, 1053.0)]
        {
            let d = demand(&Group { operator_interval: Duration::from_secs(3600 * 24), ..defaults(shards, workers) });
            let per_shard_hour = |units_per_second: f64| units_per_second * 3600.0 / f64::from(shards);
            let (reads, writes) = (per_shard_hour(d.reads()), per_shard_hour(d.writes_at_rest()));
            assert!(reads >= read && reads <= read * 1.5, "{workers} x {shards}: {reads:.0} read units vs {read}");
            assert!(writes >= write * 0.99 && writes <= write * 1.3, "{workers} x {shards}: {writes:.0} vs {write}");
        }
    }

    #[test]
    fn full_scans_grow_with_the_workers_and_segmented_ones_do_not() {
        let full = |w| demand(&Group { scan: LeaseScan::Full, ..defaults(10 * w, w) }).reads() / f64::from(10 * w);
        let segmented = |w| demand(&defaults(10 * w, w)).reads() / f64::from(10 * w);
        assert!(full(50) > 4.0 * full(10));
        assert!(segmented(50) < 1.5 * segmented(10));
    }

    #[test]
    fn capacity_is_clamped_to_dynamodbs_range() {
        assert_eq!(Capacity::sized(&Demand::default()), Capacity { read: 1, write: 1 });
        let huge = demand(&Group { renew_interval: Duration::from_millis(1), ..defaults(1_000_000, 1) });
        assert_eq!(Capacity::sized(&huge).write, MAX_UNITS);
    }

    #[test]
    fn the_specs_own_figures_win() {
        let spec = LeaseTableSpec { read_capacity: Some(5), ..LeaseTableSpec::default() };
        assert_eq!(target(&spec, Capacity { read: 9, write: 30 }), Capacity { read: 5, write: 30 });
    }

    fn table(read: i64, write: i64, decreases_today: i64, last_decrease: Option<SystemTime>) -> Provisioned {
        Provisioned { capacity: Capacity { read, write }, decreases_today, last_decrease }
    }

    #[test]
    fn increases_are_made_at_once_and_decreases_within_the_limits() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let want = Capacity { read: 10, write: 40 };
        // Raised at once, both sides.
        assert_eq!(planned(&table(4, 28, 0, None), want, (false, false), now), Some(want));
        // Sized figures: a small surplus stays (a reshard back should not spend a decrease) ...
        assert_eq!(planned(&table(15, 60, 0, None), want, (false, false), now), None);
        // ... more than twice what is needed is lowered.
        assert_eq!(planned(&table(21, 40, 0, None), want, (false, false), now), Some(want));
        // The spec's own figure is applied even when slightly lower.
        assert_eq!(planned(&table(11, 40, 0, None), want, (true, false), now), Some(want));
        // Past the day's four free decreases, one an hour.
        let recent = Some(now - Duration::from_secs(600));
        assert_eq!(planned(&table(11, 40, 4, recent), want, (true, true), now), None);
        let hour_ago = Some(now - DECREASE_SPACING);
        assert_eq!(planned(&table(11, 40, 4, hour_ago), want, (true, true), now), Some(want));
        // A raise on one side still happens when the other may not decrease.
        assert_eq!(planned(&table(11, 20, 4, recent), want, (true, true), now), Some(Capacity { read: 11, write: 40 }));
        assert_eq!(planned(&table(10, 40, 0, None), want, (true, true), now), None);
    }
}
