//! The stream consumer of enhanced fan-out (`reader.mode: fanOut`) described, and registered when it is
//! absent: written once for the worker (which waits for it to be ACTIVE before subscribing) and the
//! operator (which registers it before the workers start and records what it registered).

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ConsumerStatus;

use crate::aws::{Fault, classify};

/// A stream consumer as [`describe_or_register`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// It was registered already.
    Described {
        /// Its ARN (ends in its creation time, so it names this registration only).
        arn: String,
        /// Its status.
        status: ConsumerStatus,
    },
    /// This call registered it.
    Registered {
        /// Its ARN.
        arn: String,
        /// Its status (CREATING, usually).
        status: ConsumerStatus,
    },
    /// Another registration of the same name came first (ResourceInUseException): describe it again.
    RegisteredByAnother,
}

/// Why a stream consumer could not be described or registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamConsumerError {
    /// Kinesis refused or failed the call.
    #[error("{}", describe(fault))]
    Call {
        /// `DescribeStreamConsumer` or `RegisterStreamConsumer`.
        action: &'static str,
        /// What went wrong.
        fault: Fault,
    },
    /// Kinesis answered without the consumer.
    #[error("{0}: the answer holds no consumer")]
    Empty(&'static str),
}

/// `code: message` of a service's answer (without its request id, which differs on every call),
/// else what failed.
fn describe(fault: &Fault) -> String {
    match fault {
        Fault::Service { code, message, .. } if message.is_empty() => code.clone(),
        Fault::Service { code, message, .. } => format!("{code}: {message}"),
        Fault::Transport(message) => message.clone(),
        Fault::Timeout => "timed out".to_string(),
    }
}

/// Describes the consumer `name` of the stream `stream_arn`, registering it first if it does not
/// exist. Idempotent, and safe for many callers at once (every worker of a consumer, the operator).
pub async fn describe_or_register(client: &Client, stream_arn: &str, name: &str) -> Result<Found, StreamConsumerError> {
    const DESCRIBE: &str = "DescribeStreamConsumer";
    const REGISTER: &str = "RegisterStreamConsumer";
    match client.describe_stream_consumer().stream_arn(stream_arn).consumer_name(name).send().await {
        Ok(out) => {
            let consumer = out.consumer_description.ok_or(StreamConsumerError::Empty(DESCRIBE))?;
            return Ok(Found::Described { arn: consumer.consumer_arn, status: consumer.consumer_status });
        }
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {}
        Err(e) => return Err(StreamConsumerError::Call { action: DESCRIBE, fault: classify(&e) }),
    }
    match client.register_stream_consumer().stream_arn(stream_arn).consumer_name(name).send().await {
        Ok(out) => {
            let consumer = out.consumer.ok_or(StreamConsumerError::Empty(REGISTER))?;
            Ok(Found::Registered { arn: consumer.consumer_arn, status: consumer.consumer_status })
        }
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => {
            Ok(Found::RegisteredByAnother)
        }
        Err(e) => Err(StreamConsumerError::Call { action: REGISTER, fault: classify(&e) }),
    }
}
