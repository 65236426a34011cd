//! Stage 2b, ensure consumer: with `reader.mode: fanOut`, the stream consumer is registered on every
//! named stream unless present and is ACTIVE before workers start (they subscribe through it). The ARN
//! of each consumer this resource registers is recorded on it, the proof used at deletion
//! ([`super::stream_consumers`]).

use kube::ResourceExt;
use kube::runtime::events::EventType;
use leasehold_crds::{ReaderMode, StreamConsumer};

use super::stream_consumers::{self, ConsumerState};
use crate::conditions::Verdict;
use crate::context::Context;
use crate::error::{Error, Result};

/// Where the stream consumers stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerReadiness {
    /// The `ConsumerReady` verdict.
    pub verdict: Verdict,
    /// True when workers may start: polling, or the consumer is ACTIVE on every named stream.
    pub ready: bool,
}

/// The stream consumer name of `consumer`'s workers (`reader.consumerName`, else
/// `<namespace>.<name>`).
pub fn consumer_name(consumer: &StreamConsumer) -> Result<String> {
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    Ok(consumer.spec.consumer_name(Some((&namespace, &consumer.name_any()))))
}

/// Registers what is missing and reports the consumers' state; an AWS error fails the stage.
pub async fn ensure_consumer(consumer: &StreamConsumer, ctx: &Context) -> Result<ConsumerReadiness> {
    let spec = &consumer.spec;
    if spec.reader.mode.unwrap_or_default() != ReaderMode::FanOut {
        return Ok(ConsumerReadiness {
            verdict: Verdict::ok("Polling", "reader.mode polling: no stream consumer"),
            ready: true,
        });
    }
    if spec.streams.is_empty() {
        let message = "streams chosen by pattern or assignment: the workers register the stream consumer";
        return Ok(ConsumerReadiness { verdict: Verdict::ok("RegisteredByWorkers", message), ready: true });
    }
    let name = consumer_name(consumer)?;
    let clients = ctx.aws.get(&spec.aws).await;
    let mut pending = Vec::new();
    for stream in &spec.streams {
        let stream_name = stream.stream_name();
        let stream_arn = stream_consumers::stream_arn(&clients.kinesis, stream).await?;
        let ensured = stream_consumers::ensure(&clients.kinesis, stream_name, &stream_arn, &name).await?;
        if ensured.registered {
            // Recorded before anything else: without the record it would never be deregistered.
            stream_consumers::record(&ctx.client, consumer, &ensured.arn).await?;
            tracing::info!(consumer = %consumer.name_any(), stream = stream_name, arn = ensured.arn, "stream consumer registered");
            let note = format!("registered stream consumer {name} on {stream_name}");
            ctx.publish(consumer, EventType::Normal, "StreamConsumerRegistered", note).await;
        }
        match ensured.state {
            ConsumerState::Active => {}
            ConsumerState::Creating => pending.push(format!("{stream_name}: CREATING")),
            ConsumerState::Other(status) => pending.push(format!("{stream_name}: {status}")),
        }
    }
    let streams = spec.streams.len();
    Ok(match pending.is_empty() {
        true => ConsumerReadiness {
            verdict: Verdict::ok("Active", format!("stream consumer {name} is ACTIVE on {streams} stream(s)")),
            ready: true,
        },
        false => ConsumerReadiness {
            verdict: Verdict::failed(
                "ConsumerNotActive",
                format!("stream consumer {name} not ACTIVE yet ({})", pending.join(", ")),
            ),
            ready: false,
        },
    })
}
