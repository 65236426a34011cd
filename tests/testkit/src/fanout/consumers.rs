//! RegisterStreamConsumer, DescribeStreamConsumer, DeregisterStreamConsumer and ListStreamConsumers,
//! answered here (kinesalite has no consumers), for streams that exist in kinesalite.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::state::{Consumer, Ending, Shared};
use super::upstream::{aws_error, aws_ok};

/// Consumers per stream, as the service's quota.
const CONSUMERS_PER_STREAM: usize = 20;

/// The stream name in a stream ARN (`arn:aws:kinesis:<region>:<account>:stream/<name>`).
pub(crate) fn stream_name_of(stream_arn: &str) -> Option<&str> {
    let (_, name) = stream_arn.split_once(":stream/")?;
    let name = name.split('/').next()?;
    (!name.is_empty()).then_some(name)
}

fn not_found(message: String) -> Response {
    aws_error(StatusCode::BAD_REQUEST, "ResourceNotFoundException", &message)
}

fn invalid(message: &str) -> Response {
    aws_error(StatusCode::BAD_REQUEST, "InvalidArgumentException", message)
}

fn summary(consumer: &Consumer, status: &str) -> Value {
    json!({
        "ConsumerName": consumer.name,
        "ConsumerARN": consumer.arn,
        "ConsumerStatus": status,
        "ConsumerCreationTimestamp": consumer.creation_epoch_secs,
    })
}

/// Checks that the stream of `stream_arn` exists in kinesalite.
async fn check_stream(shared: &Shared, stream_arn: &str) -> Result<(), Response> {
    let name = stream_name_of(stream_arn).ok_or_else(|| invalid("StreamARN is not a stream ARN"))?;
    shared
        .upstream
        .call("DescribeStreamSummary", &json!({ "StreamName": name }))
        .await
        .map(|_| ())
        .map_err(|e| e.into_response())
}

/// RegisterStreamConsumer: a new consumer, CREATING for a while, then ACTIVE.
pub(crate) async fn register(shared: &Shared, input: &Value) -> Response {
    let (Some(stream_arn), Some(name)) = (input["StreamARN"].as_str(), input["ConsumerName"].as_str()) else {
        return invalid("StreamARN and ConsumerName are required");
    };
    let valid_name = !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !valid_name {
        return invalid("ConsumerName must match [a-zA-Z0-9_.-]{1,128}");
    }
    if let Err(response) = check_stream(shared, stream_arn).await {
        return response;
    }
    let mut book = shared.book();
    let transition = book.settings.consumer_transition;
    book.consumers.retain(|_, c| c.status(transition).is_some());
    let on_stream = book.consumers.values().filter(|c| c.stream_arn == stream_arn).count();
    if book.consumers.values().any(|c| c.stream_arn == stream_arn && c.name == name) {
        return aws_error(
            StatusCode::BAD_REQUEST,
            "ResourceInUseException",
            &format!("Consumer {name} under stream {stream_arn} already exists"),
        );
    }
    if on_stream >= CONSUMERS_PER_STREAM {
        return aws_error(StatusCode::BAD_REQUEST, "LimitExceededException", "too many consumers on this stream");
    }
    let creation_epoch_secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let consumer = Consumer {
        name: name.to_string(),
        arn: format!("{stream_arn}/consumer/{name}:{creation_epoch_secs}"),
        stream_arn: stream_arn.to_string(),
        creation_epoch_secs,
        registered_at: Instant::now(),
        deregistered_at: None,
    };
    let answer = json!({ "Consumer": summary(&consumer, "CREATING") });
    book.consumers.insert(consumer.arn.clone(), consumer);
    aws_ok(&answer)
}

/// The consumer an input names, by ConsumerARN or by StreamARN and ConsumerName.
fn find<'a>(consumers: impl Iterator<Item = &'a Consumer>, input: &Value) -> Option<Consumer> {
    let mut consumers = consumers;
    match (input["ConsumerARN"].as_str(), input["StreamARN"].as_str(), input["ConsumerName"].as_str()) {
        (Some(arn), _, _) => consumers.find(|c| c.arn == arn).cloned(),
        (None, Some(stream_arn), Some(name)) => {
            consumers.find(|c| c.stream_arn == stream_arn && c.name == name).cloned()
        }
        _ => None,
    }
}

/// DescribeStreamConsumer.
pub(crate) async fn describe(shared: &Shared, input: &Value) -> Response {
    let book = shared.book();
    let transition = book.settings.consumer_transition;
    let live = book.consumers.values().filter(|c| c.status(transition).is_some());
    match find(live, input) {
        Some(consumer) => {
            let status = consumer.status(transition).unwrap_or("DELETING");
            let mut description = summary(&consumer, status);
            description["StreamARN"] = json!(consumer.stream_arn);
            aws_ok(&json!({ "ConsumerDescription": description }))
        }
        None => not_found(format!(
            "Consumer {} not found",
            input["ConsumerARN"].as_str().unwrap_or_else(|| { input["ConsumerName"].as_str().unwrap_or("?") })
        )),
    }
}

/// DeregisterStreamConsumer: DELETING for a while, then gone; its open subscriptions end with
/// ResourceNotFoundException.
pub(crate) async fn deregister(shared: &Shared, input: &Value) -> Response {
    let mut book = shared.book();
    let transition = book.settings.consumer_transition;
    let registered = book.consumers.values().filter(|c| c.status(transition).is_some_and(|s| s != "DELETING"));
    let Some(consumer) = find(registered, input) else {
        return not_found("Consumer not found".to_string());
    };
    if let Some(entry) = book.consumers.get_mut(&consumer.arn) {
        entry.deregistered_at = Some(Instant::now());
    }
    for (_, subscription) in book.live().filter(|(_, s)| s.consumer_arn == consumer.arn) {
        let _ = subscription.ending.send(Ending::Exception("ResourceNotFoundException"));
    }
    aws_ok(&json!({}))
}

/// ListStreamConsumers, paged by MaxResults and NextToken (an index into the stream's consumers).
pub(crate) async fn list(shared: &Shared, input: &Value) -> Response {
    let Some(stream_arn) = input["StreamARN"].as_str() else {
        return invalid("StreamARN is required");
    };
    if let Err(response) = check_stream(shared, stream_arn).await {
        return response;
    }
    let book = shared.book();
    let transition = book.settings.consumer_transition;
    let on_stream: Vec<Value> = book
        .consumers
        .values()
        .filter(|c| c.stream_arn == stream_arn)
        .filter_map(|c| c.status(transition).map(|status| summary(c, status)))
        .collect();
    let start = input["NextToken"].as_str().and_then(|t| t.parse::<usize>().ok()).unwrap_or(0);
    let page = input["MaxResults"].as_u64().map(|n| n as usize).unwrap_or(100).max(1);
    let end = (start + page).min(on_stream.len());
    let mut answer = json!({ "Consumers": on_stream.get(start..end).unwrap_or_default() });
    if end < on_stream.len() {
        answer["NextToken"] = json!(end.to_string());
    }
    aws_ok(&answer)
}
