//! On-failure destinations beside the dead-letter stream (`retry.deadLetterQueue`,
//! `retry.deadLetterBucket`): each receives the dead-letter JSON document of a record whose attempts
//! ran out under `onExhausted: deadLetter`.
//!
//! - **SQS**: one message per record, the document as its body. On a FIFO queue (`.fifo`) the message
//!   group is the record's partition key and the deduplication id its place in the stream.
//! - **S3**: one object per record, the document as its body (`application/json`), under
//!   `<prefix><stream>/<shardId>/<sequenceNumber>.json` (`<sequenceNumber>-<subSequenceNumber>.json`
//!   for a user record of a KPL aggregate). A record sent twice (after a crash) overwrites its object.

use async_trait::async_trait;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;

use crate::processor::Record;

/// Somewhere dead letters go besides the dead-letter stream.
#[async_trait]
pub trait Destination: Send + Sync + std::fmt::Debug {
    /// The kind, for metrics and logs: `sqs` or `s3`.
    fn kind(&self) -> &'static str;
    /// Where, for logs: the queue URL or `s3://bucket/prefix`.
    fn target(&self) -> String;
    /// Sends `letter`, the dead-letter document of `record`.
    async fn send(&self, record: &Record, letter: &Bytes) -> Result<(), String>;
}

/// The S3 object key of `record`'s dead letter under `prefix`.
pub fn object_key(prefix: &str, record: &Record) -> String {
    match record.sub_sequence_number {
        Some(sub) => format!("{prefix}{}/{}/{}-{sub}.json", record.stream, record.shard_id, record.sequence_number),
        None => format!("{prefix}{}/{}/{}.json", record.stream, record.shard_id, record.sequence_number),
    }
}

/// An SQS queue.
#[derive(Debug, Clone)]
pub struct SqsDestination {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsDestination {
    /// Sends to the queue at `queue_url`.
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        Self { client, queue_url: queue_url.into() }
    }
}

#[async_trait]
impl Destination for SqsDestination {
    fn kind(&self) -> &'static str {
        "sqs"
    }

    fn target(&self) -> String {
        self.queue_url.clone()
    }

    async fn send(&self, record: &Record, letter: &Bytes) -> Result<(), String> {
        let body = String::from_utf8_lossy(letter).into_owned();
        let mut message = self.client.send_message().queue_url(&self.queue_url).message_body(body);
        if self.queue_url.ends_with(".fifo") {
            let id = match record.sub_sequence_number {
                Some(sub) => format!("{}-{}-{sub}", record.shard_id, record.sequence_number),
                None => format!("{}-{}", record.shard_id, record.sequence_number),
            };
            message = message.message_group_id(&record.partition_key).message_deduplication_id(id);
        }
        message.send().await.map(|_| ()).map_err(|e| format!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)))
    }
}

/// An S3 bucket.
#[derive(Debug, Clone)]
pub struct S3Destination {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
}

impl S3Destination {
    /// Writes to `bucket`, keys beginning with `prefix`.
    pub fn new(client: aws_sdk_s3::Client, bucket: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self { client, bucket: bucket.into(), prefix: prefix.into() }
    }
}

#[async_trait]
impl Destination for S3Destination {
    fn kind(&self) -> &'static str {
        "s3"
    }

    fn target(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    async fn send(&self, record: &Record, letter: &Bytes) -> Result<(), String> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(object_key(&self.prefix, record))
            .content_type("application/json")
            .body(ByteStream::from(letter.clone()))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| format!("{}", aws_sdk_s3::error::DisplayErrorContext(e)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn object_keys_name_the_record_and_its_user_record() {
        let mut record = Record {
            stream: Arc::from("orders"),
            shard_id: Arc::from("shardId-000000000001"),
            sequence_number: "4959".into(),
            partition_key: "k".into(),
            data: Bytes::new(),
            arrival_ms: None,
            explicit_hash_key: None,
            sub_sequence_number: None,
        };
        assert_eq!(object_key("dlq/", &record), "dlq/orders/shardId-000000000001/4959.json");
        record.sub_sequence_number = Some(3);
        assert_eq!(object_key("", &record), "orders/shardId-000000000001/4959-3.json");
    }
}
