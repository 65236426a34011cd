//! Stage 2a, ensure streams: the streams the spec asks to create when missing (`streams[].createIfMissing`,
//! `output.createIfMissing`, `retry.deadLetterStreamCreateIfMissing`) are created and ACTIVE before any
//! worker starts. An existing stream is never changed: a shape other than the one asked for is reported
//! in `StreamReady` (reason `ShapeDiffers`). No stream is ever deleted, also not with the resource.

use kube::ResourceExt;
use kube::runtime::events::EventType;
use leasehold_crds::StreamConsumer;
use leasehold_worker::streams::{self, StreamState};

use crate::context::Context;
use crate::error::{Error, Result};

/// Where the streams to create stand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamsReadiness {
    /// Streams not ACTIVE yet (being created, or in another state), with their state.
    pub pending: Vec<String>,
    /// Existing streams whose shape differs from `createIfMissing`, and how.
    pub differs: Vec<String>,
}

impl StreamsReadiness {
    /// True when workers may start: every stream to create is ACTIVE.
    pub fn ready(&self) -> bool {
        self.pending.is_empty()
    }
}

/// Creates what is missing and reports each stream's state; an AWS error fails the stage.
pub async fn ensure_streams(consumer: &StreamConsumer, ctx: &Context) -> Result<StreamsReadiness> {
    let wanted = streams::wanted(&consumer.spec);
    let mut readiness = StreamsReadiness::default();
    if wanted.is_empty() {
        return Ok(readiness);
    }
    let clients = ctx.aws.get(&consumer.spec.aws).await;
    for stream in wanted {
        let (state, created) =
            streams::ensure(&clients.kinesis, &stream).await.map_err(|e| Error::EnsureStream(e.to_string()))?;
        if created {
            tracing::info!(consumer = %consumer.name_any(), stream = stream.name, "stream created (createIfMissing)");
            let shape = match stream.shape.shards {
                Some(shards) => format!("{shards} shard(s)"),
                None => "on demand".to_string(),
            };
            let note = format!("created stream {} ({shape})", stream.name);
            ctx.publish(consumer, EventType::Normal, "StreamCreated", note).await;
        }
        match state {
            StreamState::Active { differs: None } => {}
            StreamState::Active { differs: Some(differs) } => {
                readiness.differs.push(format!("{} {differs}", stream.name));
            }
            StreamState::Creating => readiness.pending.push(format!("{}: CREATING", stream.name)),
            StreamState::Other(status) => readiness.pending.push(format!("{}: {status}", stream.name)),
        }
    }
    Ok(readiness)
}
