//! Batching for the http processor: concurrent `process` calls are coalesced into one POST in
//! CloudEvents HTTP batched mode, and the answer is split back into one outcome per record. The answer
//! format is described in the parent module.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

use futures::future::BoxFuture;

use super::answer::parse_answer;
use super::{EVENT_TYPE, Endpoint, Unanswered, attributes, event_id, event_source, event_time, to_output};
use crate::processor::{Output, ProcessError, Record, foreign};

/// The content type of a batch (CloudEvents HTTP batched mode).
pub const BATCH_CONTENT_TYPE: &str = "application/cloudevents-batch+json";

/// How records are batched (`processor.http.batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpBatching {
    /// Most records per request; 1 means one record per request (no batching).
    pub max_records: usize,
    /// How long the first record of a batch waits for more before the batch is sent anyway.
    pub max_delay: Duration,
    /// A batch failing whole without naming any record (a non-2xx answer, no answer in time) is sent
    /// again in halves, down to single records, so only the records that fail alone fail
    /// (`retry.bisect`, Lambda's BisectBatchOnFunctionError).
    pub bisect: bool,
}

/// What one record of a batch gets back: its outputs, or why it failed.
type Outcome = Result<Vec<Output>, ProcessError>;

/// A record waiting in the queue for its batch's answer.
struct Pending {
    record: Record,
    answer: oneshot::Sender<Outcome>,
}

/// Queues records and sends them in batches from a task of its own.
#[derive(Debug)]
pub(super) struct Batcher {
    batching: HttpBatching,
    endpoint: Endpoint,
    /// The flusher task's queue, started on first use: the processor may be built outside a runtime
    /// (a task needs one), and a flusher whose runtime has gone is started again in the caller's.
    queue: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
}

impl Batcher {
    /// A batcher sending to `endpoint`.
    pub(super) fn new(batching: HttpBatching, endpoint: Endpoint) -> Self {
        Self { batching, endpoint, queue: Mutex::new(None) }
    }

    /// Queues `record` and waits for the answer to the batch it goes out in.
    pub(super) async fn process(&self, record: &Record) -> Outcome {
        let (answer, outcome) = oneshot::channel();
        // Unbounded is safe: every queued record has a caller waiting for it, and the dispatcher bounds
        // how many records are in flight.
        self.queue()
            .send(Pending { record: record.clone(), answer })
            .map_err(|_| ProcessError::retryable("the http batch queue has stopped"))?;
        outcome.await.map_err(|_| ProcessError::retryable("the batch was dropped before it was answered"))?
    }

    fn queue(&self) -> mpsc::UnboundedSender<Pending> {
        // A poisoned lock only means another caller panicked while holding it; the Option is still sound.
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        match queue.as_ref() {
            Some(sender) if !sender.is_closed() => sender.clone(),
            _ => {
                let (sender, receiver) = mpsc::unbounded_channel();
                tokio::spawn(flush(receiver, self.batching, self.endpoint.clone()));
                *queue = Some(sender.clone());
                sender
            }
        }
    }
}

/// Gathers queued records into batches (full, or `max_delay` after their first record) and sends each
/// from a task of its own, so a slow answer does not hold up the next batch. Ends when the processor
/// (the queue's only sender) is dropped.
async fn flush(mut queue: mpsc::UnboundedReceiver<Pending>, batching: HttpBatching, endpoint: Endpoint) {
    while let Some(first) = queue.recv().await {
        let deadline = tokio::time::Instant::now() + batching.max_delay;
        let mut batch = vec![first];
        while batch.len() < batching.max_records {
            match tokio::time::timeout_at(deadline, queue.recv()).await {
                Ok(Some(next)) => batch.push(next),
                Ok(None) | Err(_) => break,
            }
        }
        // A caller that stopped waiting (its lease was lost, or the worker stops) no longer wants its
        // record processed: leave it out rather than start it late.
        batch.retain(|pending| !pending.answer.is_closed());
        if !batch.is_empty() {
            tokio::spawn(send(endpoint.clone(), batch, batching.bisect));
        }
    }
}

/// POSTs one batch and hands each record its outcome.
async fn send(endpoint: Endpoint, batch: Vec<Pending>, bisect: bool) {
    let (records, answers): (Vec<Record>, Vec<oneshot::Sender<Outcome>>) =
        batch.into_iter().map(|pending| (pending.record, pending.answer)).unzip();
    let outcomes = exchange(&endpoint, &records, bisect).await;
    for (answer, outcome) in answers.into_iter().zip(outcomes) {
        // The caller may have stopped waiting meanwhile; its record is simply not counted as done.
        let _ = answer.send(outcome);
    }
}

/// Each record's outcome from one POST of `records`; with `bisect`, a batch of several records
/// failing whole (answered non-2xx, or not answered in time) is sent again as two halves at once,
/// recursively, so a record fails only in a request that failed with it alone. A request that never
/// reached the receiver (connection refused) blames no record and is not split.
fn exchange<'a>(endpoint: &'a Endpoint, records: &'a [Record], bisect: bool) -> BoxFuture<'a, Vec<Outcome>> {
    Box::pin(async move {
        let request = match request(endpoint, records) {
            Ok(request) => request,
            Err(error) => return vec![Err(error); records.len()],
        };
        let (error, blames_records) = match endpoint.try_exchange(request).await {
            Ok((status, body)) if status.is_success() => return outcomes(&body, records),
            Ok((status, body)) => (endpoint.failure(status, &body), true),
            Err(Unanswered::TimedOut(error) | Unanswered::Unreadable(error)) => (error, true),
            Err(Unanswered::Transport(error)) => (error, false),
        };
        if bisect && blames_records && records.len() > 1 {
            tracing::debug!(records = records.len(), error = %error, "batch failed whole; sending it again in halves");
            let (left, right) = records.split_at(records.len() / 2);
            let (left, right) = futures::join!(exchange(endpoint, left, true), exchange(endpoint, right, true));
            return left.into_iter().chain(right).collect();
        }
        vec![Err(error); records.len()]
    })
}

/// The request carrying `records` in CloudEvents batched mode.
fn request(endpoint: &Endpoint, records: &[Record]) -> Result<Request<Full<Bytes>>, ProcessError> {
    let body = Value::Array(records.iter().map(structured_event).collect());
    let body = serde_json::to_vec(&body).map_err(|e| ProcessError::permanent(format!("batch body: {e}")))?;
    Request::builder()
        .method(Method::POST)
        .uri(endpoint.url.clone())
        .header(header::CONTENT_TYPE, BATCH_CONTENT_TYPE)
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| ProcessError::permanent(format!("request: {e}")))
}

/// `record` as a structured-mode CloudEvent: the binary-mode attributes as JSON members (no
/// percent-encoding: JSON strings carry any text), the data in base64.
fn structured_event(record: &Record) -> Value {
    let mut event = Map::new();
    event.insert("specversion".into(), "1.0".into());
    event.insert("type".into(), EVENT_TYPE.into());
    for (header, value) in attributes(record) {
        event.insert(header.trim_start_matches("ce-").into(), value.into());
    }
    if let Some(time) = event_time(record) {
        event.insert("time".into(), time.into());
    }
    event.insert("datacontenttype".into(), "application/octet-stream".into());
    event.insert("data_base64".into(), base64::engine::general_purpose::STANDARD.encode(&record.data).into());
    Value::Object(event)
}

/// Each record's outcome from a 2xx answer's body; an answer that cannot be read fails them all.
pub(crate) fn outcomes(body: &[u8], records: &[Record]) -> Vec<Outcome> {
    read_answer(body, records).unwrap_or_else(|error| vec![Err(error); records.len()])
}

fn read_answer(body: &[u8], records: &[Record]) -> Result<Vec<Outcome>, ProcessError> {
    let answer = parse_answer(body).map_err(|e| e.into_process_error("the whole batch"))?;
    let mut outcomes: Vec<Outcome> = vec![Ok(Vec::new()); records.len()];
    // Indexed only when an entry names events (most answers name none).
    let events = OnceCell::new();
    let events = || events.get_or_init(|| Events::new(records));
    for item in answer.outputs {
        for i in events().named_by(item.id.as_deref(), item.source.as_deref())? {
            let output = to_output(&item, &records[i]);
            if let Ok(outputs) = &mut outcomes[i] {
                outputs.push(output);
            }
        }
    }
    for item in &answer.failed {
        let message = item.error.as_deref().map_or_else(|| "the receiver reported it failed".into(), foreign::short);
        for i in events().named_by(item.id.as_deref(), item.source.as_deref())? {
            let error = format!("event {} failed in its batch: {message}", event_id(&records[i]));
            outcomes[i] =
                Err(if item.retryable { ProcessError::retryable(error) } else { ProcessError::permanent(error) });
        }
    }
    for id in &answer.item_failures {
        // Lambda's partial batch response: an entry naming no record of the batch fails the whole
        // batch (retryable), as Lambda treats it.
        let named: Vec<usize> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.sequence_number == *id || event_id(r) == *id)
            .map(|(i, _)| i)
            .collect();
        if named.is_empty() {
            return Err(ProcessError::retryable(format!(
                "batchItemFailures names {:?}, which is not in the batch: the whole batch failed",
                foreign::short(id)
            )));
        }
        for i in named {
            outcomes[i] = Err(ProcessError::retryable(format!(
                "event {} failed in its batch (batchItemFailures)",
                event_id(&records[i])
            )));
        }
    }
    Ok(outcomes)
}

#[cfg(test)]
pub(super) fn structured_event_for_tests(record: &Record) -> Value {
    structured_event(record)
}

/// The batch's events by id, to find the ones an answer entry names.
struct Events {
    by_id: HashMap<String, Vec<(usize, String)>>,
}

impl Events {
    fn new(records: &[Record]) -> Self {
        let mut by_id: HashMap<String, Vec<(usize, String)>> = HashMap::with_capacity(records.len());
        for (i, record) in records.iter().enumerate() {
            by_id.entry(event_id(record)).or_default().push((i, event_source(record)));
        }
        Self { by_id }
    }

    /// The positions of the events an answer entry names by `id` (and `source`, when given).
    fn named_by(&self, id: Option<&str>, source: Option<&str>) -> Result<Vec<usize>, ProcessError> {
        let id = id.ok_or_else(|| {
            ProcessError::permanent("an entry of the batch answer has no `id`: the whole batch failed")
        })?;
        let found: Vec<usize> = self
            .by_id
            .get(id)
            .into_iter()
            .flatten()
            .filter(|(_, s)| source.is_none_or(|wanted| wanted == s))
            .map(|(i, _)| *i)
            .collect();
        if found.is_empty() {
            return Err(ProcessError::permanent(format!(
                "the batch answer names event {:?}, which is not in the batch: the whole batch failed",
                foreign::short(id)
            )));
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn record(stream: &str, sequence: &str, key: &str, data: &'static [u8]) -> Record {
        Record {
            stream: Arc::from(stream),
            shard_id: Arc::from("shardId-000000000001"),
            sequence_number: sequence.into(),
            partition_key: key.into(),
            data: Bytes::from_static(data),
            arrival_ms: Some(1_700_000_000_123),
            explicit_hash_key: None,
            sub_sequence_number: None,
        }
    }

    #[test]
    fn a_record_becomes_a_structured_event() {
        let event = structured_event(&record("orders", "42", "customer 7/é", b"\x00{\"total\":7}"));
        let expected = serde_json::json!({
            "specversion": "1.0",
            "type": "io.leasehold.kinesis.record",
            "id": "shardId-000000000001-42",
            "source": "kinesis:orders",
            "partitionkey": "customer 7/é",
            "shardid": "shardId-000000000001",
            "sequencenumber": "42",
            "time": "2023-11-14T22:13:20.123Z",
            "datacontenttype": "application/octet-stream",
            "data_base64": "AHsidG90YWwiOjd9",
        });
        assert_eq!(event, expected);
        let mut unknown_time = record("orders", "43", "k", b"");
        unknown_time.arrival_ms = None;
        assert!(structured_event(&unknown_time).get("time").is_none(), "no time when the arrival is unknown");
    }

    #[test]
    fn a_batch_is_a_json_array_in_batched_mode() {
        let endpoint = super::super::HttpProcessor::new("http://127.0.0.1:9/records", Duration::from_secs(1))
            .expect("processor")
            .endpoint;
        let records = [record("orders", "1", "a", b"x"), record("orders", "2", "b", b"y")];
        let request = request(&endpoint, &records).expect("request");
        assert_eq!(request.headers()[header::CONTENT_TYPE], BATCH_CONTENT_TYPE);
        assert_eq!(request.uri(), "http://127.0.0.1:9/records");
    }

    #[test]
    fn any_2xx_body_but_a_json_object_acknowledges_all() {
        let records = [record("orders", "1", "a", b"x"), record("orders", "2", "b", b"y")];
        for body in [&b""[..], b"OK", b"[]", b"{}", b"{\"failed\": null}"] {
            let outcomes = outcomes(body, &records);
            assert!(outcomes.iter().all(|o| o.as_ref().is_ok_and(Vec::is_empty)), "{body:?}: {outcomes:?}");
        }
    }

    #[test]
    fn failed_events_and_outputs_go_to_the_events_they_name() {
        let records =
            [record("orders", "1", "a", b"x"), record("orders", "2", "b", b"y"), record("orders", "3", "c", b"z")];
        let body = serde_json::json!({
            "failed": [
                {"id": "shardId-000000000001-2", "error": "busy"},
                {"id": "shardId-000000000001-3", "retryable": false, "error": "bad"},
            ],
            "outputs": [
                {"id": "shardId-000000000001-1", "data": "b25l", "carryPartitionKey": true},
                {"id": "shardId-000000000001-1", "data": "dHdv", "partitionKey": "mine"},
                {"id": "shardId-000000000001-2", "data": "ZHJvcHBlZA=="},
            ],
        });
        let outcomes = outcomes(body.to_string().as_bytes(), &records);
        let outputs = outcomes[0].as_ref().expect("the first is acknowledged");
        assert_eq!(outputs.len(), 2, "its outputs, in order");
        assert_eq!((&outputs[0].data[..], outputs[0].key(None).as_str()), (&b"one"[..], "a"), "carries its own key");
        assert_eq!((&outputs[1].data[..], outputs[1].key(None).as_str()), (&b"two"[..], "mine"));
        let busy = outcomes[1].as_ref().expect_err("the second failed");
        assert!(busy.retryable && busy.message.contains("busy"), "retryable by default: {busy:?}");
        let bad = outcomes[2].as_ref().expect_err("the third failed");
        assert!(!bad.retryable && bad.message.contains("bad"), "{bad:?}");
    }

    #[test]
    fn ids_repeated_across_streams_are_told_apart_by_source() {
        let records = [record("orders", "1", "a", b"x"), record("refunds", "1", "b", b"y")];
        let body = r#"{"failed": [{"id": "shardId-000000000001-1", "source": "kinesis:refunds"}]}"#;
        let outcomes = outcomes(body.as_bytes(), &records);
        assert!(outcomes[0].is_ok() && outcomes[1].is_err(), "{outcomes:?}");
        let without_source = super::outcomes(br#"{"failed": [{"id": "shardId-000000000001-1"}]}"#, &records);
        assert!(without_source.iter().all(Result::is_err), "no source: every event with the id");
    }

    #[test]
    fn a_cut_json_answer_fails_every_record_retryably() {
        let records = [record("orders", "1", "a", b"x"), record("orders", "2", "b", b"y")];
        let whole = r#"{"batchItemFailures": [{"itemIdentifier": "2"}]}"#;
        for cut in 1..whole.len() {
            let outcomes = outcomes(&whole.as_bytes()[..cut], &records);
            assert!(outcomes.iter().all(|o| o.as_ref().is_err_and(|e| e.retryable)), "{cut}: {outcomes:?}");
        }
        let outcomes = outcomes(whole.as_bytes(), &records);
        assert!(outcomes[0].is_ok() && outcomes[1].as_ref().is_err_and(|e| e.retryable), "{outcomes:?}");
    }

    #[test]
    fn names_from_the_answer_are_cut_in_errors() {
        let records = [record("orders", "1", "a", b"x")];
        let long = "9".repeat(100_000);
        for body in [
            serde_json::json!({"batchItemFailures": [{"itemIdentifier": long}]}),
            serde_json::json!({"failed": [{"id": long}]}),
            serde_json::json!({"failed": [{"id": "shardId-000000000001-1", "error": long}]}),
        ] {
            let outcomes = outcomes(body.to_string().as_bytes(), &records);
            let error = outcomes[0].as_ref().expect_err("failed");
            assert!(error.message.len() < 1000, "{}", error.message.len());
        }
    }

    #[test]
    fn an_unreadable_answer_fails_every_record_permanently() {
        let records = [record("orders", "1", "a", b"x"), record("orders", "2", "b", b"y")];
        for body in [
            r#"{"failed": [{"id": "shardId-000000000001-9"}]}"#,
            r#"{"failed": [{"retryable": true}]}"#,
            r#"{"failed": {"id": "shardId-000000000001-1"}}"#,
            r#"{"outputs": [{"id": "shardId-000000000001-1", "data": "not base64!"}]}"#,
        ] {
            let outcomes = outcomes(body.as_bytes(), &records);
            assert!(outcomes.iter().all(|o| o.as_ref().is_err_and(|e| !e.retryable)), "{body}: {outcomes:?}");
        }
    }
}
