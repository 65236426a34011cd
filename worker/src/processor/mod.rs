//! Record processors: what a worker does with each record. The binary picks one from the spec; a Rust
//! program brings its own by implementing [`ShardProcessor`] and handing the worker a
//! [`ProcessorFactory`] that makes one per shard.

mod foreign;
pub(crate) mod http;
pub(crate) mod multilang;
mod output;
mod record_json;
mod stdout;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::lease::{Checkpoint, LeaseKey};
pub use http::{BATCH_CONTENT_TYPE, EVENT_TYPE, HttpBatching, HttpProcessor, HttpProcessorError};
/// The parsers of what a receiver or a child answers, for the fuzz targets (`internals::parse`).
pub(crate) use http::{batch_outcomes, parse_outputs};
pub use multilang::MultilangProcessor;
pub use output::{Output, Outputs};
pub(crate) use record_json::RecordJson;
pub use stdout::StdoutProcessor;

/// One record as handed to a processor: a Kinesis record, or one user record of a KPL aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The stream it was read from.
    pub stream: Arc<str>,
    /// The shard it was read from.
    pub shard_id: Arc<str>,
    /// Its sequence number (unique within the shard, increasing).
    pub sequence_number: String,
    /// Its partition key (a user record's own, not the aggregate's).
    pub partition_key: String,
    /// The explicit hash key its producer gave a user record of a KPL aggregate, if any (Kinesis does
    /// not return one for plain records).
    pub explicit_hash_key: Option<String>,
    /// Its payload.
    pub data: Bytes,
    /// When Kinesis accepted it (epoch ms), when known.
    pub arrival_ms: Option<i64>,
    /// For a user record of a KPL aggregate, its position in the aggregate (0..n-1), which with
    /// `sequence_number` identifies it; `None` for a plain record.
    pub sub_sequence_number: Option<u32>,
}

/// A processor's failure on one record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProcessError {
    /// What went wrong.
    pub message: String,
    /// False when trying again cannot help (a malformed record, an HTTP 4xx): the retry policy's
    /// `onExhausted` applies at once.
    pub retryable: bool,
}

impl ProcessError {
    /// A failure worth retrying (a timeout, a 5xx, a broken connection).
    pub fn retryable(message: impl Into<String>) -> Self {
        Self { message: message.into(), retryable: true }
    }

    /// A failure that will not go away by retrying.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self { message: message.into(), retryable: false }
    }
}

/// Where a shard's processing begins, as told to [`ShardProcessor::initialize`] (the KCL's
/// `InitializationInput`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStart {
    /// The shard (stream and shard id).
    pub shard: LeaseKey,
    /// The lease's checkpoint: records up to it are done; reading resumes after it.
    pub checkpoint: Checkpoint,
}

/// Business logic for one shard, made by a [`ProcessorFactory`] when this worker takes the shard's
/// lease: the shape of the Java KCL's `ShardRecordProcessor`.
///
/// Calls, in order: [`initialize`](Self::initialize) once; [`process`](Self::process) for every
/// record (up to `concurrency` at once, never two of one partition key at once with `ordering: key`);
/// then exactly one of [`shard_ended`](Self::shard_ended), [`shutdown_requested`](Self::shutdown_requested),
/// [`shard_failed`](Self::shard_failed) or [`lease_lost`](Self::lease_lost), bounded by
/// `lease.gracefulTimeout`. A record may be processed
/// again after a crash or a lost lease (delivery is at-least-once across crashes).
///
/// ```
/// use leasehold_worker::{Outputs, ProcessError, Record, ShardProcessor};
///
/// struct Printer;
///
/// #[async_trait::async_trait]
/// impl ShardProcessor for Printer {
///     async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
///         println!("{} {}", record.partition_key, record.data.len());
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait ShardProcessor: Send + Sync {
    /// The worker now holds the shard's lease and is about to read from `start.checkpoint`.
    async fn initialize(&self, _start: &ShardStart) {}

    /// Processes one record and may emit records to `output.stream` through `outputs`. `Ok` makes
    /// the record done: its outputs are published, then it may be checkpointed. An error makes the
    /// worker retry it (see `spec.retry`).
    async fn process(&self, record: &Record, outputs: &mut Outputs) -> Result<(), ProcessError>;

    /// The shard was read to its end and every record is done; `SHARD_END` is checkpointed. Its
    /// children are read next, possibly by other workers.
    async fn shard_ended(&self) {}

    /// The worker was asked to give the shard up (a handoff, a shutdown): the records running have
    /// finished and the done prefix will be checkpointed after this call.
    async fn shutdown_requested(&self) {}

    /// The worker gives the shard up because it cannot be read any more (`reason`: its stream is gone,
    /// say): the records running have finished and the done prefix will be checkpointed after this
    /// call, as after [`shutdown_requested`](Self::shutdown_requested), which is what it does unless
    /// overridden.
    async fn shard_failed(&self, reason: &str) {
        let _ = reason;
        self.shutdown_requested().await
    }

    /// Another worker holds the shard now: nothing more is checkpointed, and records not yet
    /// checkpointed will be delivered to the new holder again.
    async fn lease_lost(&self) {}
}

/// Makes the processor of each shard this worker takes (the KCL's `ShardRecordProcessorFactory`).
///
/// Any `Fn(&LeaseKey) -> P` is a factory; state shared by every shard goes in what the closure
/// captures, and [`shared`] serves one processor object to every shard.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use leasehold_worker::{LeaseKey, Outputs, ProcessError, ProcessorFactory, Record, ShardProcessor};
///
/// /// Counts one shard's records; `total` is shared by every shard.
/// struct Counter {
///     shard: LeaseKey,
///     seen: AtomicU64,
///     total: Arc<AtomicU64>,
/// }
///
/// #[async_trait::async_trait]
/// impl ShardProcessor for Counter {
///     async fn process(&self, _record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
///         self.seen.fetch_add(1, Ordering::Relaxed);
///         self.total.fetch_add(1, Ordering::Relaxed);
///         Ok(())
///     }
///
///     async fn shard_ended(&self) {
///         println!("{}: {} records", self.shard, self.seen.load(Ordering::Relaxed));
///     }
/// }
///
/// let total = Arc::new(AtomicU64::new(0));
/// let factory = move |shard: &LeaseKey| Counter { shard: shard.clone(), seen: AtomicU64::new(0), total: total.clone() };
/// let _processor = factory.create(&LeaseKey::new("orders", "shardId-000000000000"));
/// ```
pub trait ProcessorFactory: Send + Sync {
    /// The processor for `shard`, just taken by this worker.
    fn create(&self, shard: &LeaseKey) -> Arc<dyn ShardProcessor>;
}

impl<F, P> ProcessorFactory for F
where
    F: Fn(&LeaseKey) -> P + Send + Sync,
    P: ShardProcessor + 'static,
{
    fn create(&self, shard: &LeaseKey) -> Arc<dyn ShardProcessor> {
        Arc::new(self(shard))
    }
}

/// A factory handing the same `processor` to every shard: for processors with no per-shard state
/// (the stdout and http processors).
pub fn shared<P: ShardProcessor + 'static>(processor: P) -> impl ProcessorFactory {
    let processor = Arc::new(processor);
    move |_: &LeaseKey| processor.clone()
}

/// A processor shared behind an `Arc` (by [`shared`], or kept by its maker to look into) processes as
/// itself.
#[async_trait]
impl<P: ShardProcessor + ?Sized> ShardProcessor for Arc<P> {
    async fn initialize(&self, start: &ShardStart) {
        self.as_ref().initialize(start).await
    }

    async fn process(&self, record: &Record, outputs: &mut Outputs) -> Result<(), ProcessError> {
        self.as_ref().process(record, outputs).await
    }

    async fn shard_ended(&self) {
        self.as_ref().shard_ended().await
    }

    async fn shutdown_requested(&self) {
        self.as_ref().shutdown_requested().await
    }

    async fn shard_failed(&self, reason: &str) {
        self.as_ref().shard_failed(reason).await
    }

    async fn lease_lost(&self) {
        self.as_ref().lease_lost().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Notes the closing hooks it is told.
    #[derive(Default)]
    struct Closings(Mutex<Vec<String>>);

    #[async_trait]
    impl ShardProcessor for Closings {
        async fn process(&self, _record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
            Ok(())
        }

        async fn shutdown_requested(&self) {
            self.0.lock().unwrap().push("shutdown_requested".into());
        }
    }

    /// Tells a failure apart from a request to stop.
    #[derive(Default)]
    struct FailureAware(Closings);

    #[async_trait]
    impl ShardProcessor for FailureAware {
        async fn process(&self, _record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
            Ok(())
        }

        async fn shutdown_requested(&self) {
            self.0.shutdown_requested().await
        }

        async fn shard_failed(&self, reason: &str) {
            self.0.0.lock().unwrap().push(format!("shard_failed: {reason}"));
        }
    }

    #[tokio::test]
    async fn a_failed_shard_is_a_shutdown_request_unless_the_processor_tells_them_apart() {
        let plain = Arc::new(Closings::default());
        plain.shard_failed("stream deleted").await;
        assert_eq!(*plain.0.lock().unwrap(), ["shutdown_requested"]);

        let aware = Arc::new(FailureAware::default());
        let shared_copy: Arc<dyn ShardProcessor> = Arc::new(aware.clone());
        shared_copy.shard_failed("stream deleted").await;
        shared_copy.shutdown_requested().await;
        assert_eq!(*aware.0.0.lock().unwrap(), ["shard_failed: stream deleted", "shutdown_requested"]);
    }
}
