//! Prometheus metrics of the operator, served with the health checks by [`leasehold_worker::health`].

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use leasehold_worker::health::Health;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::readiness::Readiness;

/// Labels of a failed reconcile: the pipeline stage that failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// `validate`, `table`, `streams`, `consumer`, `observe`, `build`, `apply`, `status`, `cleanup`,
    /// `finalizer`, `metadata` ([`crate::error::Error::kind`]).
    pub kind: String,
}

/// Labels of a consumer's series: the StreamConsumer's namespace and name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ConsumerLabels {
    /// The StreamConsumer's namespace.
    pub namespace: String,
    /// The StreamConsumer's name.
    pub name: String,
}

/// Labels of one shard of a consumer (`shard` is the lease key, `<stream>:<shardId>`, as the worker's
/// own per-shard series label it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ShardLabels {
    /// The StreamConsumer's namespace.
    pub namespace: String,
    /// The StreamConsumer's name.
    pub name: String,
    /// `<stream>:<shardId>`.
    pub shard: String,
}

type SecondsGauge = Gauge<f64, AtomicU64>;

/// What the lag series of one consumer show (the pipeline's lag reading gives it): kept as a trait so the
/// metrics depend on no stage.
pub trait LagSeries {
    /// The largest lag of a held shard, when any was measured.
    fn largest(&self) -> Option<std::time::Duration>;
    /// Open shards whose row has no live holder.
    fn unheld(&self) -> usize;
    /// Each held shard (`<stream>:<shardId>`) with its lag.
    fn shards(&self) -> Vec<(&str, std::time::Duration)>;
}

/// The operator's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Reconciles run.
    pub reconciles: Counter,
    /// Reconciles that failed, by the stage that failed.
    pub failures: Family<FailureLabels, Counter>,
    /// Reconcile duration in seconds.
    pub duration: Histogram,
    /// Reads of lease tables (one Scan of a whole table each), over every consumer.
    pub lease_table_reads: Counter,
    /// The largest lag of a held shard, per consumer (absent while none was measured).
    pub consumer_lag: Family<ConsumerLabels, SecondsGauge>,
    /// Each held shard's lag, per consumer.
    pub shard_lag: Family<ShardLabels, SecondsGauge>,
    /// Open shards whose row has no live holder, per consumer.
    pub unheld_shards: Family<ConsumerLabels, Gauge>,
    /// The shard series exported per consumer, so shards that went away lose theirs.
    /// Window consumers: shards with a row in the window's table.
    pub window_shards: Family<ConsumerLabels, Gauge>,
    /// Window consumers: shards finished (rows at `SHARD_END`).
    pub window_shards_finished: Family<ConsumerLabels, Gauge>,
    /// Window consumers: records handed to the processor, as the rows count them.
    pub window_records_replayed: Family<ConsumerLabels, Gauge>,
    /// Window consumers: 1 once the window is completed.
    pub window_completed: Family<ConsumerLabels, Gauge>,
    exported_shards: Arc<Mutex<HashMap<ConsumerLabels, BTreeSet<String>>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let reconciles = Counter::default();
        let failures = Family::<FailureLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        let lease_table_reads = Counter::default();
        let operator = registry.sub_registry_with_prefix("leasehold_operator");
        operator.register("reconciles", "Reconciles run", reconciles.clone());
        operator.register("reconcile_failures", "Reconciles that failed, by stage", failures.clone());
        operator.register("reconcile_duration_seconds", "Reconcile duration", duration.clone());
        operator.register(
            "lease_table_reads",
            "Lease table reads (a consistent Scan each) for lease spread and lag",
            lease_table_reads.clone(),
        );
        let consumer_lag = Family::<ConsumerLabels, SecondsGauge>::default();
        let shard_lag = Family::<ShardLabels, SecondsGauge>::default();
        let unheld_shards = Family::<ConsumerLabels, Gauge>::default();
        let consumer = registry.sub_registry_with_prefix("leasehold_consumer");
        consumer.register(
            "lag_seconds",
            "Largest lag of a held shard of the StreamConsumer, as its holder last wrote it",
            consumer_lag.clone(),
        );
        consumer.register(
            "shard_lag_seconds",
            "Lag of each held shard, as its holder last wrote it",
            shard_lag.clone(),
        );
        consumer.register(
            "unheld_shards",
            "Open shards whose lease row has no owner or whose lease ran out, as last read",
            unheld_shards.clone(),
        );
        let window_shards = Family::<ConsumerLabels, Gauge>::default();
        let window_shards_finished = Family::<ConsumerLabels, Gauge>::default();
        let window_records_replayed = Family::<ConsumerLabels, Gauge>::default();
        let window_completed = Family::<ConsumerLabels, Gauge>::default();
        let window = registry.sub_registry_with_prefix("leasehold_consumer");
        window.register(
            "window_shards",
            "Shards of a window consumer with a row in its lease table",
            window_shards.clone(),
        );
        window.register(
            "window_shards_finished",
            "Shards of a window consumer finished (rows at SHARD_END)",
            window_shards_finished.clone(),
        );
        window.register(
            "window_records_replayed",
            "Records of a window consumer handed to its processor, as its rows count them",
            window_records_replayed.clone(),
        );
        window.register(
            "window_completed",
            "1 once every shard of a window consumer is finished",
            window_completed.clone(),
        );
        Self {
            registry: Arc::new(registry),
            window_shards,
            window_shards_finished,
            window_records_replayed,
            window_completed,
            reconciles,
            failures,
            duration,
            lease_table_reads,
            consumer_lag,
            shard_lag,
            unheld_shards,
            exported_shards: Arc::default(),
        }
    }
}

impl Metrics {
    /// Counts one failed reconcile of `kind`.
    pub fn failed(&self, kind: &str) {
        self.failures.get_or_create(&FailureLabels { kind: kind.to_string() }).inc();
    }

    /// Failed reconciles of `kind` so far.
    pub fn failures_of(&self, kind: &str) -> u64 {
        self.failures.get_or_create(&FailureLabels { kind: kind.to_string() }).get()
    }

    /// Exports `reading` as the lag series of `consumer`; shards no longer in it lose their series.
    pub fn publish_lag(&self, consumer: &ConsumerLabels, reading: &impl LagSeries) {
        match reading.largest() {
            Some(lag) => {
                self.consumer_lag.get_or_create(consumer).set(lag.as_secs_f64());
            }
            None => {
                self.consumer_lag.remove(consumer);
            }
        }
        self.unheld_shards.get_or_create(consumer).set(i64::try_from(reading.unheld()).unwrap_or(i64::MAX));
        let shards = reading.shards();
        let current: BTreeSet<String> = shards.iter().map(|(shard, _)| shard.to_string()).collect();
        let mut exported = self.exported_shards.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let before = exported.insert(consumer.clone(), current.clone()).unwrap_or_default();
        for gone in before.difference(&current) {
            self.shard_lag.remove(&shard_labels(consumer, gone));
        }
        for (shard, lag) in shards {
            self.shard_lag.get_or_create(&shard_labels(consumer, shard)).set(lag.as_secs_f64());
        }
    }

    /// Removes every lag series of `consumer` (it was deleted, or has no lease table any more).
    pub fn forget_consumer(&self, consumer: &ConsumerLabels) {
        self.consumer_lag.remove(consumer);
        self.unheld_shards.remove(consumer);
        for family in
            [&self.window_shards, &self.window_shards_finished, &self.window_records_replayed, &self.window_completed]
        {
            family.remove(consumer);
        }
        let mut exported = self.exported_shards.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for shard in exported.remove(consumer).unwrap_or_default() {
            self.shard_lag.remove(&shard_labels(consumer, &shard));
        }
    }

    /// The metrics as Prometheus text.
    pub fn text(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; an empty page is the worst case.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    /// The endpoints: these metrics, `/readyz` from `readiness`.
    pub fn health(&self, readiness: Readiness) -> Health {
        Health::from_registry(self.registry.clone(), move || readiness.is_ready())
    }
}

fn shard_labels(consumer: &ConsumerLabels, shard: &str) -> ShardLabels {
    ShardLabels { namespace: consumer.namespace.clone(), name: consumer.name.clone(), shard: shard.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_page_of_the_operator_metrics_is_current() {
        use leasehold_worker::reference::{check_or_write, generated_note, metric_families, metrics_markdown};
        let metrics = Metrics::default();
        // One series of every labelled family, so the page can name their labels.
        let consumer = ConsumerLabels { namespace: "ns".into(), name: "orders".into() };
        metrics.failed("table");
        metrics.consumer_lag.get_or_create(&consumer).set(1.0);
        metrics.unheld_shards.get_or_create(&consumer).set(0);
        for family in [&metrics.window_shards, &metrics.window_shards_finished, &metrics.window_records_replayed] {
            family.get_or_create(&consumer).set(1);
        }
        metrics.window_completed.get_or_create(&consumer).set(0);
        metrics.shard_lag.get_or_create(&shard_labels(&consumer, "orders:shardId-0")).set(1.0);
        let families = metric_families(&metrics.text());
        let unseen: Vec<&str> = families.iter().filter(|f| f.samples == 0).map(|f| f.name.as_str()).collect();
        assert!(unseen.is_empty(), "give these families a series in this test: {unseen:?}");
        let page = format!(
            "# Operator metrics\n\n{}\n\
             Every metric the operator serves on `/metrics` (its `--metrics-addr`, port 8080 by default), as \
             its registry encodes it; the `leasehold_consumer_*` series are read from each consumer's lease \
             table. The workers' own are in [worker-metrics.md](worker-metrics.md).\n\n{}",
            generated_note("the operator's registry (`operator/src/metrics.rs`)"),
            metrics_markdown(&families)
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/operator-metrics.md");
        if let Err(e) = check_or_write(&path, &page) {
            panic!("{e}");
        }
    }

    #[test]
    fn every_metric_on_the_generated_pages_is_in_the_chart_changelog_naming_review() {
        // The pages list every metric (their drift tests keep them so); the review must name each.
        let read =
            |path: &str| std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).expect(path);
        let changelog = read("charts/leasehold/CHANGELOG.md");
        let pages = read("docs/reference/worker-metrics.md") + &read("docs/reference/operator-metrics.md");
        let names: Vec<&str> = pages
            .lines()
            .filter_map(|line| line.strip_prefix("| `leasehold_"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        assert!(names.len() >= 40, "{names:?}");
        let unreviewed: Vec<&&str> = names
            .iter()
            .filter(|n| {
                !changelog.contains(&format!("`leasehold_{n}`")) && !changelog.contains(&format!("`leasehold_{n}{{"))
            })
            .collect();
        assert!(unreviewed.is_empty(), "metrics missing from the chart CHANGELOG's naming review: {unreviewed:?}");
    }

    #[test]
    fn failures_are_counted_by_kind() {
        let metrics = Metrics::default();
        metrics.failed("table");
        metrics.failed("table");
        metrics.failed("apply");
        let text = metrics.text();
        assert!(text.contains(r#"leasehold_operator_reconcile_failures_total{kind="table"} 2"#), "{text}");
        assert!(text.contains(r#"leasehold_operator_reconcile_failures_total{kind="apply"} 1"#), "{text}");
        assert_eq!(metrics.failures_of("table"), 2);
    }
}
