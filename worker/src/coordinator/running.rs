//! The shards this worker runs: starting a reader with its renewer on a lease taken, answering a
//! reader's exit (release, hand over, or let go of a lost lease), the membership heartbeat, and the
//! shutdown that finishes, checkpoints and releases everything.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Coordinator, Running, ScanMode};
use crate::lease::{Checkpoint, HeldLease, Lease, LeaseKey, LeaseStore, renew_until_lost};
use crate::metrics::Metrics;
use crate::shard::{ShardExit, ShardRun, run_shard};

impl Coordinator {
    /// Starts reading a lease just acquired (`sent`: when the acquire went out), with its renewer.
    pub(super) async fn start(&mut self, lease: Lease, sent: Instant) {
        let key = lease.key.clone();
        tracing::info!(shard = %key, checkpoint = %lease.checkpoint, counter = lease.counter, "lease acquired");
        let held = Arc::new(HeldLease::new(self.store.clone(), lease.clone(), sent));
        let metrics = self.metrics().clone();
        tokio::spawn(renew_until_lost(held.clone(), self.settings.renew_interval, move || {
            metrics.renewals_failed.inc();
        }));
        let stop = CancellationToken::new();
        let run = ShardRun {
            held: held.clone(),
            runner: self.runner.clone(),
            processor: self.processors.create(&key),
            start: lease.checkpoint,
            settings: self.settings.reader.clone(),
            stop: stop.clone(),
        };
        let exits = self.exits_tx.clone();
        let shards = self.shards.clone();
        let reader_key = key.clone();
        // Every log line of the shard's reader and its records carries the shard (`spans` in JSON logs).
        let span = tracing::info_span!("shard", shard = %key);
        let reader = tokio::spawn(
            async move {
                let exit = run_shard(run, |run| async move { shards.read(run).await }).await;
                let _ = exits.send((reader_key, exit));
            }
            .instrument(span),
        );
        self.running.insert(key, Running { held, stop, give_to: None, reader });
        self.metrics().leases_held.set(self.running.len() as i64);
    }

    /// A shard's reader ended: release the lease (to the asker, after a requested handoff) with what
    /// is done, or let go of it when it was lost.
    pub(super) async fn on_exit(&mut self, key: LeaseKey, exit: ShardExit) {
        let Some(running) = self.running.remove(&key) else { return };
        self.metrics().leases_held.set(self.running.len() as i64);
        let (final_checkpoint, to) = match exit {
            ShardExit::Lost => {
                tracing::warn!(shard = %key, "stopped reading a lost shard; nothing checkpointed after the loss");
                return;
            }
            ShardExit::Ended => {
                // Its children may now be read: the shares change.
                self.segmented.want_whole_at(Instant::now());
                self.announce("a shard ended").await;
                (None, None)
            }
            ShardExit::Stopped { last } => (Some(last), running.give_to),
            ShardExit::Failed { reason, last } => {
                tracing::error!(shard = %key, reason, "shard failed; releasing it");
                // The stream may be gone or recreated: the next sync tells, soon rather than at its time.
                self.next_sync = Instant::now();
                (Some(last), None)
            }
        };
        if release(&running.held, final_checkpoint, to).await {
            self.metrics().lease_handoffs.inc();
        }
    }

    /// Finishes every shard's in-flight records under one deadline, checkpoints and releases them,
    /// and leaves the group.
    pub(super) async fn shut_down(mut self) {
        tracing::info!(owner = self.owner(), leases = self.running.len(), "shutting down: finishing in-flight records");
        // Every shard finishes its records and runs its processor's closing hook at once, all under
        // one deadline.
        let deadline = Instant::now() + self.settings.graceful_timeout;
        // With segmented scans the others see the freed rows in their segments and read the whole
        // table then: leaving first makes that read show the group without this worker, so the freed
        // rows count in their shares and are taken at once rather than after a renew interval.
        let left_first = matches!(self.settings.scan, ScanMode::Segmented { .. }) && self.settings.assigned.is_none();
        if left_first && let Err(e) = self.store.leave().await {
            tracing::warn!(error = %e, "could not remove the membership row; it expires on its own");
        }
        // Each released row is told at once to the peer it is freed for, so it need not wait for a scan.
        let mut notices = self.notice_plan();
        let mut sending = JoinSet::new();
        for running in self.running.values() {
            running.stop.cancel();
        }
        while !self.running.is_empty() {
            tokio::select! {
                Some((key, exit)) = self.exits_rx.recv() => {
                    self.on_exit(key.clone(), exit).await;
                    if let Some(address) = notices.remove(&key) {
                        self.notify(&key, address, &mut sending);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        // Readers that did not finish in time are abandoned: their in-flight records are redelivered
        // from the last record they completed.
        let abandoned: Vec<_> = self.running.drain().collect();
        for (key, running) in abandoned {
            tracing::warn!(shard = %key, "in-flight records did not finish in time; abandoning them");
            running.reader.abort();
            let progress = running.held.progress();
            release(&running.held, Some(progress), None).await;
            if let Some(address) = notices.remove(&key) {
                self.notify(&key, address, &mut sending);
            }
        }
        self.metrics().leases_held.set(0);
        self.release_handed_unread().await;
        // Each send is bounded by its own timeout.
        sending.join_all().await;
        if left_first {
            self.announce("a worker left").await;
        }
        if let Some(term) = self.segmented.term.take() {
            match term.release(None, None).await {
                Ok(_) => tracing::info!("discovery term released"),
                Err(e) => tracing::debug!(error = %e, "discovery term not released; it expires on its own"),
            }
        }
        if self.settings.assigned.is_none()
            && !left_first
            && let Err(e) = self.store.leave().await
        {
            tracing::warn!(error = %e, "could not remove the membership row; it expires on its own");
        }
        tracing::info!("worker stopped");
    }

    /// Releases rows handed to this worker after its requests that it had not started reading: a
    /// worker stopped right after a handoff (a rolling deploy's new pod, stopped again) must not leave
    /// them to expire. One read per pending request.
    async fn release_handed_unread(&mut self) {
        let pending: Vec<LeaseKey> =
            self.requested.keys().filter(|key| !self.running.contains_key(*key)).cloned().collect();
        for key in pending {
            let Ok(Some(row)) = self.store.get(&key).await else { continue };
            if !row.is_held_by(self.owner()) {
                continue;
            }
            match self.store.release(&row, None).await {
                Ok(_) => tracing::info!(shard = %key, "lease handed over to this worker released unread"),
                Err(e) => tracing::debug!(shard = %key, error = %e, "lease handed over not released; it expires"),
            }
        }
    }
}

/// Writes this worker's membership row every `interval` until `stop`; a failed beat is counted and
/// logged, and the next one comes sooner.
pub(super) async fn beat(
    store: Arc<dyn LeaseStore>,
    interval: Duration,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut failing = false;
    loop {
        let next = match store.heartbeat().await {
            Ok(()) => {
                if failing {
                    tracing::info!("membership heartbeat written again");
                }
                failing = false;
                interval
            }
            Err(e) => {
                metrics.lease_table_failures.inc();
                if !failing {
                    tracing::warn!(error = %e, "membership heartbeat failed; retrying");
                }
                failing = true;
                interval / 3
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(next) => {}
        }
    }
}

/// Releases `held` (to the worker `to`, after a requested handoff) with its final checkpoint; true when
/// it was handed over.
async fn release(held: &HeldLease, final_checkpoint: Option<Checkpoint>, to: Option<String>) -> bool {
    let key = held.key().clone();
    match held.release(final_checkpoint.clone(), to.clone()).await {
        // The counter the release wrote places it among the row's writes (tests order the holds of
        // different workers by it, not by when they read the lines).
        Ok(released) => match to {
            Some(to) => {
                let counter = released.counter;
                tracing::info!(shard = %key, to, checkpoint = ?final_checkpoint, counter, "lease handed over");
                true
            }
            None => {
                let counter = released.counter;
                tracing::info!(shard = %key, checkpoint = ?final_checkpoint, counter, "lease released");
                false
            }
        },
        Err(e) => {
            tracing::warn!(shard = %key, error = %e, "release failed; the lease will expire instead");
            false
        }
    }
}
