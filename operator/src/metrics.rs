//! Prometheus metrics of the operator, served with the health checks by [`leasehold_worker::health`].

use std::sync::Arc;

use leasehold_worker::health::Health;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::readiness::Readiness;

/// Labels of a failed reconcile: the pipeline stage that failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// `validate`, `table`, `observe`, `build`, `apply`, `status`, `finalizer`.
    pub kind: String,
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
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("leasehold_operator");
        let reconciles = Counter::default();
        let failures = Family::<FailureLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register("reconcile_failures", "Reconciles that failed, by stage", failures.clone());
        registry.register("reconcile_duration_seconds", "Reconcile duration", duration.clone());
        Self { registry: Arc::new(registry), reconciles, failures, duration }
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

    /// The endpoints: these metrics, `/readyz` from `readiness`.
    pub fn health(&self, readiness: Readiness) -> Health {
        Health::from_registry(self.registry.clone(), move || readiness.is_ready())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_by_kind() {
        let metrics = Metrics::default();
        metrics.failed("table");
        metrics.failed("table");
        metrics.failed("apply");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry).unwrap();
        assert!(text.contains(r#"leasehold_operator_reconcile_failures_total{kind="table"} 2"#), "{text}");
        assert!(text.contains(r#"leasehold_operator_reconcile_failures_total{kind="apply"} 1"#), "{text}");
        assert_eq!(metrics.failures_of("table"), 2);
    }
}
