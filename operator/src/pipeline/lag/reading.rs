//! What one read of a lease table shows of a consumer's lag (pure). Only a live holder's lag is
//! trusted: a row without an owner, or whose lease ran out, carries a figure nobody is updating, so its
//! shard counts as unheld instead. Closed shards (`SHARD_END`) have no lag, and a child waiting for a
//! parent still being read is not counted as unheld (nobody may take it yet).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use leasehold_crds::LagStatus;
use leasehold_worker::lease::{Lease, LeaseKey};

/// One held shard's lag, as its holder last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLag {
    /// `<stream>:<shardId>`.
    pub shard: String,
    /// How far behind its holder is.
    pub lag: Duration,
}

/// A consumer's lag as one read of its lease rows shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LagReading {
    /// Held open shards whose holder wrote a lag, in key order.
    pub shards: Vec<ShardLag>,
    /// Open shards whose row has no live holder.
    pub unheld: usize,
    /// Held open shards whose holder has not written a lag yet.
    pub unmeasured: usize,
    /// When the rows were read.
    pub read_at: Timestamp,
}

impl LagReading {
    /// The reading of `leases` read at `read_at`. A lease counts as live while its expiry is ahead of
    /// `read_at`, or behind it by less than `clock_margin`: the expiry is the holder's wall clock, and a
    /// holder whose clock runs behind ours must not look dead.
    pub fn of(leases: &[Lease], read_at: Timestamp, clock_margin: Duration) -> Self {
        let margin_ms = i64::try_from(clock_margin.as_millis()).unwrap_or(i64::MAX);
        let now_ms = read_at.as_millisecond();
        let finished: HashMap<LeaseKey, bool> =
            leases.iter().map(|l| (l.key.clone(), l.checkpoint.is_shard_end())).collect();
        let waiting = |lease: &Lease| {
            lease.parent_shard_ids.iter().any(|parent| {
                finished.get(&LeaseKey::new(lease.key.stream(), parent.as_str())).is_some_and(|done| !done)
            })
        };
        let mut reading = Self { shards: Vec::new(), unheld: 0, unmeasured: 0, read_at };
        for lease in leases.iter().filter(|l| !l.checkpoint.is_shard_end()) {
            let live = lease.owner.is_some()
                && lease.expiry_ms.is_some_and(|expiry| expiry.saturating_add(margin_ms) > now_ms);
            match (live, lease.lag_ms) {
                (true, Some(ms)) => {
                    reading.shards.push(ShardLag { shard: lease.key.to_string(), lag: Duration::from_millis(ms) })
                }
                (true, None) => reading.unmeasured += 1,
                (false, _) if waiting(lease) => {}
                (false, _) => reading.unheld += 1,
            }
        }
        reading.shards.sort_by(|a, b| a.shard.cmp(&b.shard));
        reading
    }

    /// The shard with the largest lag (the first in key order among equals), when any was measured.
    pub fn slowest(&self) -> Option<&ShardLag> {
        self.shards.iter().rev().max_by_key(|s| s.lag)
    }

    /// The largest lag, when any was measured.
    pub fn largest(&self) -> Option<Duration> {
        self.slowest().map(|s| s.lag)
    }

    /// The status's `lag`.
    pub fn status(&self) -> LagStatus {
        let slowest = self.slowest();
        LagStatus {
            largest: slowest.map(|s| human(s.lag)),
            largest_ms: slowest.map(|s| i64::try_from(s.lag.as_millis()).unwrap_or(i64::MAX)),
            slowest_shard: slowest.map(|s| s.shard.clone()),
            read_at: Time(self.read_at),
            unheld_shards: i32::try_from(self.unheld).unwrap_or(i32::MAX),
            unmeasured_shards: i32::try_from(self.unmeasured).unwrap_or(i32::MAX),
        }
    }
}

impl crate::metrics::LagSeries for LagReading {
    fn largest(&self) -> Option<Duration> {
        LagReading::largest(self)
    }

    fn unheld(&self) -> usize {
        self.unheld
    }

    fn shards(&self) -> Vec<(&str, Duration)> {
        self.shards.iter().map(|s| (s.shard.as_str(), s.lag)).collect()
    }
}

/// A lag as people read it in a table column: `350ms`, `45s`, `1m12s`, `2h5m`, `3d4h` (two units at
/// most; humantime's form, `1m 12s 345ms`, is too wide for a column).
pub fn human(lag: Duration) -> String {
    let secs = lag.as_secs();
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) if secs == 0 && lag.subsec_millis() > 0 => format!("{}ms", lag.subsec_millis()),
        (0, 0, 0) => format!("{s}s"),
        (0, 0, m) if s == 0 => format!("{m}m"),
        (0, 0, m) => format!("{m}m{s}s"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h{m}m"),
        (d, 0, _) => format!("{d}d"),
        (d, h, _) => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use leasehold_worker::lease::Checkpoint;

    use super::*;

    const NOW_MS: i64 = 1_800_000_000_000;
    const MARGIN: Duration = Duration::from_secs(10);

    fn lease(shard: &str, owner: Option<&str>, expiry_ms: i64, lag_ms: Option<u64>) -> Lease {
        crate::test_rows::row("orders", shard)
            .owner(owner)
            .expiry_ms(owner.map(|_| expiry_ms))
            .counter(1)
            .lag_ms(lag_ms)
            .lease()
    }

    fn now() -> Timestamp {
        Timestamp::from_millisecond(NOW_MS).unwrap()
    }

    #[test]
    fn only_live_holders_lag_counts_and_the_slowest_is_named() {
        let leases = [
            lease("s0", Some("w1"), NOW_MS + 5_000, Some(1_500)),
            lease("s1", Some("w2"), NOW_MS + 5_000, Some(72_000)),
            // Dead for longer than the margin: its 10-minute lag is stale.
            lease("s2", Some("w3"), NOW_MS - 11_000, Some(600_000)),
            lease("s3", None, 0, Some(900_000)),
            lease("s4", Some("w1"), NOW_MS + 5_000, None),
            // Ran out a moment ago on our clock: within the margin, still held.
            lease("s5", Some("w2"), NOW_MS - 2_000, Some(3_000)),
        ];
        let reading = LagReading::of(&leases, now(), MARGIN);
        assert_eq!(reading.largest(), Some(Duration::from_secs(72)));
        assert_eq!((reading.unheld, reading.unmeasured, reading.shards.len()), (2, 1, 3));
        let status = reading.status();
        assert_eq!(status.largest.as_deref(), Some("1m12s"));
        assert_eq!(status.largest_ms, Some(72_000));
        assert_eq!(status.slowest_shard.as_deref(), Some("orders:s1"));
        assert_eq!((status.unheld_shards, status.unmeasured_shards), (2, 1));
    }

    #[test]
    fn closed_shards_and_children_waiting_for_their_parents_are_neither_lag_nor_unheld() {
        let mut parent = lease("p", None, 0, Some(50_000));
        parent.checkpoint = Checkpoint::ShardEnd;
        let mut reading_parent = lease("q", Some("w1"), NOW_MS + 5_000, Some(2_000));
        reading_parent.parent_shard_ids = vec![];
        let mut done_child = lease("c1", None, 0, None);
        done_child.parent_shard_ids = vec!["p".into()];
        let mut waiting_child = lease("c2", None, 0, None);
        waiting_child.parent_shard_ids = vec!["q".into()];
        let reading = LagReading::of(&[parent, reading_parent, done_child, waiting_child], now(), MARGIN);
        assert_eq!(reading.unheld, 1, "c1 may be taken and is not; c2 waits for q");
        assert_eq!(reading.largest(), Some(Duration::from_secs(2)));
    }

    #[test]
    fn nothing_measured_reads_as_unknown() {
        let reading = LagReading::of(&[lease("s0", Some("w1"), NOW_MS + 5_000, None)], now(), MARGIN);
        assert_eq!(reading.largest(), None);
        assert_eq!(reading.status().largest, None);
    }

    #[test]
    fn human_durations_fit_a_column() {
        let cases = [(0, "0s"), (350, "350ms"), (45_000, "45s"), (60_000, "1m"), (72_400, "1m12s")];
        for (ms, text) in cases {
            assert_eq!(human(Duration::from_millis(ms)), text);
        }
        assert_eq!(human(Duration::from_secs(2 * 3600 + 5 * 60 + 9)), "2h5m");
        assert_eq!(human(Duration::from_secs(3 * 3600)), "3h");
        assert_eq!(human(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d4h");
    }

    #[test]
    fn lag_series_follow_the_readings_and_go_with_the_consumer() {
        use crate::metrics::{ConsumerLabels, Metrics};
        use std::time::Duration;

        let metrics = Metrics::default();
        let orders = ConsumerLabels { namespace: "shop".into(), name: "orders".into() };
        let shard = |name: &str, secs: u64| ShardLag { shard: name.into(), lag: Duration::from_secs(secs) };
        let read_at = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let first = LagReading { shards: vec![shard("o:s0", 3), shard("o:s1", 72)], unheld: 1, unmeasured: 0, read_at };
        metrics.publish_lag(&orders, &first);
        let text = metrics.text();
        assert!(text.contains(r#"leasehold_consumer_lag_seconds{namespace="shop",name="orders"} 72.0"#), "{text}");
        assert!(
            text.contains(r#"leasehold_consumer_shard_lag_seconds{namespace="shop",name="orders",shard="o:s0"} 3.0"#),
            "{text}"
        );
        assert!(text.contains(r#"leasehold_consumer_unheld_shards{namespace="shop",name="orders"} 1"#), "{text}");
        let second = LagReading { shards: vec![shard("o:s1", 5)], unheld: 0, unmeasured: 1, read_at };
        metrics.publish_lag(&orders, &second);
        let text = metrics.text();
        assert!(!text.contains(r#"shard="o:s0""#), "a shard no longer held loses its series: {text}");
        assert!(text.contains(r#"leasehold_consumer_lag_seconds{namespace="shop",name="orders"} 5.0"#), "{text}");
        metrics.forget_consumer(&orders);
        assert!(!metrics.text().contains(r#"name="orders""#));
        assert!(
            metrics.text().contains("leasehold_operator_reconciles_total"),
            "the operator's own series keep their prefix"
        );
    }
}
