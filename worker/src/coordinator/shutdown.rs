//! Shutdown: every shard's in-flight records finished under one deadline, checkpointed and released
//! (each told at once to the peer it is freed for), and the group left.

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Coordinator;
use super::mode::Role;
use super::readers::release;
use crate::lease::LeaseKey;

impl Coordinator {
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
        let left_first = matches!(self.role, Role::Segmented { .. });
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
        if let Some(term) = self.role.segmented_mut().and_then(|scan| scan.term.take()) {
            match term.release(None, None).await {
                Ok(_) => tracing::info!("discovery term released"),
                Err(e) => tracing::debug!(error = %e, "discovery term not released; it expires on its own"),
            }
        }
        if matches!(self.role, Role::Full)
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
