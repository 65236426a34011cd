//! One subscription's reader: kinesalite's GetRecords pages pushed as events into a small bounded
//! channel. A client that stops reading fills the channel and the socket, and the pump waits: nothing
//! is buffered without bound.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use super::events;
use super::position::continuation_at;
use super::state::{Ending, Shared};
use super::upstream::UpstreamError;

/// Why a pump stops.
enum Stop {
    /// The subscription's lifetime is over: the stream ends cleanly.
    Lifetime,
    /// The client went away, the test cut the connection, or the server stops.
    Gone,
    /// End with this event-stream exception.
    Exception(&'static str),
}

/// What ends a subscription from outside its read loop.
struct Watch {
    deadline: Instant,
    ending: watch::Receiver<Ending>,
    shutdown: CancellationToken,
    client: mpsc::Sender<Bytes>,
}

impl Watch {
    /// Resolves once the subscription must stop.
    async fn stopped(&mut self) -> Stop {
        tokio::select! {
            _ = sleep_until(self.deadline) => Stop::Lifetime,
            _ = self.client.closed() => Stop::Gone,
            _ = self.shutdown.cancelled() => Stop::Gone,
            ending = self.ending.wait_for(|e| *e != Ending::Open) => match ending.map(|e| *e) {
                Ok(Ending::Exception(kind)) => Stop::Exception(kind),
                _ => Stop::Gone,
            },
        }
    }
}

/// A subscription's reader, ready to run.
pub(crate) struct Pump {
    pub(crate) id: u64,
    pub(crate) shared: Arc<Shared>,
    pub(crate) stream: String,
    pub(crate) shard_id: String,
    pub(crate) iterator: String,
    pub(crate) continuation: String,
    pub(crate) lifetime: Duration,
    pub(crate) stalled: bool,
    pub(crate) tx: mpsc::Sender<Bytes>,
    pub(crate) ending: watch::Receiver<Ending>,
    pub(crate) wake: Arc<Notify>,
}

fn now_millis() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Pump {
    /// Reads and pushes until the subscription ends; then it is over for the service, whether or not
    /// its client has read everything yet.
    pub(crate) async fn run(self) {
        let (id, shared) = (self.id, self.shared.clone());
        self.read_and_push().await;
        shared.book().over(id);
    }

    async fn read_and_push(self) {
        let Pump {
            id: _,
            shared,
            stream,
            shard_id,
            mut iterator,
            mut continuation,
            lifetime,
            stalled,
            tx,
            ending,
            wake,
        } = self;
        let mut watch = Watch {
            deadline: Instant::now() + lifetime,
            ending,
            shutdown: shared.shutdown.clone(),
            client: tx.clone(),
        };
        if stalled {
            // Silent forever: no events and no end of lifetime, only an outside ending.
            watch.deadline = Instant::now() + Duration::from_secs(365 * 24 * 3600);
            let stop = watch.stopped().await;
            finish(&tx, &mut watch, stop).await;
            return;
        }
        let mut last_event: Option<Instant> = None;
        loop {
            let settings = shared.book().settings.clone();
            let input = json!({ "ShardIterator": iterator, "Limit": settings.records_per_event });
            let page = tokio::select! {
                page = shared.upstream.call("GetRecords", &input) => page,
                stop = watch.stopped() => return finish(&tx, &mut watch, stop).await,
            };
            let page = match page {
                Ok(page) => page,
                Err(UpstreamError::Service { error_type, .. }) if error_type == "ResourceNotFoundException" => {
                    return finish(&tx, &mut watch, Stop::Exception("ResourceNotFoundException")).await;
                }
                Err(_) => return finish(&tx, &mut watch, Stop::Exception("InternalFailureException")).await,
            };
            let records = page["Records"].as_array().cloned().unwrap_or_default();
            let next = page["NextShardIterator"].as_str().map(str::to_string);
            let full_page = records.len() >= settings.records_per_event;
            if let Some(last) = records.last().and_then(|r| r["SequenceNumber"].as_str()) {
                continuation = last.to_string();
            } else if let Some(position) = next.as_deref().and_then(continuation_at) {
                continuation = position;
            }
            let millis_behind = match records.last().and_then(|r| r["ApproximateArrivalTimestamp"].as_f64()) {
                Some(arrival) if full_page => (now_millis() - (arrival * 1000.0) as i64).max(0),
                _ => 0,
            };
            let Some(next) = next else {
                let children = child_shards(&shared, &stream, &shard_id).await;
                let event = json!({ "Records": records, "MillisBehindLatest": 0, "ChildShards": children });
                send(&tx, &mut watch, event).await;
                return;
            };
            iterator = next;
            let records_sent = records.len();
            let due = last_event.is_none_or(|at| at.elapsed() >= settings.event_interval);
            if !records.is_empty() || due {
                let event = json!({
                    "Records": records,
                    "ContinuationSequenceNumber": continuation,
                    "MillisBehindLatest": millis_behind,
                });
                if !send(&tx, &mut watch, event).await {
                    return;
                }
                shared.book().records_pushed += records_sent;
                last_event = Some(Instant::now());
            }
            if full_page {
                continue;
            }
            let until_due =
                last_event.map_or(Duration::ZERO, |at| settings.event_interval.saturating_sub(at.elapsed()));
            tokio::select! {
                _ = sleep(settings.idle_poll.min(until_due)) => {}
                _ = wake.notified() => {}
                stop = watch.stopped() => return finish(&tx, &mut watch, stop).await,
            }
        }
    }
}

/// Pushes one event, waiting while the client does not read; false when the subscription stopped.
async fn send(tx: &mpsc::Sender<Bytes>, watch: &mut Watch, event: Value) -> bool {
    let Ok(bytes) = events::shard_event(&event) else {
        finish(tx, watch, Stop::Exception("InternalFailureException")).await;
        return false;
    };
    tokio::select! {
        sent = tx.send(bytes) => sent.is_ok(),
        stop = watch.stopped() => {
            finish(tx, watch, stop).await;
            false
        }
    }
}

/// Ends the stream as `stop` says; a clean end is simply the pump returning (the channel closes).
async fn finish(tx: &mpsc::Sender<Bytes>, watch: &mut Watch, stop: Stop) {
    let Stop::Exception(kind) = stop else { return };
    let Ok(bytes) = events::exception(kind, "ended by the fan-out test server") else { return };
    tokio::select! {
        _ = tx.send(bytes) => {}
        _ = watch.client.closed() => {}
        _ = watch.shutdown.cancelled() => {}
        _ = sleep(Duration::from_secs(1)) => {}
    }
}

/// The children of a closed shard, as ChildShards entries.
async fn child_shards(shared: &Shared, stream: &str, shard_id: &str) -> Vec<Value> {
    let Ok(listed) = shared.upstream.call("ListShards", &json!({ "StreamName": stream })).await else {
        return Vec::new();
    };
    listed["Shards"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["ParentShardId"] == shard_id || s["AdjacentParentShardId"] == shard_id)
        .map(|s| {
            let parents: Vec<&Value> =
                [&s["ParentShardId"], &s["AdjacentParentShardId"]].into_iter().filter(|p| p.is_string()).collect();
            json!({ "ShardId": s["ShardId"], "ParentShards": parents, "HashKeyRange": s["HashKeyRange"] })
        })
        .collect()
}
