//! The reads and writes of `scan: segmented`: this worker's segments (or the whole table), the change
//! row, the rows of pending requests and of orphans' parents, and the discovery term. What they show
//! is handed to [`SegmentedScan`](super::SegmentedScan), which decides.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::time::Instant;

use super::{AfterSegments, DISCOVERY_TERM, Orphan};
use crate::coordinator::balance::Moves;
use crate::coordinator::{Coordinator, Read};
use crate::lease::renew_until_lost;
use crate::lease::{Checkpoint, HeldLease, Lease, LeaseError, LeaseKey, LeasePage, NewLease, term_key};

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
        let segments = if sync_due { None } else { self.segmented.segments_to_read(&me, rows_per_segment, lease, now) };
        if let Some(segments) = segments {
            let page = self.read_segments(&segments).await?;
            let askers = self.askers(&page);
            match self.segmented.note_segments(&page, &me, &askers, now) {
                AfterSegments::Plan | AfterSegments::TakeFreedThenReadWhole => {
                    return Ok(Read { page, whole: false });
                }
                AfterSegments::ReadWhole => {}
            }
        }
        let page = self.store.list_segment(0, 1).await?;
        let askers = self.askers(&page);
        self.segmented.note_whole(&page, &me, askers, &self.settings, now);
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

    /// The segmented part of a scan's plan: requests judged, only rows read now acted on, the
    /// segments' orphans taken, and a short worker's asks left to a whole read.
    pub(in crate::coordinator) async fn plan_segmented(
        &mut self,
        moves: &mut Moves,
        page: &LeasePage,
        fresh: &HashSet<LeaseKey>,
        whole: bool,
        now: Instant,
    ) {
        let me = self.owner().to_string();
        let requests = self.running.iter().map(|(key, r)| (key.clone(), r.held.handoff_to(), r.give_to.is_some()));
        let renew = self.settings.renew_interval;
        self.segmented.judge_requests(&me, whole, !moves.give.is_empty(), requests.collect(), renew);
        // Only rows read now are acted on: a copy from an older whole read may be stale.
        moves.take.retain(|l| fresh.contains(&l.key));
        moves.expired_candidates.retain(|l| fresh.contains(&l.key));
        // Only a segment's readers take its orphans: on a whole read, only those freed in its segments.
        let orphans = self.orphaned_free_rows(page, &moves.take, whole, now).await;
        moves.take.extend(orphans);
        let short = self.running.len() + moves.take.len() + self.requested.len() < moves.target;
        if !whole && short {
            // Handoffs are asked for from a whole read only (the holders' counters must be current),
            // and a view that is partly old may show no donor at all (rows free when last read whole,
            // taken since by others): still short, read it all, at most once a renew interval.
            moves.ask.clear();
            let at = self.segmented.reread_at(&me, renew);
            self.segmented.want_whole_at(at);
        }
    }

    /// The view to plan on (see [`SegmentedScan::view_for_plan`](super::SegmentedScan::view_for_plan)).
    pub(in crate::coordinator) fn view_for_plan(
        &self,
        fresh: &HashSet<LeaseKey>,
    ) -> (Vec<Lease>, Vec<crate::lease::Member>) {
        let latest = self.running.iter().map(|(key, running)| (key.clone(), running.held.latest()));
        self.segmented.view_for_plan(fresh, latest)
    }

    /// Tells the group the shares moved (`scan: segmented` only): workers that read no segment, or
    /// not the one that changed, read the whole table when they next read the change row.
    pub(in crate::coordinator) async fn announce(&mut self, why: &str) {
        if !self.is_segmented() {
            return;
        }
        match self.store.announce().await {
            Ok(()) => self.segmented.announced(),
            Err(e) => tracing::debug!(error = %e, why, "change not announced; the others see it at a whole read"),
        }
    }

    /// Reads the group's change row (one small eventually consistent read a renew interval) and reads
    /// the whole table soon when another worker announced a change since.
    pub(in crate::coordinator) async fn watch_changes(&mut self, now: Instant) {
        match self.store.changes().await {
            Ok(counter) => {
                if self.segmented.note_changes(counter, now) {
                    tracing::debug!(counter, "the group announced a change: reading the whole table");
                }
            }
            Err(e) => tracing::debug!(error = %e, "change row not read"),
        }
    }

    /// The orphans of this worker's segments (see [`SegmentedScan::orphans`](super::SegmentedScan::orphans))
    /// whose parents are all finished; a row that looks held back only by parents this worker has not
    /// read lately gets its parents read first.
    async fn orphaned_free_rows(
        &mut self,
        page: &LeasePage,
        taking: &[Lease],
        whole: bool,
        now: Instant,
    ) -> Vec<Lease> {
        let me = self.owner().to_string();
        let patience = self.segmented.reread_interval(&me, self.settings.renew_interval) + self.settings.renew_interval;
        let mut orphans = Vec::new();
        for orphan in self.segmented.orphans(page, taking, whole, patience, now) {
            let (lease, message) = match orphan {
                Orphan::Freed(lease) => {
                    // The rest of the holder's releases may land just after this read: look again soon.
                    self.rescan_at = Some(now + self.settings.scan_interval / 5);
                    (lease, "lease freed by its holder; taking it")
                }
                Orphan::Untaken(lease) => (lease, "free lease left untaken; taking it"),
            };
            if self.parents_done_now(&lease).await {
                tracing::info!(shard = %lease.key, message);
                orphans.push(lease);
            }
        }
        orphans
    }

    /// Whether `lease`'s parents are all finished, reading those the view shows unfinished again.
    pub(in crate::coordinator) async fn parents_done_now(&mut self, lease: &Lease) -> bool {
        for parent in &lease.parent_shard_ids {
            let key = LeaseKey::new(lease.key.stream(), parent.as_str());
            if self.segmented.row(&key).is_some_and(|row| row.checkpoint == Checkpoint::ShardEnd) {
                continue;
            }
            match self.store.get(&key).await {
                Ok(Some(row)) => {
                    let done = row.checkpoint.is_shard_end();
                    self.segmented.remember(row);
                    if !done {
                        return false;
                    }
                }
                // A parent without a row was cleaned up after it finished.
                Ok(None) => {}
                Err(_) => return false,
            }
        }
        self.segmented.is_active(lease)
    }

    /// Takes the discovery term when it is free or this worker saw it expire; creates its row when a
    /// whole read shows none. Notes its loss.
    pub(in crate::coordinator) async fn keep_term(&mut self, page: &LeasePage, whole: bool) {
        if let Some(term) = &self.segmented.term {
            if !term.lost().is_cancelled() {
                return;
            }
            tracing::info!("discovery term lost: another worker lists the shards");
            self.segmented.term = None;
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
                self.segmented.term = Some(held);
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
