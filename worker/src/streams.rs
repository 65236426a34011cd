//! Streams created on demand (`streams[].createIfMissing`, `output.createIfMissing`,
//! `retry.deadLetterStreamCreateIfMissing`): a missing stream is created with the shape asked for, and
//! readers wait until it is ACTIVE. Shared by the worker (run without the operator) and the operator.
//! An existing stream is never changed, whatever its shape (a different shape is reported, not fixed),
//! and no stream is ever deleted.

use std::time::Duration;

use aws_sdk_kinesis::types::{StreamMode, StreamModeDetails};
use leasehold_crds::{CreateIfMissing, StreamConsumerSpec};

use crate::aws::{Fault, classify};
use crate::kinesis::{KinesisError, StreamRef};

/// A stream the spec asks to create when missing: its name and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The stream's name.
    pub name: String,
    /// The shape to create it with.
    pub shape: CreateIfMissing,
}

/// Every stream `spec` asks to create when missing: the consumed streams, then the output stream,
/// then the dead-letter stream.
pub fn wanted(spec: &StreamConsumerSpec) -> Vec<Wanted> {
    let mut out = Vec::new();
    for stream in &spec.streams {
        if let (Some(name), Some(shape)) = (&stream.name, stream.create_if_missing) {
            out.push(Wanted { name: name.clone(), shape });
        }
    }
    if let Some(output) = &spec.output
        && let Some(shape) = output.create_if_missing
    {
        out.push(Wanted { name: output.stream.clone(), shape });
    }
    if let Some(retry) = &spec.retry
        && let (Some(name), Some(shape)) = (&retry.dead_letter_stream, retry.dead_letter_stream_create_if_missing)
    {
        out.push(Wanted { name: name.clone(), shape });
    }
    out
}

/// Where a stream stands after [`ensure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamState {
    /// ACTIVE (or UPDATING: readable); `differs` says how its shape differs from the one asked for.
    Active {
        /// How the existing stream's shape differs from `createIfMissing`, if it does.
        differs: Option<String>,
    },
    /// Being created (by this call or another).
    Creating,
    /// Another status (DELETING).
    Other(String),
}

/// Why a stream could not be described or created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamsError {
    /// Kinesis refused or failed a call.
    #[error("stream {stream}: {action}: {message}")]
    Kinesis {
        /// The stream.
        stream: String,
        /// `DescribeStreamSummary` or `CreateStream`.
        action: &'static str,
        /// The error.
        message: String,
    },
    /// The stream did not become ACTIVE in time.
    #[error("stream {stream} is not ACTIVE after {waited:?} (last seen {state:?})")]
    NotActive {
        /// The stream.
        stream: String,
        /// How long it was waited for.
        waited: Duration,
        /// Its last state.
        state: StreamState,
    },
}

fn fault_message(fault: Fault) -> String {
    match fault {
        Fault::Timeout => "timed out".into(),
        Fault::Transport(message) => message,
        Fault::Service { code, message, .. } => format!("{code}: {message}"),
    }
}

/// Describes `wanted`'s stream, creating it when it does not exist; `created` is true when this call
/// created it. A stream created meanwhile by someone else (`ResourceInUseException`) counts as
/// being created, not as created here.
pub async fn ensure(client: &aws_sdk_kinesis::Client, wanted: &Wanted) -> Result<(StreamState, bool), StreamsError> {
    let describe =
        |message| StreamsError::Kinesis { stream: wanted.name.clone(), action: "DescribeStreamSummary", message };
    match leasehold_aws::kinesis::describe_stream(client, StreamRef::named(&wanted.name)).await {
        Ok(summary) => {
            let on_demand = summary.stream_mode_details.as_ref().is_some_and(|m| m.stream_mode == StreamMode::OnDemand);
            let state = match summary.stream_status.as_str() {
                "ACTIVE" | "UPDATING" => {
                    StreamState::Active { differs: differs(&wanted.shape, on_demand, summary.open_shard_count) }
                }
                "CREATING" => StreamState::Creating,
                other => StreamState::Other(other.to_string()),
            };
            Ok((state, false))
        }
        Err(KinesisError::StreamNotFound { .. }) => create(client, wanted).await,
        Err(e) => Err(describe(e.to_string())),
    }
}

async fn create(client: &aws_sdk_kinesis::Client, wanted: &Wanted) -> Result<(StreamState, bool), StreamsError> {
    let mut request = client.create_stream().stream_name(&wanted.name);
    request = match wanted.shape.shards {
        Some(shards) => request.shard_count(shards),
        None => request.stream_mode_details(
            StreamModeDetails::builder().stream_mode(StreamMode::OnDemand).build().map_err(|e| {
                StreamsError::Kinesis { stream: wanted.name.clone(), action: "CreateStream", message: e.to_string() }
            })?,
        ),
    };
    match request.send().await {
        Ok(_) => {
            tracing::info!(stream = wanted.name, shards = ?wanted.shape.shards, on_demand = wanted.shape.shards.is_none(),
                "stream created (createIfMissing)");
            Ok((StreamState::Creating, true))
        }
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => {
            Ok((StreamState::Creating, false))
        }
        Err(e) => Err(StreamsError::Kinesis {
            stream: wanted.name.clone(),
            action: "CreateStream",
            message: fault_message(classify(&e)),
        }),
    }
}

/// How an existing stream's shape differs from `shape`, if it does.
fn differs(shape: &CreateIfMissing, on_demand: bool, open_shards: i32) -> Option<String> {
    match (shape.shards, on_demand) {
        (Some(shards), false) if shards != open_shards => {
            Some(format!("has {open_shards} open shard(s); createIfMissing asks for {shards}"))
        }
        (Some(shards), true) => Some(format!("is on demand; createIfMissing asks for {shards} provisioned shard(s)")),
        (None, false) => {
            Some(format!("is provisioned ({open_shards} open shards); createIfMissing asks for on demand"))
        }
        _ => None,
    }
}

/// [`ensure`] every stream of `spec` that asks for it, then waits until each is ACTIVE (polling every
/// 200 ms, at most `timeout`). Logs a stream whose shape differs from the one asked for (left as it is).
pub async fn ensure_all(
    client: &aws_sdk_kinesis::Client,
    spec: &StreamConsumerSpec,
    timeout: Duration,
) -> Result<(), StreamsError> {
    let started = tokio::time::Instant::now();
    for wanted in wanted(spec) {
        loop {
            let (state, _) = ensure(client, &wanted).await?;
            match state {
                StreamState::Active { differs } => {
                    if let Some(differs) = differs {
                        tracing::warn!(
                            stream = wanted.name,
                            differs,
                            "existing stream left as it is (createIfMissing)"
                        );
                    }
                    break;
                }
                state if started.elapsed() >= timeout => {
                    return Err(StreamsError::NotActive { stream: wanted.name.clone(), waited: timeout, state });
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_differs_only_when_it_does() {
        let shards = CreateIfMissing { shards: Some(2), on_demand: None };
        let on_demand = CreateIfMissing { shards: None, on_demand: Some(true) };
        assert_eq!(differs(&shards, false, 2), None);
        assert!(differs(&shards, false, 4).is_some_and(|d| d.contains("4 open shard(s)")));
        assert!(differs(&shards, true, 4).is_some_and(|d| d.contains("on demand")));
        assert_eq!(differs(&on_demand, true, 4), None);
        assert!(differs(&on_demand, false, 1).is_some_and(|d| d.contains("provisioned")));
    }
}
