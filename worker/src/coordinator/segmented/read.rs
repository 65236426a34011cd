//! The reads of `scan: segmented`: this worker's segments (or the whole table), the rows of pending
//! requests, and the group's change row. What they show is handed to
//! [`SegmentedScan`](super::SegmentedScan), which decides.

use std::collections::HashSet;

use tokio::time::Instant;

use super::AfterSegments;
use crate::coordinator::{Coordinator, Read};
use crate::lease::{LeaseError, LeaseKey, LeasePage};

impl Coordinator {
    /// Reads this worker's segments, or the whole table when it is due or the segments show a change
    /// that calls for it.
    pub(in crate::coordinator) async fn read_segmented(
        &mut self,
        now: Instant,
        rows_per_segment: usize,
    ) -> Result<Read, LeaseError> {
        let sync_due = self.syncs_shards() && now >= self.next_sync;
        let lease = self.store.settings().duration;
        let me = self.owner().to_string();
        let segments = match self.role.segmented_mut() {
            Some(scan) if !sync_due => scan.segments_to_read(&me, rows_per_segment, lease, now),
            _ => None,
        };
        if let Some(segments) = segments {
            let page = self.read_segments(&segments).await?;
            let askers = self.askers(&page);
            let Some(scan) = self.role.segmented_mut() else { return Ok(Read { page, whole: false }) };
            match scan.note_segments(&page, &me, &askers, now) {
                AfterSegments::Plan | AfterSegments::TakeFreedThenReadWhole => {
                    return Ok(Read { page, whole: false });
                }
                AfterSegments::ReadWhole => {}
            }
        }
        let page = self.store.list_segment(0, 1).await?;
        let askers = self.askers(&page);
        if let Some(scan) = self.role.segmented_mut() {
            scan.note_whole(&page, &me, askers, &self.settings, now);
        }
        Ok(Read { page, whole: true })
    }

    /// The rows of `segments`, each once, and those of this worker's pending requests (one small read
    /// each, instead of a scan), read at once: a scan takes one round trip, as a whole read does,
    /// however many segments (a slow scan delays the membership heartbeat).
    async fn read_segments(&self, segments: &[(u32, u32)]) -> Result<LeasePage, LeaseError> {
        let store = self.store.clone();
        let parts = futures::future::try_join_all(segments.iter().map(|&(segment, total)| {
            let store = store.clone();
            async move { store.list_segment(segment, total).await }
        }));
        let pending: Vec<LeaseKey> = self.requested.keys().cloned().collect();
        let requested = futures::future::join_all(pending.iter().map(|key| {
            let store = store.clone();
            async move { (key, store.get(key).await) }
        }));
        let (parts, requested) = futures::future::join(parts, requested).await;
        let mut page = LeasePage::default();
        for part in parts? {
            page.absorb(part);
        }
        // Segments of two splits overlap: each row once.
        let mut read: HashSet<LeaseKey> = HashSet::new();
        page.leases.retain(|l| read.insert(l.key.clone()));
        let mut members: HashSet<String> = HashSet::new();
        page.members.retain(|m| members.insert(m.owner.clone()));
        let mut terms: HashSet<LeaseKey> = HashSet::new();
        page.terms.retain(|t| terms.insert(t.key.clone()));
        for (key, got) in requested {
            match got {
                Ok(Some(lease)) if !read.contains(key) => page.leases.push(lease),
                Ok(_) => {}
                Err(e) => tracing::debug!(shard = %key, error = %e, "requested lease not read"),
            }
        }
        Ok(page)
    }

    /// The askers of handoff requests on this worker's leases: as its renewals returned them, and as
    /// the rows in `page` show them.
    fn askers(&self, page: &LeasePage) -> Vec<String> {
        self.running
            .values()
            .filter_map(|r| r.held.handoff_to())
            .chain(
                page.leases.iter().filter(|l| self.running.contains_key(&l.key)).filter_map(|l| l.handoff_to.clone()),
            )
            .collect()
    }

    /// Reads the group's change row (one small eventually consistent read a renew interval) and reads
    /// the whole table soon when another worker announced a change since.
    pub(in crate::coordinator) async fn watch_changes(&mut self, now: Instant) {
        match self.store.changes().await {
            Ok(counter) => {
                if self.role.segmented_mut().is_some_and(|scan| scan.note_changes(counter, now)) {
                    tracing::debug!(counter, "the group announced a change: reading the whole table");
                }
            }
            Err(e) => tracing::debug!(error = %e, "change row not read"),
        }
    }
}
