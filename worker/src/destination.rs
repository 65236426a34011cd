//! Where dead letters go: the dead-letter stream (`retry.deadLetterStream`) and the on-failure
//! destinations beside it (`retry.deadLetterQueue`, `retry.deadLetterBucket`). Each receives the
//! dead-letter JSON document of a record whose attempts ran out under `onExhausted: deadLetter`, whole
//! when it takes it, else cut (see `dispatch/letter.rs`).
//!
//! - **Kinesis** (the dead-letter stream): one record per letter, keyed by the record's partition key
//!   (its SHA-256, hex, when Kinesis would refuse the key: empty or over 256 characters). A letter
//!   takes at most [`KINESIS_MAX_RECORD_BYTES`] with its key.
//! - **SQS**: one message per record, the document as its body, at most the queue's
//!   `MaximumMessageSize` (read once with GetQueueAttributes; [`SQS_MAX_MESSAGE_BYTES`] while it
//!   cannot be read). On
//!   a FIFO queue (`.fifo`) the message group is the record's partition key and the deduplication id
//!   its place in the stream, each replaced by its SHA-256 (hex, 64 characters) when SQS would refuse
//!   it (over 128 characters, or a character outside SQS's set).
//! - **S3**: one object per record, the document as its body (`application/json`), under
//!   `<prefix><stream>/<shardId>/<sequenceNumber>.json` (`<sequenceNumber>-<subSequenceNumber>.json`
//!   for a user record of a KPL aggregate). A record sent twice (after a crash) overwrites its object.
//!   No letter is over its limit (5 GB), so it always keeps the whole letter.
//!
//! A refusal is typed ([`DeliveryError`]): `Invalid` (a validation error: sending the same again can
//! never succeed) or `Unavailable` (throttled, missing, unreachable: worth retrying).

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;

use crate::aws::{Fault, classify, credentials};
use crate::processor::Record;

/// The most a Kinesis record takes: data and partition key together (1 MiB).
pub const KINESIS_MAX_RECORD_BYTES: usize = 1024 * 1024;

/// The longest partition key Kinesis takes, in characters.
pub const KINESIS_MAX_KEY_CHARS: usize = 256;

/// The most an SQS message body is assumed to take when the queue's `MaximumMessageSize` cannot be
/// read (256 KiB, SQS's limit until 2025 and the least a queue may be set to by default).
pub const SQS_MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// The most an SQS message takes at all (1 MiB, `MaximumMessageSize`'s upper bound since 2025).
pub const SQS_LARGEST_MESSAGE_BYTES: usize = 1024 * 1024;

/// The longest FIFO message group or deduplication id SQS takes.
pub const SQS_MAX_ID_CHARS: usize = 128;

/// Why a letter (or a record) was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// Refused for what it is (too large, a bad group id or key): the same can never be taken.
    #[error("refused as invalid: {0}")]
    Invalid(String),
    /// Not taken now (throttled, the queue, bucket or stream missing, access denied, network, a 5xx):
    /// worth retrying.
    #[error("{0}")]
    Unavailable(String),
}

impl DeliveryError {
    /// Sorts a service fault: the validation codes of Kinesis, SQS and S3 are `Invalid`, the rest
    /// `Unavailable`.
    pub fn from_fault(fault: Fault, text: String) -> Self {
        match fault {
            Fault::Service { code, .. } if is_validation_code(&code) => DeliveryError::Invalid(text),
            _ => DeliveryError::Unavailable(text),
        }
    }
}

/// True for an error code that says the request itself is invalid (and so is every retry of it).
pub fn is_validation_code(code: &str) -> bool {
    let code = code.rsplit('#').next().unwrap_or(code);
    matches!(
        code,
        "ValidationException"
            | "InvalidArgumentException"
            | "InvalidParameterValue"
            | "InvalidParameterValueException"
            | "InvalidMessageContents"
            | "MessageTooLong"
            | "EntityTooLarge"
            | "KeyTooLongError"
            | "InvalidArgument"
    ) || code.contains("TooLarge")
        || code.contains("TooLong")
}

/// Somewhere dead letters go.
#[async_trait]
pub trait Destination: Send + Sync + std::fmt::Debug {
    /// The kind, for metrics and logs: `kinesis`, `sqs` or `s3`.
    fn kind(&self) -> &'static str;
    /// Where, for logs: the stream name, the queue URL or `s3://bucket/prefix`.
    fn target(&self) -> String;
    /// The largest letter of `record` it takes, in bytes; `None` when no letter reaches its limit.
    async fn max_letter_bytes(&self, record: &Record) -> Option<usize>;
    /// Where it keeps `record`'s letter for good (`s3://bucket/key`), if it keeps whole letters for
    /// others to point at.
    fn location(&self, _record: &Record) -> Option<String> {
        None
    }
    /// Sends `letter`, the dead-letter document of `record`.
    async fn send(&self, record: &Record, letter: &Bytes) -> Result<(), DeliveryError>;
}

/// The S3 object key of `record`'s dead letter under `prefix`.
pub fn object_key(prefix: &str, record: &Record) -> String {
    match record.sub_sequence_number {
        Some(sub) => format!("{prefix}{}/{}/{}-{sub}.json", record.stream, record.shard_id, record.sequence_number),
        None => format!("{prefix}{}/{}/{}.json", record.stream, record.shard_id, record.sequence_number),
    }
}

/// `id` if SQS takes it as a FIFO group or deduplication id (1 to 128 characters, each alphanumeric
/// ASCII or punctuation), else its SHA-256 as 64 hex digits.
pub fn sqs_id(id: &str) -> String {
    let valid = !id.is_empty() && id.len() <= SQS_MAX_ID_CHARS && id.bytes().all(|b| b.is_ascii_graphic());
    if valid { id.to_string() } else { sha256_hex(id.as_bytes()) }
}

/// `key` if Kinesis takes it as a partition key (1 to 256 characters), else its SHA-256 as 64 hex
/// digits.
pub fn kinesis_key(key: &str) -> String {
    let chars = key.chars().count();
    if (1..=KINESIS_MAX_KEY_CHARS).contains(&chars) { key.to_string() } else { sha256_hex(key.as_bytes()) }
}

/// Writes records to a stream (requeued copies, dead letters, outputs).
#[async_trait]
pub trait Publisher: Send + Sync {
    /// Puts one record on `stream`; a refusal says whether it can ever succeed.
    async fn publish(&self, stream: &str, partition_key: &str, data: Bytes) -> Result<(), DeliveryError>;
}

/// Hex of the SHA-256 of `bytes` (dead letters' `dataSha256`, ids and keys a destination would refuse).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// A stream, written through a [`Publisher`] (the dead-letter stream).
#[derive(Clone)]
pub struct StreamDestination {
    publisher: Arc<dyn Publisher>,
    stream: String,
}

impl std::fmt::Debug for StreamDestination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamDestination").field("stream", &self.stream).finish()
    }
}

impl StreamDestination {
    /// Puts letters on `stream` with `publisher`.
    pub fn new(publisher: Arc<dyn Publisher>, stream: impl Into<String>) -> Self {
        Self { publisher, stream: stream.into() }
    }
}

#[async_trait]
impl Destination for StreamDestination {
    fn kind(&self) -> &'static str {
        "kinesis"
    }

    fn target(&self) -> String {
        self.stream.clone()
    }

    async fn max_letter_bytes(&self, record: &Record) -> Option<usize> {
        Some(KINESIS_MAX_RECORD_BYTES - kinesis_key(&record.partition_key).len())
    }

    async fn send(&self, record: &Record, letter: &Bytes) -> Result<(), DeliveryError> {
        self.publisher.publish(&self.stream, &kinesis_key(&record.partition_key), letter.clone()).await
    }
}

/// An SQS queue.
#[derive(Debug)]
pub struct SqsDestination {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    /// The queue's `MaximumMessageSize`, once read.
    max_message: std::sync::OnceLock<usize>,
}

impl SqsDestination {
    /// Sends to the queue at `queue_url`.
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        Self { client, queue_url: queue_url.into(), max_message: std::sync::OnceLock::new() }
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

    async fn max_letter_bytes(&self, _record: &Record) -> Option<usize> {
        if let Some(max) = self.max_message.get() {
            return Some(*max);
        }
        let read = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::MaximumMessageSize)
            .send()
            .await;
        let max = read.ok().and_then(|out| {
            let attributes = out.attributes?;
            attributes.get(&aws_sdk_sqs::types::QueueAttributeName::MaximumMessageSize)?.parse::<usize>().ok()
        });
        match max {
            Some(max) => {
                // Kept once read; a concurrent reader that kept it first read the same attribute.
                Some(*self.max_message.get_or_init(|| max.min(SQS_LARGEST_MESSAGE_BYTES)))
            }
            // Not readable now (no sqs:GetQueueAttributes, a missing queue): the least a queue takes.
            None => Some(SQS_MAX_MESSAGE_BYTES),
        }
    }

    async fn send(&self, record: &Record, letter: &Bytes) -> Result<(), DeliveryError> {
        let body = String::from_utf8_lossy(letter).into_owned();
        let mut message = self.client.send_message().queue_url(&self.queue_url).message_body(body);
        if self.queue_url.ends_with(".fifo") {
            let id = match record.sub_sequence_number {
                Some(sub) => format!("{}-{}-{sub}", record.shard_id, record.sequence_number),
                None => format!("{}-{}", record.shard_id, record.sequence_number),
            };
            message = message.message_group_id(sqs_id(&record.partition_key)).message_deduplication_id(sqs_id(&id));
        }
        message.send().await.map(|_| ()).map_err(|e| {
            let text = format!("{}", aws_sdk_sqs::error::DisplayErrorContext(&e));
            let fault = classify(&e);
            credentials::note(&fault);
            DeliveryError::from_fault(fault, text)
        })
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

    async fn max_letter_bytes(&self, _record: &Record) -> Option<usize> {
        None
    }

    fn location(&self, record: &Record) -> Option<String> {
        Some(format!("s3://{}/{}", self.bucket, object_key(&self.prefix, record)))
    }

    async fn send(&self, record: &Record, letter: &Bytes) -> Result<(), DeliveryError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(object_key(&self.prefix, record))
            .content_type("application/json")
            .body(ByteStream::from(letter.clone()))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| {
                let text = format!("{}", aws_sdk_s3::error::DisplayErrorContext(&e));
                let fault = classify(&e);
                credentials::note(&fault);
                DeliveryError::from_fault(fault, text)
            })
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

    #[test]
    fn ids_sqs_or_kinesis_would_refuse_are_hashed() {
        assert_eq!(sqs_id("key-1:{a}"), "key-1:{a}");
        let long = "k".repeat(200);
        for refused in [long.as_str(), "", "with space", "ünïcode", "tab\t"] {
            let id = sqs_id(refused);
            assert_eq!(id, sha256_hex(refused.as_bytes()), "{refused:?}");
            assert_eq!(id.len(), 64);
        }
        assert_eq!(sqs_id(&"k".repeat(128)), "k".repeat(128));
        assert_eq!(kinesis_key("ünïcode key"), "ünïcode key");
        assert_eq!(kinesis_key(&"ü".repeat(256)), "ü".repeat(256), "256 characters, more bytes");
        assert_eq!(kinesis_key(&"k".repeat(257)).len(), 64);
        assert_eq!(kinesis_key("").len(), 64);
    }

    #[test]
    fn validation_codes_are_told_from_the_others() {
        for code in [
            "ValidationException",
            "InvalidParameterValue",
            "com.amazonaws.sqs#InvalidParameterValueException",
            "EntityTooLarge",
            "InvalidArgumentException",
            "KeyTooLongError",
        ] {
            assert!(is_validation_code(code), "{code}");
        }
        for code in [
            "ThrottlingException",
            "ProvisionedThroughputExceededException",
            "ResourceNotFoundException",
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
            "NoSuchBucket",
            "AccessDenied",
            "InternalError",
            "KMSThrottlingException",
        ] {
            assert!(!is_validation_code(code), "{code}");
        }
    }
}
