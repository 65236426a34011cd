//! How much work one held shard gives its holder: records/s, bytes/s and the processor's busy time per
//! second (ms/s, summed over records running at once), each a moving figure over about
//! [`HALF_LIFE`]. Records and bytes are per second of the records' *arrival* (their
//! `ApproximateArrivalTimestamp`s), not of reading: a holder that falls behind still measures what the
//! shard asks of a worker (its demand), not the share of a saturated worker it gets, and the figure
//! does not jump with the pages' rhythm. Kept up to date by the shard's reader, measured by the lease writes the holder makes
//! anyway (renewals, checkpoints), which carry it into the row as `load_records`, `load_bytes` and
//! `load_busy` (as `lag_ms`: no extra write). Read back by every worker's coordinator for
//! `lease.balance: load`, and by `leasehold describe`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;

/// How quickly the moving figure forgets: a sample this old weighs half as much as a fresh one.
pub const HALF_LIFE: Duration = Duration::from_secs(15);

/// The largest figure a row may carry in any of the three attributes. Far above what one shard can
/// carry (Kinesis caps a shard at 2 MB/s read, and a processor's busy ms/s at its concurrency × 1000);
/// a larger number is not a measure but a malformed row.
pub const MAX_FIGURE: u64 = 1 << 40;

/// One shard's load as written in its row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardLoad {
    /// Kinesis records read per second (a KPL aggregate counts once).
    pub records_per_s: u64,
    /// Bytes of record data delivered per second.
    pub bytes_per_s: u64,
    /// Milliseconds per second the processor spent on the shard's records (summed over records
    /// running at once, so up to the shard's concurrency × 1000).
    pub busy_ms_per_s: u64,
}

impl ShardLoad {
    /// The figure balancing weighs: records/s. Not busy time: by Little's law busy ms/s is the number
    /// of records in flight, and on a worker whose shards share one CPU (or one sidecar) that is mostly
    /// records waiting for it, so a busy worker's every shard looks heavy and moving one does not
    /// lower what the rows promised (docs/benchmarks.md, "Spread"). Records/s add up, do not depend on
    /// who holds the shard while its holder keeps up, and one consumer's records share one processor.
    pub fn weight(&self) -> u64 {
        self.records_per_s
    }

    /// The sum of `loads`, saturating.
    pub fn sum<'a>(loads: impl IntoIterator<Item = &'a ShardLoad>) -> ShardLoad {
        loads.into_iter().fold(ShardLoad::default(), |a, b| ShardLoad {
            records_per_s: a.records_per_s.saturating_add(b.records_per_s),
            bytes_per_s: a.bytes_per_s.saturating_add(b.bytes_per_s),
            busy_ms_per_s: a.busy_ms_per_s.saturating_add(b.busy_ms_per_s),
        })
    }
}

/// An exponentially weighted moving rate: fold in counts with the time they took, read the rate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MovingRate {
    rate: f64,
    started: bool,
}

impl MovingRate {
    /// Folds in `count` events seen over `elapsed`; an empty interval changes nothing. The first
    /// interval sets the rate outright (no slow climb from zero on a lease just taken).
    pub fn fold(&mut self, count: f64, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if seconds <= 0.0 {
            return;
        }
        let sample = count / seconds;
        if !self.started {
            self.rate = sample;
            self.started = true;
            return;
        }
        let keep = 0.5_f64.powf(seconds / HALF_LIFE.as_secs_f64());
        self.rate = self.rate * keep + sample * (1.0 - keep);
    }

    /// The current rate per second, as a whole number bounded by [`MAX_FIGURE`].
    pub fn per_second(&self) -> u64 {
        // A float to integer cast saturates; NaN (never made here) would give 0.
        (self.rate.round() as u64).min(MAX_FIGURE)
    }
}

/// The gauges a shard's load is exported to (`leasehold_shard_load_*`): records/s, bytes/s and the
/// processor's busy seconds per second (base units, as Prometheus names want them), set at each measure.
#[derive(Debug, Clone, Default)]
pub struct LoadGauges {
    /// Records per second.
    pub records: Gauge,
    /// Bytes per second.
    pub bytes: Gauge,
    /// Busy seconds per second (the row's busy ms/s over 1000).
    pub busy: Gauge<f64, AtomicU64>,
}

impl LoadGauges {
    fn set(&self, load: &ShardLoad) {
        let figure = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.records.set(figure(load.records_per_s));
        self.bytes.set(figure(load.bytes_per_s));
        self.busy.set(load.busy_ms_per_s as f64 / 1000.0);
    }
}

#[derive(Debug)]
struct Rates {
    since: Instant,
    /// The arrival (epoch ms, the service's clock) of the last record the figures cover; `None` when
    /// the next records' span must be taken from the wall clock (none yet, or the shard was idle).
    covered_to_ms: Option<i64>,
    records: MovingRate,
    bytes: MovingRate,
    busy_ms: MovingRate,
}

/// The shortest arrival span a sample is taken over: records put together (one `PutRecords`, the same
/// millisecond) carry no rate of their own, so they wait for the next measure.
const MIN_ARRIVAL_SPAN: Duration = Duration::from_millis(200);

/// One held shard's load meter, shared by its reader (which counts) and its lease writes (which
/// measure).
#[derive(Debug)]
pub struct LoadMeter {
    records: AtomicU64,
    bytes: AtomicU64,
    /// The latest arrival (epoch ms) among the records counted, or [`i64::MIN`] when none said.
    last_arrival_ms: AtomicI64,
    busy_us: AtomicU64,
    rates: Mutex<Rates>,
    /// Where each measure is also shown, once the reader attached them.
    gauges: OnceLock<LoadGauges>,
}

impl Default for LoadMeter {
    fn default() -> Self {
        let rates = Rates {
            since: Instant::now(),
            covered_to_ms: None,
            records: MovingRate::default(),
            bytes: MovingRate::default(),
            busy_ms: MovingRate::default(),
        };
        Self {
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            last_arrival_ms: AtomicI64::new(i64::MIN),
            busy_us: AtomicU64::new(0),
            rates: Mutex::new(rates),
            gauges: OnceLock::new(),
        }
    }
}

impl LoadMeter {
    /// Folds the records and bytes counted since the last measure over the span of their arrivals
    /// (since the last record already covered); over the wall clock's `elapsed` when that span is
    /// unknown. An interval without records lowers the figure only when the holder is caught up (an
    /// idle shard); a holder that is behind and delivered nothing (its processor stalled) keeps it.
    fn fold_demand(&self, rates: &mut Rates, elapsed: Duration, caught_up: bool) {
        let last = Some(self.last_arrival_ms.load(Ordering::Relaxed)).filter(|&ms| ms != i64::MIN);
        let records = self.records.load(Ordering::Relaxed);
        if records == 0 {
            if caught_up {
                rates.records.fold(0.0, elapsed);
                rates.bytes.fold(0.0, elapsed);
                rates.covered_to_ms = None;
            }
            return;
        }
        let span = match (rates.covered_to_ms, last) {
            // An arrival before what is covered (never within one shard; a clock stepped back)
            // leaves the span unknown.
            (Some(from), Some(to)) if to >= from => {
                let span = Duration::from_millis(u64::try_from(to - from).unwrap_or(0));
                if span < MIN_ARRIVAL_SPAN {
                    // Too close together to be a rate: counted with the next measure's.
                    return;
                }
                span
            }
            (None, Some(to)) if !caught_up => {
                // The first records with arrivals since the lease was taken (or the shard idle), read
                // from behind: how long they took to arrive is unknown and the wall clock would give
                // the reading pace (a backlog worked off). They only mark where the figure starts.
                self.records.swap(0, Ordering::Relaxed);
                self.bytes.swap(0, Ordering::Relaxed);
                rates.covered_to_ms = Some(to);
                return;
            }
            _ => elapsed,
        };
        let records = self.records.swap(0, Ordering::Relaxed);
        let bytes = self.bytes.swap(0, Ordering::Relaxed);
        rates.records.fold(records as f64, span);
        rates.bytes.fold(bytes as f64, span);
        rates.covered_to_ms = last;
    }

    /// Counts records delivered to the processor, their data's bytes and the latest arrival (epoch ms)
    /// among them, when the service said.
    pub fn delivered(&self, records: u64, bytes: u64, last_arrival_ms: Option<i64>) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(arrival) = last_arrival_ms {
            self.last_arrival_ms.fetch_max(arrival, Ordering::Relaxed);
        }
    }

    /// Counts time the processor spent on a record.
    pub fn busy(&self, spent: Duration) {
        self.busy_us.fetch_add(u64::try_from(spent.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Shows every later measure on `gauges` as well.
    pub fn report_to(&self, gauges: LoadGauges) {
        // Set once per held lease: a second reader of the same lease never exists.
        let _ = self.gauges.set(gauges);
    }

    /// Folds what was counted since the last measure into the moving figures and returns them; `None`
    /// while the shard's demand is not measured yet (the first measure on a lease just taken covers
    /// too short a time to be a figure, under a second; a holder reading from behind needs two).
    /// `caught_up`: the holder has finished every record read and reached the shard's tip (its lag is
    /// 0), so an interval without records is an idle one.
    pub fn measure(&self, caught_up: bool) -> Option<ShardLoad> {
        let mut rates = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(rates.since);
        if !rates.records.started && elapsed < Duration::from_secs(1) {
            return None;
        }
        if elapsed > Duration::ZERO {
            let busy_us = self.busy_us.swap(0, Ordering::Relaxed);
            rates.busy_ms.fold(busy_us as f64 / 1000.0, elapsed);
            rates.since = now;
            self.fold_demand(&mut rates, elapsed, caught_up);
        }
        if !rates.records.started {
            // No figure of its own yet: the row keeps the one its last holder wrote.
            return None;
        }
        let load = ShardLoad {
            records_per_s: rates.records.per_second(),
            bytes_per_s: rates.bytes.per_second(),
            busy_ms_per_s: rates.busy_ms.per_second(),
        };
        if let Some(gauges) = self.gauges.get() {
            gauges.set(&load);
        }
        Some(load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_rate_is_read_back() {
        let mut rate = MovingRate::default();
        for _ in 0..20 {
            rate.fold(500.0, Duration::from_secs(5));
        }
        assert_eq!(rate.per_second(), 100);
    }

    #[test]
    fn a_change_is_half_followed_after_one_half_life() {
        let mut rate = MovingRate::default();
        rate.fold(100.0, Duration::from_secs(1));
        rate.fold(300.0 * HALF_LIFE.as_secs_f64(), HALF_LIFE);
        assert_eq!(rate.per_second(), 200, "halfway from 100 to 300");
        for _ in 0..10 {
            rate.fold(300.0 * HALF_LIFE.as_secs_f64(), HALF_LIFE);
        }
        assert_eq!(rate.per_second(), 300);
        // Gone cold: the figure falls towards 0 and reaches it.
        for _ in 0..40 {
            rate.fold(0.0, HALF_LIFE);
        }
        assert_eq!(rate.per_second(), 0);
    }

    #[test]
    fn empty_intervals_and_huge_counts_are_bounded() {
        let mut rate = MovingRate::default();
        rate.fold(1e30, Duration::ZERO);
        assert_eq!(rate.per_second(), 0, "an empty interval is no sample");
        rate.fold(1e30, Duration::from_millis(1));
        assert_eq!(rate.per_second(), MAX_FIGURE);
    }

    /// Reads a page of `per_page` records a second for `seconds`, records that arrived at `arrivals`
    /// a second, the last read's arrival in `arrived_ms`, measuring every 3 s; the figure at the end.
    async fn read_behind(
        meter: &LoadMeter,
        arrived_ms: &mut i64,
        (seconds, per_page, arrivals): (u64, u64, u64),
        caught_up: bool,
    ) -> ShardLoad {
        let mut load = None;
        for second in 1..=seconds {
            tokio::time::advance(Duration::from_secs(1)).await;
            *arrived_ms += (per_page * 1000 / arrivals) as i64;
            meter.delivered(per_page, per_page * 100, Some(*arrived_ms));
            if second % 3 == 0 {
                load = meter.measure(caught_up);
            }
        }
        load.expect("measured")
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_behind_measures_the_shards_demand_by_arrival_not_its_own_pace() {
        // A saturated worker reads 140 records a second of a shard whose records arrive at 180 a second.
        let (meter, mut arrived_ms) = (LoadMeter::default(), 1_000_000);
        let load = read_behind(&meter, &mut arrived_ms, (90, 140, 180), false).await;
        assert!((175..=185).contains(&load.records_per_s), "{load:?}");
        assert!((17_500..=18_500).contains(&load.bytes_per_s), "{load:?}");
        // A fast new holder works off the backlog at 900 a second: no figure of its own at first (the
        // row keeps its last holder's), then still the shard's 180, not its own pace.
        let meter = LoadMeter::default();
        tokio::time::advance(Duration::from_secs(3)).await;
        arrived_ms += 15_000;
        meter.delivered(2700, 270_000, Some(arrived_ms));
        assert_eq!(meter.measure(false), None, "reading from behind, the first measure only marks the start");
        let load = read_behind(&meter, &mut arrived_ms, (30, 900, 180), false).await;
        assert!((175..=185).contains(&load.records_per_s), "{load:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_interval_lowers_the_figure_only_when_the_holder_is_caught_up() {
        let meter = LoadMeter::default();
        read_behind(&meter, &mut 1_000_000, (30, 100, 100), true).await;
        // Behind with nothing delivered (the processor stalled): the demand is what it was.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(meter.measure(false).expect("measured").records_per_s >= 99);
        // Caught up and nothing arrives: an idle shard, the figure falls.
        tokio::time::advance(Duration::from_secs(30)).await;
        let load = meter.measure(true).expect("measured");
        assert!(load.records_per_s <= 30, "{load:?}");
        // Records put together (one millisecond) after an idle spell: a wall-clock interval.
        tokio::time::advance(Duration::from_secs(3)).await;
        meter.delivered(30, 3000, Some(5_000_000));
        assert!(meter.measure(true).expect("measured").records_per_s > 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_meter_measures_on_the_paused_clock() {
        let meter = LoadMeter::default();
        assert_eq!(meter.measure(true), None, "too soon after taking the lease");
        for _ in 0..30 {
            tokio::time::advance(Duration::from_secs(1)).await;
            meter.delivered(100, 10_000, None);
            meter.busy(Duration::from_millis(250));
        }
        let load = meter.measure(true).expect("measured");
        assert_eq!(load, ShardLoad { records_per_s: 100, bytes_per_s: 10_000, busy_ms_per_s: 250 });
        assert_eq!(load.weight(), 100, "balancing weighs records/s");
        // Gauges attached later show the measures from then on.
        let gauges = LoadGauges::default();
        meter.report_to(gauges.clone());
        // A write soon after, with nothing counted between, keeps the figure nearly where it was.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(meter.measure(true).expect("measured").records_per_s >= 99);
        assert!(gauges.records.get() >= 99, "{}", gauges.records.get());
        assert!((9_900..=10_000).contains(&gauges.bytes.get()), "{}", gauges.bytes.get());
        assert!((0.247..=0.25).contains(&gauges.busy.get()), "{}", gauges.busy.get());
    }
}
