//! Reading one shard: iterator from the checkpoint and paced GetRecords (polling), or subscriptions
//! (enhanced fan-out, `fanout`); either way KPL aggregates unpacked into their user records, records
//! to the dispatcher (order, concurrency, retries), checkpoints of the completed prefix (inside an
//! aggregate: its sub-sequence), and the shard's end.

mod fanout;
mod lifecycle;
mod pace;
mod unpack;

use std::sync::Arc;
use std::time::Duration;

use leasehold_crds::{ReaderMode, ResolvedSpec, WindowBounds};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::dispatch::{DispatchSettings, Dispatcher, Gate, Halted, RecordRunner};
use crate::kinesis::{Batch, Kinesis, KinesisError, StartAt};
use crate::lease::{Checkpoint, HeldLease, LeaseError};
use crate::metrics::Metrics;
use crate::processor::{Record, ShardProcessor};
use pace::{Pace, PageLimit};
use unpack::Unpacker;

pub use lifecycle::read_with_hooks;

/// How a shard is read.
#[derive(Debug, Clone)]
pub struct ReaderSettings {
    /// Records per GetRecords call at most (fewer for a while after a call timed out).
    pub max_records: i32,
    /// Pause after a call that returned nothing.
    pub idle_time: Duration,
    /// How often progress is checkpointed.
    pub checkpoint_interval: Duration,
    /// Shortest gap between two GetRecords calls on one shard (Kinesis allows 5 calls/s per shard).
    pub min_call_gap: Duration,
    /// Order and concurrency inside the shard.
    pub dispatch: DispatchSettings,
    /// Longest wait for a processor's closing hook (`lease.gracefulTimeout`).
    pub hook_timeout: Duration,
    /// Unpack KPL aggregates into their user records (`reader.deaggregate`).
    pub deaggregate: bool,
    /// Polling or enhanced fan-out (`reader.mode`).
    pub mode: ReaderMode,
    /// Fan-out: a subscription silent this long is dropped and replaced
    /// (`reader.subscriptionIdleTimeout`).
    pub subscription_idle_timeout: Duration,
    /// Fan-out: a shard whose subscription cannot be re-established (no event from a new one) within
    /// this long is given up and its lease released (`lease.duration`).
    pub resubscribe_limit: Duration,
    /// Fan-out: a subscription that has brought no record for this long has its shard's end checked
    /// with one GetRecords (`lease.shardSyncInterval`), since an implementation may never end a closed
    /// shard's subscription.
    pub end_check_interval: Duration,
    /// A bounded consumer's window (`spec.window`): records that arrived before its start are passed
    /// over, and the shard is finished (`SHARD_END`) at its first record after its end, or once the
    /// tip has passed its end.
    pub window: Option<WindowBounds>,
}

impl ReaderSettings {
    /// The reading settings of a resolved spec.
    pub fn from_spec(spec: &ResolvedSpec) -> Self {
        Self {
            max_records: spec.max_records,
            idle_time: spec.durations.idle_time,
            checkpoint_interval: spec.durations.checkpoint_interval,
            min_call_gap: Duration::from_millis(200),
            dispatch: DispatchSettings::from_spec(spec),
            hook_timeout: spec.durations.graceful_timeout,
            deaggregate: spec.deaggregate,
            mode: spec.mode,
            subscription_idle_timeout: spec.durations.subscription_idle_timeout,
            resubscribe_limit: spec.durations.lease,
            end_check_interval: spec.durations.shard_sync_interval,
            window: None,
        }
    }
}

impl Default for ReaderSettings {
    fn default() -> Self {
        Self::from_spec(&ResolvedSpec::default())
    }
}

/// Why a shard's reader stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardExit {
    /// Read to its end; `SHARD_END` is checkpointed.
    Ended,
    /// Stopped on request after finishing the records in progress; `last` is the position to checkpoint
    /// on release (every record up to it is done).
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

/// What reading one held shard needs, whatever reads it (Kinesis, or a test's stand-in).
pub struct ShardContext {
    /// The held lease (checkpoints go through it).
    pub held: Arc<HeldLease>,
    /// Runs each record through the processor and the retry policy.
    pub runner: Arc<RecordRunner>,
    /// The worker's metrics, which the reader counts into.
    pub metrics: Arc<Metrics>,
    /// The shard's processor (made for this lease).
    pub processor: Arc<dyn ShardProcessor>,
    /// Where to start: the lease's checkpoint.
    pub start: Checkpoint,
    /// Reading settings.
    pub settings: ReaderSettings,
    /// Cancelled to ask for a graceful stop.
    pub stop: CancellationToken,
}

/// One shard's reader over Kinesis.
pub struct ShardReader {
    /// Kinesis client.
    kinesis: Kinesis,
    /// The shard, its lease and its processor.
    context: ShardContext,
}

fn start_at(position: &Checkpoint) -> Option<StartAt> {
    match position {
        Checkpoint::Sequence(sequence) => Some(StartAt::AfterSequence(sequence.clone())),
        // Part of that aggregate is not done: read it again, the done user records are left out.
        Checkpoint::SubSequence { sequence, .. } => Some(StartAt::AtSequence(sequence.clone())),
        Checkpoint::TrimHorizon => Some(StartAt::TrimHorizon),
        Checkpoint::Latest => Some(StartAt::Latest),
        Checkpoint::AtTimestamp(ms) => Some(StartAt::AtTimestamp(*ms)),
        Checkpoint::ShardEnd => None,
    }
}

/// Delays between retries of failed Kinesis calls: 100 ms doubling to 5 s, with jitter.
fn read_backoff() -> impl Iterator<Item = Duration> {
    backoff(Duration::from_millis(100), Duration::from_secs(5))
}

/// Delays from `min` doubling to `max`, with up to as much again added at random, without end.
fn backoff(min: Duration, max: Duration) -> impl Iterator<Item = Duration> {
    crate::backoff::Backoff::new(min, max).with_jitter(crate::backoff::Jitter::Added(1.0)).delays()
}

/// What happens after a failed call was handled.
enum Step {
    Continue,
    Exit(ShardExit),
}

/// What one turn of polling gave.
enum Polled {
    /// Records were read (or none yet): go on.
    Read,
    /// The reader is done.
    Exit(ShardExit),
    /// A Kinesis call failed: back off (or give the shard up) and go on.
    Failed(KinesisError),
}

/// Whether the stream is still the incarnation the lease's row is about.
enum RowIncarnation {
    /// It is (or it cannot be told for good, as for rows without a stamp).
    Same,
    /// It was deleted and recreated: the shard is given up with this exit.
    Recreated(ShardExit),
    /// It could not be described now: back off and try again.
    Unknown(KinesisError),
}

/// A polling reader's state between GetRecords calls.
struct Polling {
    iterator: Option<String>,
    /// The next page, asked for while the last one is delivered (at most one ahead: bounded memory).
    prefetch: Option<Prefetch>,
    pace: Pace,
    page: PageLimit,
    unpacker: Unpacker,
    failures: Box<dyn Iterator<Item = Duration> + Send>,
}

/// A GetRecords call already sent for the page after the one being delivered; aborted when dropped
/// (a lost lease, a stop, a finished window).
struct Prefetch {
    /// The iterator it reads at, asked for again if the call fails.
    iterator: String,
    answer: AbortOnDropHandle<Result<Batch, KinesisError>>,
}

/// What [`ShardReader::next_page`] came to: a GetRecords answer at an iterator (`None` when a stop came
/// first), or what the polling loop does next without one.
enum Page {
    Answer(String, Option<Result<Batch, KinesisError>>),
    Then(Polled),
}

/// Where a reader is: where it started, the last record fetched (a new iterator starts after it), and
/// what was last checkpointed.
struct Cursor {
    start: Checkpoint,
    fetched: Checkpoint,
    checkpointed: Checkpoint,
    last_checkpoint: Instant,
}

impl Cursor {
    /// The checkpoint the done prefix allows: the watermark, or the start before any record is done.
    fn position(&self, dispatcher: &Dispatcher) -> Checkpoint {
        dispatcher.watermark().cloned().unwrap_or_else(|| self.start.clone())
    }
}

/// Early exits of the reading loop (`?` on the lease being lost).
type Flow<T> = Result<T, ShardExit>;

impl ShardReader {
    /// A reader of `context`'s shard through `kinesis`.
    pub fn new(kinesis: Kinesis, context: ShardContext) -> Self {
        Self { kinesis, context }
    }

    /// Reads the shard until it ends, the lease is lost, or a stop is requested.
    pub async fn read(self) -> ShardExit {
        let mut start = self.context.start.clone();
        if start.is_shard_end() {
            return ShardExit::Ended;
        }
        // A LATEST start is pinned to a timestamp and checkpointed at once, so a worker that takes the
        // lease over before any record arrives resumes from here rather than from its own later tip.
        if start == Checkpoint::Latest {
            start = Checkpoint::AtTimestamp(self.context.held.wall_ms());
            self.context.held.set_progress(start.clone());
            if let Err(e) = self.write_checkpoint(&start).await
                && e.is_not_held()
            {
                return ShardExit::Lost;
            }
        }
        let held = self.context.held.clone();
        // After a pause (a stopped process, a starved runtime) the deadline may have passed before the
        // renewer noticed: no record starts past it.
        let gate: Gate = Arc::new(move || held.is_valid());
        let mut dispatcher = Dispatcher::new(
            self.context.settings.dispatch,
            self.context.runner.clone(),
            self.context.processor.clone(),
            self.context.stop.clone(),
            gate,
        );
        let key = self.context.held.key();
        self.context.held.lag().report_to(self.context.metrics.shard_lag(key.stream(), key.shard_id()));
        self.context.held.load().report_to(self.context.metrics.shard_load(key.stream(), key.shard_id()));
        let mut cursor =
            Cursor { fetched: start.clone(), checkpointed: start.clone(), start, last_checkpoint: Instant::now() };
        let read = match self.context.settings.mode {
            ReaderMode::Polling => self.read_polling(&mut dispatcher, &mut cursor).await,
            ReaderMode::FanOut => self.read_fan_out(&mut dispatcher, &mut cursor).await,
        };
        let exit = match read {
            Ok(exit) | Err(exit) => exit,
        };
        self.context.metrics.forget_shard(&key.to_string());
        self.context.metrics.forget_shard_lag(key.stream(), key.shard_id());
        exit
    }

    /// Reads the shard by polling until it ends, the lease is lost, or a stop is requested.
    async fn read_polling(&self, d: &mut Dispatcher, cursor: &mut Cursor) -> Flow<ShardExit> {
        let mut polling = Polling {
            iterator: None,
            prefetch: None,
            pace: Pace::new(self.context.settings.min_call_gap),
            page: PageLimit::new(self.context.settings.max_records),
            unpacker: self.unpacker(cursor),
            failures: Box::new(read_backoff()),
        };
        loop {
            if self.context.held.lost().is_cancelled() {
                return Ok(ShardExit::Lost);
            }
            if self.context.stop.is_cancelled() {
                return self.stopped(d, cursor).await;
            }
            let step = match self.poll_once(d, cursor, &mut polling).await? {
                Polled::Read => Step::Continue,
                Polled::Exit(exit) => Step::Exit(exit),
                Polled::Failed(error) => self.read_failed(d, error, &mut polling.failures, cursor).await?,
            };
            if let Step::Exit(exit) = step {
                return Ok(exit);
            }
        }
    }

    /// One turn of polling: an iterator if there is none, then one paced GetRecords and its records
    /// handed over; says what happens next.
    async fn poll_once(&self, d: &mut Dispatcher, cursor: &mut Cursor, polling: &mut Polling) -> Flow<Polled> {
        let key = self.context.held.key();
        let (stream, shard): (Arc<str>, Arc<str>) = (Arc::from(key.stream()), Arc::from(key.shard_id()));
        let (current, read) = match self.next_page(d, cursor, polling, &stream, &shard).await? {
            Page::Answer(current, read) => (current, read),
            Page::Then(polled) => return Ok(polled),
        };
        let Some(batch) = read else { return self.stopped(d, cursor).await.map(Polled::Exit) };
        let shard_label = key.to_string();
        let batch = match batch {
            Ok(batch) => {
                if polling.page.succeeded() {
                    self.context.metrics.page_limit(&shard_label, polling.page.get());
                }
                batch
            }
            Err(KinesisError::ExpiredIterator) => {
                tracing::info!(shard = %key, "shard iterator expired; getting a new one after the last record fetched");
                return Ok(Polled::Read);
            }
            Err(e) => {
                if matches!(e, KinesisError::TimedOut) {
                    self.context.metrics.get_records_timeouts.inc();
                    if polling.page.timed_out() {
                        tracing::info!(shard = %key, limit = polling.page.get(), "GetRecords timed out; asking for smaller pages");
                        self.context.metrics.page_limit(&shard_label, polling.page.get());
                    }
                }
                polling.iterator = Some(current);
                return Ok(Polled::Failed(e));
            }
        };
        polling.failures = Box::new(read_backoff());
        let empty = batch.records.is_empty();
        let caught_up = batch.millis_behind.unwrap_or(0) == 0;
        let next = batch.next_iterator;
        // A page with records is likely followed by more: the next call goes out now (paced), so
        // Kinesis works on it while this page is delivered, as the KCL's prefetching does.
        if !empty && let Some(iterator) = &next {
            polling.prefetch = Some(self.prefetch(&stream, &shard, iterator, polling));
        }
        if let Some(exit) = self.deliver(d, cursor, &mut polling.unpacker, batch.records, batch.millis_behind).await? {
            return Ok(Polled::Exit(exit));
        }
        let ended = next.is_none();
        polling.iterator = if polling.prefetch.is_some() { None } else { next };
        if ended {
            return self.finish_window(d, cursor, "shard_end").await.map(Polled::Exit);
        }
        if empty && caught_up && self.tip_passed_window() {
            tracing::info!(shard = %key, "window: nothing after its end yet and the tip has passed it; shard finished");
            return self.finish_window(d, cursor, "tip_passed").await.map(Polled::Exit);
        }
        self.maybe_checkpoint(d, cursor).await?;
        if empty {
            // Interrupted or not, the loop's top checks for a lost lease or a stop request next.
            self.drive(d, self.wait(Some(Instant::now() + self.context.settings.idle_time))).await?;
        }
        Ok(Polled::Read)
    }

    /// The next page's answer: the one asked for ahead, or a paced GetRecords now (with an iterator got
    /// first when there is none); `None` in the answer when a stop came first.
    async fn next_page(
        &self,
        d: &mut Dispatcher,
        cursor: &mut Cursor,
        polling: &mut Polling,
        stream: &Arc<str>,
        shard: &Arc<str>,
    ) -> Flow<Page> {
        match polling.prefetch.take() {
            Some(prefetch) => {
                let read = tokio::select! {
                    biased;
                    _ = self.context.stop.cancelled() => None,
                    answer = self.drive(d, prefetch.answer) => Some(answer?.unwrap_or_else(|e| {
                        Err(KinesisError::Transport(format!("the GetRecords task ended: {e}")))
                    })),
                };
                Ok(Page::Answer(prefetch.iterator, read))
            }
            None => {
                let current = match polling.iterator.take() {
                    Some(current) => current,
                    None => {
                        let Some(from) = start_at(&cursor.fetched) else {
                            return Ok(Page::Then(Polled::Exit(ShardExit::Ended)));
                        };
                        match self.check_incarnation(d, stream, cursor).await? {
                            RowIncarnation::Same => {}
                            RowIncarnation::Recreated(exit) => return Ok(Page::Then(Polled::Exit(exit))),
                            RowIncarnation::Unknown(e) => return Ok(Page::Then(Polled::Failed(e))),
                        }
                        match self.drive(d, self.kinesis.iterator(stream, shard, &from)).await? {
                            Ok(Some(it)) => it,
                            Ok(None) => {
                                return self
                                    .finish_window(d, cursor, "shard_end")
                                    .await
                                    .map(|e| Page::Then(Polled::Exit(e)));
                            }
                            Err(e) => return Ok(Page::Then(Polled::Failed(e))),
                        }
                    }
                };
                if !self.drive(d, self.wait(polling.pace.until_next())).await? {
                    polling.iterator = Some(current);
                    return Ok(Page::Then(Polled::Read));
                }
                polling.pace.called();
                // A stop does not wait for a read in flight (slow on a loaded endpoint): nothing of it
                // has been delivered, so the next holder reads it again from the checkpoint.
                let read = tokio::select! {
                    biased;
                    _ = self.context.stop.cancelled() => None,
                    batch = self.drive(d, self.kinesis.get_records(stream, shard, &current, polling.page.get())) => Some(batch?),
                };
                Ok(Page::Answer(current, read))
            }
        }
    }

    /// Sends the GetRecords call for the page at `iterator` in a task of its own, when the pace allows.
    fn prefetch(&self, stream: &Arc<str>, shard: &Arc<str>, iterator: &str, polling: &mut Polling) -> Prefetch {
        let at = polling.pace.reserve();
        let (kinesis, stream, shard, limit) = (self.kinesis.clone(), stream.clone(), shard.clone(), polling.page.get());
        let page_at = iterator.to_string();
        let answer = AbortOnDropHandle::new(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            kinesis.get_records(&stream, &shard, &page_at, limit).await
        }));
        Prefetch { iterator: iterator.to_string(), answer }
    }

    /// The unpacker of this shard, read from `cursor`'s start.
    fn unpacker(&self, cursor: &Cursor) -> Unpacker {
        let label = self.context.held.key().to_string();
        Unpacker::new(self.context.settings.deaggregate, &cursor.start, self.context.metrics.clone(), label)
    }

    /// Hands the records of one read (a GetRecords answer or a fan-out event) to the dispatcher in
    /// order, aggregates unpacked, each admitted only when the window has room (backpressure: nothing
    /// more is read meanwhile). `Some` when a stop came first.
    async fn deliver(
        &self,
        d: &mut Dispatcher,
        cursor: &mut Cursor,
        unpacker: &mut Unpacker,
        records: Vec<Record>,
        millis_behind: Option<i64>,
    ) -> Flow<Option<ShardExit>> {
        let key = self.context.held.key();
        if let Some(behind) = millis_behind {
            self.context.metrics.behind(&key.to_string(), behind);
        }
        self.context.held.lag().read(millis_behind);
        if d.pending() == 0 {
            // Until the first of them is admitted, the oldest record not finished is this read's first.
            self.context.held.lag().set_oldest_unfinished(records.first().and_then(|r| r.arrival_ms));
        }
        self.context.held.lag().measure(self.context.held.wall_ms());
        let bytes: usize = records.iter().map(|r| r.data.len()).sum();
        let last_arrival = records.iter().filter_map(|r| r.arrival_ms).max();
        self.context.held.load().delivered(records.len() as u64, bytes as u64, last_arrival);
        let last_fetched = records.last().map(|r| r.sequence_number.clone());
        let window = self.context.settings.window;
        for record in records {
            if let (Some(window), Some(arrival)) = (window, record.arrival_ms) {
                if arrival > window.end_ms {
                    // The shard's first record after the window: it and everything after stay unread.
                    tracing::info!(shard = %key, sequence = %record.sequence_number,
                        "window: first record after its end; shard finished");
                    return self.finish_window(d, cursor, "past_end").await.map(Some);
                }
                if arrival < window.start_ms {
                    // A child read from its oldest record holds records from before the window.
                    self.context.metrics.window_records_before_start.inc();
                    continue;
                }
            }
            let deaggregated = unpacker.deaggregate(&record);
            if unpacker.wants_range(&record, &deaggregated) {
                let listed = self.drive(d, self.kinesis.hash_key_range(key.stream(), key.shard_id())).await?;
                unpacker.set_range(listed);
            }
            for (record, covers) in unpacker.unpack(record, deaggregated) {
                if self.context.stop.is_cancelled() {
                    return self.stopped(d, cursor).await.map(Some);
                }
                // Backpressure: the next record is admitted only when the window has room.
                while !d.has_room() {
                    self.step(d).await?;
                    self.maybe_checkpoint(d, cursor).await?;
                }
                let pushed = d.push(record, covers);
                self.stepped(d, pushed.map(|()| true))?;
                if window.is_some() {
                    self.context.metrics.window_records_replayed.inc();
                    // Carried into the row by the next checkpoint or renewal (status.window).
                    self.context.held.replayed(1);
                }
            }
        }
        if let Some(sequence) = last_fetched {
            cursor.fetched = Checkpoint::Sequence(sequence);
        }
        Ok(None)
    }

    /// Before a new iterator: the stream must still be the incarnation the lease's row is about, or a
    /// stream deleted and recreated under its name would be read from a former incarnation's checkpoint
    /// (or under a row the shard sync is replacing). `Ok(Some(exit))` gives the shard up; `Err` is a
    /// failed describe to back off from. A describe refused for good (no permission) lets the iterator
    /// be taken unchecked, as for rows without a stamp.
    async fn check_incarnation(&self, d: &mut Dispatcher, stream: &str, cursor: &Cursor) -> Flow<RowIncarnation> {
        let Some(created) = self.context.held.stream_created() else { return Ok(RowIncarnation::Same) };
        match self.drive(d, self.kinesis.stream_created(stream)).await? {
            Ok(state) if state.created == created => Ok(RowIncarnation::Same),
            Ok(state) => {
                let now = state.created;
                tracing::warn!(shard = %self.context.held.key(), row = created, stream = now,
                    "the stream was recreated since the lease was taken; giving the shard up");
                self.drain(d).await?;
                let reason = format!("stream recreated (created {now}, the row is about {created})");
                Ok(RowIncarnation::Recreated(ShardExit::Failed { reason, last: cursor.position(d) }))
            }
            Err(e) if e.is_retryable() || matches!(e, KinesisError::StreamNotFound { .. }) => {
                Ok(RowIncarnation::Unknown(e))
            }
            Err(e) => {
                tracing::debug!(shard = %self.context.held.key(), error = %e, "cannot describe the stream; iterator taken unchecked");
                Ok(RowIncarnation::Same)
            }
        }
    }

    /// Runs `work` while records keep running and finishing; stops at once if the lease is lost.
    async fn drive<F: std::future::Future>(&self, d: &mut Dispatcher, work: F) -> Flow<F::Output> {
        tokio::pin!(work);
        loop {
            let stepped = tokio::select! {
                biased;
                _ = self.context.held.lost().cancelled() => return Err(ShardExit::Lost),
                out = &mut work => return Ok(out),
                stepped = d.step(), if d.is_busy() => stepped,
            };
            self.stepped(d, stepped)?;
        }
    }

    /// Waits for one running record to end.
    async fn step(&self, d: &mut Dispatcher) -> Flow<()> {
        let stepped = tokio::select! {
            biased;
            _ = self.context.held.lost().cancelled() => return Err(ShardExit::Lost),
            stepped = d.step() => stepped,
        };
        self.stepped(d, stepped)
    }

    /// After records started or ended: a closed gate means the lease is gone; progress follows the
    /// watermark (what to checkpoint if this reader has to be abandoned).
    fn stepped(&self, d: &mut Dispatcher, result: Result<bool, Halted>) -> Flow<()> {
        if result.is_err() {
            self.context.held.mark_lost("deadline passed before processing");
            return Err(ShardExit::Lost);
        }
        if let Some(position) = d.take_advanced() {
            self.context.held.set_progress(position.clone());
        }
        self.context.held.lag().set_oldest_unfinished(d.oldest_pending_arrival());
        self.context.held.load().busy(d.take_busy());
        Ok(())
    }

    /// Checkpoints the done prefix if `checkpointInterval` has passed and it moved.
    async fn maybe_checkpoint(&self, d: &mut Dispatcher, cursor: &mut Cursor) -> Flow<()> {
        if cursor.last_checkpoint.elapsed() < self.context.settings.checkpoint_interval {
            return Ok(());
        }
        let position = cursor.position(d);
        if position == cursor.checkpointed {
            return Ok(());
        }
        match self.drive(d, self.write_checkpoint(&position)).await? {
            Ok(()) => {
                cursor.checkpointed = position;
                cursor.last_checkpoint = Instant::now();
            }
            Err(e) if e.is_not_held() => return Err(ShardExit::Lost),
            Err(e) => tracing::warn!(shard = %self.context.held.key(), error = %e, "checkpoint failed; will retry"),
        }
        Ok(())
    }

    /// Writes a checkpoint through the held lease, counting it once written.
    async fn write_checkpoint(&self, position: &Checkpoint) -> Result<(), LeaseError> {
        self.context.held.checkpoint(position).await?;
        self.context.metrics.checkpoints_written.inc();
        Ok(())
    }

    /// Waits for every record running to end.
    async fn drain(&self, d: &mut Dispatcher) -> Flow<()> {
        while d.is_busy() {
            self.step(d).await?;
        }
        Ok(())
    }

    /// A graceful stop: the records running finish (those waiting for a retry are abandoned, nothing
    /// new starts); the position is the done prefix.
    async fn stopped(&self, d: &mut Dispatcher, cursor: &Cursor) -> Flow<ShardExit> {
        self.drain(d).await?;
        Ok(ShardExit::Stopped { last: cursor.position(d) })
    }

    /// Sleeps until `until` unless the lease is lost or a stop is asked for; false if interrupted.
    async fn wait(&self, until: Option<Instant>) -> bool {
        let Some(until) = until else { return true };
        tokio::select! {
            _ = self.context.held.lost().cancelled() => false,
            _ = self.context.stop.cancelled() => false,
            _ = tokio::time::sleep_until(until) => true,
        }
    }

    /// Handles a failed Kinesis call: back off and go on, or give the shard up.
    async fn read_failed(
        &self,
        d: &mut Dispatcher,
        error: KinesisError,
        failures: &mut impl Iterator<Item = Duration>,
        cursor: &Cursor,
    ) -> Flow<Step> {
        let key = self.context.held.key();
        if let KinesisError::StreamNotFound { .. } = error {
            tracing::error!(shard = %key, error = %error, "stream gone; giving the shard up");
            // Records already admitted finish first, so the release checkpoints as far as possible.
            self.drain(d).await?;
            return Ok(Step::Exit(ShardExit::Failed { reason: error.to_string(), last: cursor.position(d) }));
        }
        let delay = failures.next().unwrap_or(Duration::from_secs(5));
        if error.is_retryable() {
            tracing::info!(shard = %key, error = %error, ?delay, "read failed; backing off");
        } else {
            tracing::error!(shard = %key, error = %error, ?delay, "read failed; backing off");
        }
        // Interrupted or not, the loop's top checks for a lost lease or a stop request next.
        self.drive(d, self.wait(Some(Instant::now() + delay))).await?;
        Ok(Step::Continue)
    }

    /// True for a window consumer whose wall clock is past the window's end by its tip slack: a shard
    /// with nothing more to read (and not behind the tip) holds no record of the window any more. The
    /// wall clock stands in for the stream's tip because emulators report `MillisBehindLatest` 0
    /// always; the slack covers records in flight at `end` and clock skew with Kinesis.
    fn tip_passed_window(&self) -> bool {
        let Some(window) = self.context.settings.window else { return false };
        let slack = i64::try_from(window.tip_slack.as_millis()).unwrap_or(i64::MAX);
        self.context.held.wall_ms() > window.end_ms.saturating_add(slack)
    }

    /// [`finish`](Self::finish), counted for a window consumer by `reason` (past_end, tip_passed,
    /// shard_end). A window's shard finished early is checkpointed `SHARD_END` like one read to its
    /// end: it is never read again, and its children (which hold only later records) get rows and
    /// are finished at their first record.
    async fn finish_window(&self, d: &mut Dispatcher, cursor: &Cursor, reason: &str) -> Flow<ShardExit> {
        let exit = self.finish(d, cursor).await?;
        if self.context.settings.window.is_some() && exit == ShardExit::Ended {
            self.context.metrics.window_shard_finished(reason);
        }
        Ok(exit)
    }

    /// The shard is read to its end: once every record is done, checkpoint `SHARD_END`.
    async fn finish(&self, d: &mut Dispatcher, cursor: &Cursor) -> Flow<ShardExit> {
        while !d.is_settled() && d.is_busy() {
            self.step(d).await?;
        }
        if d.pending() > 0 {
            // A stop came first; the records not done are delivered again by the next reader.
            return Ok(ShardExit::Stopped { last: cursor.position(d) });
        }
        let position = cursor.position(d);
        loop {
            match self.write_checkpoint(&Checkpoint::ShardEnd).await {
                Ok(()) => {
                    tracing::info!(shard = %self.context.held.key(), "shard ended");
                    return Ok(ShardExit::Ended);
                }
                Err(e) if e.is_not_held() => return Ok(ShardExit::Lost),
                Err(e) => {
                    tracing::warn!(shard = %self.context.held.key(), error = %e, last = %position, "SHARD_END checkpoint failed; retrying");
                    if !self.wait(Some(Instant::now() + Duration::from_millis(500))).await {
                        if self.context.held.lost().is_cancelled() {
                            return Ok(ShardExit::Lost);
                        }
                        return Ok(ShardExit::Stopped { last: position });
                    }
                }
            }
        }
    }
}
