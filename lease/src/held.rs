//! A lease this worker holds: the latest copy of its row, the deadline after which this worker must
//! stop using it, and the signal that it was lost. Every write on it goes through here, one at a time,
//! so a checkpoint never races a renewal on the counter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Checkpoint, Lease, LeaseError, LeaseKey, LeaseStore, LoadMeter, ShardLag};

/// A held lease shared by the coordinator (renewals, release) and the shard's reader (checkpoints).
pub struct HeldLease {
    store: Arc<dyn LeaseStore>,
    key: LeaseKey,
    lease: tokio::sync::Mutex<Lease>,
    /// The copy after the last successful write, readable without waiting for a write in flight.
    latest: Mutex<Lease>,
    deadline: Mutex<Instant>,
    lost: CancellationToken,
    duration: Duration,
    progress: Mutex<Checkpoint>,
    stream_created: Option<i64>,
    lag: ShardLag,
    load: LoadMeter,
    /// Window consumers: records handed to the processor, from the row's count on (see
    /// [`HeldLease::replayed`]).
    replayed: AtomicU64,
}

impl std::fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLease").field("key", &self.key).field("lost", &self.lost.is_cancelled()).finish()
    }
}

impl HeldLease {
    /// Wraps a lease just acquired by a write sent at `sent`.
    pub fn new(store: Arc<dyn LeaseStore>, lease: Lease, sent: Instant) -> Self {
        let duration = store.settings().duration;
        let progress = Mutex::new(lease.checkpoint.clone());
        let replayed = AtomicU64::new(lease.window_records.unwrap_or(0));
        Self {
            stream_created: lease.stream_created,
            store,
            progress,
            key: lease.key.clone(),
            latest: Mutex::new(lease.clone()),
            lease: tokio::sync::Mutex::new(lease),
            deadline: Mutex::new(sent + duration),
            lost: CancellationToken::new(),
            duration,
            lag: ShardLag::default(),
            load: LoadMeter::default(),
            replayed,
        }
    }

    /// How far behind this worker is on the shard: set by its reader, written by renewals and
    /// checkpoints.
    pub fn lag(&self) -> &ShardLag {
        &self.lag
    }

    /// The shard's load meter: counted by its reader, measured by renewals and checkpoints.
    pub fn load(&self) -> &LoadMeter {
        &self.load
    }

    /// Counts `n` more records of a window handed to the processor; renewals and checkpoints carry the
    /// total into the row (`window_records`).
    pub fn replayed(&self, n: u64) {
        self.replayed.fetch_add(n, Ordering::Relaxed);
    }

    /// `lease` carrying the lag and load measured now, for a renewal or checkpoint to write.
    fn with_lag(&self, lease: Lease) -> Lease {
        let lag = self.lag.measure(self.wall_ms());
        let lag_ms = lag.map(|lag| u64::try_from(lag.as_millis()).unwrap_or(u64::MAX));
        let load = self.load.measure(lag == Some(Duration::ZERO)).or(lease.load);
        let window_records = match (lease.window_records, self.replayed.load(Ordering::Relaxed)) {
            (None, 0) => None,
            (_, n) => Some(n),
        };
        Lease { lag_ms, load, window_records, ..lease }
    }

    /// The row's key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// The creation time (epoch ms) of the stream incarnation the row was about when taken, if stamped.
    pub fn stream_created(&self) -> Option<i64> {
        self.stream_created
    }

    /// The row as the last successful write on it returned it (a renewal's answer shows a handoff
    /// request placed since, at no read cost).
    pub fn latest(&self) -> Lease {
        self.latest.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The handoff request on the row as the last write returned it, without copying the row (read
    /// for every held lease at every scan).
    pub fn handoff_to(&self) -> Option<String> {
        self.latest.lock().unwrap_or_else(|p| p.into_inner()).handoff_to.clone()
    }

    /// Cancelled once the lease is lost.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// The instant after which this worker may no longer act on the lease unless a renewal succeeded.
    pub fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True while the lease is held and its deadline has not passed.
    pub fn is_valid(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < self.deadline()
    }

    /// Marks the lease lost; the shard's reader stops at once and writes nothing more.
    pub fn mark_lost(&self, reason: &'static str) {
        if !self.lost.is_cancelled() {
            tracing::warn!(shard = %self.key, reason, "lease lost");
            self.lost.cancel();
        }
    }

    /// Runs one write on the held copy, bounded by the deadline; updates the copy and, when `renewal`,
    /// the deadline (from the time the write was sent, never later).
    async fn write<F, Fut>(&self, renewal: bool, operation: F) -> Result<Lease, LeaseError>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: std::future::Future<Output = Result<Lease, LeaseError>>,
    {
        let mut held = self.lease.lock().await;
        let sent = Instant::now();
        let deadline = self.deadline();
        if self.lost.is_cancelled() || sent >= deadline {
            self.mark_lost("deadline passed");
            return Err(LeaseError::Lost { key: self.key.clone(), reason: "deadline passed before the write" });
        }
        match tokio::time::timeout_at(deadline, operation(held.clone())).await {
            Err(_) => {
                self.mark_lost("deadline passed with a write in flight");
                Err(LeaseError::Lost { key: self.key.clone(), reason: "deadline passed with a write in flight" })
            }
            Ok(Ok(lease)) => {
                *held = lease.clone();
                *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = lease.clone();
                if renewal {
                    *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = sent + self.duration;
                }
                Ok(lease)
            }
            Ok(Err(e)) => {
                if e.is_not_held() {
                    self.mark_lost("the table refused a holder write");
                }
                Err(e)
            }
        }
    }

    /// Renews the lease; returns the new copy (which shows any handoff request).
    pub async fn renew(&self) -> Result<Lease, LeaseError> {
        let store = self.store.clone();
        let lease_with_lag = |lease| self.with_lag(lease);
        self.write(true, |lease| {
            let lease = lease_with_lag(lease);
            async move { store.renew(&lease).await }
        })
        .await
    }

    /// Records progress.
    pub async fn checkpoint(&self, checkpoint: &Checkpoint) -> Result<Lease, LeaseError> {
        let store = self.store.clone();
        let checkpoint = checkpoint.clone();
        let lease_with_lag = |lease| self.with_lag(lease);
        self.write(false, |lease| {
            let lease = lease_with_lag(lease);
            async move { store.checkpoint(&lease, &checkpoint).await }
        })
        .await
    }

    /// Gives the lease up (to `to` when given), with a final checkpoint in the same write. Afterwards
    /// the lease counts as lost to this worker.
    pub async fn release(&self, final_checkpoint: Option<Checkpoint>, to: Option<String>) -> Result<Lease, LeaseError> {
        let store = self.store.clone();
        let result = self
            .write(false, |lease| async move {
                match &to {
                    Some(to) => store.release_to(&lease, to, final_checkpoint.as_ref()).await,
                    None => store.release(&lease, final_checkpoint.as_ref()).await,
                }
            })
            .await;
        self.lost.cancel();
        result
    }

    /// Records that every record up to `position` is processed (what to checkpoint if the reader has
    /// to be abandoned).
    pub fn set_progress(&self, position: Checkpoint) {
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = position;
    }

    /// The position set by [`set_progress`](Self::set_progress), or the checkpoint the lease came with.
    pub fn progress(&self) -> Checkpoint {
        self.progress.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Wall-clock time by the store's clock, epoch ms.
    pub fn wall_ms(&self) -> i64 {
        self.store.settings().clock.wall_ms()
    }
}
