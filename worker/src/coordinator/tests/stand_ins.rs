//! Stand-ins for the coordinator's seams: a clock the test pauses, a store that can be cut off, and a
//! shard source with a fixed set of shards that records every reading.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::STREAM;
use crate::coordinator::ShardSource;
use crate::discovery::{Incarnation, SyncReport};
use crate::lease::{
    Checkpoint, Clock, GroupRows, Lease, LeaseError, LeaseKey, LeasePage, LeaseSettings, LeaseStore, Member,
    MemoryLeaseStore, NewLease, PageToken, Result, ShardLeases,
};
use crate::processor::{Outputs, ProcessError, Record, ShardProcessor};
use crate::shard::{ShardContext, ShardExit};

/// The lease store's clocks read from tokio's (paused) clock, so expiry is judged on the time the test moves.
#[derive(Debug)]
pub(super) struct PausedClock {
    pub(super) start: Instant,
}

impl Clock for PausedClock {
    fn wall_ms(&self) -> i64 {
        1_800_000_000_000 + i64::try_from(self.monotonic().as_millis()).unwrap_or(i64::MAX)
    }

    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A worker's view of the memory table that can be cut off, as a worker that lost its network (or
/// hung) is: every call fails from then on, so its leases run out while it still thinks it runs them.
pub(super) struct Severable {
    pub(super) inner: MemoryLeaseStore,
    pub(super) cut: AtomicBool,
    /// Pages of whole-table reads made through this store.
    pub(super) whole_reads: AtomicU64,
}

impl Severable {
    fn check(&self) -> Result<()> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(LeaseError::Transport { table: "memory".into(), message: "cut off".into() });
        }
        Ok(())
    }
}

#[async_trait]
impl ShardLeases for Severable {
    fn settings(&self) -> &LeaseSettings {
        self.inner.settings()
    }
    async fn create_if_absent(&self, lease: &NewLease) -> Result<bool> {
        self.check()?;
        self.inner.create_if_absent(lease).await
    }
    async fn get(&self, key: &LeaseKey) -> Result<Option<Lease>> {
        self.check()?;
        self.inner.get(key).await
    }
    async fn acquire(&self, seen: &Lease) -> Result<Lease> {
        self.check()?;
        self.inner.acquire(seen).await
    }
    async fn renew(&self, held: &Lease) -> Result<Lease> {
        self.check()?;
        self.inner.renew(held).await
    }
    async fn checkpoint(&self, held: &Lease, checkpoint: &Checkpoint) -> Result<Lease> {
        self.check()?;
        self.inner.checkpoint(held, checkpoint).await
    }
    async fn release(&self, held: &Lease, final_checkpoint: Option<&Checkpoint>) -> Result<Lease> {
        self.check()?;
        self.inner.release(held, final_checkpoint).await
    }
    async fn release_to(&self, held: &Lease, to: &str, final_checkpoint: Option<&Checkpoint>) -> Result<Lease> {
        self.check()?;
        self.inner.release_to(held, to, final_checkpoint).await
    }
    async fn request_handoff(&self, seen: &Lease) -> Result<Lease> {
        self.check()?;
        self.inner.request_handoff(seen).await
    }
    async fn withdraw_handoff(&self, seen: &Lease) -> Result<bool> {
        self.check()?;
        self.inner.withdraw_handoff(seen).await
    }
    async fn replace(&self, seen: &Lease, new: &NewLease) -> Result<()> {
        self.check()?;
        self.inner.replace(seen, new).await
    }
    async fn delete(&self, seen: &Lease) -> Result<()> {
        self.check()?;
        self.inner.delete(seen).await
    }
}

#[async_trait]
impl GroupRows for Severable {
    async fn heartbeat(&self) -> Result<()> {
        self.check()?;
        self.inner.heartbeat().await
    }
    async fn leave(&self) -> Result<()> {
        self.check()?;
        self.inner.leave().await
    }
    async fn remove_member(&self, member: &Member) -> Result<()> {
        self.check()?;
        self.inner.remove_member(member).await
    }
    async fn mark_draining(&self, worker: &str) -> Result<bool> {
        self.check()?;
        self.inner.mark_draining(worker).await
    }
    async fn unmark_draining(&self, worker: &str) -> Result<bool> {
        self.check()?;
        self.inner.unmark_draining(worker).await
    }
    async fn announce(&self) -> Result<()> {
        self.check()?;
        self.inner.announce().await
    }
    async fn changes(&self) -> Result<u64> {
        self.check()?;
        self.inner.changes().await
    }
    async fn requeue_secret(&self) -> Result<String> {
        self.check()?;
        self.inner.requeue_secret().await
    }
}

#[async_trait]
impl LeaseStore for Severable {
    async fn list_segment_page(
        &self,
        segment: u32,
        total: u32,
        start: Option<&PageToken>,
        limit: i32,
    ) -> Result<LeasePage> {
        self.check()?;
        if total == 1 {
            self.whole_reads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.list_segment_page(segment, total, start, limit).await
    }
}

/// One shard reading by one worker, as the stand-in source saw it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Reading {
    pub(super) owner: String,
    pub(super) shard: String,
    pub(super) start: Checkpoint,
    /// Where it stopped (`SHARD_END` when it read to the end), `None` while reading or when it lost the lease.
    pub(super) end: Option<Checkpoint>,
    started: Instant,
    /// When it stopped acting on the shard: when it stopped, or at the latest its lease's deadline
    /// when it lost the lease (a holder acts only while `HeldLease::is_valid`).
    ended: Option<Instant>,
}

/// A fixed set of shards (with their parents) standing in for Kinesis. Reading a shard waits for the
/// stop or the loss of its lease and stops at a position of its own (a sequence number no other reading
/// stops at), so the next reader's start shows whose checkpoint it resumed from; shards listed in
/// `ending` are read to their end at once. It records every reading, with when it started and stopped.
#[derive(Default)]
pub(super) struct StandInShards {
    pub(super) shards: Vec<(String, Vec<String>)>,
    pub(super) ending: HashSet<String>,
    /// How long a reader goes on after its lease is lost before it returns (a processor finishing the
    /// records in flight).
    pub(super) linger_after_loss: Duration,
    readings: Mutex<Vec<Reading>>,
    stops: AtomicU64,
}

impl StandInShards {
    pub(super) fn open(count: usize) -> Self {
        Self { shards: (0..count).map(|i| (format!("shard-{i:02}"), vec![])).collect(), ..Self::default() }
    }

    pub(super) fn readings(&self) -> Vec<Reading> {
        self.readings.lock().expect("readings").clone()
    }

    /// Shards read now, per reader.
    pub(super) fn reading_now(&self) -> BTreeMap<String, usize> {
        let mut now = BTreeMap::new();
        for reading in self.readings().into_iter().filter(|r| r.ended.is_none()) {
            *now.entry(reading.owner).or_insert(0) += 1;
        }
        now
    }

    /// Readings of one shard that overlapped in time: a shard read by two workers at once.
    pub(super) fn overlaps(&self) -> Vec<String> {
        let mut last: HashMap<String, Reading> = HashMap::new();
        let mut overlaps = Vec::new();
        for reading in self.readings() {
            if let Some(before) = last.get(&reading.shard)
                && before.ended.is_none_or(|ended| ended > reading.started)
            {
                overlaps.push(format!("{}: {} while {}", reading.shard, reading.owner, before.owner));
            }
            last.insert(reading.shard.clone(), reading);
        }
        overlaps
    }

    /// Readings that did not start where the shard's previous reading left it (its final checkpoint,
    /// or where it started when it lost the lease, as the stand-in checkpoints nothing on the way): a
    /// record processed twice, or skipped.
    pub(super) fn restarts(&self) -> Vec<String> {
        let mut left_at: HashMap<String, Checkpoint> = HashMap::new();
        let mut wrong = Vec::new();
        for reading in self.readings() {
            if let Some(expected) = left_at.get(&reading.shard)
                && *expected != reading.start
            {
                wrong
                    .push(format!("{}: {} started at {}, not {expected}", reading.shard, reading.owner, reading.start));
            }
            left_at.insert(reading.shard.clone(), reading.end.clone().unwrap_or(reading.start.clone()));
        }
        wrong
    }
}

#[async_trait]
impl ShardSource for StandInShards {
    async fn sync(&self, store: &dyn LeaseStore, rows: &[Lease]) -> SyncReport {
        let known: HashSet<&str> = rows.iter().map(|row| row.key.shard_id()).collect();
        let mut report = SyncReport { streams: vec![STREAM.into()], ..SyncReport::default() };
        for (shard, parents) in &self.shards {
            if known.contains(shard.as_str()) {
                continue;
            }
            let new = NewLease {
                key: LeaseKey::new(STREAM, shard.clone()),
                checkpoint: Checkpoint::TrimHorizon,
                parent_shard_ids: parents.clone(),
                stream_created: None,
            };
            if store.create_if_absent(&new).await.unwrap_or(false) {
                report.created += 1;
            }
        }
        report
    }

    async fn incarnation(&self, _stream: &str, _max_age: Duration) -> Incarnation {
        Incarnation::Unknown
    }

    async fn read(&self, context: ShardContext) -> ShardExit {
        let owner = context.held.latest().owner.unwrap_or_default();
        let shard = context.held.key().shard_id().to_string();
        let index = {
            let mut readings = self.readings.lock().expect("readings");
            let start = context.start.clone();
            readings.push(Reading {
                owner,
                shard: shard.clone(),
                start,
                end: None,
                started: Instant::now(),
                ended: None,
            });
            readings.len() - 1
        };
        let exit = if self.ending.contains(&shard) {
            match context.held.checkpoint(&Checkpoint::ShardEnd).await {
                Ok(_) => ShardExit::Ended,
                Err(_) => ShardExit::Lost,
            }
        } else {
            tokio::select! {
                _ = context.stop.cancelled() => {
                    let sequence = 1_000 + self.stops.fetch_add(1, Ordering::SeqCst);
                    ShardExit::Stopped { last: Checkpoint::Sequence(sequence.to_string()) }
                }
                _ = context.held.lost().cancelled() => {
                    tokio::time::sleep(self.linger_after_loss).await;
                    ShardExit::Lost
                }
            }
        };
        let mut readings = self.readings.lock().expect("readings");
        let reading = &mut readings[index];
        reading.ended = Some(Instant::now());
        reading.end = match &exit {
            ShardExit::Ended => Some(Checkpoint::ShardEnd),
            ShardExit::Stopped { last } | ShardExit::Failed { last, .. } => Some(last.clone()),
            ShardExit::Lost => {
                reading.ended = Some(Instant::now().min(context.held.deadline()));
                None
            }
        };
        drop(readings);
        exit
    }
}

pub(super) struct Ignore;

#[async_trait]
impl ShardProcessor for Ignore {
    async fn process(&self, _record: &Record, _outputs: &mut Outputs) -> std::result::Result<(), ProcessError> {
        Ok(())
    }
}
