//! What every reconcile shares: the Kubernetes client, AWS clients, shard counts, events, metrics, the
//! failure streaks behind the backoff and the readiness `/readyz` reports.

pub mod lease_rows;
pub mod shards;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use leasehold_crds::StreamConsumer;

use crate::aws::ClientCache;
use crate::backoff::Failures;
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use lease_rows::LeaseReads;
use shards::ShardCounts;

/// Operator settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Image of the worker container (unless the consumer's template names one).
    pub worker_image: String,
    /// How often stream shard counts are polled (default 30 s).
    pub shard_poll_interval: Duration,
    /// Fixed AWS credentials (access key, secret) instead of the default chain: for emulators and tests.
    pub static_credentials: Option<(String, String)>,
    /// Refuse pod templates that ask for host access or privilege (`--restrict-templates`).
    pub restrict_templates: bool,
    /// Give every consumer's workers a NetworkPolicy, metrics open to these scrapers
    /// (`--worker-network-policy`); `None`: no NetworkPolicy.
    pub worker_network_policy: Option<MetricsScrapers>,
}

/// Shared state of the controller.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Settings.
    pub settings: Settings,
    /// AWS clients per `spec.aws`.
    pub aws: ClientCache,
    /// Stream shard counts shared by every consumer.
    pub shards: ShardCounts,
    /// Each consumer's last read of its lease rows (at most one read per reconcile interval).
    pub lease_reads: LeaseReads,
    /// Publishes events on StreamConsumers.
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Consecutive failures per object, for backoff and for announcing a failure once.
    pub failures: Failures,
    /// The controller's state, as `/readyz` reports it.
    pub readiness: Readiness,
}

impl Context {
    /// A context for `client` with `settings`.
    pub fn new(client: Client, settings: Settings, metrics: Metrics) -> Self {
        let reporter = Reporter { controller: crate::FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            shards: ShardCounts::new(settings.shard_poll_interval),
            lease_reads: LeaseReads::new(settings.shard_poll_interval),
            aws: ClientCache::new(settings.static_credentials.clone()),
            client,
            settings,
            metrics,
            failures: Failures::default(),
            readiness: Readiness::default(),
        }
    }
}

impl Context {
    /// Publishes an event on `consumer` (best effort: a failure is logged at debug and dropped).
    pub async fn publish(&self, consumer: &StreamConsumer, type_: EventType, reason: &str, note: String) {
        self.publish_action(consumer, type_, reason, "Reconcile", note).await
    }

    /// [`Context::publish`] with its own `action`. The recorder folds events of the same type, reason
    /// and action into one series that keeps the first note, so changes that each need their note
    /// seen (every scaling step and why) name what they did in the action.
    pub async fn publish_action(
        &self,
        consumer: &StreamConsumer,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: None };
        if let Err(e) = self.recorder.publish(&event, &consumer.object_ref(&())).await {
            tracing::debug!(error = %e, "event not published");
        }
    }
}

/// The key of a consumer in the per-object state (failure streaks, lease reads): its UID, so a
/// recreated object starts afresh.
pub fn object_key(consumer: &StreamConsumer) -> String {
    consumer.uid().unwrap_or_else(|| format!("{}/{}", consumer.namespace().unwrap_or_default(), consumer.name_any()))
}

/// Who may scrape the workers' metrics port: pods matching `pod_labels` in namespaces matching
/// `namespace_labels`. Both empty: anyone (a scraper the operator was not told of keeps working).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsScrapers {
    /// Labels of the scraper's namespace (`kubernetes.io/metadata.name=monitoring`, say).
    pub namespace_labels: BTreeMap<String, String>,
    /// Labels of the scraper's pods (`app.kubernetes.io/name=prometheus`, say).
    pub pod_labels: BTreeMap<String, String>,
}

impl MetricsScrapers {
    /// Parses two `k=v,k=v` lists (the operator's `--metrics-from-namespace-labels` and
    /// `--metrics-from-pod-labels`); an error names the entry that is not `k=v`.
    pub fn parse(namespace_labels: &str, pod_labels: &str) -> Result<Self, String> {
        Ok(Self { namespace_labels: labels(namespace_labels)?, pod_labels: labels(pod_labels)? })
    }
}

fn labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| match entry.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => Err(format!("label {entry:?} is not key=value")),
        })
        .collect()
}
