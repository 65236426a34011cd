//! The acts of `scan: segmented` beyond the moves: the discovery term taken (its holder lists the
//! shards for the group), its row created when a whole read shows none.

use std::sync::Arc;

use tokio::time::Instant;

use super::DISCOVERY_TERM;
use crate::coordinator::Coordinator;
use crate::lease::renew_until_lost;
use crate::lease::{Checkpoint, HeldLease, Lease, LeaseError, LeaseKey, LeasePage, NewLease, term_key};

impl Coordinator {
    /// Takes the discovery term when it is free or this worker saw it expire; creates its row when a
    /// whole read shows none. Notes its loss.
    pub(in crate::coordinator) async fn keep_term(&mut self, page: &LeasePage, whole: bool) {
        let Some(scan) = self.role.segmented_mut() else { return };
        if let Some(term) = &scan.term {
            if !term.lost().is_cancelled() {
                return;
            }
            tracing::info!("discovery term lost: another worker lists the shards");
            scan.term = None;
        }
        let key = term_key(DISCOVERY_TERM);
        let row = match page.terms.iter().find(|t| t.key == key) {
            Some(row) => row.clone(),
            None if whole => match self.create_term(&key).await {
                Some(row) => row,
                None => return,
            },
            None => return,
        };
        let sent = Instant::now();
        match self.store.acquire(&row).await {
            Ok(acquired) => {
                tracing::info!(
                    counter = acquired.counter,
                    "discovery term taken: this worker lists the shards for the group"
                );
                let held = Arc::new(HeldLease::new(self.store.clone(), acquired, sent));
                let metrics = self.metrics().clone();
                tokio::spawn(renew_until_lost(held.clone(), self.settings.renew_interval, move || {
                    metrics.renewals_failed.inc();
                }));
                if let Some(scan) = self.role.segmented_mut() {
                    scan.term = Some(held);
                }
                self.next_sync = Instant::now();
            }
            Err(LeaseError::HeldByOther { remaining, .. }) => {
                let at = Instant::now() + remaining;
                self.next_expiry = Some(self.next_expiry.map_or(at, |next| next.min(at)));
            }
            Err(e) => tracing::debug!(error = %e, "discovery term not taken"),
        }
    }

    /// Creates the discovery term's row if absent and reads it back.
    async fn create_term(&self, key: &LeaseKey) -> Option<Lease> {
        let new = NewLease {
            key: key.clone(),
            checkpoint: Checkpoint::TrimHorizon,
            parent_shard_ids: vec![],
            stream_created: None,
        };
        if let Err(e) = self.store.create_if_absent(&new).await {
            tracing::debug!(error = %e, "discovery term row not created");
            return None;
        }
        self.store.get(key).await.ok().flatten()
    }
}
