//! Assembling a worker from its configuration and running it until shutdown.

use std::sync::Arc;
use std::time::Duration;

use leasehold_crds::{OnExhausted, Ordering};
use tokio_util::sync::CancellationToken;

use crate::aws::{dynamodb_client, kinesis_client, sdk_config};
use crate::config::WorkerConfig;
use crate::coordinator::{Coordinator, CoordinatorSettings};
use crate::discovery::{ShardSync, StreamSelection};
use crate::dispatch::{DispatchSettings, RetryPolicy, Runner};
use crate::kinesis::Kinesis;
use crate::lease::{
    DynamoLeaseStore, LeaseError, LeaseSettings, LeaseStore, MemoryLeaseStore, ensure_table, unique_owner_id,
};
use crate::metrics::Metrics;
use crate::processor::{
    HttpBatching, HttpProcessor, HttpProcessorError, MultilangProcessor, RecordProcessor, StdoutProcessor,
};
use crate::shard::ReaderSettings;

/// Why a worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The lease table could not be created or reached.
    #[error("lease table: {0}")]
    LeaseTable(#[from] LeaseError),
    /// The spec names a processor this binary does not provide yet.
    #[error("processor {0} is not available in this build")]
    ProcessorUnavailable(&'static str),
    /// The http processor's settings are unusable.
    #[error(transparent)]
    Http(#[from] HttpProcessorError),
}

/// Picks the owner id: `--owner-id`, else `spec.ownerId`, else a fresh one unique to this process.
pub fn owner_id(config: &WorkerConfig, flag: Option<String>) -> String {
    flag.or_else(|| config.spec.owner_id.clone()).unwrap_or_else(|| unique_owner_id("worker"))
}

/// The processor named by the spec.
pub fn processor(config: &WorkerConfig, owner: &str) -> Result<Arc<dyn RecordProcessor>, RuntimeError> {
    let spec = &config.spec.processor;
    if spec.stdout.is_some() {
        return Ok(Arc::new(StdoutProcessor::new(owner)));
    }
    if let Some(http) = &spec.http {
        let batching = HttpBatching {
            max_records: http
                .batch
                .as_ref()
                .and_then(|b| b.max_records)
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(1),
            max_delay: config.durations.http_batch_max_delay,
        };
        return Ok(Arc::new(HttpProcessor::new(&http.url, config.durations.http_timeout)?.with_batching(batching)));
    }
    match &spec.multilang {
        Some(multilang) => {
            Ok(Arc::new(MultilangProcessor::new(multilang.command.clone(), config.durations.multilang_timeout)))
        }
        None => Err(RuntimeError::ProcessorUnavailable("none")),
    }
}

/// The order and concurrency named by the spec (`ordering` default key, `concurrency` default 1).
pub fn dispatch_settings(config: &WorkerConfig) -> DispatchSettings {
    DispatchSettings {
        ordering: config.spec.ordering.unwrap_or(Ordering::Key),
        concurrency: config.spec.concurrency.and_then(|n| usize::try_from(n).ok()).unwrap_or(1),
    }
}

/// The retry policy named by the spec (default: 5 attempts from 1 s, then block).
pub fn retry_policy(config: &WorkerConfig) -> RetryPolicy {
    let retry = config.spec.retry.clone().unwrap_or_default();
    RetryPolicy {
        max_attempts: retry.max_attempts.and_then(|n| u32::try_from(n).ok()).unwrap_or(5).max(1),
        backoff: config.durations.retry_backoff,
        on_exhausted: retry.on_exhausted.unwrap_or(OnExhausted::Block),
        dead_letter_stream: retry.dead_letter_stream,
        ..RetryPolicy::default()
    }
}

/// Builds the worker described by `config` and runs it with `processor` until `shutdown` is cancelled.
pub async fn run(
    config: WorkerConfig,
    owner: String,
    processor: Arc<dyn RecordProcessor>,
    shutdown: CancellationToken,
) -> Result<(), RuntimeError> {
    run_with_metrics(config, owner, processor, Arc::default(), shutdown).await
}

/// [`run`], counting into `metrics` (which the caller may serve on `/metrics`).
pub async fn run_with_metrics(
    config: WorkerConfig,
    owner: String,
    processor: Arc<dyn RecordProcessor>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<(), RuntimeError> {
    let spec = &config.spec;
    let durations = config.durations;
    let sdk = sdk_config(&spec.aws).await;
    let settings = LeaseSettings::new(owner.clone()).with_duration(durations.lease);
    let store: Arc<dyn LeaseStore> = match &spec.lease_table {
        Some(table) => {
            let client = dynamodb_client(&sdk, &spec.aws);
            let tags = vec![("leasehold.io/created-by".to_string(), "leasehold-worker".to_string())];
            if ensure_table(&client, &table.name, &tags, Duration::from_secs(60)).await? {
                tracing::info!(table = table.name, "lease table created");
            }
            Arc::new(DynamoLeaseStore::new(client, table.name.clone(), settings))
        }
        None => {
            tracing::info!("no leaseTable: leases are kept in memory (one instance; empty after a restart)");
            Arc::new(MemoryLeaseStore::new(settings))
        }
    };
    let kinesis = Kinesis::new(kinesis_client(&sdk, &spec.aws));
    let sync = ShardSync::new(kinesis.clone(), config.selection.clone(), config.root_start.clone());
    let assigned = match &config.selection {
        StreamSelection::Assigned(keys) => Some(keys.clone()),
        _ => None,
    };
    let settings = CoordinatorSettings {
        renew_interval: durations.renew_interval,
        scan_interval: durations.scan_interval,
        shard_sync_interval: durations.shard_sync_interval,
        graceful_timeout: durations.graceful_timeout,
        handoff_timeout: durations.lease,
        reader: ReaderSettings {
            max_records: spec.reader.max_records.unwrap_or(1000),
            idle_time: durations.idle_time,
            checkpoint_interval: durations.checkpoint_interval,
            dispatch: dispatch_settings(&config),
            ..ReaderSettings::default()
        },
        assigned,
    };
    let runner = Runner::new(processor, metrics.clone())
        .with_policy(retry_policy(&config))
        .with_publisher(Arc::new(kinesis.clone()))
        .with_owner(owner);
    let runner = match &spec.output {
        Some(output) => runner.with_output(output.stream.clone(), output.partition_key.clone()),
        None => runner,
    };
    let coordinator = Coordinator::new(store, kinesis, sync, Arc::new(runner), settings);
    metrics.set_ready(true);
    coordinator.run(shutdown).await;
    metrics.set_ready(false);
    Ok(())
}
