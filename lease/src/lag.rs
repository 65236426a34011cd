//! How far behind its holder is on one shard: kept up to date by the shard's reader, measured by the
//! lease writes the holder makes anyway (renewals, checkpoints), which carry it into the row as
//! `lag_ms` (docs/lease-protocol.md, "Lag").
//!
//! The lag is the age of the oldest record read but not finished (by its `ApproximateArrivalTimestamp`),
//! or the service's `millisBehindLatest` at the last read when that is larger: 0 when every record read
//! is done and the service reports the shard's tip reached.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;

/// Marks an atomic that holds no value (no record unfinished; no read yet).
const NOTHING: i64 = i64::MIN;

/// The gauge a shard's lag is exported to, in seconds.
pub type LagGauge = Gauge<f64, AtomicU64>;

/// One held shard's lag, shared by its reader (which sets it) and its lease writes (which measure it).
#[derive(Debug)]
pub struct ShardLag {
    /// Arrival (epoch ms) of the oldest record read and not yet finished, or [`NOTHING`].
    oldest_unfinished_ms: AtomicI64,
    /// `millisBehindLatest` at the last read (0 when the service did not say), or [`NOTHING`] before
    /// the first read: until then nothing is known.
    service_behind_ms: AtomicI64,
    /// Where each measure is also shown (`leasehold_shard_lag_seconds`), once the reader attached it.
    gauge: OnceLock<LagGauge>,
}

impl Default for ShardLag {
    fn default() -> Self {
        Self {
            oldest_unfinished_ms: AtomicI64::new(NOTHING),
            service_behind_ms: AtomicI64::new(NOTHING),
            gauge: OnceLock::new(),
        }
    }
}

impl ShardLag {
    /// Records a read (a GetRecords answer or a fan-out event) and the `millisBehindLatest` it
    /// carried, if any.
    pub fn read(&self, millis_behind_latest: Option<i64>) {
        self.service_behind_ms.store(millis_behind_latest.unwrap_or(0).max(0), Ordering::Relaxed);
    }

    /// Records the arrival time (epoch ms) of the oldest record read and not finished; `None` when
    /// every record read is done (or its arrival is unknown).
    pub fn set_oldest_unfinished(&self, arrival_ms: Option<i64>) {
        self.oldest_unfinished_ms.store(arrival_ms.unwrap_or(NOTHING), Ordering::Relaxed);
    }

    /// Shows every later measure on `gauge` as well.
    pub fn report_to(&self, gauge: LagGauge) {
        // Set once per held lease: a second reader of the same lease never exists.
        let _ = self.gauge.set(gauge);
    }

    /// The lag at wall-clock time `now_ms`; `None` before the first read.
    pub fn measure(&self, now_ms: i64) -> Option<Duration> {
        let behind = self.service_behind_ms.load(Ordering::Relaxed);
        if behind == NOTHING {
            return None;
        }
        let oldest = self.oldest_unfinished_ms.load(Ordering::Relaxed);
        // A record stamped later than this worker's clock (skew) is as young as a record can be: 0.
        let age = if oldest == NOTHING { 0 } else { now_ms.saturating_sub(oldest).max(0) };
        let lag = Duration::from_millis(u64::try_from(age.max(behind)).unwrap_or(0));
        if let Some(gauge) = self.gauge.get() {
            gauge.set(lag.as_secs_f64());
        }
        Some(lag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_before_the_first_read_then_zero_when_caught_up() {
        let lag = ShardLag::default();
        assert_eq!(lag.measure(10_000), None);
        lag.read(None);
        assert_eq!(lag.measure(10_000), Some(Duration::ZERO), "nothing unfinished and no service figure: 0");
    }

    #[test]
    fn the_oldest_unfinished_record_ages_with_the_clock() {
        let lag = ShardLag::default();
        lag.read(Some(0));
        lag.set_oldest_unfinished(Some(4_000));
        assert_eq!(lag.measure(10_000), Some(Duration::from_secs(6)));
        assert_eq!(lag.measure(11_500), Some(Duration::from_millis(7_500)));
        lag.set_oldest_unfinished(None);
        assert_eq!(lag.measure(11_500), Some(Duration::ZERO));
    }

    #[test]
    fn the_service_figure_counts_when_larger() {
        let lag = ShardLag::default();
        lag.read(Some(9_000));
        lag.set_oldest_unfinished(Some(9_000));
        assert_eq!(lag.measure(10_000), Some(Duration::from_secs(9)), "the tip is further than our oldest record");
        lag.read(Some(0));
        assert_eq!(lag.measure(10_000), Some(Duration::from_secs(1)));
        lag.set_oldest_unfinished(Some(12_000));
        assert_eq!(lag.measure(10_000), Some(Duration::ZERO), "a record from a clock ahead of ours is not negative");
    }

    #[test]
    fn each_measure_is_shown_on_the_gauge() {
        let (lag, gauge) = (ShardLag::default(), LagGauge::default());
        lag.report_to(gauge.clone());
        lag.read(Some(2_500));
        lag.measure(0);
        assert!((gauge.get() - 2.5).abs() < 1e-9, "{}", gauge.get());
    }
}
