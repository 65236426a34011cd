//! The Kinesis calls a worker makes: listing streams and shards, iterators, GetRecords, and (in
//! `fanout`) the stream consumer and SubscribeToShard.

mod fanout;

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::{Blob, DateTime};
use aws_sdk_kinesis::types::ShardIteratorType;
use bytes::Bytes;

use crate::dispatch::Publisher;
use crate::kpl::HashKeyRange;
use crate::processor::Record;
pub use fanout::{Consumers, FanOutEvent, Subscription};

/// Result of a Kinesis call.
pub type Result<T, E = KinesisError> = std::result::Result<T, E>;

pub use leasehold_aws::kinesis::{KinesisError, ShardInfo, StreamIncarnation, StreamRef};

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

    /// How calls name `stream`: by its ARN when the spec gave one.
    fn stream_ref<'a>(&'a self, stream: &'a str) -> StreamRef<'a> {
        StreamRef { name: stream, arn: self.arns.get(stream).map(String::as_str) }
    }

    /// When `stream` was created, epoch ms (what tells one incarnation of a stream name from the next),
    /// and whether its shards can be listed yet.
    pub async fn stream_created(&self, stream: &str) -> Result<StreamIncarnation> {
        leasehold_aws::kinesis::stream_incarnation(&self.client, self.stream_ref(stream)).await
    }

    /// Every shard of `stream` (open and closed but retained), following NextToken paging.
    pub async fn list_shards(&self, stream: &str) -> Result<Vec<ShardInfo>> {
        leasehold_aws::kinesis::list_shards(&self.client, self.stream_ref(stream)).await
    }

    /// The hash key range of one shard, as ListShards reports it; `None` when the shard is not listed.
    pub async fn hash_key_range(&self, stream: &str, shard_id: &str) -> Result<Option<HashKeyRange>> {
        let shards = self.list_shards(stream).await?;
        let Some((start, end)) = shards.into_iter().find(|s| s.id == shard_id).and_then(|s| s.hash_keys) else {
            return Ok(None);
        };
        Ok(HashKeyRange::parse(&start, &end)
            .inspect_err(|e| tracing::warn!(stream, shard_id, error = %e, "unreadable hash key range"))
            .ok())
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
