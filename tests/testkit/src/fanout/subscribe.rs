//! SubscribeToShard: the service's rules on who may subscribe when, then a streaming
//! `application/vnd.amazon.eventstream` answer fed by a [`Pump`].

use std::io;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::consumers::stream_name_of;
use super::events;
use super::pump::Pump;
use super::state::{Ending, OpenSubscription, Shared};
use super::upstream::aws_error;

/// Events waiting between a pump and the socket: small, so a client that does not read stops the pump.
const EVENT_BUFFER: usize = 2;

fn refuse(error_type: &str, message: &str) -> Response {
    aws_error(StatusCode::BAD_REQUEST, error_type, message)
}

/// Removes a subscription from the open ones when its response body goes (ended, cut or abandoned).
struct OpenGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.shared.book().open.remove(&self.id);
    }
}

/// What the response body reads from.
struct BodySource {
    events: mpsc::Receiver<Bytes>,
    ending: watch::Receiver<Ending>,
    _open: OpenGuard,
}

/// The response body: events in order, or a transport error as soon as the test cuts the connection
/// (even while events are waiting), which makes the server abort the connection mid-body.
fn body(source: BodySource) -> Body {
    let stream = futures::stream::unfold(Some((source, true)), |state| async move {
        let (mut source, mut watching) = state?;
        loop {
            let next = tokio::select! {
                biased;
                cut = source.ending.wait_for(|e| *e == Ending::Cut), if watching => match cut {
                    Ok(_) => None,
                    // No more endings can come (the server is going away): deliver what is left.
                    Err(_) => {
                        watching = false;
                        continue;
                    }
                },
                event = source.events.recv() => Some(event),
            };
            return match next {
                Some(Some(bytes)) => Some((Ok(bytes), Some((source, watching)))),
                Some(None) => None,
                None => {
                    let error =
                        io::Error::new(io::ErrorKind::ConnectionReset, "connection cut by the fan-out test server");
                    Some((Err(error), None))
                }
            };
        }
    });
    Body::from_stream(stream)
}

/// The pending fault for `shard_id` to answer now, if any (each is used `times` times).
fn take_fault(shared: &Shared, shard_id: &str) -> Option<&'static str> {
    let mut book = shared.book();
    let pending =
        book.faults.iter_mut().find(|f| f.remaining > 0 && f.shard_id.as_deref().is_none_or(|s| s == shard_id))?;
    pending.remaining -= 1;
    let kind = pending.fault.error_type();
    book.faults.retain(|f| f.remaining > 0);
    Some(kind)
}

/// GetShardIterator input for a SubscribeToShard StartingPosition.
fn iterator_input(stream: &str, shard_id: &str, position: &Value) -> Value {
    let mut input = json!({
        "StreamName": stream,
        "ShardId": shard_id,
        "ShardIteratorType": position["Type"],
    });
    if position["SequenceNumber"].is_string() {
        input["StartingSequenceNumber"] = position["SequenceNumber"].clone();
    }
    if !position["Timestamp"].is_null() {
        input["Timestamp"] = position["Timestamp"].clone();
    }
    input
}

/// SubscribeToShard.
pub(crate) async fn subscribe(shared: Arc<Shared>, input: Value, connection: CancellationToken) -> Response {
    let (Some(consumer_arn), Some(shard_id)) = (input["ConsumerARN"].as_str(), input["ShardId"].as_str()) else {
        return refuse("InvalidArgumentException", "ConsumerARN and ShardId are required");
    };
    if !input["StartingPosition"]["Type"].is_string() {
        return refuse("InvalidArgumentException", "StartingPosition.Type is required");
    }
    if let Some(kind) = take_fault(&shared, shard_id) {
        return refuse(kind, "injected by the fan-out test server");
    }
    let key = (consumer_arn.to_string(), shard_id.to_string());
    let (id, stream, lifetime, ending_rx, wake) = {
        let mut book = shared.book();
        let settings = book.settings.clone();
        let Some(consumer) = book.consumers.get(consumer_arn).cloned() else {
            return refuse("ResourceNotFoundException", &format!("Consumer {consumer_arn} not found"));
        };
        match consumer.status(settings.consumer_transition) {
            Some("ACTIVE") => {}
            None => return refuse("ResourceNotFoundException", &format!("Consumer {consumer_arn} not found")),
            Some(status) => {
                return refuse("ResourceInUseException", &format!("Consumer {consumer_arn} is {status}, not ACTIVE"));
            }
        }
        let now = Instant::now();
        if book.last_call.get(&key).is_some_and(|at| now.duration_since(*at) < settings.call_interval) {
            return refuse("LimitExceededException", "Rate exceeded for consumer and shard (1 call per second)");
        }
        book.last_call.insert(key.clone(), now);
        let open: Vec<u64> = book
            .live()
            .filter(|(_, s)| s.consumer_arn == consumer_arn && s.shard_id == shard_id)
            .map(|(id, _)| *id)
            .collect();
        let recent = book.last_start.get(&key).is_some_and(|at| now.duration_since(*at) < settings.resubscribe_window);
        if recent || (!open.is_empty() && !settings.takeover) {
            return refuse(
                "ResourceInUseException",
                &format!("Another active subscription exists for consumer {consumer_arn} and shard {shard_id}"),
            );
        }
        let Some(stream) = stream_name_of(&consumer.stream_arn).map(str::to_string) else {
            return refuse("InvalidArgumentException", "the consumer's stream ARN names no stream");
        };
        for id in open {
            if let Some(previous) = book.open.get(&id) {
                let _ = previous.ending.send(Ending::Exception("ResourceInUseException"));
            }
            book.over(id);
        }
        // Reserve the consumer and shard now, so two racing calls cannot both open.
        let id = book.next_subscription;
        book.next_subscription += 1;
        let (ending, ending_rx) = watch::channel(Ending::Open);
        let wake = Arc::new(Notify::new());
        book.open.insert(
            id,
            OpenSubscription {
                consumer_arn: consumer_arn.to_string(),
                stream: stream.clone(),
                shard_id: shard_id.to_string(),
                ending,
                wake: wake.clone(),
                connection,
                over: false,
            },
        );
        (id, stream, settings.subscription_lifetime, ending_rx, wake)
    };
    let guard = OpenGuard { shared: shared.clone(), id };
    let position = &input["StartingPosition"];
    let iterator = match shared.upstream.call("GetShardIterator", &iterator_input(&stream, shard_id, position)).await {
        Ok(answer) => match answer["ShardIterator"].as_str() {
            Some(iterator) => iterator.to_string(),
            None => return refuse("InternalFailureException", "kinesalite gave no shard iterator"),
        },
        Err(e) => return e.into_response(),
    };
    let stalled = {
        let mut book = shared.book();
        book.last_start.insert(key, Instant::now());
        *book.started.entry(shard_id.to_string()).or_default() += 1;
        let stall = book.stalls.iter().position(|s| s.as_deref().is_none_or(|s| s == shard_id));
        stall.map(|i| book.stalls.remove(i)).is_some()
    };
    // Before any record: AFTER the given sequence number resumes where this one starts; for the other
    // positions the first page's iterator tells.
    let continuation = match position["Type"].as_str() {
        Some("AFTER_SEQUENCE_NUMBER") => position["SequenceNumber"].as_str().unwrap_or_default().to_string(),
        _ => super::position::continuation_at(&iterator).unwrap_or_default(),
    };
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let Ok(initial) = events::initial_response() else {
        return refuse("InternalFailureException", "could not frame the initial response");
    };
    // The channel is new and has room: the initial response is always first.
    let _ = tx.try_send(initial);
    let pump = Pump {
        id,
        shared: shared.clone(),
        stream,
        shard_id: shard_id.to_string(),
        iterator,
        continuation,
        lifetime,
        stalled,
        tx,
        ending: ending_rx.clone(),
        wake,
    };
    tokio::spawn(pump.run());
    let source = BodySource { events: rx, ending: ending_rx, _open: guard };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/vnd.amazon.eventstream")
        .header("x-amzn-requestid", uuid::Uuid::new_v4().to_string())
        .body(body(source))
        .unwrap_or_else(|e| refuse("InternalFailureException", &e.to_string()))
}
