//! How much work one held shard gives its holder: records/s, bytes/s and the processor's busy time per
//! second (ms/s, summed over records running at once), each a moving figure over about
//! [`HALF_LIFE`]. Kept up to date by the shard's reader, measured by the lease writes the holder makes
//! anyway (renewals, checkpoints), which carry it into the row as `load_records`, `load_bytes` and
//! `load_busy` (as `lag_ms`: no extra write). Read back by every worker's coordinator for
//! `lease.balance: load`, and by `leasehold describe`.

use std::sync::atomic::{AtomicU64, Ordering};
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
    /// The figure balancing weighs: busy time when the processor took any (the best proxy for a
    /// worker's CPU across processor kinds), records otherwise (a processor too fast to measure).
    pub fn weight(&self) -> u64 {
        if self.busy_ms_per_s > 0 { self.busy_ms_per_s.saturating_mul(1000) } else { self.records_per_s }
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
    records: MovingRate,
    bytes: MovingRate,
    busy_ms: MovingRate,
}

/// One held shard's load meter, shared by its reader (which counts) and its lease writes (which
/// measure).
#[derive(Debug)]
pub struct LoadMeter {
    records: AtomicU64,
    bytes: AtomicU64,
    busy_us: AtomicU64,
    rates: Mutex<Rates>,
    /// Where each measure is also shown, once the reader attached them.
    gauges: OnceLock<LoadGauges>,
}

impl Default for LoadMeter {
    fn default() -> Self {
        let rates = Rates {
            since: Instant::now(),
            records: MovingRate::default(),
            bytes: MovingRate::default(),
            busy_ms: MovingRate::default(),
        };
        Self {
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            busy_us: AtomicU64::new(0),
            rates: Mutex::new(rates),
            gauges: OnceLock::new(),
        }
    }
}

impl LoadMeter {
    /// Counts records delivered to the processor and their data's bytes.
    pub fn delivered(&self, records: u64, bytes: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
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
    /// when nothing was measured yet (the first measure on a lease just taken covers too short a time
    /// to be a figure: under a second).
    pub fn measure(&self) -> Option<ShardLoad> {
        let mut rates = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(rates.since);
        if !rates.records.started && elapsed < Duration::from_secs(1) {
            return None;
        }
        if elapsed > Duration::ZERO {
            let records = self.records.swap(0, Ordering::Relaxed);
            let bytes = self.bytes.swap(0, Ordering::Relaxed);
            let busy_us = self.busy_us.swap(0, Ordering::Relaxed);
            rates.records.fold(records as f64, elapsed);
            rates.bytes.fold(bytes as f64, elapsed);
            rates.busy_ms.fold(busy_us as f64 / 1000.0, elapsed);
            rates.since = now;
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

    #[tokio::test(start_paused = true)]
    async fn the_meter_measures_on_the_paused_clock() {
        let meter = LoadMeter::default();
        assert_eq!(meter.measure(), None, "too soon after taking the lease");
        for _ in 0..30 {
            tokio::time::advance(Duration::from_secs(1)).await;
            meter.delivered(100, 10_000);
            meter.busy(Duration::from_millis(250));
        }
        let load = meter.measure().expect("measured");
        assert_eq!(load, ShardLoad { records_per_s: 100, bytes_per_s: 10_000, busy_ms_per_s: 250 });
        assert_eq!(load.weight(), 250_000);
        // Gauges attached later show the measures from then on.
        let gauges = LoadGauges::default();
        meter.report_to(gauges.clone());
        // A write soon after, with nothing counted between, keeps the figure nearly where it was.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(meter.measure().expect("measured").records_per_s >= 99);
        assert!(gauges.records.get() >= 99, "{}", gauges.records.get());
        assert!((9_900..=10_000).contains(&gauges.bytes.get()), "{}", gauges.bytes.get());
        assert!((0.247..=0.25).contains(&gauges.busy.get()), "{}", gauges.busy.get());
    }
}
