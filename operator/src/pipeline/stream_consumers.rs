//! The registered stream consumers of enhanced fan-out (`reader.mode: fanOut`): registered on each
//! named stream unless present, waited on until ACTIVE, and deregistered on the resource's deletion only
//! when this resource registered them.
//!
//! Proof of ownership: Kinesis has no consumer tags on the emulators (and a name proves nothing: a
//! worker, or a person, may register the same name), so the operator records the exact ARN of every
//! consumer it registers in the annotation [`REGISTERED_ANNOTATION`] of the StreamConsumer. A consumer
//! ARN ends in its creation time (`.../consumer/<name>:<epoch-secs>`), so a consumer registered by
//! someone else, even under the same name after ours was removed, has another ARN and is never touched.
//! A registration whose ARN could not be recorded (the annotation write failed) is left registered, not
//! claimed later: a leak is the safe side.

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ConsumerStatus;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use leasehold_crds::{StreamConsumer, StreamSpec};
use leasehold_worker::aws::kinesis::{self, KinesisError, StreamRef};
use leasehold_worker::stream_consumer::{self, Found};
use serde_json::json;

use crate::error::{Error, Result};

/// The annotation holding the ARNs (a JSON list) of the stream consumers this resource registered.
pub const REGISTERED_ANNOTATION: &str = "leasehold.io/registered-stream-consumers";

/// Where one stream's consumer stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerState {
    /// ACTIVE: workers can subscribe.
    Active,
    /// CREATING (registered by us just now, or by someone else).
    Creating,
    /// DELETING, or a status this operator does not know.
    Other(String),
}

/// One stream's consumer after [`ensure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ensured {
    /// Its ARN.
    pub arn: String,
    /// Its status.
    pub state: ConsumerState,
    /// True when this call registered it.
    pub registered: bool,
}

fn failed(stream: &str, message: impl std::fmt::Display) -> Error {
    Error::StreamConsumer { stream: stream.into(), message: message.to_string() }
}

/// The stream's ARN: given in the spec, or from DescribeStreamSummary.
pub async fn stream_arn(client: &Client, stream: &StreamSpec) -> Result<String> {
    if let Some(arn) = &stream.arn {
        return Ok(arn.clone());
    }
    let name = stream.stream_name();
    match kinesis::describe_stream(client, StreamRef::named(name)).await {
        Ok(summary) => Ok(summary.stream_arn),
        Err(KinesisError::StreamNotFound { .. }) => Err(Error::ConsumerStreamNotFound(vec![name.to_string()])),
        Err(e) => Err(failed(name, e)),
    }
}

fn state(status: &ConsumerStatus) -> ConsumerState {
    match status {
        ConsumerStatus::Active => ConsumerState::Active,
        ConsumerStatus::Creating => ConsumerState::Creating,
        other => ConsumerState::Other(other.as_str().to_string()),
    }
}

/// Describes the consumer `name` of the stream `stream_arn` (named `stream` in messages), registering
/// it first if it does not exist. Idempotent: a registration that loses a race with a worker's
/// (ResourceInUseException) is reported as being created, and described on the next reconcile.
pub async fn ensure(client: &Client, stream: &str, stream_arn: &str, name: &str) -> Result<Ensured> {
    let found = stream_consumer::describe_or_register(client, stream_arn, name).await.map_err(|e| failed(stream, e))?;
    Ok(match found {
        Found::Described { arn, status } => Ensured { arn, state: state(&status), registered: false },
        Found::Registered { arn, status } => Ensured { arn, state: state(&status), registered: true },
        Found::RegisteredByAnother => Ensured { arn: String::new(), state: ConsumerState::Creating, registered: false },
    })
}

/// The ARNs this resource recorded as registered by it.
pub fn recorded(consumer: &StreamConsumer) -> Vec<String> {
    consumer
        .annotations()
        .get(REGISTERED_ANNOTATION)
        .and_then(|text| serde_json::from_str::<Vec<String>>(text).ok())
        .unwrap_or_default()
}

/// Adds `arn` to the resource's record, read fresh from the API (the reconciled copy may lag our own
/// last write).
pub async fn record(client: &kube::Client, consumer: &StreamConsumer, arn: &str) -> Result<()> {
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let api = Api::<StreamConsumer>::namespaced(client.clone(), &namespace);
    let current = api.get(&consumer.name_any()).await.map_err(Error::Record)?;
    let mut arns = recorded(&current);
    if arns.iter().any(|a| a == arn) {
        return Ok(());
    }
    arns.push(arn.to_string());
    let value = serde_json::to_string(&arns).map_err(|e| failed(arn, e))?;
    let patch = json!({ "metadata": { "annotations": { REGISTERED_ANNOTATION: value } } });
    api.patch(&consumer.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(Error::Record)?;
    Ok(())
}

/// What a deregistration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deregistration {
    /// The consumer was deregistered.
    Deregistered,
    /// It was already gone (or is being deleted).
    Missing,
}

/// Deregisters the consumer with exactly this ARN, if it is still registered.
pub async fn deregister(client: &Client, arn: &str) -> Result<Deregistration> {
    let described = client.describe_stream_consumer().consumer_arn(arn).send().await;
    match described {
        Ok(out) => {
            let same = out.consumer_description.as_ref().is_some_and(|d| d.consumer_arn == arn);
            let deleting =
                out.consumer_description.as_ref().is_some_and(|d| d.consumer_status == ConsumerStatus::Deleting);
            if !same || deleting {
                return Ok(Deregistration::Missing);
            }
        }
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
            return Ok(Deregistration::Missing);
        }
        Err(e) => return Err(failed(arn, crate::aws::error_message(&e))),
    }
    match client.deregister_stream_consumer().consumer_arn(arn).send().await {
        Ok(_) => Ok(Deregistration::Deregistered),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
            Ok(Deregistration::Missing)
        }
        Err(e) => Err(failed(arn, crate::aws::error_message(&e))),
    }
}
