//! Reading one shard: iterator from the checkpoint, paced GetRecords, records to the processor in
//! order, periodic checkpoints, and the shard's end.

mod pace;

use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::coordinator::HeldLease;
use crate::kinesis::{Kinesis, KinesisError, StartAt};
use crate::lease::{Checkpoint, LeaseError};
use crate::processor::{Record, RecordProcessor};
use pace::Pace;

/// How a shard is read.
#[derive(Debug, Clone)]
pub struct ReaderSettings {
    /// Records per GetRecords call.
    pub max_records: i32,
    /// Pause after a call that returned nothing.
    pub idle_time: Duration,
    /// How often progress is checkpointed.
    pub checkpoint_interval: Duration,
    /// Shortest gap between two GetRecords calls on one shard (Kinesis allows 5 calls/s per shard).
    pub min_call_gap: Duration,
    /// First delay before retrying a failed record (doubling, capped at 30 s).
    pub retry_backoff: Duration,
}

impl Default for ReaderSettings {
    fn default() -> Self {
        Self {
            max_records: 1000,
            idle_time: Duration::from_millis(500),
            checkpoint_interval: Duration::from_secs(1),
            min_call_gap: Duration::from_millis(200),
            retry_backoff: Duration::from_secs(1),
        }
    }
}

/// Why a shard's reader stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardExit {
    /// Read to its end; `SHARD_END` is checkpointed.
    Ended,
    /// Stopped on request after finishing the record in progress; `last` is the position to checkpoint
    /// on release (every record up to it is processed).
    Stopped {
        /// The position reached.
        last: Checkpoint,
    },
    /// The lease was lost; nothing was checkpointed after the loss.
    Lost,
    /// The shard cannot be read (its stream is gone); the lease should be released.
    Failed {
        /// Why.
        reason: String,
        /// The position reached.
        last: Checkpoint,
    },
}

/// Everything one shard's reader needs.
pub struct ShardReader {
    /// Kinesis client.
    pub kinesis: Kinesis,
    /// The held lease (checkpoints go through it).
    pub held: Arc<HeldLease>,
    /// The record processor.
    pub processor: Arc<dyn RecordProcessor>,
    /// Where to start: the lease's checkpoint.
    pub start: Checkpoint,
    /// Reading settings.
    pub settings: ReaderSettings,
    /// Cancelled to ask for a graceful stop.
    pub stop: CancellationToken,
}

fn start_at(position: &Checkpoint) -> Option<StartAt> {
    match position {
        Checkpoint::Sequence(sequence) => Some(StartAt::AfterSequence(sequence.clone())),
        Checkpoint::TrimHorizon => Some(StartAt::TrimHorizon),
        Checkpoint::Latest => Some(StartAt::Latest),
        Checkpoint::AtTimestamp(ms) => Some(StartAt::AtTimestamp(*ms)),
        Checkpoint::ShardEnd => None,
    }
}

/// Delays between retries of failed Kinesis calls: 100 ms doubling to 5 s, with jitter.
fn read_backoff() -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build()
}

enum Step {
    Continue,
    Exit(ShardExit),
}

impl ShardReader {
    /// Reads the shard until it ends, the lease is lost, or a stop is requested.
    pub async fn run(self) -> ShardExit {
        let key = self.held.key().clone();
        let stream: Arc<str> = Arc::from(key.stream());
        let shard: Arc<str> = Arc::from(key.shard_id());
        let mut position = self.start.clone();
        if position.is_shard_end() {
            return ShardExit::Ended;
        }
        // A LATEST start is pinned to a timestamp and checkpointed at once, so a worker that takes the
        // lease over before any record arrives resumes from here rather than from its own later tip.
        if position == Checkpoint::Latest {
            position = Checkpoint::AtTimestamp(self.held.wall_ms());
            self.held.set_progress(position.clone());
            if let Err(e) = self.held.checkpoint(&position).await
                && e.is_not_held()
            {
                return ShardExit::Lost;
            }
        }
        let mut checkpointed = position.clone();
        let mut last_checkpoint = Instant::now();
        let mut iterator: Option<String> = None;
        let mut pace = Pace::new(self.settings.min_call_gap);
        let mut failures = read_backoff();
        loop {
            if self.held.lost().is_cancelled() {
                return ShardExit::Lost;
            }
            if self.stop.is_cancelled() {
                return ShardExit::Stopped { last: position };
            }
            let current = match iterator.take() {
                Some(current) => current,
                None => {
                    let Some(from) = start_at(&position) else { return ShardExit::Ended };
                    match self.kinesis.iterator(&stream, &shard, &from).await {
                        Ok(Some(it)) => it,
                        Ok(None) => return self.finish(&position).await,
                        Err(e) => match self.read_failed(e, &mut failures, &position).await {
                            Step::Continue => continue,
                            Step::Exit(exit) => return exit,
                        },
                    }
                }
            };
            if !self.wait(pace.until_next()).await {
                iterator = Some(current);
                continue;
            }
            pace.called();
            let batch = tokio::select! {
                biased;
                _ = self.held.lost().cancelled() => return ShardExit::Lost,
                batch = self.kinesis.get_records(&stream, &shard, &current, self.settings.max_records) => batch,
            };
            let batch = match batch {
                Ok(batch) => batch,
                Err(KinesisError::ExpiredIterator) => {
                    tracing::info!(shard = %key, "shard iterator expired; getting a new one after the last record processed");
                    continue;
                }
                Err(e) => {
                    iterator = Some(current);
                    match self.read_failed(e, &mut failures, &position).await {
                        Step::Continue => continue,
                        Step::Exit(exit) => return exit,
                    }
                }
            };
            failures = read_backoff();
            let empty = batch.records.is_empty();
            for record in &batch.records {
                if self.stop.is_cancelled() {
                    return ShardExit::Stopped { last: position };
                }
                // After a pause (a stopped process, a starved runtime) the deadline may have passed
                // before the renewer noticed: never process past it.
                if !self.held.is_valid() {
                    self.held.mark_lost("deadline passed before processing");
                    return ShardExit::Lost;
                }
                if !self.process(record).await {
                    return ShardExit::Lost;
                }
                position = Checkpoint::Sequence(record.sequence_number.clone());
                self.held.set_progress(position.clone());
            }
            iterator = batch.next_iterator;
            if iterator.is_none() {
                return self.finish(&position).await;
            }
            if position != checkpointed && last_checkpoint.elapsed() >= self.settings.checkpoint_interval {
                match self.held.checkpoint(&position).await {
                    Ok(_) => {
                        checkpointed = position.clone();
                        last_checkpoint = Instant::now();
                    }
                    Err(e) if e.is_not_held() => return ShardExit::Lost,
                    Err(e) => tracing::warn!(shard = %key, error = %e, "checkpoint failed; will retry"),
                }
            }
            if empty && !self.wait(Some(Instant::now() + self.settings.idle_time)).await {
                continue;
            }
        }
    }

    /// Sleeps until `until` unless the lease is lost or a stop is asked for; false if interrupted.
    async fn wait(&self, until: Option<Instant>) -> bool {
        let Some(until) = until else { return true };
        tokio::select! {
            _ = self.held.lost().cancelled() => false,
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep_until(until) => true,
        }
    }

    /// Processes one record, retrying in place (order kept) until it succeeds; false if the lease was
    /// lost meanwhile.
    async fn process(&self, record: &Record) -> bool {
        let mut delay = self.settings.retry_backoff;
        let mut attempt = 1u32;
        loop {
            let result = tokio::select! {
                biased;
                _ = self.held.lost().cancelled() => return false,
                result = self.processor.process(record) => result,
            };
            match result {
                Ok(()) => return true,
                Err(e) => {
                    tracing::warn!(shard = %self.held.key(), sequence = %record.sequence_number, attempt,
                        error = %e, "processing failed; retrying in place");
                    tokio::select! {
                        _ = self.held.lost().cancelled() => return false,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(30));
                    attempt += 1;
                }
            }
        }
    }

    /// Handles a failed Kinesis call: back off and go on, or give the shard up.
    async fn read_failed(
        &self,
        error: KinesisError,
        failures: &mut impl Iterator<Item = Duration>,
        position: &Checkpoint,
    ) -> Step {
        let key = self.held.key();
        if let KinesisError::StreamNotFound { .. } = error {
            tracing::error!(shard = %key, error = %error, "stream gone; giving the shard up");
            return Step::Exit(ShardExit::Failed { reason: error.to_string(), last: position.clone() });
        }
        let delay = failures.next().unwrap_or(Duration::from_secs(5));
        if error.is_retryable() {
            tracing::info!(shard = %key, error = %error, ?delay, "read failed; backing off");
        } else {
            tracing::error!(shard = %key, error = %error, ?delay, "read failed; backing off");
        }
        // Interrupted or not, the loop's top checks for a lost lease or a stop request next.
        self.wait(Some(Instant::now() + delay)).await;
        Step::Continue
    }

    /// The shard is read to its end: checkpoint `SHARD_END`.
    async fn finish(&self, position: &Checkpoint) -> ShardExit {
        loop {
            match self.held.checkpoint(&Checkpoint::ShardEnd).await {
                Ok(_) => {
                    tracing::info!(shard = %self.held.key(), "shard ended");
                    self.processor.shard_ended(self.held.key()).await;
                    return ShardExit::Ended;
                }
                Err(LeaseError::Lost { .. }) => return ShardExit::Lost,
                Err(e) if e.is_not_held() => return ShardExit::Lost,
                Err(e) => {
                    tracing::warn!(shard = %self.held.key(), error = %e, last = %position, "SHARD_END checkpoint failed; retrying");
                    if !self.wait(Some(Instant::now() + Duration::from_millis(500))).await {
                        if self.held.lost().is_cancelled() {
                            return ShardExit::Lost;
                        }
                        return ShardExit::Stopped { last: position.clone() };
                    }
                }
            }
        }
    }
}
