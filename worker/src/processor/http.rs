//! The `http` processor: each record is POSTed to a URL (usually a sidecar in the same pod) as a
//! CloudEvent in HTTP binary mode: the raw data as the body, the metadata in `ce-` headers.
//!
//! | header | value |
//! |---|---|
//! | `ce-specversion` | `1.0` |
//! | `ce-id` | `<shardId>-<sequenceNumber>` (unique within the stream) |
//! | `ce-source` | `kinesis:<stream>` |
//! | `ce-type` | `io.leasehold.kinesis.record` |
//! | `ce-time` | the record's arrival time (RFC 3339), when known |
//! | `ce-partitionkey` | the partition key (CloudEvents partitioning extension) |
//! | `ce-shardid`, `ce-sequencenumber` | the shard and sequence number |
//! | `content-type` | `application/octet-stream` |
//!
//! Values outside printable ASCII (and space, `"`, `%`) are percent-encoded, as the CloudEvents HTTP
//! binding requires. Answers: 2xx acknowledges the record. 5xx, 408, 429, timeouts and connection
//! errors are retryable failures (retried in place with backoff). Any other 4xx means the receiver
//! rejects this record: it is not retried and `retry.onExhausted` applies at once (with `block`, the
//! default, it is still retried, so nothing is lost to a misconfigured URL). 1xx and 3xx (redirects are
//! not followed) are retryable failures.
//!
//! # Batches
//!
//! With `batch.maxRecords` above 1 ([`HttpProcessor::with_batching`]), records being processed at the
//! same time (up to `concurrency` per shard, over all the worker's shards) are sent together: each
//! `process` call queues its record and waits; a batch is POSTed once `maxRecords` records are queued,
//! or `maxDelay` after its first record was queued. The body is CloudEvents HTTP *batched* mode
//! (`content-type: application/cloudevents-batch+json`): a JSON array of structured-mode events with
//! the attributes above (`specversion`, `id`, `source`, `type`, `time`, `partitionkey`, `shardid`,
//! `sequencenumber`, `datacontenttype: application/octet-stream`) and the raw data in `data_base64`.
//!
//! Batches only fill when records are in flight together: with `ordering: shard` a shard has one record
//! in flight, so a batch gathers at most one record per shard; `ordering: key` or `none` with
//! `concurrency` > 1 fills them faster. A batch that cannot fill waits `maxDelay`.
//!
//! The answer applies to every record of the batch: 5xx, 408, 429, timeouts and connection errors fail
//! them all (retryable), another 4xx rejects them all (permanent), as above. A 2xx acknowledges every
//! record, except those its JSON body names as failed:
//!
//! ```json
//! {"failed":  [{"id": "<ce id>", "retryable": true, "error": "why"}],
//!  "outputs": [{"id": "<ce id>", "data": "<base64>", "partitionKey": "k", "carryPartitionKey": true}]}
//! ```
//!
//! Both lists are optional; so are `retryable` (default true), `error`, `partitionKey` and
//! `carryPartitionKey`. An entry may add `source` where ids repeat across streams; without it, it names
//! every event of the batch with that id. Outputs belong to the event they name (and carry its
//! partition key), in the order given; a failed event's outputs are dropped (it is retried and answers
//! again). A JSON answer naming things wrongly (an entry naming no event of the batch or no `id`, an
//! output without base64 `data`, a list member that is not a list) fails every record of the batch
//! permanently.
//!
//! Lambda's partial batch response, `{"batchItemFailures": [{"itemIdentifier": "<sequenceNumber>"}]}`,
//! is read as well, with Lambda's rules: an empty or null list (or an empty or null answer) is complete
//! success; the records with that sequence number (or CloudEvent id) failed, retryable; an entry with
//! an empty, null, non-string or misspelt `itemIdentifier`, or naming no record of the batch, fails the
//! whole batch, retryable.
//!
//! # What an answer is (both modes)
//!
//! - An answer is read whole, up to [`MAX_ANSWER_BYTES`] (6 MiB, Lambda's payload limit), within the
//!   timeout. An answer that breaks off (the connection reset or closed before its `Content-Length`
//!   or last chunk) or is longer than the limit is no answer: the whole call fails, retryably, and
//!   `http answer unreadable; the call failed` is logged with the URL and why. In a batch this blames
//!   the batch as a timeout does (`bisect` splits it).
//! - A 2xx body that is empty or plain text (its first non-blank byte is not `{` or `[`) acknowledges
//!   the record, or every record of the batch, with no outputs; so does JSON that is not an object.
//! - A 2xx body starting with `{` or `[` must parse as JSON: one that does not (cut, or malformed)
//!   fails the whole call, retryably. A body without `Content-Length` or chunks, ended by closing the
//!   connection, cannot be told from a cut one; a cut JSON one still fails by this rule.
//! - Text from the answer that reaches a log or an error (a non-2xx body, a name, an `error`) is cut
//!   to a few hundred characters.
//!
//! With [`HttpBatching::bisect`], a batch failing whole (a non-2xx answer or no answer in time, not a
//! transport error) is sent again as two halves, recursively, so a record fails only alone.

mod answer;
mod batch;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{Output, Outputs, ProcessError, Record, ShardProcessor, foreign};
pub use answer::{Answer, AnswerError, AnswerOutput, Failed, MAX_ANSWER_BYTES, parse_answer};
use batch::Batcher;
/// The answer readers of both modes, for the fuzz targets (`internals::parse`).
pub(crate) use batch::outcomes as batch_outcomes;
pub use batch::{BATCH_CONTENT_TYPE, HttpBatching};

/// The `ce-type` of every record.
pub const EVENT_TYPE: &str = "io.leasehold.kinesis.record";

/// Why an http processor could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpProcessorError {
    /// The URL does not parse.
    #[error("processor.http.url: {0}")]
    BadUrl(String),
    /// Only plain HTTP is spoken (to a sidecar or a service in the cluster).
    #[error("processor.http.url: only http:// URLs are supported, got {0}")]
    UnsupportedScheme(String),
}

/// POSTs each record to a URL, CloudEvents binary mode; or batches of records, CloudEvents batched mode
/// (see [`with_batching`](Self::with_batching)).
#[derive(Debug, Clone)]
pub struct HttpProcessor {
    endpoint: Endpoint,
    batcher: Option<Arc<Batcher>>,
}

/// Where requests go and how long an exchange may take; shared by the per-record and batched paths.
#[derive(Debug, Clone)]
struct Endpoint {
    client: Client<HttpConnector, Full<Bytes>>,
    url: Uri,
    timeout: Duration,
}

impl Endpoint {
    /// Sends `request` and reads the whole answer, within the timeout. Transport failures, the
    /// timeout and an answer that cannot be read whole are retryable errors.
    async fn exchange(&self, request: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), ProcessError> {
        self.try_exchange(request).await.map_err(|failed| match failed {
            Unanswered::Transport(error) | Unanswered::TimedOut(error) | Unanswered::Unreadable(error) => error,
        })
    }

    /// [`exchange`](Self::exchange), telling a request that got no answer in time (the receiver may
    /// have choked on it) or an unreadable one from one that never reached the receiver.
    async fn try_exchange(&self, request: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), Unanswered> {
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| Unanswered::Transport(ProcessError::retryable(format!("{e:?}"))))?;
            let status = response.status();
            let declared = response.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
            if let Some(length) = declared.filter(|length: &u64| *length > MAX_ANSWER_BYTES as u64) {
                return Err(self.unreadable(status, &format!("it declares {length} bytes")));
            }
            // Read to its end (which lets the connection be reused), up to the limit. A body that
            // breaks off (reset, closed before its Content-Length or last chunk) is no answer at all:
            // taking it as empty would acknowledge what the receiver may have failed.
            let body =
                Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect().await.map_err(|error| {
                    match error.downcast_ref::<LengthLimitError>() {
                        Some(_) => self.unreadable(status, "it is longer than that"),
                        None => self.unreadable(status, &format!("it broke off: {}", error_chain(error.as_ref()))),
                    }
                })?;
            Ok((status, body.to_bytes()))
        };
        tokio::time::timeout(self.timeout, exchange).await.map_err(|_| {
            Unanswered::TimedOut(ProcessError::retryable(format!("no answer within {:?}", self.timeout)))
        })?
    }

    /// The failure of a call whose answer (with `status`) could not be read whole, logged once here
    /// (the dispatcher logs and counts each record's failed attempt).
    fn unreadable(&self, status: StatusCode, why: &str) -> Unanswered {
        let message = format!(
            "{} answered {status} but the answer could not be read within {MAX_ANSWER_BYTES} bytes ({why}): \
             the call failed",
            self.url
        );
        tracing::warn!(url = %self.url, %status, why, "http answer unreadable; the call failed");
        Unanswered::Unreadable(ProcessError::retryable(message))
    }

    /// The error for a non-2xx answer: permanent for the 4xx that reject the request, else retryable.
    fn failure(&self, status: StatusCode, body: &[u8]) -> ProcessError {
        let message = format!("{} answered {status}: {}", self.url, foreign::excerpt(body, 200));
        if rejects_record(status) { ProcessError::permanent(message) } else { ProcessError::retryable(message) }
    }
}

/// An error and its sources, `: `-separated (hyper's own message is only the outermost).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    foreign::short(&text)
}

/// Why an exchange brought no answer.
#[derive(Debug)]
enum Unanswered {
    /// The request did not reach the receiver (connection refused or reset before an answer began).
    Transport(ProcessError),
    /// No answer within the timeout.
    TimedOut(ProcessError),
    /// An answer began but could not be read whole: it broke off, or was longer than
    /// [`MAX_ANSWER_BYTES`]. The receiver got the request, so (like a timeout) it may be to blame.
    Unreadable(ProcessError),
}

impl HttpProcessor {
    /// A processor POSTing to `url`, each exchange bounded by `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, HttpProcessorError> {
        let url: Uri = url.parse().map_err(|e: http::uri::InvalidUri| HttpProcessorError::BadUrl(e.to_string()))?;
        if url.scheme_str() != Some("http") {
            return Err(HttpProcessorError::UnsupportedScheme(url.to_string()));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self { endpoint: Endpoint { client, url, timeout }, batcher: None })
    }

    /// The same processor sending records in batches; `max_records` of 1 (or 0) keeps one record per
    /// request. Each batch is one exchange bounded by the timeout.
    pub fn with_batching(mut self, batching: HttpBatching) -> Self {
        self.batcher = (batching.max_records > 1).then(|| Arc::new(Batcher::new(batching, self.endpoint.clone())));
        self
    }

    /// The request for `record` (binary mode, one record).
    pub fn request(&self, record: &Record) -> Result<Request<Full<Bytes>>, ProcessError> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.url.clone())
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .header("ce-specversion", "1.0")
            .header("ce-type", EVENT_TYPE);
        for (name, value) in attributes(record) {
            request = request.header(HeaderName::from_static(name), ce_value(&value)?);
        }
        if let Some(time) = event_time(record) {
            request = request.header("ce-time", time);
        }
        request.body(Full::new(record.data.clone())).map_err(|e| ProcessError::permanent(format!("request: {e}")))
    }
}

/// The CloudEvents id of `record`, unique within its stream: `<shardId>-<sequenceNumber>`, and
/// `-<subSequenceNumber>` after it for a user record of a KPL aggregate (they share the sequence number).
fn event_id(record: &Record) -> String {
    match record.sub_sequence_number {
        Some(sub) => format!("{}-{}-{sub}", record.shard_id, record.sequence_number),
        None => format!("{}-{}", record.shard_id, record.sequence_number),
    }
}

/// The CloudEvents source of `record`: `kinesis:<stream>`.
fn event_source(record: &Record) -> String {
    format!("kinesis:{}", record.stream)
}

/// The attributes that vary per record, as binary-mode header names; structured mode (batches) uses
/// the same names without `ce-`, so both modes carry the same metadata. `ce-subsequencenumber` only
/// for a user record of a KPL aggregate.
fn attributes(record: &Record) -> Vec<(&'static str, String)> {
    let mut attributes = vec![
        ("ce-id", event_id(record)),
        ("ce-source", event_source(record)),
        ("ce-partitionkey", record.partition_key.clone()),
        ("ce-shardid", record.shard_id.to_string()),
        ("ce-sequencenumber", record.sequence_number.clone()),
    ];
    if let Some(sub) = record.sub_sequence_number {
        attributes.push(("ce-subsequencenumber", sub.to_string()));
    }
    attributes
}

/// The arrival time at Kinesis (RFC 3339, milliseconds), when known.
fn event_time(record: &Record) -> Option<String> {
    let ms = record.arrival_ms.and_then(|ms| u64::try_from(ms).ok())?;
    let time = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    Some(humantime::format_rfc3339_millis(time).to_string())
}

/// A header value percent-encoded per the CloudEvents HTTP binding.
fn ce_value(value: &str) -> Result<HeaderValue, ProcessError> {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if (0x21..=0x7e).contains(&byte) && byte != b'"' && byte != b'%' {
            out.push(char::from(byte));
        } else {
            // Writing into a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
    HeaderValue::from_str(&out).map_err(|e| ProcessError::permanent(format!("header value: {e}")))
}

/// Outputs in a 2xx answer: a JSON body `{"outputs": [{"data": "<base64>", "partitionKey": "k",
/// "carryPartitionKey": true}]}` (both keys optional). An empty or plain-text body emits nothing; a
/// body starting like JSON must parse (see [`parse_answer`]).
pub(crate) fn parse_outputs(body: &[u8], record: &Record) -> Result<Vec<Output>, ProcessError> {
    let answer = parse_answer(body).map_err(|e| e.into_process_error("the call"))?;
    Ok(answer.outputs.iter().map(|item| to_output(item, record)).collect())
}

/// One entry of an answer's `outputs`, emitted while processing `record`.
fn to_output(item: &AnswerOutput, record: &Record) -> Output {
    let mut output = Output::new(item.data.clone());
    if let Some(key) = &item.partition_key {
        output = output.with_key(key);
    }
    if item.carry_partition_key {
        output = output.carrying_key_of(record);
    }
    output
}

/// True for the 4xx answers that mean "this record is refused" rather than "try later".
fn rejects_record(status: StatusCode) -> bool {
    status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT && status != StatusCode::TOO_MANY_REQUESTS
}

#[async_trait]
impl ShardProcessor for HttpProcessor {
    async fn process(&self, record: &Record, outputs: &mut Outputs) -> Result<(), ProcessError> {
        let emitted = match &self.batcher {
            Some(batcher) => batcher.process(record).await?,
            None => {
                let (status, body) = self.endpoint.exchange(self.request(record)?).await?;
                if !status.is_success() {
                    return Err(self.endpoint.failure(status, &body));
                }
                parse_outputs(&body, record)?
            }
        };
        for output in emitted {
            outputs.emit(output);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_records_carry_their_sub_sequence_in_both_modes() {
        let mut record = Record {
            stream: std::sync::Arc::from("orders"),
            shard_id: std::sync::Arc::from("shardId-000000000001"),
            sequence_number: "4959".into(),
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: Bytes::from_static(b"x"),
            arrival_ms: None,
            sub_sequence_number: None,
        };
        let processor = HttpProcessor::new("http://127.0.0.1:1/", Duration::from_secs(1)).unwrap();
        let plain = processor.request(&record).unwrap();
        assert!(plain.headers().get("ce-subsequencenumber").is_none());
        assert_eq!(plain.headers()["ce-id"], "shardId-000000000001-4959");
        record.sub_sequence_number = Some(3);
        let user = processor.request(&record).unwrap();
        assert_eq!(user.headers()["ce-subsequencenumber"], "3");
        assert_eq!(user.headers()["ce-id"], "shardId-000000000001-4959-3", "ids stay unique per user record");
        let event = batch::structured_event_for_tests(&record);
        assert_eq!(
            (event["subsequencenumber"].as_str(), event["id"].as_str()),
            (Some("3"), Some("shardId-000000000001-4959-3"))
        );
    }

    #[test]
    fn header_values_are_percent_encoded() {
        assert_eq!(ce_value("customer-7").unwrap(), "customer-7");
        assert_eq!(ce_value("a b\"c%d").unwrap(), "a%20b%22c%25d");
        assert_eq!(ce_value("é").unwrap(), "%C3%A9");
    }

    #[test]
    fn only_plain_http_urls() {
        assert!(HttpProcessor::new("http://127.0.0.1:8080/records", Duration::from_secs(1)).is_ok());
        assert!(matches!(
            HttpProcessor::new("https://example.invalid/", Duration::from_secs(1)),
            Err(HttpProcessorError::UnsupportedScheme(_))
        ));
        assert!(matches!(HttpProcessor::new("not a url", Duration::from_secs(1)), Err(HttpProcessorError::BadUrl(_))));
    }

    #[test]
    fn which_answers_reject_the_record() {
        assert!(rejects_record(StatusCode::BAD_REQUEST));
        assert!(rejects_record(StatusCode::UNPROCESSABLE_ENTITY));
        assert!(!rejects_record(StatusCode::TOO_MANY_REQUESTS));
        assert!(!rejects_record(StatusCode::REQUEST_TIMEOUT));
        assert!(!rejects_record(StatusCode::SERVICE_UNAVAILABLE));
    }
}
