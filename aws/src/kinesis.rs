//! The Kinesis control-plane calls the worker, the operator and the CLI share, written once: a stream's
//! shards (ListShards, every page, by name or ARN, a throttled page asked again after a backoff) and its
//! summary (DescribeStreamSummary), with errors sorted into [`KinesisError`] from the SDK's error
//! metadata, never from message text.

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::types::{StreamDescriptionSummary, StreamStatus};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;

use crate::Fault;
use crate::backoff::{Backoff, Jitter};

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

    /// The error of a call on `stream` that failed with `error`.
    pub fn from_sdk<E>(error: SdkError<E, HttpResponse>, stream: &str) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let fault = crate::classify(&error);
        crate::credentials::note(&fault);
        Self::from_fault(fault, stream)
    }

    /// The error of a call on `stream` that met `fault`.
    pub fn from_fault(fault: Fault, stream: &str) -> Self {
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

/// How a call names a stream: by name, or by ARN when the spec gave one (then the ARN is sent and the
/// name only appears in errors and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRef<'a> {
    /// The stream's name.
    pub name: &'a str,
    /// Its ARN, when calls must name it so (another account, or the spec said so).
    pub arn: Option<&'a str>,
}

impl<'a> StreamRef<'a> {
    /// A stream named by its name only.
    pub fn named(name: &'a str) -> Self {
        Self { name, arn: None }
    }

    /// `(StreamName, StreamARN)` of a request: exactly one of them set.
    fn address(&self) -> (Option<String>, Option<String>) {
        match self.arn {
            Some(arn) => (None, Some(arn.to_string())),
            None => (Some(self.name.to_string()), None),
        }
    }
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
    /// Its hash key range as listed (starting, ending; decimal strings), when the answer had one.
    pub hash_keys: Option<(String, String)>,
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

/// Every shard of `stream` (open, and closed but retained), following NextToken paging.
pub async fn list_shards(client: &Client, stream: StreamRef<'_>) -> Result<Vec<ShardInfo>, KinesisError> {
    let mut shards = Vec::new();
    let mut token: Option<String> = None;
    let mut throttled = 0;
    loop {
        // With a NextToken the API refuses the stream name.
        let request = match &token {
            Some(token) => client.list_shards().next_token(token),
            None => {
                let (name, arn) = stream.address();
                client.list_shards().set_stream_name(name).set_stream_arn(arn)
            }
        };
        let out = match request.send().await {
            Ok(out) => out,
            Err(e) => match KinesisError::from_sdk(e, stream.name) {
                // ListShards allows 1,000 calls/s per account (100 per stream): a throttled page is
                // asked again after a backoff, keeping the pages already listed and the token.
                KinesisError::Throttled(message) if throttled < LIST_SHARDS_THROTTLE_RETRIES => {
                    let wait = list_shards_backoff(throttled);
                    throttled += 1;
                    tracing::info!(
                        stream = stream.name,
                        error = message,
                        ?wait,
                        "ListShards throttled; retrying the page"
                    );
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
            let hash_keys = shard.hash_key_range.map(|r| (r.starting_hash_key, r.ending_hash_key));
            shards.push(ShardInfo { id: shard.shard_id, parents, closed, hash_keys });
        }
        match out.next_token {
            Some(next) if !next.is_empty() => token = Some(next),
            _ => return Ok(shards),
        }
    }
}

/// DescribeStreamSummary of `stream`; an answer without a summary is a service error.
pub async fn describe_stream(client: &Client, stream: StreamRef<'_>) -> Result<StreamDescriptionSummary, KinesisError> {
    let (name, arn) = stream.address();
    let out = client
        .describe_stream_summary()
        .set_stream_name(name)
        .set_stream_arn(arn)
        .send()
        .await
        .map_err(|e| KinesisError::from_sdk(e, stream.name))?;
    out.stream_description_summary.ok_or_else(|| KinesisError::Service {
        code: "EmptyAnswer".into(),
        message: format!("DescribeStreamSummary of {} gave no StreamDescriptionSummary", stream.name),
        retryable: true,
    })
}

/// A stream's incarnation as described: when it was created (what tells one stream of a name from the
/// next one of the same name) and whether its shards can be listed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamIncarnation {
    /// When the stream was created, epoch ms.
    pub created: i64,
    /// ACTIVE or UPDATING: a listing of its shards is complete.
    pub listable: bool,
}

/// The incarnation of `stream` (DescribeStreamSummary).
pub async fn stream_incarnation(client: &Client, stream: StreamRef<'_>) -> Result<StreamIncarnation, KinesisError> {
    let summary = describe_stream(client, stream).await?;
    // A stream being created lists no shards yet (kinesalite lists none at all): a sync must not
    // conclude from that listing that the former incarnation's shards are gone.
    let listable = matches!(summary.stream_status, StreamStatus::Active | StreamStatus::Updating);
    let created = summary.stream_creation_timestamp.to_millis().map_err(|e| KinesisError::Service {
        code: "NoCreationTimestamp".into(),
        message: format!("DescribeStreamSummary of {}: unreadable StreamCreationTimestamp ({e})", stream.name),
        retryable: true,
    })?;
    Ok(StreamIncarnation { created, listable })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(code: &str) -> Fault {
        Fault::Service { code: code.into(), message: "m".into(), server_error: false }
    }

    #[test]
    fn errors_are_sorted_by_code_not_by_message() {
        assert!(matches!(
            KinesisError::from_fault(service("ResourceNotFoundException"), "s"),
            KinesisError::StreamNotFound { stream, .. } if stream == "s"
        ));
        assert!(matches!(KinesisError::from_fault(service("LimitExceededException"), "s"), KinesisError::Throttled(_)));
        assert!(matches!(
            KinesisError::from_fault(service("ExpiredIteratorException"), "s"),
            KinesisError::ExpiredIterator
        ));
        assert!(matches!(
            KinesisError::from_fault(service("ResourceInUseException"), "s"),
            KinesisError::ResourceInUse(_)
        ));
        assert!(matches!(KinesisError::from_fault(Fault::Timeout, "s"), KinesisError::TimedOut));
        let other = KinesisError::from_fault(service("AccessDeniedException"), "s");
        assert!(
            matches!(&other, KinesisError::Service { code, retryable: false, .. } if code == "AccessDeniedException")
        );
        assert!(!other.is_retryable());
        assert!(KinesisError::from_fault(service("LimitExceededException"), "s").is_retryable());
    }

    #[test]
    fn a_stream_is_addressed_by_exactly_one_of_name_and_arn() {
        assert_eq!(StreamRef::named("orders").address(), (Some("orders".into()), None));
        let arn = "arn:aws:kinesis:eu-west-1:1:stream/orders";
        assert_eq!(StreamRef { name: "orders", arn: Some(arn) }.address(), (None, Some(arn.into())));
    }

    #[test]
    fn throttled_list_shards_pages_back_off_to_a_cap() {
        use std::time::Duration;
        let waits: Vec<Duration> = (0..LIST_SHARDS_THROTTLE_RETRIES).map(list_shards_backoff).collect();
        assert!(waits[0] >= Duration::from_millis(200) && waits[0] <= Duration::from_millis(300), "{waits:?}");
        assert!(waits.iter().all(|w| *w <= Duration::from_millis(7_500)), "capped: {waits:?}");
        assert!(waits[LIST_SHARDS_THROTTLE_RETRIES as usize - 1] >= Duration::from_secs(5), "{waits:?}");
    }
}
