//! Assembling a worker from its configuration and running it until shutdown.

use std::sync::Arc;
use std::time::Duration;

use leasehold_crds::filter::RecordFilter;
use leasehold_crds::{LeaseBalance, LeaseScan, ReaderMode};
use tokio_util::sync::CancellationToken;

use crate::aws::{dynamodb_client, kinesis_client, s3_client, sdk_config, sqs_client};
use crate::backoff::{Backoff, Jitter};
use crate::config::WorkerConfig;
use crate::coordinator::{Balance, Coordinator, CoordinatorSettings, HandoffInbox, KinesisShards, LoadTuning, Mode};
use crate::destination::{S3Destination, SqsDestination};
use crate::discovery::{ShardSync, StreamSelection};
use crate::dispatch::{RecordRunner, RetryPolicy};
use crate::kinesis::{Consumers, Kinesis};
use crate::lease::{
    DynamoLeaseStore, LeaseError, LeaseSettings, LeaseStore, MemoryLeaseStore, ensure_table, unique_owner_id,
};
use crate::metrics::Metrics;
use crate::processor::{
    HttpBatching, HttpProcessor, HttpProcessorError, MultilangProcessor, ProcessorFactory, StdoutProcessor, shared,
};
use crate::shard::ReaderSettings;

/// Why a worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The lease table could not be created or reached.
    #[error("lease table: {0}")]
    LeaseTable(#[from] LeaseError),
    /// The spec names `processor.custom` but this binary brings no processor of its own.
    #[error(
        "spec.processor.custom: this binary has no processor of its own; build one with \
         leasehold_worker::main_with_processor, or name stdout, http or multilang"
    )]
    NoCustomProcessor,
    /// The owner id is too long to write into lease rows (it is written twice per row at most, and
    /// bounding it is what keeps every row the worker writes far below DynamoDB's 400 KB item limit).
    #[error("owner id is {0} bytes; at most {MAX_OWNER_ID_BYTES} are allowed")]
    OwnerIdTooLong(usize),
    /// The http processor's settings are unusable.
    #[error(transparent)]
    Http(#[from] HttpProcessorError),
    /// A stream of `createIfMissing` could not be created or did not become ACTIVE.
    #[error(transparent)]
    Streams(#[from] crate::streams::StreamsError),
    /// A `filter` pattern is not in the grammar (the spec's validation refuses it first).
    #[error("spec.filter: {0}")]
    Filter(leasehold_crds::filter::PatternError),
}

/// Longest owner id accepted (`--owner-id`, `spec.ownerId`).
pub const MAX_OWNER_ID_BYTES: usize = 256;

/// Picks the owner id: `--owner-id`, else `spec.ownerId`, else a fresh one unique to this process.
pub fn owner_id(config: &WorkerConfig, flag: Option<String>) -> String {
    flag.or_else(|| config.spec.owner_id.clone()).unwrap_or_else(|| unique_owner_id("worker"))
}

/// The processor factory named by the spec: a built-in processor, or `custom` (the binary's own, when
/// it has one).
pub fn processors(
    config: &WorkerConfig,
    owner: &str,
    custom: Option<Arc<dyn ProcessorFactory>>,
) -> Result<Arc<dyn ProcessorFactory>, RuntimeError> {
    let spec = &config.spec.processor;
    let durations = &config.resolved.durations;
    if spec.stdout.is_some() {
        return Ok(Arc::new(shared(StdoutProcessor::new(owner))));
    }
    if let Some(http) = &spec.http {
        let batching = HttpBatching {
            max_records: config.resolved.http_batch_records,
            max_delay: durations.http_batch_max_delay,
            bisect: config.resolved.bisect,
        };
        return Ok(Arc::new(shared(HttpProcessor::new(&http.url, durations.http_timeout)?.with_batching(batching))));
    }
    if let Some(multilang) = &spec.multilang {
        return Ok(Arc::new(MultilangProcessor::new(multilang.command.clone(), durations.multilang_timeout)));
    }
    custom.ok_or(RuntimeError::NoCustomProcessor)
}

/// Everything [`run_worker`] needs, in one value so a caller names what it passes.
pub struct Worker {
    /// The validated configuration.
    pub config: WorkerConfig,
    /// The lease owner id (see [`owner_id`]).
    pub owner: String,
    /// Makes each shard's processor (see [`processors`]).
    pub processors: Arc<dyn ProcessorFactory>,
    /// Counted into while running; the caller may serve it on `/metrics`. Marked ready once the lease
    /// store is reachable.
    pub metrics: Arc<Metrics>,
    /// Cancelled to shut the worker down (leases released, done prefixes checkpointed).
    pub shutdown: CancellationToken,
}

/// Builds the worker described by `worker.config` and runs it until `worker.shutdown` is cancelled.
pub async fn run_worker(worker: Worker) -> Result<(), RuntimeError> {
    run_taking_notices(worker, None).await
}

/// [`run_worker`], taking handoff notices from `inbox` (whose route the caller serves at the address the
/// inbox advertises): peers that shut down tell this worker at once which rows they freed for it.
pub(crate) async fn run_taking_notices(worker: Worker, inbox: Option<HandoffInbox>) -> Result<(), RuntimeError> {
    let Worker { config, owner, processors, metrics, shutdown } = worker;
    if owner.len() > MAX_OWNER_ID_BYTES {
        return Err(RuntimeError::OwnerIdTooLong(owner.len()));
    }
    let spec = &config.spec;
    let sdk = sdk_config(&spec.aws).await;
    // A shutdown while the lease table is still out of reach ends the run at once (nothing was read).
    let address = inbox.as_ref().and_then(|inbox| inbox.address.clone());
    let Some(store) = lease_store(&config, &sdk, &owner, address, &metrics, &shutdown).await? else {
        return Ok(());
    };
    // Streams the spec asks to create when missing, ACTIVE before any is read or written; a shutdown
    // meanwhile ends the run at once (nothing was read yet).
    let streams_client = kinesis_client(&sdk, &spec.aws);
    tokio::select! {
        ensured = crate::streams::ensure_all(&streams_client, spec, Duration::from_secs(120)) => ensured?,
        _ = shutdown.cancelled() => return Ok(()),
    }
    let mut kinesis = Kinesis::new(kinesis_client(&sdk, &spec.aws)).with_arns(config.stream_arns.clone());
    if config.resolved.mode == ReaderMode::FanOut {
        tracing::info!(consumer = config.consumer_name, "reading with enhanced fan-out");
        let consumers = Consumers::new(config.consumer_name.clone(), metrics.fanout_consumers_registered.clone());
        kinesis = kinesis.with_consumers(Arc::new(consumers));
    }
    let sync = ShardSync::new(kinesis.clone(), config.selection.clone(), config.root_start.clone());
    let keys = Arc::new(LeaseTableKeys(store.clone()));
    let (store_for_window, window_kinesis) = (store.clone(), kinesis.clone());
    let runner = runner(&config, &sdk, &kinesis, owner, metrics.clone())?.with_requeue_keys(keys);
    let settings = coordinator_settings(&config);
    let mut coordinator = Coordinator::new(
        store,
        Arc::new(KinesisShards::new(kinesis, sync)),
        Arc::new(runner),
        metrics.clone(),
        processors,
        settings,
    );
    if let Some(inbox) = inbox {
        coordinator = coordinator.with_handoff_inbox(inbox.for_streams(config.selection.clone()));
    }
    metrics.set_ready(true);
    // A window consumer stops by itself once every shard of its window is finished (exit 0).
    let stop = shutdown.child_token();
    if let (Some(_), StreamSelection::Named(streams)) = (config.window, &config.selection) {
        let interval = config.resolved.durations.shard_sync_interval;
        let watch = crate::window::watch(
            store_for_window,
            window_kinesis,
            streams.clone(),
            interval,
            metrics.clone(),
            stop.clone(),
        );
        tokio::spawn(watch);
    }
    coordinator.run(stop).await;
    metrics.set_ready(false);
    Ok(())
}

/// The lease store the spec names: the DynamoDB table (created if missing), or the memory store.
/// A table out of reach for a while (throttled, unavailable, timing out) is waited for with backoff,
/// counted and logged, rather than ending the process; `None` when `shutdown` came first.
async fn lease_store(
    config: &WorkerConfig,
    sdk: &aws_config::SdkConfig,
    owner: &str,
    address: Option<String>,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Result<Option<Arc<dyn LeaseStore>>, RuntimeError> {
    let spec = &config.spec;
    let settings = LeaseSettings::new(owner).with_duration(config.resolved.durations.lease).with_address(address);
    let Some(table) = &spec.lease_table else {
        tracing::info!("no leaseTable: leases are kept in memory (one instance; empty after a restart)");
        return Ok(Some(Arc::new(MemoryLeaseStore::new(settings))));
    };
    let client = dynamodb_client(sdk, &spec.aws);
    let tags = vec![("leasehold.io/created-by".to_string(), "leasehold-worker".to_string())];
    let mut delays =
        Backoff::new(Duration::from_millis(200), Duration::from_secs(5)).with_jitter(Jitter::Added(1.0)).delays();
    loop {
        let error = match ensure_table(&client, &table.name, &tags, Duration::from_secs(60)).await {
            Ok(created) => {
                if created {
                    tracing::info!(table = table.name, "lease table created");
                }
                return Ok(Some(Arc::new(DynamoLeaseStore::new(client, table.name.clone(), settings))));
            }
            Err(e) if e.is_retryable() => e,
            Err(e) => return Err(e.into()),
        };
        metrics.lease_table_failures.inc();
        let delay = delays.next().unwrap_or(Duration::from_secs(5));
        tracing::warn!(table = table.name, error = %error, ?delay, "cannot reach the lease table at start; retrying");
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The consumer's requeue key, kept in its lease table (`#term:requeue-key`), so every worker of the
/// consumer signs and checks requeued copies alike, across restarts; producers, who write the stream
/// but cannot read the table, cannot sign a copy (docs/worker.md, "Requeued copy").
struct LeaseTableKeys(Arc<dyn LeaseStore>);

#[async_trait::async_trait]
impl crate::dispatch::KeySource for LeaseTableKeys {
    async fn requeue_key(&self) -> Result<crate::dispatch::RequeueKey, String> {
        let secret = self.0.requeue_secret().await.map_err(|e| e.to_string())?;
        crate::dispatch::RequeueKey::from_hex(&secret)
            .ok_or_else(|| "the lease table's requeue_secret is not 64 hex digits".to_string())
    }
}

/// The coordinator's timing and mode from the spec.
fn coordinator_settings(config: &WorkerConfig) -> CoordinatorSettings {
    let resolved = &config.resolved;
    let durations = &resolved.durations;
    CoordinatorSettings {
        renew_interval: durations.renew_interval,
        scan_interval: durations.scan_interval,
        shard_sync_interval: durations.shard_sync_interval,
        graceful_timeout: durations.graceful_timeout,
        handoff_timeout: durations.lease,
        reader: ReaderSettings { window: config.window, ..ReaderSettings::from_spec(resolved) },
        mode: match (&config.selection, resolved.lease_scan) {
            (StreamSelection::Assigned(keys), _) => Mode::Assigned(keys.clone()),
            (_, LeaseScan::Full) => Mode::Full,
            (_, LeaseScan::Segmented) => Mode::Segmented { rows_per_segment: resolved.segment_rows },
        },
        balance: match resolved.lease_balance {
            LeaseBalance::Count => Balance::Count,
            LeaseBalance::Load => Balance::Load(LoadTuning::for_renewals(durations.renew_interval)),
        },
    }
}

/// The record runner: the retry policy with its destinations (dead-letter stream, queue, bucket), the
/// filter, the output stream.
fn runner(
    config: &WorkerConfig,
    sdk: &aws_config::SdkConfig,
    kinesis: &Kinesis,
    owner: String,
    metrics: Arc<Metrics>,
) -> Result<RecordRunner, RuntimeError> {
    let spec = &config.spec;
    let resolved = &config.resolved;
    let dead_letters = spec.retry.as_ref().and_then(|r| r.dead_letter_stream.clone());
    let mut runner = RecordRunner::new(metrics)
        .with_policy(RetryPolicy::from_spec(resolved, dead_letters))
        .with_publisher(Arc::new(kinesis.clone()))
        .with_owner(owner)
        .with_stuck_after(resolved.durations.graceful_timeout);
    if let Some(table) = &spec.lease_table {
        runner = runner.with_lease_table(table.name.clone());
    }
    if let Some(retry) = &spec.retry {
        if let Some(queue) = &retry.dead_letter_queue {
            runner = runner.with_destination(Arc::new(SqsDestination::new(sqs_client(sdk, &spec.aws), queue.clone())));
        }
        if let Some(bucket) = &retry.dead_letter_bucket {
            let prefix = bucket.prefix.clone().unwrap_or_default();
            let s3 = S3Destination::new(s3_client(sdk, &spec.aws), bucket.name.clone(), prefix);
            runner = runner.with_destination(Arc::new(s3));
        }
    }
    if let Some(filter) = &spec.filter {
        runner = runner.with_filter(RecordFilter::new(&filter.patterns).map_err(RuntimeError::Filter)?);
    }
    if let Some(output) = &spec.output {
        runner = runner.with_output(output.stream.clone(), output.partition_key.clone());
    }
    Ok(runner)
}
