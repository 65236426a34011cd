//! The plan of `scan: segmented`: requests judged, only rows read now acted on, the segments'
//! orphans taken, a short worker's asks left to a whole read; the view planned on.

use std::collections::HashSet;

use tokio::time::Instant;

use super::Orphan;
use crate::coordinator::Coordinator;
use crate::coordinator::balance::Moves;
use crate::lease::{Lease, LeaseKey, LeasePage};

impl Coordinator {
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
        let requests = requests.collect();
        if let Some(scan) = self.role.segmented_mut() {
            scan.judge_requests(&me, whole, !moves.give.is_empty(), requests, renew);
        }
        // Only rows read now are acted on: a copy from an older whole read may be stale.
        moves.take.retain(|l| fresh.contains(&l.key));
        moves.expired_candidates.retain(|l| fresh.contains(&l.key));
        // Only a segment's readers take its orphans: on a whole read, only those freed in its segments;
        // a draining worker takes none.
        let orphans =
            if moves.draining { Vec::new() } else { self.orphaned_free_rows(page, &moves.take, whole, now).await };
        moves.take.extend(orphans);
        let short = self.running.len() + moves.take.len() + self.requested.len() < moves.target;
        if !whole && short {
            // Handoffs are asked for from a whole read only (the holders' counters must be current),
            // and a view that is partly old may show no donor at all (rows free when last read whole,
            // taken since by others): still short, read it all, at most once a renew interval.
            moves.ask.clear();
            if let Some(scan) = self.role.segmented_mut() {
                let at = scan.reread_at(&me, renew);
                scan.want_whole_at(at);
            }
        }
    }

    /// The view to plan on (see [`SegmentedScan::view_for_plan`](super::SegmentedScan::view_for_plan)).
    pub(in crate::coordinator) fn view_for_plan(
        &self,
        fresh: &HashSet<LeaseKey>,
    ) -> (Vec<Lease>, Vec<crate::lease::Member>) {
        let latest = self.running.iter().map(|(key, running)| (key.clone(), running.held.latest()));
        self.role.segmented().map(|scan| scan.view_for_plan(fresh, latest)).unwrap_or_default()
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
        let renew = self.settings.renew_interval;
        let found = match self.role.segmented_mut() {
            Some(scan) => {
                let patience = scan.reread_interval(&me, renew) + renew;
                scan.orphans(page, taking, whole, patience, now)
            }
            None => Vec::new(),
        };
        let mut orphans = Vec::new();
        for orphan in found {
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
}
