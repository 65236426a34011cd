//! Enhanced fan-out calls: the stream consumer registered once per stream (if absent, waited on until
//! ACTIVE), and `SubscribeToShard` with its event stream read one event at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_kinesis::config::retry::RetryConfig;
use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::primitives::event_stream::EventReceiver;
use aws_sdk_kinesis::types::error::SubscribeToShardEventStreamError;
use aws_sdk_kinesis::types::{ConsumerStatus, ShardIteratorType, StartingPosition, SubscribeToShardEventStream};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::OnceCell;

use super::{Kinesis, KinesisError, Result, StartAt, StreamRef};
use crate::processor::Record;
use crate::stream_consumer::{self, Found, StreamConsumerError};

/// How long a consumer registration is waited on to become ACTIVE (the service takes seconds).
const ACTIVE_WAIT: Duration = Duration::from_secs(120);

/// The registered stream consumer of a fan-out reader, by stream: registered on first use when absent.
#[derive(Debug)]
pub struct Consumers {
    name: String,
    arns: Mutex<HashMap<String, Arc<OnceCell<String>>>>,
    /// Counts the consumers this worker registered (it found them absent).
    registered: Counter,
}

impl Consumers {
    /// The consumer `name` on every stream read; registrations are counted in `registered`.
    pub fn new(name: impl Into<String>, registered: Counter) -> Self {
        Self { name: name.into(), arns: Mutex::default(), registered }
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn cell(&self, stream: &str) -> Arc<OnceCell<String>> {
        // A poisoned lock only means another reader panicked while inserting; the map is still whole.
        let mut arns = self.arns.lock().unwrap_or_else(|e| e.into_inner());
        arns.entry(stream.to_string()).or_default().clone()
    }

    /// Forgets the consumer ARN of `stream` (the consumer was deregistered): the next use registers.
    fn forget(&self, stream: &str) {
        let mut arns = self.arns.lock().unwrap_or_else(|e| e.into_inner());
        arns.remove(stream);
    }
}

/// One `SubscribeToShard` event.
#[derive(Debug, Clone)]
pub struct FanOutEvent {
    /// The records, in shard order.
    pub records: Vec<Record>,
    /// Where the next subscription starts (after it); `None` once the shard is read to its end.
    pub continuation: Option<String>,
    /// How far behind the tip the subscription is.
    pub millis_behind: i64,
}

/// An open subscription to one shard.
pub struct Subscription {
    events: EventReceiver<SubscribeToShardEventStream, SubscribeToShardEventStreamError>,
    stream: Arc<str>,
    shard_id: Arc<str>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("stream", &self.stream).field("shard_id", &self.shard_id).finish()
    }
}

impl Subscription {
    /// The next event; `None` when the service ended the subscription (its 5-minute lifetime).
    pub async fn next(&mut self) -> Result<Option<FanOutEvent>> {
        loop {
            let event = match self.events.recv().await {
                Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(event))) => event,
                // An event type newer than this SDK: nothing of it can be read.
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(None),
                Err(e) => return Err(event_error(e, &self.stream)),
            };
            let ended = event.continuation_sequence_number.is_empty()
                || event.child_shards.as_ref().is_some_and(|children| !children.is_empty());
            let records =
                event.records.into_iter().map(|r| super::record_of(r, &self.stream, &self.shard_id)).collect();
            let continuation = (!ended).then_some(event.continuation_sequence_number);
            return Ok(Some(FanOutEvent { records, continuation, millis_behind: event.millis_behind_latest }));
        }
    }
}

/// Sorts an error of the event stream (a modeled exception event, or the connection failing).
fn event_error<R: std::fmt::Debug>(error: SdkError<SubscribeToShardEventStreamError, R>, stream: &str) -> KinesisError {
    match &error {
        SdkError::ServiceError(service) => {
            let e = service.err();
            let code = e.code().unwrap_or("Unknown").to_string();
            let message = e.message().unwrap_or_default().to_string();
            classify_code(
                code,
                message,
                stream,
                matches!(e, SubscribeToShardEventStreamError::InternalFailureException(_)),
            )
        }
        _ => KinesisError::Transport(aws_smithy_types::error::display::DisplayErrorContext(&error).to_string()),
    }
}

fn classify_code(code: String, message: String, stream: &str, server_error: bool) -> KinesisError {
    match code.as_str() {
        "ResourceInUseException" => KinesisError::ResourceInUse(message),
        "LimitExceededException" => KinesisError::Throttled(message),
        "ResourceNotFoundException" => KinesisError::StreamNotFound { stream: stream.into(), message },
        _ => KinesisError::Service { code, message, retryable: server_error },
    }
}

fn starting_position(start: &StartAt) -> Result<StartingPosition> {
    let builder = match start {
        StartAt::AfterSequence(sequence) => {
            StartingPosition::builder().r#type(ShardIteratorType::AfterSequenceNumber).sequence_number(sequence)
        }
        StartAt::AtSequence(sequence) => {
            StartingPosition::builder().r#type(ShardIteratorType::AtSequenceNumber).sequence_number(sequence)
        }
        StartAt::TrimHorizon => StartingPosition::builder().r#type(ShardIteratorType::TrimHorizon),
        StartAt::Latest => StartingPosition::builder().r#type(ShardIteratorType::Latest),
        StartAt::AtTimestamp(ms) => {
            StartingPosition::builder().r#type(ShardIteratorType::AtTimestamp).timestamp(DateTime::from_millis(*ms))
        }
    };
    builder.build().map_err(|e| KinesisError::Service {
        code: "InvalidStartingPosition".into(),
        message: e.to_string(),
        retryable: false,
    })
}

impl Kinesis {
    /// The same client reading with enhanced fan-out through the stream consumer `consumers`.
    pub fn with_consumers(mut self, consumers: Arc<Consumers>) -> Self {
        self.consumers = Some(consumers);
        self
    }

    /// The ARN of the stream consumer on `stream`, registering it if absent and waiting until it is
    /// ACTIVE. Many workers may do this at once: a registration that finds the consumer made by another
    /// (ResourceInUseException) waits for it like any other.
    pub async fn consumer_arn(&self, stream: &str) -> Result<String> {
        let Some(consumers) = self.consumers.clone() else {
            return Err(KinesisError::Service {
                code: "NoConsumer".into(),
                message: "this client does not read with enhanced fan-out".into(),
                retryable: false,
            });
        };
        let cell = consumers.cell(stream);
        cell.get_or_try_init(|| self.register_consumer(&consumers, stream)).await.cloned()
    }

    async fn stream_arn(&self, stream: &str) -> Result<String> {
        if let Some(arn) = self.arns.get(stream) {
            return Ok(arn.clone());
        }
        Ok(leasehold_aws::kinesis::describe_stream(&self.client, StreamRef::named(stream)).await?.stream_arn)
    }

    async fn register_consumer(&self, consumers: &Consumers, stream: &str) -> Result<String> {
        let stream_arn = self.stream_arn(stream).await?;
        let name = consumers.name();
        let deadline = tokio::time::Instant::now() + ACTIVE_WAIT;
        loop {
            let found = stream_consumer::describe_or_register(&self.client, &stream_arn, name).await;
            if let Ok(Found::Registered { .. }) = &found {
                consumers.registered.inc();
                tracing::info!(stream, consumer = name, "stream consumer registered");
            }
            match found {
                Ok(Found::Described { arn, status } | Found::Registered { arn, status }) => {
                    if status == ConsumerStatus::Active {
                        tracing::info!(stream, consumer = name, arn, "stream consumer active");
                        return Ok(arn);
                    }
                    tracing::info!(stream, consumer = name, status = %status, "waiting for the stream consumer to be ACTIVE");
                }
                Ok(Found::RegisteredByAnother) => {}
                Err(StreamConsumerError::Empty(action)) => {
                    tracing::info!(stream, consumer = name, action, "no stream consumer in the answer; retrying");
                }
                Err(StreamConsumerError::Call { action, fault }) => match KinesisError::from_fault(fault, stream) {
                    e if e.is_retryable() => {
                        tracing::info!(stream, consumer = name, action, error = %e, "stream consumer call failed; retrying")
                    }
                    e => return Err(e),
                },
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KinesisError::Service {
                    code: "ConsumerNotActive".into(),
                    message: format!("stream consumer {name} on {stream} not ACTIVE after {ACTIVE_WAIT:?}"),
                    retryable: true,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Opens a subscription to `shard_id` from `start`. The SDK does not retry it: the caller's
    /// backoff sees (and counts) every ResourceInUseException and LimitExceededException.
    /// `StreamNotFound` means the stream is gone; a consumer gone under the worker is registered again
    /// by the next call.
    pub async fn subscribe(&self, stream: &Arc<str>, shard_id: &Arc<str>, start: &StartAt) -> Result<Subscription> {
        let consumer = self.consumer_arn(stream).await?;
        let subscribed = self
            .client
            .subscribe_to_shard()
            .consumer_arn(consumer)
            .shard_id(shard_id.as_ref())
            .starting_position(starting_position(start)?)
            .customize()
            .config_override(aws_sdk_kinesis::config::Builder::default().retry_config(RetryConfig::disabled()))
            .send()
            .await
            .map_err(|e| KinesisError::from_sdk(e, stream));
        let out = match subscribed {
            Ok(out) => out,
            Err(KinesisError::StreamNotFound { message, .. }) => {
                if let Some(consumers) = &self.consumers {
                    consumers.forget(stream);
                }
                return Err(KinesisError::Service {
                    code: "ResourceNotFoundException".into(),
                    message,
                    retryable: true,
                });
            }
            Err(e) => return Err(e),
        };
        Ok(Subscription { events: out.event_stream, stream: stream.clone(), shard_id: shard_id.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fan_out_faults_are_sorted() {
        let sort = |code: &str| classify_code(code.into(), "m".into(), "s", false);
        assert!(matches!(sort("ResourceInUseException"), KinesisError::ResourceInUse(_)));
        assert!(matches!(sort("LimitExceededException"), KinesisError::Throttled(_)));
        assert!(matches!(sort("ResourceNotFoundException"), KinesisError::StreamNotFound { .. }));
        assert!(sort("ResourceInUseException").is_retryable());
    }

    #[test]
    fn starting_positions_carry_their_sequence() {
        let at = starting_position(&StartAt::AfterSequence("42".into())).expect("valid");
        assert_eq!((at.r#type(), at.sequence_number()), (&ShardIteratorType::AfterSequenceNumber, Some("42")));
        let at = starting_position(&StartAt::AtTimestamp(5)).expect("valid");
        assert_eq!(at.timestamp().map(|t| t.to_millis().ok()), Some(Some(5)));
    }
}
