//! Running one record to its end: processing attempts retried in place with backoff, then the
//! consumer's `retry.onExhausted` policy. Nothing is dropped without a metric and a log line.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use leasehold_crds::filter::RecordFilter;
use leasehold_crds::{OnExhausted, ResolvedSpec};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::requeue::{self, History};
use crate::destination::Destination;
use crate::metrics::Metrics;
use crate::processor::{Outputs, ProcessError, Record, RecordJson, ShardProcessor};

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

/// Writes records to a stream (requeued copies, dead letters).
#[async_trait]
pub trait Publisher: Send + Sync {
    /// Puts one record on `stream`.
    async fn publish(&self, stream: &str, partition_key: &str, data: Bytes) -> Result<(), String>;
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

/// The document written to the dead-letter stream (JSON), keyed by the record's partition key: the
/// record's fields as the stdout processor prints them, and why it is here.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeadLetter<'a> {
    #[serde(flatten)]
    record: RecordJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arrival_ms: Option<i64>,
    attempts: u32,
    requeues: u32,
    error: &'a str,
    owner: &'a str,
}

/// Runs records through a shard's processor under a retry policy; shared by every shard of a worker.
pub struct Runner {
    policy: RetryPolicy,
    publisher: Option<Arc<dyn Publisher>>,
    output: Option<(String, Option<String>)>,
    metrics: Arc<Metrics>,
    owner: String,
    stuck_after: Duration,
    filter: Option<RecordFilter>,
    destinations: Vec<Arc<dyn Destination>>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").field("policy", &self.policy).field("owner", &self.owner).finish()
    }
}

/// Keeps the in-flight gauge right even when a run is dropped (a lost lease).
struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.records_in_flight.dec();
    }
}

impl Runner {
    /// A runner with the default policy (see `RetryPolicy::default`) and no publisher.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        let stuck_after = ResolvedSpec::default().durations.graceful_timeout;
        Self {
            policy: RetryPolicy::default(),
            publisher: None,
            output: None,
            metrics,
            owner: String::new(),
            stuck_after,
            filter: None,
            destinations: Vec::new(),
        }
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

    /// Sends dead letters to `destination` too (after the dead-letter stream, if one is set).
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
    pub async fn run(&self, processor: &dyn ShardProcessor, record: &Record, stop: &CancellationToken) -> Outcome {
        self.metrics.records_in_flight.inc();
        let _in_flight = InFlight(&self.metrics);
        let opened;
        let (record, history) = match requeue::open(&record.data) {
            Some((history, data)) => {
                opened = Record { data, ..record.clone() };
                (&opened, history)
            }
            None => (record, History::default()),
        };
        if let Some(filter) = &self.filter
            && !filter.matches(&record.partition_key, &record.data)
        {
            self.metrics.records_filtered.inc();
            tracing::trace!(shard = %record.shard_id, sequence = %record.sequence_number, "record filtered out");
            return Outcome::Filtered;
        }
        let mut attempt = 0u32;
        let mut delay = self.policy.backoff;
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
            if !pause(delay, stop).await {
                return Outcome::Abandoned;
            }
            delay = delay.saturating_mul(2).min(self.policy.max_backoff);
            self.metrics.records_retried.inc();
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
            if !self.publish(stream, &key, output.data, stop).await {
                return Ok(false);
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
        let policy = match self.policy.on_exhausted {
            OnExhausted::Requeue if history.requeues >= self.policy.max_requeues => {
                let (fallback, name) = match self.policy.dead_letter_stream.is_some() || !self.destinations.is_empty() {
                    true => (OnExhausted::DeadLetter, "deadLetter"),
                    false => (OnExhausted::Skip, "skip"),
                };
                tracing::error!(shard = %record.shard_id, sequence = %record.sequence_number,
                    requeues = history.requeues, fallback = name, "requeue limit reached");
                fallback
            }
            OnExhausted::DeadLetter if self.policy.dead_letter_stream.is_none() && self.destinations.is_empty() => {
                tracing::error!(shard = %record.shard_id, sequence = %record.sequence_number,
                    "onExhausted deadLetter names no destination; skipping the record");
                OnExhausted::Skip
            }
            policy => policy,
        };
        match policy {
            OnExhausted::Block | OnExhausted::Skip => {
                self.metrics.exhausted("skip");
                tracing::error!(shard = %record.shard_id, sequence = %record.sequence_number,
                    partition_key = %record.partition_key, attempts = history.attempts, error = %error,
                    "record skipped after its attempts ran out");
                Outcome::Skipped
            }
            OnExhausted::Requeue => {
                let copy = History { requeues: history.requeues.saturating_add(1), attempts: history.attempts };
                let data = requeue::wrap(&record.data, copy);
                if !self.publish(&record.stream, &record.partition_key, data, stop).await {
                    return Outcome::Abandoned;
                }
                self.metrics.exhausted("requeue");
                tracing::warn!(shard = %record.shard_id, sequence = %record.sequence_number,
                    partition_key = %record.partition_key, attempts = history.attempts, requeues = copy.requeues,
                    error = %error, "record requeued at the stream's tail");
                Outcome::Requeued
            }
            OnExhausted::DeadLetter => {
                let letter = DeadLetter {
                    record: RecordJson::from(record),
                    arrival_ms: record.arrival_ms,
                    attempts: history.attempts,
                    requeues: history.requeues,
                    error: &error.message,
                    owner: &self.owner,
                };
                let data = match serde_json::to_vec(&letter) {
                    Ok(data) => Bytes::from(data),
                    Err(e) => Bytes::from(format!("{{\"error\":\"cannot encode dead letter: {e}\"}}")),
                };
                if let Some(stream) = &self.policy.dead_letter_stream
                    && !self.publish(stream, &record.partition_key, data.clone(), stop).await
                {
                    return Outcome::Abandoned;
                }
                for destination in &self.destinations {
                    if !self.deliver(destination.as_ref(), record, &data, stop).await {
                        return Outcome::Abandoned;
                    }
                }
                self.metrics.exhausted("deadLetter");
                tracing::warn!(shard = %record.shard_id, sequence = %record.sequence_number,
                    partition_key = %record.partition_key, attempts = history.attempts,
                    dead_letter_stream = self.policy.dead_letter_stream.as_deref().unwrap_or_default(),
                    destinations = self.destinations.len(), error = %error, "record sent to the dead-letter stream");
                Outcome::DeadLettered
            }
        }
    }

    /// Sends a dead letter to `destination` until it is taken (never dropping it: the record's shard
    /// waits, counted and logged); false if a graceful stop came first.
    async fn deliver(
        &self,
        destination: &dyn Destination,
        record: &Record,
        letter: &Bytes,
        stop: &CancellationToken,
    ) -> bool {
        let mut delay = self.policy.backoff.min(Duration::from_secs(1));
        loop {
            match destination.send(record, letter).await {
                Ok(()) => return true,
                Err(e) => {
                    self.metrics.dead_letter_failed(destination.kind());
                    tracing::error!(destination = destination.kind(), target = %destination.target(),
                        shard = %record.shard_id, sequence = %record.sequence_number, error = %e, ?delay,
                        "cannot send the dead letter to its destination; retrying, the record waits");
                }
            }
            if !pause(delay, stop).await {
                return false;
            }
            delay = delay.saturating_mul(2).min(self.policy.max_backoff);
        }
    }

    /// Publishes until it succeeds (never dropping a record or an output); false if a graceful stop came
    /// first.
    async fn publish(&self, stream: &str, partition_key: &str, data: Bytes, stop: &CancellationToken) -> bool {
        let mut delay = self.policy.backoff.min(Duration::from_secs(1));
        loop {
            let result = match &self.publisher {
                Some(publisher) => publisher.publish(stream, partition_key, data.clone()).await,
                None => Err("no publisher configured".to_string()),
            };
            match result {
                Ok(()) => return true,
                Err(e) => tracing::warn!(stream, error = %e, ?delay, "cannot publish to the stream; retrying"),
            }
            if !pause(delay, stop).await {
                return false;
            }
            delay = delay.saturating_mul(2).min(self.policy.max_backoff);
        }
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
