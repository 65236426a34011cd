//! Act: the moves carried out (hand over what is asked for, take free, expired and orphaned leases,
//! ask for handoffs), and the group told when the shares moved.

use tokio::time::Instant;

use super::Coordinator;
use super::balance::Moves;
use crate::discovery::Incarnation;
use crate::lease::{Lease, LeaseError};

impl Coordinator {
    /// Carries the moves out: hands over what is asked for, takes leases (free, expired, orphaned),
    /// asks for handoffs.
    pub(super) async fn act(&mut self, moves: Moves) {
        let Moves { take, expired_candidates, ask, give, .. } = moves;
        for (key, to) in give {
            if let Some(running) = self.running.get_mut(&key)
                && running.give_to.is_none()
            {
                tracing::info!(shard = %key, to, "handing lease over on request");
                running.give_to = Some(to);
                running.stop.cancel();
            }
        }
        self.next_expiry = None;
        let mut took_over = false;
        for lease in take.into_iter().chain(expired_candidates) {
            took_over |= self.take(lease).await;
        }
        if took_over {
            self.announce("leases taken over").await;
        }
        for lease in ask {
            self.ask(lease).await;
        }
    }

    /// Acquires `lease` and starts reading it; true when it was taken over from a worker that stopped
    /// renewing it (with `segmented`, the group changed: the caller tells the others).
    pub(super) async fn take(&mut self, lease: Lease) -> bool {
        if self.running.contains_key(&lease.key) {
            // The reader of an earlier holding, its lease lost, is still finishing its records (a slow
            // processor, a stalled machine): a second reader of the shard in this process would process
            // them again, and the first one's end would be taken for the second's. Taken once it ended.
            tracing::debug!(shard = %lease.key, "the previous reader of this shard is still finishing; not taken yet");
            return false;
        }
        if !self.same_incarnation(&lease).await {
            return false;
        }
        let sent = Instant::now();
        let from_another = lease.owner.as_deref().is_some_and(|o| o != self.owner());
        let mut took_over = false;
        match self.store.acquire(&lease).await {
            Ok(acquired) => {
                if from_another {
                    self.metrics().lease_takeovers.inc();
                    tracing::info!(shard = %lease.key, from = lease.owner.as_deref().unwrap_or("-"),
                        "lease taken over: its holder stopped renewing it");
                    if let Some(scan) = self.role.segmented_mut() {
                        // A worker died or stalled: the group changed, so read it all at the next
                        // scan, and tell those who read it rarely (once for all the takeovers of this scan).
                        scan.want_whole_at(Instant::now());
                        took_over = true;
                    }
                }
                self.start(acquired, sent).await
            }
            Err(LeaseError::HeldByOther { remaining, .. }) => {
                let at = Instant::now() + remaining;
                self.next_expiry = Some(self.next_expiry.map_or(at, |next| next.min(at)));
            }
            Err(e @ LeaseError::NotObserved { .. }) => tracing::trace!(shard = %lease.key, error = %e, "not taken"),
            Err(e @ LeaseError::ItemTooLarge { .. }) => {
                // Retried at every scan (an operator may trim the row), reported once like a malformed row.
                if self.reported_malformed.insert(lease.key.to_string()) {
                    tracing::error!(row = %lease.key, error = %e, "lease row too large to take; skipped");
                }
            }
            Err(e) if e.is_not_held() => {
                tracing::debug!(shard = %lease.key, error = %e, "lost the race for a lease")
            }
            Err(e) => tracing::warn!(shard = %lease.key, error = %e, "acquire failed"),
        }
        took_over
    }

    /// Asks the holder of `lease` to hand it over.
    async fn ask(&mut self, lease: Lease) {
        let mut placed = self.store.request_handoff(&lease).await;
        if self.role.segmented().is_some() && matches!(placed, Err(LeaseError::ConditionFailed { .. })) {
            // The holder renewed since the whole read (likely on a large table): read the row
            // again and ask once more if it is still the holder's and its request is still the one
            // the plan judged (none, or a stale one to replace), rather than wait for the next
            // whole read.
            if let Ok(Some(now)) = self.store.get(&lease.key).await
                && now.owner == lease.owner
                && now.handoff_to == lease.handoff_to
            {
                placed = self.store.request_handoff(&now).await;
            }
        }
        match placed {
            Ok(_) => {
                tracing::info!(shard = %lease.key, holder = lease.owner.as_deref().unwrap_or("-"), "asked for a handoff");
                self.requested.insert(lease.key.clone(), Instant::now());
            }
            Err(e) => tracing::debug!(shard = %lease.key, error = %e, "handoff request not placed"),
        }
    }

    /// True when `lease` belongs to its stream as it exists now: a row of a former incarnation (the
    /// stream deleted and recreated under its name) is never taken, since its checkpoint is about
    /// another stream; the next shard sync, brought forward, replaces it.
    async fn same_incarnation(&mut self, lease: &Lease) -> bool {
        let Some(created) = lease.stream_created else { return true };
        match self.shards.incarnation(lease.key.stream(), self.settings.renew_interval).await {
            Incarnation::Known(now) if now == created => true,
            Incarnation::Known(_) => {
                tracing::info!(shard = %lease.key, "row of a former incarnation of its stream not taken; syncing shards");
                self.next_sync = Instant::now();
                false
            }
            Incarnation::Gone => {
                tracing::debug!(shard = %lease.key, "stream gone; lease not taken");
                false
            }
            // Cannot be told now (throttled, no permission): taken as before stamps existed.
            Incarnation::Unknown => true,
        }
    }

    /// Tells the group the shares moved (`scan: segmented` only): workers that read no segment, or
    /// not the one that changed, read the whole table when they next read the change row.
    pub(super) async fn announce(&mut self, why: &str) {
        if self.role.segmented().is_none() {
            return;
        }
        match self.store.announce().await {
            Ok(()) => {
                if let Some(scan) = self.role.segmented_mut() {
                    scan.announced();
                }
            }
            Err(e) => tracing::debug!(error = %e, why, "change not announced; the others see it at a whole read"),
        }
    }
}
