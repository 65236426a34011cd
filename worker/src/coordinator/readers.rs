//! The shards this worker reads: a reader started with its renewer on a lease taken, and a reader's
//! end answered (release, hand over, or let go of a lost lease).

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Coordinator, Running};
use crate::lease::{Checkpoint, HeldLease, Lease, LeaseKey, renew_until_lost};
use crate::shard::{ShardContext, ShardExit, read_with_hooks};

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
        let context = ShardContext {
            held: held.clone(),
            runner: self.runner.clone(),
            metrics: self.metrics.clone(),
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
                let exit = read_with_hooks(context, |context| async move { shards.read(context).await }).await;
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
                self.role.want_whole_at(Instant::now());
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
}

/// Releases `held` (to the worker `to`, after a requested handoff) with its final checkpoint; true when
/// it was handed over.
pub(super) async fn release(held: &HeldLease, final_checkpoint: Option<Checkpoint>, to: Option<String>) -> bool {
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
