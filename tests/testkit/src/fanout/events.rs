//! The event-stream messages of a SubscribeToShard response, framed by the SDK's own event-stream crate
//! (`aws-smithy-eventstream`), so a framing mistake here is one the SDK would also make.

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use aws_smithy_types::str_bytes::StrBytes;
use bytes::Bytes;

/// A message could not be framed (only a payload over the format's 16 MiB limit does that).
#[derive(Debug, thiserror::Error)]
#[error("event-stream framing: {0}")]
pub struct FramingError(String);

fn string_header(name: &'static str, value: &'static str) -> Header {
    Header::new(name, HeaderValue::String(StrBytes::from(value)))
}

fn frame(headers: Vec<Header>, payload: Vec<u8>) -> Result<Bytes, FramingError> {
    let message = Message::new_from_parts(headers, payload);
    let mut out = Vec::new();
    write_message_to(&message, &mut out).map_err(|e| FramingError(e.to_string()))?;
    Ok(Bytes::from(out))
}

/// The first message of every subscription, as the service sends it before any event.
pub(crate) fn initial_response() -> Result<Bytes, FramingError> {
    frame(
        vec![
            string_header(":message-type", "event"),
            string_header(":event-type", "initial-response"),
            string_header(":content-type", "application/json"),
        ],
        b"{}".to_vec(),
    )
}

/// A `SubscribeToShardEvent` whose JSON payload is `event`.
pub(crate) fn shard_event(event: &serde_json::Value) -> Result<Bytes, FramingError> {
    frame(
        vec![
            string_header(":message-type", "event"),
            string_header(":event-type", "SubscribeToShardEvent"),
            string_header(":content-type", "application/json"),
        ],
        event.to_string().into_bytes(),
    )
}

/// An exception message (`ResourceInUseException`, `InternalFailureException`, ...) that ends a stream.
pub(crate) fn exception(exception_type: &'static str, message: &str) -> Result<Bytes, FramingError> {
    frame(
        vec![
            string_header(":message-type", "exception"),
            string_header(":exception-type", exception_type),
            string_header(":content-type", "application/json"),
        ],
        serde_json::json!({ "message": message }).to_string().into_bytes(),
    )
}
