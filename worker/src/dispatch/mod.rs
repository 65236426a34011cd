//! Dispatch inside one shard: records go in in shard order and run up to `concurrency` at once under
//! the consumer's `ordering` (`key`: never two of one partition key at once; `shard`: one at a time;
//! `none`: no order), each through the [`RecordRunner`] (retries and the exhausted policy). The checkpoint
//! watermark only ever covers a prefix of the shard in which every record is done.
//!
//! Memory is bounded: at most [`DispatchSettings::window`] records are admitted and not yet behind the
//! watermark. The shard reader admits a record only when there is room, and fetches the next batch
//! only once the current one is admitted, so a slow processor slows fetching.
//!
//! Records run as futures polled by the shard's own task (no task per record): cheap, and dropping the
//! dispatcher stops every record at once when the lease is lost.

mod letter;
mod record_runner;
pub(crate) mod requeue;
mod stuck;
mod watermark;

use std::collections::hash_map::{Entry, RandomState};
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use leasehold_crds::{Ordering, ResolvedSpec};
use tokio_util::sync::CancellationToken;

pub use crate::destination::Publisher;
use crate::lease::Checkpoint;
use crate::processor::{Record, ShardProcessor};
pub use record_runner::{Outcome, RecordRunner, RetryPolicy};
/// Parses a requeue header without checking its proof: `fn(&Bytes) -> Option<(History, Bytes)>`.
pub use requeue::open_unverified as open_requeued;
pub use requeue::{Envelope, History, KeySource, Opened, RequeueKey, parse as parse_requeued};
pub use watermark::Watermark;

/// Order and concurrency inside a shard (`spec.ordering`, `spec.concurrency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchSettings {
    /// The order guarantee.
    pub ordering: Ordering,
    /// Records run at once (1 with `ordering: shard`).
    pub concurrency: usize,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self::from_spec(&ResolvedSpec::default())
    }
}

impl DispatchSettings {
    /// The order and concurrency of a resolved spec.
    pub fn from_spec(spec: &ResolvedSpec) -> Self {
        Self { ordering: spec.ordering, concurrency: spec.concurrency }
    }

    /// Records that may run at once.
    pub fn limit(&self) -> usize {
        match self.ordering {
            Ordering::Shard => 1,
            Ordering::Key | Ordering::None => self.concurrency.max(1),
        }
    }

    /// Records that may be admitted and not yet behind the watermark: four per slot, so that with
    /// `ordering: key` a busy key does not starve the slots while other keys wait further on.
    pub fn window(&self) -> usize {
        self.limit() * 4
    }
}

/// The lease may no longer be used: a record was about to start after its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lease may no longer be used")]
pub struct Halted;

/// Decides, just before each record starts, whether the lease may still be used.
pub type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

struct Admitted {
    ordinal: u64,
    key: u64,
    record: Record,
    covers: Checkpoint,
}

struct Finished {
    ordinal: u64,
    key: u64,
    outcome: Outcome,
    covers: Checkpoint,
    /// The gate was closed when the record's processing was about to begin: it did not run.
    halted: bool,
    /// How long the runner took over the record (the shard's load, `lease::load`).
    spent: std::time::Duration,
}

/// Runs one shard's records under its ordering, concurrency and window.
pub struct Dispatcher {
    limit: usize,
    window: usize,
    by_key: bool,
    runner: Arc<RecordRunner>,
    processor: Arc<dyn ShardProcessor>,
    stop: CancellationToken,
    gate: Gate,
    in_flight: FuturesUnordered<BoxFuture<'static, Finished>>,
    /// Admitted records free to start, oldest first (with `ordering: key`, at most one per key).
    ready: VecDeque<Admitted>,
    /// With `ordering: key`: every key with a record ready or running, and the records waiting behind
    /// it in shard order. Keys are 64-bit hashes: a collision only makes two keys wait for each other.
    waiting: HashMap<u64, VecDeque<Admitted>>,
    hasher: RandomState,
    marks: Watermark,
    /// Processing time of records finished since [`take_busy`](Self::take_busy) was last called.
    busy: std::time::Duration,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("limit", &self.limit)
            .field("in_flight", &self.in_flight.len())
            .field("pending", &self.marks.pending())
            .field("watermark", &self.marks.last())
            .finish()
    }
}

impl Dispatcher {
    /// A dispatcher running records through `runner` with the shard's `processor`. Once `stop` is
    /// cancelled no record starts and records waiting to be retried are abandoned; `gate` is asked
    /// before each record starts.
    pub fn new(
        settings: DispatchSettings,
        runner: Arc<RecordRunner>,
        processor: Arc<dyn ShardProcessor>,
        stop: CancellationToken,
        gate: Gate,
    ) -> Self {
        let limit = settings.limit();
        Self {
            limit,
            window: settings.window(),
            by_key: settings.ordering == Ordering::Key && limit > 1,
            runner,
            processor,
            stop,
            gate,
            in_flight: FuturesUnordered::new(),
            ready: VecDeque::new(),
            waiting: HashMap::new(),
            hasher: RandomState::new(),
            marks: Watermark::default(),
            busy: std::time::Duration::ZERO,
        }
    }

    /// True while another record may be admitted.
    pub fn has_room(&self) -> bool {
        self.marks.pending() < self.window
    }

    /// Records running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Records admitted and not yet behind the watermark.
    pub fn pending(&self) -> usize {
        self.marks.pending()
    }

    /// True while some record is running (so [`step`](Self::step) has something to wait for).
    pub fn is_busy(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// True when every admitted record is done, or, after a stop, nothing runs any more.
    pub fn is_settled(&self) -> bool {
        self.marks.pending() == 0 || (self.stop.is_cancelled() && self.in_flight.is_empty())
    }

    /// Admits the next record of the shard (call only when [`has_room`](Self::has_room)) and starts
    /// what may start. `covers` is the checkpoint once it and every record before it are done.
    pub fn push(&mut self, record: Record, covers: Checkpoint) -> Result<(), Halted> {
        let ordinal = self.marks.admit(record.arrival_ms);
        let key = if self.by_key { self.hasher.hash_one(record.partition_key.as_str()) } else { 0 };
        let admitted = Admitted { ordinal, key, record, covers };
        if self.by_key {
            match self.waiting.entry(key) {
                Entry::Occupied(mut busy) => {
                    busy.get_mut().push_back(admitted);
                    return Ok(());
                }
                Entry::Vacant(free) => {
                    free.insert(VecDeque::new());
                }
            }
        }
        self.ready.push_back(admitted);
        self.start_ready()
    }

    /// Waits for one running record to end and starts what may start next; `Ok(false)` when nothing
    /// runs. Cancel-safe: a record that ends is accounted for in the call that sees it.
    pub async fn step(&mut self) -> Result<bool, Halted> {
        match self.in_flight.next().await {
            Some(done) => self.finished(done).map(|()| true),
            None => Ok(false),
        }
    }

    /// When the oldest admitted record not yet done arrived (epoch ms), if any is pending.
    pub fn oldest_pending_arrival(&self) -> Option<i64> {
        self.marks.oldest_pending_arrival()
    }

    /// The checkpoint of the done prefix.
    pub fn watermark(&self) -> Option<&Checkpoint> {
        self.marks.last()
    }

    /// The watermark if it moved since the previous call.
    pub fn take_advanced(&mut self) -> Option<&Checkpoint> {
        self.marks.take_advanced()
    }

    /// Processing time of the records finished since the previous call.
    pub fn take_busy(&mut self) -> std::time::Duration {
        std::mem::take(&mut self.busy)
    }

    fn finished(&mut self, done: Finished) -> Result<(), Halted> {
        self.busy += done.spent;
        if done.halted {
            return Err(Halted);
        }
        let is_done = done.outcome.is_done();
        if is_done {
            self.marks.complete(done.ordinal, done.covers);
        }
        if self.by_key {
            if !is_done {
                // Abandoned (a stop came while it waited for a retry): the records of its key behind
                // it must not run before it; the next reader delivers them all again, in order.
                self.waiting.remove(&done.key);
            } else if let Some(queue) = self.waiting.get_mut(&done.key) {
                match queue.pop_front() {
                    Some(next) => self.ready.push_back(next),
                    None => {
                        self.waiting.remove(&done.key);
                    }
                }
            }
        }
        self.start_ready()
    }

    /// The next admitted record that may start. After a stop, only records behind one already done
    /// start: they close the gaps below it, so the done prefix (what the release checkpoints) reaches
    /// every record that finished out of order and the next holder repeats none of them; records
    /// beyond the furthest done one are left to the next holder.
    fn next_ready(&mut self) -> Option<Admitted> {
        if !self.stop.is_cancelled() {
            return self.ready.pop_front();
        }
        let furthest = self.marks.highest_done()?;
        let index = self.ready.iter().position(|r| r.ordinal < furthest)?;
        self.ready.remove(index)
    }

    fn start_ready(&mut self) -> Result<(), Halted> {
        while self.in_flight.len() < self.limit {
            let Some(next) = self.next_ready() else { break };
            if !(self.gate)() {
                self.ready.push_front(next);
                return Err(Halted);
            }
            let runner = self.runner.clone();
            let processor = self.processor.clone();
            let stop = self.stop.clone();
            let gate = self.gate.clone();
            self.in_flight.push(Box::pin(async move {
                // First polled when the reader next drives its records, which can be much later (a
                // call to Kinesis or DynamoDB in between, a process stopped and resumed): the gate is
                // asked again just before the processor runs, so nothing begins past the deadline.
                if !gate() {
                    let (outcome, halted, spent) = (Outcome::Abandoned, true, std::time::Duration::ZERO);
                    return Finished {
                        ordinal: next.ordinal,
                        key: next.key,
                        outcome,
                        covers: next.covers,
                        halted,
                        spent,
                    };
                }
                let began = tokio::time::Instant::now();
                let outcome = runner.process(processor.as_ref(), &next.record, &stop).await;
                let spent = began.elapsed();
                Finished { ordinal: next.ordinal, key: next.key, outcome, covers: next.covers, halted: false, spent }
            }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
