//! Assembling a worker from its configuration and running it until shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::aws::{dynamodb_client, kinesis_client, sdk_config};
use crate::config::WorkerConfig;
use crate::coordinator::{Coordinator, CoordinatorSettings};
use crate::discovery::{ShardSync, StreamSelection};
use crate::kinesis::Kinesis;
use crate::lease::{
    DynamoLeaseStore, LeaseError, LeaseSettings, LeaseStore, MemoryLeaseStore, ensure_table, unique_owner_id,
};
use crate::processor::{RecordProcessor, StdoutProcessor};
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
    Err(RuntimeError::ProcessorUnavailable(if spec.http.is_some() { "http" } else { "multilang" }))
}

/// Builds the worker described by `config` and runs it with `processor` until `shutdown` is cancelled.
pub async fn run(
    config: WorkerConfig,
    owner: String,
    processor: Arc<dyn RecordProcessor>,
    shutdown: CancellationToken,
) -> Result<(), RuntimeError> {
    let spec = &config.spec;
    let durations = config.durations;
    let sdk = sdk_config(&spec.aws).await;
    let settings = LeaseSettings::new(owner).with_duration(durations.lease);
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
            min_call_gap: Duration::from_millis(200),
            retry_backoff: durations.retry_backoff,
        },
        assigned,
    };
    Coordinator::new(store, kinesis, sync, processor, settings).run(shutdown).await;
    Ok(())
}
