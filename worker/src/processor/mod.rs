//! Record processors: what a worker does with each record. The binary picks one from the spec; a Rust
//! program can bring its own by implementing [`RecordProcessor`].

mod http;
mod multilang;
mod output;
mod stdout;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::lease::LeaseKey;
pub use http::{BATCH_CONTENT_TYPE, EVENT_TYPE, HttpBatching, HttpProcessor, HttpProcessorError};
pub use multilang::MultilangProcessor;
pub use output::{Output, Outputs};
pub use stdout::StdoutProcessor;

/// One Kinesis record as handed to a processor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The stream it was read from.
    pub stream: Arc<str>,
    /// The shard it was read from.
    pub shard_id: Arc<str>,
    /// Its sequence number (unique within the shard, increasing).
    pub sequence_number: String,
    /// Its partition key.
    pub partition_key: String,
    /// Its payload.
    pub data: Bytes,
    /// When Kinesis accepted it (epoch ms), when known.
    pub arrival_ms: Option<i64>,
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

/// Business logic plugged into a worker.
///
/// `process` may be called again for a record after a crash or a lost lease (delivery is
/// at-least-once). The lifecycle calls say which shards the processor currently owns.
#[async_trait]
pub trait RecordProcessor: Send + Sync {
    /// Processes one record; an error makes the worker retry it (see `spec.retry`).
    async fn process(&self, record: &Record) -> Result<(), ProcessError>;

    /// Processes one record and may emit records to `output.stream`. The worker calls this one; the
    /// default calls [`process`](Self::process) and emits nothing. Outputs are published after it
    /// returns `Ok` and before the record counts as done, so they are delivered at least once.
    async fn process_emitting(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        self.process(record).await
    }

    /// This worker now owns `shard`.
    async fn shard_assigned(&self, _shard: &LeaseKey) {}

    /// `shard` is being given up gracefully (handoff or shutdown); its progress will be checkpointed.
    async fn shard_revoked(&self, _shard: &LeaseKey) {}

    /// `shard` was lost (another worker took it); nothing more may be checkpointed for it.
    async fn shard_lost(&self, _shard: &LeaseKey) {}

    /// `shard` has been read to its end and checkpointed `SHARD_END`.
    async fn shard_ended(&self, _shard: &LeaseKey) {}
}
