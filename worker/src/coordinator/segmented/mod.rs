//! `lease.scan: segmented`: reading the lease table at a cost that does not grow with the group.
//!
//! The table is split into segments (a DynamoDB parallel Scan's `Segment`/`TotalSegments`), about
//! `segmentRows` rows each; every segment is read every scan interval by two workers
//! (`segments.rs`), which watch its rows' counters exactly as a whole scan would, so a dead worker's
//! leases are taken after one lease duration by a worker that watched them, even when one of the two
//! readers is the dead worker. Everything else comes without reading the table:
//! - handoff requests on this worker's leases arrive in its renewals' answers (`ReturnValues`);
//! - leases handed to this worker are read with one `GetItem` each while a request is pending;
//! - the whole table is read when a read shows a change that moves the shares (a row freed, a shard
//!   ended, a worker joined or went silent, a request from a worker this one does not know, a lease
//!   taken over), when this worker is short and must ask, for the shard sync of the discovery term's
//!   holder, and otherwise once every `max(shardSyncInterval, 4 x scanInterval x workers)` (so the
//!   group reads the whole table about once every four scan intervals, whatever its size);
//! - rows freed by their holder (a worker shutting down) are taken by their segment's readers from the
//!   read that shows them, before that whole read.
//!
//! The shard list is synced by one worker, the holder of the term row `#term:discovery`: a row taken,
//! renewed and expired like a lease, so any worker that watches it takes it over one lease duration
//! after its holder stops, and none stalls the group meanwhile (rows are only created later).
//!
//! [`SegmentedScan`] holds what this mode keeps between scans and decides from what was read (pure:
//! unit-tested below with a paused clock); the coordinator's reads, plan and acts for it are in
//! `read.rs`, `plan.rs` and `act.rs` beside it, and which worker reads which segment in `segments.rs`.

mod act;
mod plan;
mod read;
pub(super) mod segments;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::CoordinatorSettings;
use super::balance::active;
use crate::lease::{HeldLease, Lease, LeaseKey, LeasePage, Member, changes_key};
use segments::{segment_count, watched};

/// The name of the shard discovery's term row.
const DISCOVERY_TERM: &str = "discovery";

/// The table as this worker last read it: rows in its segments as of the last scan, the rest as of
/// the last whole read.
#[derive(Debug, Default)]
pub(super) struct TableView {
    leases: BTreeMap<LeaseKey, Lease>,
    members: BTreeMap<String, Member>,
    terms: BTreeMap<LeaseKey, Lease>,
}

impl TableView {
    fn merge(&mut self, page: &LeasePage) {
        for lease in &page.leases {
            self.leases.insert(lease.key.clone(), lease.clone());
        }
        for member in &page.members {
            self.members.insert(member.owner.clone(), member.clone());
        }
        for term in &page.terms {
            self.terms.insert(term.key.clone(), term.clone());
        }
    }

    /// The live workers' ids, `me` among them, sorted.
    fn live(&self, me: &str) -> Vec<String> {
        let mut live: Vec<String> = self.members.values().filter(|m| m.alive).map(|m| m.owner.clone()).collect();
        live.push(me.to_string());
        live.sort();
        live.dedup();
        live
    }

    fn rows(&self) -> usize {
        self.leases.len() + self.members.len() + self.terms.len()
    }
}

/// What the shares depend on, as one whole read showed it: two equal shapes in a row mean the group is
/// at rest.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct GroupShape {
    live: Vec<String>,
    held: BTreeMap<Option<String>, usize>,
}

impl GroupShape {
    fn of(view: &TableView, me: &str) -> Self {
        let leases: Vec<Lease> = view.leases.values().cloned().collect();
        let mut held = BTreeMap::new();
        for lease in active(&leases) {
            *held.entry(lease.owner.clone()).or_default() += 1;
        }
        Self { live: view.live(me), held }
    }
}

/// What a segment read calls for next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AfterSegments {
    /// Nothing that moves the shares: plan on the segments read.
    Plan,
    /// Rows were freed by their holder: plan on the segments read (their readers take the rows at
    /// once), and read the whole table at the next scan.
    TakeFreedThenReadWhole,
    /// The group changed: read the whole table now.
    ReadWhole,
}

/// A free row this worker may take whatever the shares say, and why.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Orphan {
    /// Freed by its holder since this worker last read it.
    Freed(Lease),
    /// Free and untaken for longer than the worker it was dealt to needed.
    Untaken(Lease),
}

/// What `scan: segmented` keeps between scans.
#[derive(Debug)]
pub(super) struct SegmentedScan {
    /// When the group's change row is read next.
    pub(super) next_changes_check: Instant,
    /// The table as last read, whole or in part.
    view: Option<TableView>,
    /// When the whole table is read next (brought forward by changes).
    whole_at: Instant,
    /// When the whole table was last read.
    last_whole: Instant,
    /// The group as the last whole read showed it.
    shape: Option<GroupShape>,
    /// The counter of the group's change row as last read.
    changes_seen: Option<u64>,
    /// Rows the last read showed freed since this worker last read them, in its segments.
    freed: HashSet<LeaseKey>,
    /// The rows this worker's last segment read returned: its segments, as far as a whole read can tell.
    segment_rows: HashSet<LeaseKey>,
    /// Free rows seen in this worker's reads, with the counter and since when.
    free_since: HashMap<LeaseKey, (u64, Instant)>,
    /// The discovery term, while this worker holds it.
    pub(super) term: Option<Arc<HeldLease>>,
    /// The segments this worker read last (of how many), logged when they change.
    reading: (u32, Vec<u32>),
    /// Segments given up (of how many), still read until the instant given.
    handing_over: Vec<(u32, Vec<u32>, Instant)>,
    /// Askers of handoffs already judged on a whole read.
    strangers: HashSet<String>,
    /// The askers of requests on this worker's leases as of its last whole read.
    judged_requests: HashMap<LeaseKey, String>,
}

impl SegmentedScan {
    /// Nothing read yet: the first scan reads the whole table.
    pub(super) fn new(now: Instant) -> Self {
        Self {
            next_changes_check: now,
            view: None,
            whole_at: now,
            last_whole: now,
            shape: None,
            changes_seen: None,
            freed: HashSet::new(),
            segment_rows: HashSet::new(),
            free_since: HashMap::new(),
            term: None,
            reading: (0, Vec::new()),
            handing_over: Vec::new(),
            strangers: HashSet::new(),
            judged_requests: HashMap::new(),
        }
    }

    /// The segments (with their totals) this worker reads now, or `None` when the whole table is due
    /// (nothing read yet, or `whole_at` passed). Segments this worker stopped reading are read on for
    /// a lease duration, so a dead worker's lease there does not wait for their new readers.
    pub(super) fn segments_to_read(
        &mut self,
        me: &str,
        rows_per_segment: usize,
        lease: Duration,
        now: Instant,
    ) -> Option<Vec<(u32, u32)>> {
        let view = self.view.as_ref()?;
        if now >= self.whole_at {
            return None;
        }
        let members = view.live(me);
        let total = segment_count(view.rows(), members.len(), rows_per_segment);
        let mine = watched(&members, total, me);
        if self.reading != (total, mine.clone()) {
            tracing::info!(total, segments = ?mine, workers = members.len(), "reading segments of the lease table");
            let given_up = std::mem::replace(&mut self.reading, (total, mine.clone()));
            if given_up.0 > 0 {
                self.handing_over.push((given_up.0, given_up.1, now + lease));
            }
        }
        self.handing_over.retain(|(_, _, until)| now < *until);
        let mut reads: Vec<(u32, u32)> = mine.iter().map(|&segment| (segment, total)).collect();
        for (old_total, segments, _) in &self.handing_over {
            reads.extend(segments.iter().map(|&segment| (segment, *old_total)));
        }
        reads.sort_unstable();
        reads.dedup();
        Some(reads)
    }

    /// Takes in a segment read (`page`, this worker's askers on it) and says what it calls for.
    pub(super) fn note_segments(
        &mut self,
        page: &LeasePage,
        me: &str,
        askers: &[String],
        now: Instant,
    ) -> AfterSegments {
        let changed = self.changed(page, me, askers);
        self.segment_rows = page.leases.iter().map(|l| l.key.clone()).collect();
        self.freed = self.freed_in(page, |_| true);
        if let Some(view) = self.view.as_mut() {
            view.merge(page);
        }
        if !changed {
            return AfterSegments::Plan;
        }
        if !self.freed.is_empty() {
            // Taken from this read at once, as a whole scan would: reading the whole table first would
            // add a read to the handoff, and that read's plan deals the rows to workers that may read
            // no segment and learn of the change only from the change row (a renew interval later).
            self.want_whole_at(now);
            return AfterSegments::TakeFreedThenReadWhole;
        }
        tracing::debug!("the group changed: reading the whole table");
        AfterSegments::ReadWhole
    }

    /// Takes in a whole read (`page`, this worker's askers on it): the view, the group's shape, and
    /// when to read it all again.
    pub(super) fn note_whole(
        &mut self,
        page: &LeasePage,
        me: &str,
        askers: Vec<String>,
        settings: &CoordinatorSettings,
        now: Instant,
    ) {
        // Askers this read is about to judge: a request from one of them that the whole table does not
        // show (it left, or its row was removed) calls for no further whole read.
        if self.strangers.len() > 1_000 {
            self.strangers.clear();
        }
        self.strangers.extend(askers);
        // A holder's releases can straddle a scan: rows of this worker's segments freed after its last
        // segment read are still news here, and still this worker's to take at once.
        self.freed = self.freed_in(page, |key| self.segment_rows.contains(key));
        let mut view = TableView::default();
        view.merge(page);
        let changes = changes_key();
        self.changes_seen = Some(page.terms.iter().find(|t| t.key == changes).map_or(0, |t| t.counter));
        let workers = u32::try_from(view.live(me).len()).unwrap_or(u32::MAX);
        let shape = GroupShape::of(&view, me);
        // A group still forming (workers starting, leases being taken or handed over, rows created)
        // is read again after a renew interval: a worker that reads no segment, or whose segments
        // hide the change, learns only from whole reads that it is short. A group at rest is read
        // rarely.
        let settled = self.shape.as_ref() == Some(&shape);
        self.shape = Some(shape);
        self.view = Some(view);
        self.last_whole = now;
        self.whole_at = if settled {
            now + settings.shard_sync_interval.max(settings.scan_interval * 4 * workers)
        } else {
            now + self.reread_interval(me, settings.renew_interval)
        };
    }

    /// The rows `page` shows free (and unfinished) that the view showed held, among those `mine` accepts.
    fn freed_in(&self, page: &LeasePage, mine: impl Fn(&LeaseKey) -> bool) -> HashSet<LeaseKey> {
        let Some(view) = &self.view else { return HashSet::new() };
        page.leases
            .iter()
            .filter(|l| l.owner.is_none() && !l.checkpoint.is_shard_end() && mine(&l.key))
            .filter(|l| view.leases.get(&l.key).is_some_and(|before| before.owner.is_some()))
            .map(|l| l.key.clone())
            .collect()
    }

    /// How soon a worker that is short, or whose group is still forming, reads the whole table again:
    /// a renew interval per twenty live workers, so that however large the group, it makes about twenty
    /// such reads a renew interval between all its workers (a hundred workers starting at once would
    /// otherwise read a 1,000-row table 33 times a second).
    pub(super) fn reread_interval(&self, me: &str, renew_interval: Duration) -> Duration {
        let workers = self.view.as_ref().map_or(1, |v| v.live(me).len());
        let twenties = u32::try_from(workers.div_ceil(20)).unwrap_or(u32::MAX).max(1);
        renew_interval * twenties
    }

    /// A re-read interval after the last whole read.
    pub(super) fn reread_at(&self, me: &str, renew_interval: Duration) -> Instant {
        self.last_whole + self.reread_interval(me, renew_interval)
    }

    /// Brings the next whole read forward to `at`.
    pub(super) fn want_whole_at(&mut self, at: Instant) {
        self.whole_at = self.whole_at.min(at);
    }

    /// The change row read `counter`: true (and a whole read brought forward) when another worker
    /// announced a change since this worker last read or wrote it.
    pub(super) fn note_changes(&mut self, counter: u64, now: Instant) -> bool {
        let announced = self.changes_seen.is_some_and(|seen| seen != counter);
        if announced {
            self.want_whole_at(now);
        }
        self.changes_seen = Some(counter);
        announced
    }

    /// This worker announced a change: its own signal calls for no whole read of its own.
    pub(super) fn announced(&mut self) {
        self.changes_seen = self.changes_seen.map(|seen| seen + 1);
    }

    /// After the plan of a scan: a whole read notes the requests on this worker's leases (`requests`:
    /// each running lease, its asker, and whether it is being handed over). On a segment read on which
    /// this worker gave nothing, a request it refused (it holds no more than its share, as its view has
    /// it) means the asker's view differs, so it is judged again on a whole read within a re-read
    /// interval, rather than at the next whole read of a group at rest (minutes at scale). A request a
    /// whole read already judged is not judged again.
    pub(super) fn judge_requests(
        &mut self,
        me: &str,
        whole: bool,
        gave: bool,
        requests: Vec<(LeaseKey, Option<String>, bool)>,
        renew_interval: Duration,
    ) {
        if whole {
            self.judged_requests =
                requests.into_iter().filter_map(|(key, asker, _)| asker.map(|asker| (key, asker))).collect();
            return;
        }
        if gave {
            return;
        }
        let refused = requests.iter().any(|(key, asker, giving)| {
            !giving && asker.as_ref().is_some_and(|asker| asker != me && self.judged_requests.get(key) != Some(asker))
        });
        if refused {
            self.want_whole_at(self.reread_at(me, renew_interval));
        }
    }

    /// True when `page` (rows read now) shows a change that moves the shares since the view: a row
    /// freed or new, a shard ended, a worker new, gone silent, draining or back from draining, or a handoff request on a lease of
    /// this worker (`askers`) from a worker the view does not show alive.
    fn changed(&self, page: &LeasePage, me: &str, askers: &[String]) -> bool {
        let Some(view) = &self.view else { return true };
        let alive = |owner: &str| owner == me || view.members.get(owner).is_some_and(|m| m.alive);
        let rows = page.leases.iter().any(|lease| {
            let before = view.leases.get(&lease.key);
            let freed = lease.owner.is_none()
                && !lease.checkpoint.is_shard_end()
                && before.is_none_or(|b| b.owner.is_some() || b.counter != lease.counter);
            let ended = lease.checkpoint.is_shard_end() && before.is_some_and(|b| !b.checkpoint.is_shard_end());
            freed || ended
        });
        let members = page.members.iter().any(|member| match view.members.get(&member.owner) {
            None => member.owner != me,
            Some(before) => before.alive != member.alive || before.draining != member.draining,
        });
        // A request from a worker the view does not know (it joined since the last whole read): read
        // the group to judge it. A request from a worker known dead is ignored, as `plan` does.
        let strangers = askers
            .iter()
            .any(|asker| !alive(asker) && !view.members.contains_key(asker) && !self.strangers.contains(asker));
        rows || members || strangers
    }

    /// The view to plan on: the rows as read, with this worker's running leases as its last write on
    /// each returned them (`latest`; a handoff request shows there within a renew interval) unless read
    /// now (`fresh`) at a newer counter.
    pub(super) fn view_for_plan(
        &self,
        fresh: &HashSet<LeaseKey>,
        latest: impl Iterator<Item = (LeaseKey, Lease)>,
    ) -> (Vec<Lease>, Vec<Member>) {
        let Some(view) = &self.view else { return (Vec::new(), Vec::new()) };
        let mut leases = view.leases.clone();
        for (key, latest) in latest {
            let newer = match leases.get(&key) {
                None => true,
                Some(row) if fresh.contains(&key) => latest.counter > row.counter,
                Some(row) => latest.counter >= row.counter,
            };
            if newer {
                leases.insert(key, latest);
            }
        }
        (leases.into_values().collect(), view.members.values().cloned().collect())
    }

    /// Free rows read now (`page`, less those the plan takes) that this worker may take whatever the
    /// shares say: those of its segments freed by their holder since it last read them, at once; the
    /// others once they have stayed free and untaken (same counter) for `patience`, which is longer
    /// than the worker the matching dealt them to needs. Their parents are still to be checked.
    /// On a whole read (`whole`) only the freed rows: every worker reads the others, and would race for
    /// them.
    pub(super) fn orphans(
        &mut self,
        page: &LeasePage,
        taking: &[Lease],
        whole: bool,
        patience: Duration,
        now: Instant,
    ) -> Vec<Orphan> {
        let freed = std::mem::take(&mut self.freed);
        let mut orphans = Vec::new();
        let free = page
            .leases
            .iter()
            .filter(|l| l.owner.is_none() && !l.checkpoint.is_shard_end() && !taking.iter().any(|t| t.key == l.key));
        for lease in free {
            if freed.contains(&lease.key) {
                orphans.push(Orphan::Freed(lease.clone()));
                continue;
            }
            if whole {
                continue;
            }
            let since = match self.free_since.get(&lease.key) {
                Some(&(counter, since)) if counter == lease.counter => since,
                _ => {
                    self.free_since.insert(lease.key.clone(), (lease.counter, now));
                    continue;
                }
            };
            if now.duration_since(since) < patience {
                continue;
            }
            self.free_since.insert(lease.key.clone(), (lease.counter, now));
            orphans.push(Orphan::Untaken(lease.clone()));
        }
        if whole {
            return orphans;
        }
        let view = self.view.as_ref();
        self.free_since.retain(|key, _| view.and_then(|v| v.leases.get(key)).is_some_and(|l| l.owner.is_none()));
        orphans
    }

    /// The row of `key` as the view has it.
    pub(super) fn row(&self, key: &LeaseKey) -> Option<&Lease> {
        self.view.as_ref().and_then(|v| v.leases.get(key))
    }

    /// Puts a row read on its own into the view.
    pub(super) fn remember(&mut self, row: Lease) {
        if let Some(view) = self.view.as_mut() {
            view.leases.insert(row.key.clone(), row);
        }
    }

    /// Whether `lease` should be running somewhere (unfinished, its parents finished) as the view has
    /// its parents.
    pub(super) fn is_active(&self, lease: &Lease) -> bool {
        let mut all: Vec<Lease> = self.view.as_ref().map(|v| v.leases.values().cloned().collect()).unwrap_or_default();
        if !all.iter().any(|l| l.key == lease.key) {
            all.push(lease.clone());
        }
        active(&all).iter().any(|l| l.key == lease.key)
    }
}

#[cfg(test)]
mod tests;
