//! The Kinesis calls a worker makes: listing streams and shards, iterators, GetRecords, and (in
//! `fanout`) the stream consumer and SubscribeToShard.

mod fanout;

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::primitives::{Blob, DateTime};
use aws_sdk_kinesis::types::ShardIteratorType;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use bytes::Bytes;

use crate::aws::Fault;
use crate::backoff::{Backoff, Jitter};
use crate::dispatch::Publisher;
use crate::kpl::HashKeyRange;
use crate::processor::Record;
pub use fanout::{Consumers, FanOutEvent, Subscription};

/// Result of a Kinesis call.
pub type Result<T, E = KinesisError> = std::result::Result<T, E>;

/// What went wrong with a Kinesis call.
#[derive(Debug, thiserror::Error)]
pub enum KinesisError {
    /// The stream does not exist (or is being deleted).
    #[error("stream {stream} not found: {message}")]
    StreamNotFound {
        /// The stream.
        stream: String,
        /// The service's message.
        message: String,
    },
    /// The shard iterator is older than 5 minutes; get a new one.
    #[error("shard iterator expired")]
    ExpiredIterator,
    /// Throttled (per-shard read limits, the control-plane call limits, SubscribeToShard's 1 call/s per
    /// consumer and shard). Retry with backoff.
    #[error("kinesis throttled the request: {0}")]
    Throttled(String),
    /// The resource is busy: a subscription to the shard is still open (the previous holder's, or one
    /// replaced less than 5 s ago), or a consumer being registered. Retry with backoff.
    #[error("kinesis resource in use: {0}")]
    ResourceInUse(String),
    /// The call did not complete within the SDK's attempt timeout; retry (a GetRecords with a smaller
    /// page).
    #[error("kinesis request failed in transport: request timed out")]
    TimedOut,
    /// Failed in transport; retry.
    #[error("kinesis request failed in transport: {0}")]
    Transport(String),
    /// Any other service error.
    #[error("kinesis error {code}: {message}")]
    Service {
        /// Error code.
        code: String,
        /// The service's message.
        message: String,
        /// True for 5xx.
        retryable: bool,
    },
}

impl KinesisError {
    /// True for failures worth retrying after a backoff.
    pub fn is_retryable(&self) -> bool {
        match self {
            KinesisError::Throttled(_)
            | KinesisError::TimedOut
            | KinesisError::Transport(_)
            | KinesisError::ExpiredIterator
            | KinesisError::ResourceInUse(_) => true,
            KinesisError::Service { retryable, .. } => *retryable,
            KinesisError::StreamNotFound { .. } => false,
        }
    }

    fn from_sdk<E>(error: SdkError<E, HttpResponse>, stream: &str) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        Self::from_fault(crate::aws::classify(&error), stream)
    }

    /// The error of a call on `stream` that met `fault`.
    fn from_fault(fault: Fault, stream: &str) -> Self {
        if fault.is_throttling() {
            let message = match fault {
                Fault::Service { message, .. } if !message.is_empty() => message,
                _ => "throttled".to_string(),
            };
            return KinesisError::Throttled(message);
        }
        match fault {
            Fault::Timeout => KinesisError::TimedOut,
            Fault::Transport(message) => KinesisError::Transport(message),
            Fault::Service { code, message, server_error } => match code.as_str() {
                "ResourceNotFoundException" => KinesisError::StreamNotFound { stream: stream.into(), message },
                "ExpiredIteratorException" => KinesisError::ExpiredIterator,
                "ResourceInUseException" => KinesisError::ResourceInUse(message),
                _ => KinesisError::Service { code, message, retryable: server_error },
            },
        }
    }
}

/// A stream as described: its incarnation and whether its shards can be listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamState {
    /// When the stream was created, epoch ms.
    pub created: i64,
    /// ACTIVE or UPDATING: a listing of its shards is complete.
    pub listable: bool,
}

/// How many times in a row one ListShards page is asked again after `LimitExceededException`.
const LIST_SHARDS_THROTTLE_RETRIES: u32 = 8;

/// The wait before asking a throttled ListShards page again for the `attempt`-th time: 200 ms
/// doubling to 5 s, with up to half of it added at random so a group does not retry in step.
fn list_shards_backoff(attempt: u32) -> std::time::Duration {
    const BACKOFF: Backoff = Backoff::new(std::time::Duration::from_millis(200), std::time::Duration::from_secs(5))
        .with_jitter(Jitter::Added(0.5));
    BACKOFF.delay(attempt.saturating_add(1), rand::random())
}

/// One shard as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// Its id.
    pub id: String,
    /// Its parent and adjacent parent (after a split: one; after a merge: two).
    pub parents: Vec<String>,
    /// True once it no longer takes writes (it has an ending sequence number).
    pub closed: bool,
}

/// Where an iterator starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAt {
    /// Just after this sequence number.
    AfterSequence(String),
    /// At this sequence number (to resume inside a KPL aggregate).
    AtSequence(String),
    /// The oldest retained record.
    TrimHorizon,
    /// Records written from now on.
    Latest,
    /// Records at or after this time (epoch ms).
    AtTimestamp(i64),
}

/// One GetRecords answer.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The records, in shard order.
    pub records: Vec<Record>,
    /// Where to read next; `None` once a closed shard has been read to its end.
    pub next_iterator: Option<String>,
    /// How far behind the tip this read was (emulators always say 0).
    pub millis_behind: Option<i64>,
}

/// A record as read (by GetRecords or a fan-out event) from `shard_id` of `stream`.
fn record_of(r: aws_sdk_kinesis::types::Record, stream: &Arc<str>, shard_id: &Arc<str>) -> Record {
    Record {
        stream: stream.clone(),
        shard_id: shard_id.clone(),
        sequence_number: r.sequence_number,
        partition_key: r.partition_key,
        data: Bytes::from(r.data.into_inner()),
        arrival_ms: r.approximate_arrival_timestamp.and_then(|t| t.to_millis().ok()),
        explicit_hash_key: None,
        sub_sequence_number: None,
    }
}

/// A Kinesis client for the worker's calls.
#[derive(Debug, Clone)]
pub struct Kinesis {
    client: Client,
    /// Streams named by ARN (`spec.streams[].arn`), by stream name: their calls pass `StreamARN`.
    arns: Arc<HashMap<String, String>>,
    /// The stream consumer of enhanced fan-out (`reader.mode: fanOut`).
    consumers: Option<Arc<Consumers>>,
}

impl Kinesis {
    /// Wraps an SDK client.
    pub fn new(client: Client) -> Self {
        Self { client, arns: Arc::default(), consumers: None }
    }

    /// The same client addressing the streams of `arns` (stream name -> ARN) by their ARN.
    pub fn with_arns(mut self, arns: HashMap<String, String>) -> Self {
        self.arns = Arc::new(arns);
        self
    }

    /// How a call names `stream`: `(StreamName, StreamARN)`, exactly one of them set.
    fn address(&self, stream: &str) -> (Option<String>, Option<String>) {
        match self.arns.get(stream) {
            Some(arn) => (None, Some(arn.clone())),
            None => (Some(stream.to_string()), None),
        }
    }

    /// Every stream in the account and region, following paging.
    pub async fn list_streams(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        let mut start: Option<String> = None;
        loop {
            let out = self
                .client
                .list_streams()
                .set_exclusive_start_stream_name(start.clone())
                .send()
                .await
                .map_err(|e| KinesisError::from_sdk(e, "*"))?;
            let more = out.has_more_streams;
            let page = out.stream_names;
            let last = page.last().cloned();
            names.extend(page);
            match (more, last) {
                (true, Some(last)) => start = Some(last),
                _ => return Ok(names),
            }
        }
    }

    /// DescribeStreamSummary of `stream`.
    async fn stream_summary(&self, stream: &str) -> Result<Option<aws_sdk_kinesis::types::StreamDescriptionSummary>> {
        let out = self
            .client
            .describe_stream_summary()
            .stream_name(stream)
            .send()
            .await
            .map_err(|e| KinesisError::from_sdk(e, stream))?;
        Ok(out.stream_description_summary)
    }

    /// When `stream` was created, epoch ms (what tells one incarnation of a stream name from the next),
    /// and whether its shards can be listed yet.
    pub async fn stream_created(&self, stream: &str) -> Result<StreamState> {
        let summary = self.stream_summary(stream).await?;
        // A stream being created lists no shards yet (kinesalite lists none at all): a sync must not
        // conclude from that listing that the former incarnation's shards are gone.
        let listable = summary.as_ref().is_some_and(|s| {
            matches!(
                s.stream_status,
                aws_sdk_kinesis::types::StreamStatus::Active | aws_sdk_kinesis::types::StreamStatus::Updating
            )
        });
        let created = summary.map(|s| s.stream_creation_timestamp);
        let created = created.and_then(|t| t.to_millis().ok()).ok_or_else(|| KinesisError::Service {
            code: "NoCreationTimestamp".into(),
            message: format!("DescribeStreamSummary of {stream} gave no StreamCreationTimestamp"),
            retryable: true,
        })?;
        Ok(StreamState { created, listable })
    }

    /// Every shard of `stream` (open and closed but retained), following NextToken paging.
    pub async fn list_shards(&self, stream: &str) -> Result<Vec<ShardInfo>> {
        let mut shards = Vec::new();
        let mut token: Option<String> = None;
        let mut throttled = 0;
        loop {
            // With a NextToken the API refuses the stream name.
            let request = match &token {
                Some(token) => self.client.list_shards().next_token(token),
                None => {
                    let (name, arn) = self.address(stream);
                    self.client.list_shards().set_stream_name(name).set_stream_arn(arn)
                }
            };
            let out = match request.clone().send().await {
                Ok(out) => out,
                Err(e) => match KinesisError::from_sdk(e, stream) {
                    // ListShards allows 1,000 calls/s per account (100 per stream): a throttled page
                    // is asked again after a backoff, keeping the pages already listed and the token.
                    KinesisError::Throttled(message) if throttled < LIST_SHARDS_THROTTLE_RETRIES => {
                        let wait = list_shards_backoff(throttled);
                        throttled += 1;
                        tracing::info!(stream, error = message, ?wait, "ListShards throttled; retrying the page");
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    other => return Err(other),
                },
            };
            throttled = 0;
            for shard in out.shards.unwrap_or_default() {
                let parents = [shard.parent_shard_id, shard.adjacent_parent_shard_id].into_iter().flatten().collect();
                let closed = shard.sequence_number_range.and_then(|r| r.ending_sequence_number).is_some();
                shards.push(ShardInfo { id: shard.shard_id, parents, closed });
            }
            match out.next_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(shards),
            }
        }
    }

    /// The hash key range of one shard, as ListShards reports it; `None` when the shard is not listed.
    pub async fn hash_key_range(&self, stream: &str, shard_id: &str) -> Result<Option<HashKeyRange>> {
        let mut token: Option<String> = None;
        loop {
            let request = match &token {
                Some(token) => self.client.list_shards().next_token(token),
                None => self.client.list_shards().stream_name(stream),
            };
            let out = request.send().await.map_err(|e| KinesisError::from_sdk(e, stream))?;
            if let Some(shard) = out.shards.unwrap_or_default().into_iter().find(|s| s.shard_id == shard_id) {
                let range = shard.hash_key_range.and_then(|r| {
                    HashKeyRange::parse(&r.starting_hash_key, &r.ending_hash_key)
                        .inspect_err(|e| tracing::warn!(stream, shard_id, error = %e, "unreadable hash key range"))
                        .ok()
                });
                return Ok(range);
            }
            match out.next_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(None),
            }
        }
    }

    /// A shard iterator starting at `start`.
    pub async fn iterator(&self, stream: &str, shard_id: &str, start: &StartAt) -> Result<Option<String>> {
        let (name, arn) = self.address(stream);
        let request = self.client.get_shard_iterator().set_stream_name(name).set_stream_arn(arn).shard_id(shard_id);
        let request = match start {
            StartAt::AfterSequence(sequence) => {
                request.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).starting_sequence_number(sequence)
            }
            StartAt::AtSequence(sequence) => {
                request.shard_iterator_type(ShardIteratorType::AtSequenceNumber).starting_sequence_number(sequence)
            }
            StartAt::TrimHorizon => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            StartAt::Latest => request.shard_iterator_type(ShardIteratorType::Latest),
            StartAt::AtTimestamp(ms) => {
                request.shard_iterator_type(ShardIteratorType::AtTimestamp).timestamp(DateTime::from_millis(*ms))
            }
        };
        let out = request.send().await.map_err(|e| KinesisError::from_sdk(e, stream))?;
        Ok(out.shard_iterator)
    }

    /// One GetRecords call.
    pub async fn get_records(
        &self,
        stream: &Arc<str>,
        shard_id: &Arc<str>,
        iterator: &str,
        limit: i32,
    ) -> Result<Batch> {
        let out = self
            .client
            .get_records()
            .set_stream_arn(self.address(stream).1)
            .shard_iterator(iterator)
            .limit(limit)
            .customize()
            // One attempt: the reader retries with its own backoff, and a timed-out page is asked for
            // again smaller at once rather than after the SDK's three attempts of the same size.
            .config_override(
                aws_sdk_kinesis::config::Builder::default()
                    .retry_config(aws_sdk_kinesis::config::retry::RetryConfig::disabled()),
            )
            .send()
            .await
            .map_err(|e| KinesisError::from_sdk(e, stream))?;
        let records = out.records.into_iter().map(|r| record_of(r, stream, shard_id)).collect();
        Ok(Batch { records, next_iterator: out.next_shard_iterator, millis_behind: out.millis_behind_latest })
    }

    /// Puts one record on `stream` (requeued copies, dead letters).
    pub async fn put_record(&self, stream: &str, partition_key: &str, data: Bytes) -> Result<()> {
        let (name, arn) = self.address(stream);
        self.client
            .put_record()
            .set_stream_name(name)
            .set_stream_arn(arn)
            .partition_key(partition_key)
            .data(Blob::new(data))
            .send()
            .await
            .map_err(|e| KinesisError::from_sdk(e, stream))?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Publisher for Kinesis {
    async fn publish(
        &self,
        stream: &str,
        partition_key: &str,
        data: Bytes,
    ) -> std::result::Result<(), crate::destination::DeliveryError> {
        use crate::destination::{DeliveryError, is_validation_code};
        self.put_record(stream, partition_key, data).await.map_err(|e| match &e {
            KinesisError::Service { code, .. } if is_validation_code(code) => DeliveryError::Invalid(e.to_string()),
            _ => DeliveryError::Unavailable(e.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn throttled_list_shards_pages_back_off_to_a_cap() {
        let waits: Vec<Duration> = (0..LIST_SHARDS_THROTTLE_RETRIES).map(list_shards_backoff).collect();
        assert!(waits[0] >= Duration::from_millis(200) && waits[0] <= Duration::from_millis(300), "{waits:?}");
        assert!(waits.iter().all(|w| *w <= Duration::from_millis(7_500)), "capped: {waits:?}");
        assert!(waits[LIST_SHARDS_THROTTLE_RETRIES as usize - 1] >= Duration::from_secs(5), "{waits:?}");
    }
}
