//! Running one record to its end: processing attempts retried in place with backoff, then the
//! consumer's `retry.onExhausted` policy. Nothing is dropped without a metric and a log line.
//!
//! Dead letters go to every destination set (the bucket first, so the others can point at the whole
//! letter, then the stream, then the queue). Each destination is sent the whole letter when it is
//! within its limit, else the cut form (`letter.rs`); a refusal that can be retried (throttling, a
//! missing queue, the network) is retried with backoff while the record waits; a refusal that never
//! can (a validation error) is answered with the cut form, then with the smallest cut form (no data);
//! if even that is refused, that destination is given up for this record, counted in
//! `leasehold_dead_letters_undeliverable_total{destination}` and logged (error) with the record's
//! place, size and SHA-256, and the record goes on to the other destinations: a letter no retry can
//! deliver must not stall the shard until the stream's retention removes everything behind it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use leasehold_crds::filter::RecordFilter;
use leasehold_crds::{OnExhausted, ResolvedSpec};
use tokio_util::sync::CancellationToken;

use super::letter::Letters;
use super::requeue::{self, History, KeySource, Opened, RequeueKey};
use crate::backoff::{Backoff, Delays};
use crate::destination::{DeliveryError, Destination, KINESIS_MAX_RECORD_BYTES, Publisher, StreamDestination};
use crate::metrics::Metrics;
use crate::processor::{Outputs, ProcessError, Record, ShardProcessor};

/// What happens when processing a record fails (`spec.retry`).
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts before `on_exhausted` applies (at least 1).
    pub max_attempts: u32,
    /// First delay between attempts; doubles up to `max_backoff`.
    pub backoff: Duration,
    /// Longest delay between attempts.
    pub max_backoff: Duration,
    /// What happens after the last attempt.
    pub on_exhausted: OnExhausted,
    /// Where `deadLetter` sends records (and `requeue` once a copy was put back `max_requeues` times).
    pub dead_letter_stream: Option<String>,
    /// How many times one record may be put back at the tail; past that it goes to the dead-letter
    /// stream if one is set, else it is skipped (logged and counted).
    pub max_requeues: u32,
    /// A record failing when older than this (by its arrival time) is not retried (`retry.maxRecordAge`).
    pub max_record_age: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::from_spec(&ResolvedSpec::default(), None)
    }
}

impl RetryPolicy {
    /// The waits between attempts: from `first` doubling to `max_backoff`, without jitter (what
    /// `retry.backoff` documents, docs/worker.md).
    fn delays(&self, first: Duration) -> Delays {
        Backoff::new(first, self.max_backoff).delays()
    }

    /// The next of `delays` (which never ends).
    fn next(&self, delays: &mut Delays) -> Duration {
        delays.next().unwrap_or(self.max_backoff)
    }

    /// The policy of a resolved spec, dead letters going to `dead_letter_stream`.
    pub fn from_spec(spec: &ResolvedSpec, dead_letter_stream: Option<String>) -> Self {
        Self {
            max_attempts: spec.max_attempts.max(1),
            backoff: spec.durations.retry_backoff,
            max_backoff: Duration::from_secs(30),
            on_exhausted: spec.on_exhausted,
            dead_letter_stream,
            max_requeues: 3,
            max_record_age: spec.max_record_age,
        }
    }
}

/// How a record's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The processor succeeded.
    Processed,
    /// Attempts ran out; skipped (logged and counted).
    Skipped,
    /// Attempts ran out; a copy was put at the stream's tail.
    Requeued,
    /// Attempts ran out; sent to the dead-letter stream.
    DeadLettered,
    /// The record does not match the consumer's `filter`: not processed, counted, and done.
    Filtered,
    /// A graceful stop came while the record waited for a retry: it is not done and will be delivered
    /// again by the shard's next reader.
    Abandoned,
}

impl Outcome {
    /// True when the record counts as done for the checkpoint.
    pub fn is_done(self) -> bool {
        self != Outcome::Abandoned
    }
}

/// Runs records through a shard's processor under a retry policy; shared by every shard of a worker.
pub struct RecordRunner {
    policy: RetryPolicy,
    publisher: Option<Arc<dyn Publisher>>,
    output: Option<(String, Option<String>)>,
    metrics: Arc<Metrics>,
    owner: String,
    lease_table: Option<String>,
    stuck_after: Duration,
    filter: Option<RecordFilter>,
    destinations: Vec<Arc<dyn Destination>>,
    keys: RequeueKeys,
}

/// The consumer's requeue key: read from its source when first needed, then kept.
struct RequeueKeys {
    source: Option<Arc<dyn KeySource>>,
    key: tokio::sync::OnceCell<RequeueKey>,
}

/// How publishing one record ended.
enum Published {
    /// The stream took it.
    Taken,
    /// A graceful stop came first.
    Stopped,
    /// Refused for what it is: publishing it again can never succeed.
    Refused(String),
}

/// How sending one letter to one destination ended.
enum Sent {
    /// Taken, whole or cut.
    Taken { cut: bool },
    /// Even the smallest cut form was refused as invalid (counted and logged).
    Undeliverable,
    /// A graceful stop came first.
    Stopped,
}

impl std::fmt::Debug for RecordRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordRunner").field("policy", &self.policy).field("owner", &self.owner).finish()
    }
}

/// Keeps the in-flight gauge right even when a run is dropped (a lost lease).
struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.records_in_flight.dec();
    }
}

impl RecordRunner {
    /// A runner with the default policy (see `RetryPolicy::default`) and no publisher.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        let stuck_after = ResolvedSpec::default().durations.graceful_timeout;
        Self {
            policy: RetryPolicy::default(),
            publisher: None,
            output: None,
            metrics,
            owner: String::new(),
            lease_table: None,
            stuck_after,
            filter: None,
            destinations: Vec::new(),
            // Without a source (a runner of its own, in tests) the key is this runner's alone.
            keys: RequeueKeys { source: None, key: tokio::sync::OnceCell::new_with(Some(RequeueKey::random())) },
        }
    }

    /// Reads the consumer's requeue key from `source` (once, when a copy is first read or written),
    /// so that every worker of the consumer signs and verifies copies alike.
    pub fn with_requeue_keys(mut self, source: Arc<dyn KeySource>) -> Self {
        self.keys = RequeueKeys { source: Some(source), key: tokio::sync::OnceCell::new() };
        self
    }

    /// Uses `policy`.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Publishes requeued copies and dead letters with `publisher`.
    pub fn with_publisher(mut self, publisher: Arc<dyn Publisher>) -> Self {
        self.publisher = Some(publisher);
        self
    }

    /// Publishes processors' outputs to `stream`, with `fixed_key` as the consumer's key policy.
    pub fn with_output(mut self, stream: impl Into<String>, fixed_key: Option<String>) -> Self {
        self.output = Some((stream.into(), fixed_key));
        self
    }

    /// Names the worker in dead letters.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Names the consumer's lease table in dead letters (`leaseTable`): `leasehold redrive` returns
    /// only letters naming the table it is given.
    pub fn with_lease_table(mut self, table: impl Into<String>) -> Self {
        self.lease_table = Some(table.into());
        self
    }

    /// Reports a processing call that has not returned after `after` as stuck (see `stuck.rs`).
    pub fn with_stuck_after(mut self, after: Duration) -> Self {
        self.stuck_after = after;
        self
    }

    /// Processes only records matching `filter`; the others end `Outcome::Filtered` at once.
    pub fn with_filter(mut self, filter: RecordFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Sends dead letters to `destination` too (a bucket before the dead-letter stream, a queue after).
    pub fn with_destination(mut self, destination: Arc<dyn Destination>) -> Self {
        self.destinations.push(destination);
        self
    }

    /// The metrics it counts into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Processes `record` with `processor` until it succeeds or the policy disposes of it. A graceful
    /// `stop` interrupts only the waits between attempts (the attempt in progress finishes).
    pub async fn process(&self, processor: &dyn ShardProcessor, record: &Record, stop: &CancellationToken) -> Outcome {
        self.metrics.records_in_flight.inc();
        let _in_flight = InFlight(&self.metrics);
        let opened;
        let (record, history) = match self.open(record, stop).await {
            None => return Outcome::Abandoned,
            Some(Opened::Genuine(history, data)) => {
                opened = Record { data, ..record.clone() };
                (&opened, history)
            }
            Some(Opened::Plain | Opened::Forged) => (record, History::default()),
        };
        if let Some(filter) = &self.filter
            && !filter.matches(&record.partition_key, &record.data)
        {
            self.metrics.records_filtered.inc();
            tracing::trace!(shard = %record.shard_id, sequence = %record.sequence_number, "record filtered out");
            return Outcome::Filtered;
        }
        let mut attempt = 0u32;
        let mut delays = self.policy.delays(self.policy.backoff);
        loop {
            attempt = attempt.saturating_add(1);
            let mut outputs = Outputs::default();
            let call = processor.process(record, &mut outputs);
            let processed = match super::stuck::watch(call, record, self.stuck_after, &self.metrics).await {
                Ok(()) => self.publish_outputs(outputs, stop).await,
                Err(error) => Err(error),
            };
            let error = match processed {
                Ok(true) => {
                    self.metrics.records_processed.inc();
                    return Outcome::Processed;
                }
                // Stopped mid-way: the record is redelivered, its outputs published again.
                Ok(false) => return Outcome::Abandoned,
                Err(error) => error,
            };
            self.metrics.records_failed.inc();
            let too_old = self.too_old(record);
            if too_old && self.policy.on_exhausted != OnExhausted::Block {
                self.metrics.records_aged_out.inc();
                tracing::warn!(shard = %record.shard_id, sequence = %record.sequence_number, attempt,
                    max_record_age = ?self.policy.max_record_age, error = %error,
                    "record older than retry.maxRecordAge failed; not retried");
            }
            let exhausted = attempt >= self.policy.max_attempts || !error.retryable || too_old;
            if exhausted && self.policy.on_exhausted != OnExhausted::Block {
                let history =
                    History { requeues: history.requeues, attempts: history.attempts.saturating_add(attempt) };
                return self.dispose(record, history, &error, stop).await;
            }
            if exhausted && attempt == self.policy.max_attempts.max(1) {
                tracing::error!(shard = %record.shard_id, sequence = %record.sequence_number, attempt, error = %error,
                    "attempts exhausted; retrying until it succeeds (onExhausted: block), later records of its key wait");
            } else {
                tracing::warn!(shard = %record.shard_id, sequence = %record.sequence_number, attempt, error = %error,
                    "processing failed; retrying in place");
            }
            if !pause(self.policy.next(&mut delays), stop).await {
                return Outcome::Abandoned;
            }
            self.metrics.records_retried.inc();
        }
    }

    /// Reads `record` as a requeued copy or not; `None` if a graceful stop came while the key was
    /// being read. A header that does not verify is counted and logged, and the record is ordinary.
    async fn open(&self, record: &Record, stop: &CancellationToken) -> Option<Opened> {
        if !requeue::looks_like_copy(&record.data) {
            return Some(Opened::Plain);
        }
        let key = self.requeue_key(stop).await?;
        let opened = requeue::open(key, &record.partition_key, &record.data);
        if opened == Opened::Forged {
            self.metrics.requeue_headers_rejected.inc();
            tracing::warn!(shard = %record.shard_id, sequence = %record.sequence_number, bytes = record.data.len(),
                "a record opens with the requeue header but its proof does not check (written by a producer, or \
                 under another consumer's key): processed as an ordinary record, its bytes as they are");
        }
        Some(opened)
    }

    /// The consumer's requeue key, read from its source until it answers (the record waits, counted
    /// and logged); `None` if a graceful stop came first.
    async fn requeue_key(&self, stop: &CancellationToken) -> Option<&RequeueKey> {
        let mut delays =
            self.policy.delays(self.policy.backoff.clamp(Duration::from_millis(100), Duration::from_secs(1)));
        loop {
            let read = self
                .keys
                .key
                .get_or_try_init(|| async {
                    match &self.keys.source {
                        Some(source) => source.requeue_key().await,
                        None => Ok(RequeueKey::random()),
                    }
                })
                .await;
            let delay = match read {
                Ok(key) => return Some(key),
                Err(error) => {
                    let delay = self.policy.next(&mut delays);
                    self.metrics.lease_table_failures.inc();
                    tracing::warn!(error = %error, ?delay, "cannot read the consumer's requeue key; retrying, the record waits");
                    delay
                }
            };
            if !pause(delay, stop).await {
                return None;
            }
        }
    }

    /// True when `record` arrived longer than `retry.maxRecordAge` ago (never when either is unknown).
    fn too_old(&self, record: &Record) -> bool {
        let (Some(limit), Some(arrival)) = (self.policy.max_record_age, record.arrival_ms) else { return false };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let limit = i64::try_from(limit.as_millis()).unwrap_or(i64::MAX);
        now.saturating_sub(arrival) > limit
    }

    /// Publishes a processed record's outputs to `output.stream`, in order: true once all are out (or
    /// there are none), false if a graceful stop came first, an error if there is no output stream.
    async fn publish_outputs(&self, outputs: Outputs, stop: &CancellationToken) -> Result<bool, ProcessError> {
        if outputs.is_empty() {
            return Ok(true);
        }
        let Some((stream, fixed)) = &self.output else {
            return Err(ProcessError::permanent("the processor emitted outputs but spec.output names no stream"));
        };
        for output in outputs.into_vec() {
            let key = output.key(fixed.as_deref());
            match self.publish(stream, &key, output.data, stop).await {
                Published::Taken => {}
                Published::Stopped => return Ok(false),
                // An output the stream can never take (too large, a bad key) fails the record, whose
                // policy then applies, rather than being retried for ever.
                Published::Refused(e) => {
                    return Err(ProcessError::permanent(format!("output stream {stream} refused an output: {e}")));
                }
            }
        }
        Ok(true)
    }

    /// Applies the policy to a record whose attempts ran out.
    async fn dispose(
        &self,
        record: &Record,
        history: History,
        error: &ProcessError,
        stop: &CancellationToken,
    ) -> Outcome {
        let (fallback, name) = match self.policy.dead_letter_stream.is_some() || !self.destinations.is_empty() {
            true => (OnExhausted::DeadLetter, "deadLetter"),
            false => (OnExhausted::Skip, "skip"),
        };
        let mut policy = match self.policy.on_exhausted {
            OnExhausted::Requeue if history.requeues >= self.policy.max_requeues => {
                tracing::error!(shard = %record.shard_id, sequence = %record.sequence_number,
                    requeues = history.requeues, fallback = name, "requeue limit reached");
                fallback
            }
            OnExhausted::DeadLetter if fallback == OnExhausted::Skip => {
                tracing::error!(shard = %record.shard_id, sequence = %record.sequence_number,
                    "onExhausted deadLetter names no destination; skipping the record");
                OnExhausted::Skip
            }
            policy => policy,
        };
        if policy == OnExhausted::Requeue {
            match self.requeue(record, history, error, stop).await {
                Ok(outcome) => return outcome,
                Err(reason) => {
                    tracing::error!(shard = %record.shard_id, sequence = %record.sequence_number,
                        bytes = record.data.len(), fallback = name, reason = %reason,
                        "the stream can never take a copy of the record; not requeued");
                    policy = fallback;
                }
            }
        }
        match policy {
            OnExhausted::DeadLetter => self.dead_letter(record, history, error, stop).await,
            _ => self.skip(record, history, &error.message),
        }
    }

    /// Counts and logs a record skipped after its attempts ran out.
    fn skip(&self, record: &Record, history: History, error: &str) -> Outcome {
        self.metrics.exhausted("skip");
        tracing::error!(shard = %record.shard_id, sequence = %record.sequence_number,
            partition_key = %super::letter::cut_str(&record.partition_key, 256), attempts = history.attempts,
            error = %super::letter::cut_str(error, 4096), "record skipped after its attempts ran out");
        Outcome::Skipped
    }

    /// Puts a copy of `record` at its stream's tail; an error when the stream can never take it (too
    /// large with its header, refused as invalid).
    async fn requeue(
        &self,
        record: &Record,
        history: History,
        error: &ProcessError,
        stop: &CancellationToken,
    ) -> Result<Outcome, String> {
        let copy = History { requeues: history.requeues.saturating_add(1), attempts: history.attempts };
        let Some(key) = self.requeue_key(stop).await else { return Ok(Outcome::Abandoned) };
        let data = requeue::wrap(key, &record.partition_key, &record.data, copy);
        let size = data.len() + record.partition_key.len();
        if size > KINESIS_MAX_RECORD_BYTES {
            return Err(format!("the copy takes {size} bytes with its key, over Kinesis's {KINESIS_MAX_RECORD_BYTES}"));
        }
        match self.publish(&record.stream, &record.partition_key, data, stop).await {
            Published::Taken => {}
            Published::Stopped => return Ok(Outcome::Abandoned),
            Published::Refused(e) => return Err(e),
        }
        self.metrics.exhausted("requeue");
        tracing::warn!(shard = %record.shard_id, sequence = %record.sequence_number,
            partition_key = %record.partition_key, attempts = history.attempts, requeues = copy.requeues,
            error = %error, "record requeued at the stream's tail");
        Ok(Outcome::Requeued)
    }

    /// Sends `record`'s dead letter to every destination: the bucket first (its object is then where
    /// the others' cut letters point), then the stream, then the queue.
    async fn dead_letter(
        &self,
        record: &Record,
        history: History,
        error: &ProcessError,
        stop: &CancellationToken,
    ) -> Outcome {
        let letters =
            Letters::new(record, history, &error.message, &self.owner).of_consumer(self.lease_table.as_deref());
        let stream = self.policy.dead_letter_stream.as_ref().map(|stream| {
            let publisher = self.publisher.clone().unwrap_or_else(|| Arc::new(NoPublisher));
            StreamDestination::new(publisher, stream.clone())
        });
        let keeping = |d: &&Arc<dyn Destination>| d.location(record).is_some();
        let mut ordered: Vec<&dyn Destination> =
            self.destinations.iter().filter(keeping).map(|d| d.as_ref() as &dyn Destination).collect();
        if let Some(stream) = &stream {
            ordered.push(stream);
        }
        ordered.extend(self.destinations.iter().filter(|d| !keeping(d)).map(|d| d.as_ref() as &dyn Destination));
        let mut whole_at: Option<String> = None;
        let mut taken = 0usize;
        for destination in ordered {
            match self.send_letter(destination, record, &letters, whole_at.as_deref(), stop).await {
                Sent::Taken { cut } => {
                    taken += 1;
                    if !cut && whole_at.is_none() {
                        whole_at = destination.location(record);
                    }
                }
                Sent::Undeliverable => {}
                Sent::Stopped => return Outcome::Abandoned,
            }
        }
        if taken == 0 {
            // Every destination refused even the smallest letter: counted per destination, logged
            // above, and the record is skipped (counted and logged as such).
            return self.skip(record, history, &error.message);
        }
        self.metrics.exhausted("deadLetter");
        tracing::warn!(shard = %record.shard_id, sequence = %record.sequence_number,
            partition_key = %super::letter::cut_str(&record.partition_key, 256), attempts = history.attempts,
            dead_letter_stream = self.policy.dead_letter_stream.as_deref().unwrap_or_default(),
            destinations = self.destinations.len(), error = %super::letter::cut_str(&error.message, 4096),
            "record sent to the dead-letter stream");
        Outcome::DeadLettered
    }

    /// Sends `record`'s letter to `destination` until it is taken: whole when within its limit, else
    /// cut to the limit; a refusal as invalid is answered with the cut form, then the smallest one; a
    /// refusal that can be retried is retried with backoff (the record's shard waits, counted and
    /// logged). `whole_at` names where the whole letter is kept, for a cut one to point at.
    async fn send_letter(
        &self,
        destination: &dyn Destination,
        record: &Record,
        letters: &Letters<'_>,
        whole_at: Option<&str>,
        stop: &CancellationToken,
    ) -> Sent {
        #[derive(Clone, Copy, PartialEq)]
        enum Form {
            Whole,
            Cut(usize),
            Smallest,
        }
        let kind = destination.kind();
        let limit = destination.max_letter_bytes(record).await;
        let (mut form, mut reason) = match limit {
            Some(max) if letters.whole().len() > max => (Form::Cut(max), "too_large"),
            _ => (Form::Whole, "refused"),
        };
        let mut delays = self.policy.delays(self.policy.backoff.min(Duration::from_secs(1)));
        loop {
            let letter = match form {
                Form::Whole => letters.whole().clone(),
                Form::Cut(max) => letters.cut(max, whole_at),
                Form::Smallest => letters.cut(0, whole_at),
            };
            let refusal = match destination.send(record, &letter).await {
                Ok(()) => {
                    if form != Form::Whole {
                        self.metrics.dead_letter_cut(kind, reason);
                        tracing::warn!(destination = kind, target = %destination.target(), shard = %record.shard_id,
                            sequence = %record.sequence_number, sub_sequence = ?record.sub_sequence_number,
                            bytes = record.data.len(), letter_bytes = letters.whole().len(), sent_bytes = letter.len(),
                            data_sha256 = letters.data_sha256(), whole_at = whole_at.unwrap_or_default(), reason,
                            "dead letter cut to a form its destination takes");
                    }
                    return Sent::Taken { cut: form != Form::Whole };
                }
                Err(refusal) => refusal,
            };
            let delay = match refusal {
                DeliveryError::Invalid(e) => {
                    let next = match (form, limit) {
                        (Form::Whole, Some(max)) => Some(Form::Cut(max.min(letters.whole().len().saturating_sub(1)))),
                        (Form::Whole, None) | (Form::Cut(_), _) => Some(Form::Smallest),
                        (Form::Smallest, _) => None,
                    };
                    let Some(next) = next else {
                        self.metrics.dead_letter_undeliverable(kind);
                        tracing::error!(destination = kind, target = %destination.target(), shard = %record.shard_id,
                            sequence = %record.sequence_number, sub_sequence = ?record.sub_sequence_number,
                            bytes = record.data.len(), data_sha256 = letters.data_sha256(), error = %e,
                            "the destination refuses even the smallest dead letter of the record; given up for it");
                        return Sent::Undeliverable;
                    };
                    tracing::warn!(destination = kind, target = %destination.target(), shard = %record.shard_id,
                        sequence = %record.sequence_number, letter_bytes = letter.len(), error = %e,
                        "the destination refuses the dead letter as invalid; sending it cut");
                    (form, reason) = (next, "refused");
                    continue;
                }
                DeliveryError::Unavailable(e) => {
                    let delay = self.policy.next(&mut delays);
                    self.metrics.dead_letter_failed(kind);
                    tracing::error!(destination = kind, target = %destination.target(),
                        shard = %record.shard_id, sequence = %record.sequence_number, error = %e, ?delay,
                        "cannot send the dead letter to its destination; retrying, the record waits");
                    delay
                }
            };
            if !pause(delay, stop).await {
                return Sent::Stopped;
            }
        }
    }

    /// Publishes until the stream takes it (never dropping a record or an output) or refuses it as
    /// invalid (publishing it again could never succeed).
    async fn publish(&self, stream: &str, partition_key: &str, data: Bytes, stop: &CancellationToken) -> Published {
        let mut delays = self.policy.delays(self.policy.backoff.min(Duration::from_secs(1)));
        loop {
            let result = match &self.publisher {
                Some(publisher) => publisher.publish(stream, partition_key, data.clone()).await,
                None => NoPublisher.publish(stream, partition_key, data.clone()).await,
            };
            let delay = match result {
                Ok(()) => return Published::Taken,
                Err(DeliveryError::Invalid(e)) => return Published::Refused(e),
                Err(DeliveryError::Unavailable(e)) => {
                    let delay = self.policy.next(&mut delays);
                    tracing::warn!(stream, error = %e, ?delay, "cannot publish to the stream; retrying");
                    delay
                }
            };
            if !pause(delay, stop).await {
                return Published::Stopped;
            }
        }
    }
}

/// The publisher of a runner given none: refuses, retryably (a configuration waiting to be fixed).
struct NoPublisher;

#[async_trait]
impl Publisher for NoPublisher {
    async fn publish(&self, _stream: &str, _partition_key: &str, _data: Bytes) -> Result<(), DeliveryError> {
        Err(DeliveryError::Unavailable("no publisher configured".into()))
    }
}

/// Sleeps `delay`; false if `stop` came first.
async fn pause(delay: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

#[cfg(test)]
mod tests;
