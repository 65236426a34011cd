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
//!   group reads the whole table about once every four scan intervals, whatever its size).
//!
//! The shard list is synced by one worker, the holder of the term row `#term:discovery`: a row taken,
//! renewed and expired like a lease, so any worker that watches it takes it over one lease duration
//! after its holder stops, and none stalls the group meanwhile (rows are only created later).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use tokio::time::Instant;

use super::balance::active;
use super::segments::{segment_count, watched};
use super::{Coordinator, Read};
use crate::lease::renew_until_lost;
use crate::lease::{
    Checkpoint, HeldLease, Lease, LeaseError, LeaseKey, LeasePage, Member, NewLease, changes_key, term_key,
};

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

impl Coordinator {
    /// Reads this worker's segments, or the whole table when it is due or the segments show a change
    /// that calls for it.
    pub(super) async fn read_segmented(&mut self, now: Instant, rows_per_segment: usize) -> Result<Read, LeaseError> {
        let sync_due = self.syncs_shards() && now >= self.next_sync;
        if let Some(view) = &self.view
            && !sync_due
            && now < self.whole_at
        {
            let members = view.live(self.owner());
            let total = segment_count(view.rows(), members.len(), rows_per_segment);
            let mine = watched(&members, total, self.owner());
            if self.reading != (total, mine.clone()) {
                tracing::info!(total, segments = ?mine, workers = members.len(), "reading segments of the lease table");
                let given_up = std::mem::replace(&mut self.reading, (total, mine.clone()));
                if given_up.0 > 0 {
                    // Kept being read for a lease duration: the new readers of these rows start
                    // watching them now, and a dead worker's lease there must not wait for them.
                    let until = now + self.store.settings().duration;
                    self.handing_over.push((given_up.0, given_up.1, until));
                }
            }
            self.handing_over.retain(|(_, _, until)| now < *until);
            let mut reads: Vec<(u32, u32)> = mine.iter().map(|&segment| (segment, total)).collect();
            for (old_total, segments, _) in &self.handing_over {
                reads.extend(segments.iter().map(|&segment| (segment, *old_total)));
            }
            reads.sort_unstable();
            reads.dedup();
            // The segments and the rows asked for, read at once: a scan takes one round trip, as a
            // whole read does, however many segments (a slow scan delays the membership heartbeat).
            let store = self.store.clone();
            let segments = futures::future::try_join_all(reads.iter().map(|&(segment, total)| {
                let store = store.clone();
                async move { store.list_segment(segment, total).await }
            }));
            // Handed over yet? One small read per pending request, instead of a scan.
            let pending: Vec<LeaseKey> = self.requested.keys().cloned().collect();
            let requested = futures::future::join_all(pending.iter().map(|key| {
                let store = store.clone();
                async move { (key, store.get(key).await) }
            }));
            let (segments, requested) = futures::future::join(segments, requested).await;
            let mut page = LeasePage::default();
            for part in segments? {
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
            let changed = self.changed(&page);
            if let Some(view) = &self.view {
                self.freed = page
                    .leases
                    .iter()
                    .filter(|l| l.owner.is_none() && !l.checkpoint.is_shard_end())
                    .filter(|l| view.leases.get(&l.key).is_some_and(|before| before.owner.is_some()))
                    .map(|l| l.key.clone())
                    .collect();
            }
            if let Some(view) = self.view.as_mut() {
                view.merge(&page);
            }
            if !changed {
                return Ok(Read { page, whole: false });
            }
            if !self.freed.is_empty() {
                // Rows freed by their holder (a worker shutting down) are taken from this read at once,
                // as a whole scan would: reading the whole table first would add a read to the
                // handoff, and that read's plan deals the rows to workers that may read no segment
                // and learn of the change only from the change row (a renew interval later). The
                // whole read the change calls for comes at the next scan.
                self.want_whole_at(now);
                return Ok(Read { page, whole: false });
            }
            tracing::debug!("the group changed: reading the whole table");
        }
        let page = self.store.list_segment(0, 1).await?;
        // Askers this read is about to judge: a request from one of them that the whole table does not
        // show (it left, or its row was removed) calls for no further whole read.
        if self.strangers.len() > 1_000 {
            self.strangers.clear();
        }
        let askers: Vec<String> = self
            .running
            .values()
            .filter_map(|r| r.held.handoff_to())
            .chain(
                page.leases.iter().filter(|l| self.running.contains_key(&l.key)).filter_map(|l| l.handoff_to.clone()),
            )
            .collect();
        self.strangers.extend(askers);
        let mut view = TableView::default();
        view.merge(&page);
        let changes = changes_key();
        self.changes_seen = Some(page.terms.iter().find(|t| t.key == changes).map_or(0, |t| t.counter));
        let workers = u32::try_from(view.live(self.owner()).len()).unwrap_or(u32::MAX);
        let shape = GroupShape::of(&view, self.owner());
        // A group still forming (workers starting, leases being taken or handed over, rows created)
        // is read again after a renew interval: a worker that reads no segment, or whose segments
        // hide the change, learns only from whole reads that it is short. A group at rest is read
        // rarely.
        let settled = self.shape.as_ref() == Some(&shape);
        self.shape = Some(shape);
        self.view = Some(view);
        self.last_whole = now;
        self.whole_at = if settled {
            now + self.settings.shard_sync_interval.max(self.settings.scan_interval * 4 * workers)
        } else {
            now + self.reread_interval()
        };
        Ok(Read { page, whole: true })
    }

    /// How soon a worker that is short, or whose group is still forming, reads the whole table again:
    /// a renew interval per twenty live workers, so that however large the group, it makes about twenty
    /// such reads a renew interval between all its workers (a hundred workers starting at once would
    /// otherwise read a 1,000-row table 33 times a second).
    pub(super) fn reread_interval(&self) -> std::time::Duration {
        let workers = self.view.as_ref().map_or(1, |v| v.live(self.owner()).len());
        let twenties = u32::try_from(workers.div_ceil(20)).unwrap_or(u32::MAX).max(1);
        self.settings.renew_interval * twenties
    }

    /// Tells the group the shares moved (`scan: segmented` only): workers that read no segment, or
    /// not the one that changed, read the whole table when they next read the change row.
    pub(super) async fn announce(&mut self, why: &str) {
        if !matches!(self.settings.scan, super::ScanMode::Segmented { .. }) {
            return;
        }
        match self.store.announce().await {
            // Our own signal calls for no whole read of ours beyond what the change already asked.
            Ok(()) => self.changes_seen = self.changes_seen.map(|seen| seen + 1),
            Err(e) => tracing::debug!(error = %e, why, "change not announced; the others see it at a whole read"),
        }
    }

    /// Reads the group's change row (one small eventually consistent read a renew interval) and reads the whole table soon
    /// when another worker announced a change since.
    pub(super) async fn watch_changes(&mut self, now: Instant) {
        match self.store.changes().await {
            Ok(counter) => {
                if self.changes_seen.is_some_and(|seen| seen != counter) {
                    tracing::debug!(counter, "the group announced a change: reading the whole table");
                    self.want_whole_at(now);
                }
                self.changes_seen = Some(counter);
            }
            Err(e) => tracing::debug!(error = %e, "change row not read"),
        }
    }

    /// After the plan of a scan on which this worker gave nothing: a request on one of its leases that it
    /// refused (it holds no more than its share, as its view has it) means the asker's view differs, so
    /// it is judged again on a whole read within a re-read interval, rather than at the next whole read
    /// of a group at rest (minutes at scale). A request a whole read already judged is not judged again;
    /// a whole read notes the requests it judged.
    pub(super) fn judge_requests(&mut self, whole: bool, gave: bool) {
        if whole {
            self.judged_requests = self
                .running
                .iter()
                .filter_map(|(key, r)| r.held.handoff_to().map(|asker| (key.clone(), asker)))
                .collect();
            return;
        }
        if gave {
            return;
        }
        let me = self.owner();
        let refused = self.running.iter().any(|(key, r)| {
            r.give_to.is_none()
                && r.held.handoff_to().is_some_and(|asker| asker != me && self.judged_requests.get(key) != Some(&asker))
        });
        if refused {
            self.want_whole_at(self.last_whole + self.reread_interval());
        }
    }

    /// Brings the next whole read forward to `at`.
    pub(super) fn want_whole_at(&mut self, at: Instant) {
        self.whole_at = self.whole_at.min(at);
    }

    /// True when `page` (rows read now) shows a change that moves the shares since the view: a row
    /// freed or new, a shard ended, a worker new or gone silent, or a handoff request on a lease of
    /// this worker from a worker the view does not show alive.
    fn changed(&self, page: &LeasePage) -> bool {
        let Some(view) = &self.view else { return true };
        let me = self.owner();
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
            Some(before) => before.alive != member.alive,
        });
        // A request from a worker the view does not know (it joined since the last whole read): read
        // the group to judge it. A request from a worker known dead is ignored, as `plan` does.
        let strangers = page
            .leases
            .iter()
            .filter(|lease| self.running.contains_key(&lease.key))
            .filter_map(|lease| lease.handoff_to.clone())
            .chain(self.running.values().filter_map(|r| r.held.handoff_to()))
            .any(|asker| !alive(&asker) && !view.members.contains_key(&asker) && !self.strangers.contains(&asker));
        rows || members || strangers
    }

    /// The view to plan on: the rows as read, with this worker's running leases as its last write on
    /// each returned them (a handoff request shows there within a renew interval) unless read now.
    pub(super) fn view_for_plan(&self, fresh: &HashSet<LeaseKey>) -> (Vec<Lease>, Vec<Member>) {
        let Some(view) = &self.view else { return (Vec::new(), Vec::new()) };
        let mut leases = view.leases.clone();
        for (key, running) in &self.running {
            let latest = running.held.latest();
            let newer = match leases.get(key) {
                None => true,
                Some(row) if fresh.contains(key) => latest.counter > row.counter,
                Some(row) => latest.counter >= row.counter,
            };
            if newer {
                leases.insert(key.clone(), latest);
            }
        }
        (leases.into_values().collect(), view.members.values().cloned().collect())
    }

    /// Free rows read now that nobody has taken for a re-read interval and a renew interval although they could run (every
    /// worker that read them may believe itself at its share): taken whatever the shares say, so a
    /// lease never waits for a whole read; balance is restored by handoff. A row that looks held back
    /// only by parents this worker has not read lately gets its parents read first.
    pub(super) async fn orphaned_free_rows(&mut self, page: &LeasePage, taking: &[Lease], now: Instant) -> Vec<Lease> {
        // Longer than a short worker waits between whole reads: the worker the matching dealt the row
        // to takes it first, and the segment's readers only if it does not.
        let patience = self.reread_interval() + self.settings.renew_interval;
        let free: Vec<Lease> = page
            .leases
            .iter()
            .filter(|l| l.owner.is_none() && !l.checkpoint.is_shard_end() && !taking.iter().any(|t| t.key == l.key))
            .cloned()
            .collect();
        let mut orphans = Vec::new();
        let freed = std::mem::take(&mut self.freed);
        for lease in free {
            // Freed since this worker's last read of it (its holder left or gave up): a reader of its
            // segment takes it at once, so a leaving worker's shards move within a scan; those who
            // read no segment learn of the change from the change row and ask for their share.
            if freed.contains(&lease.key) {
                if self.parents_done_now(&lease).await {
                    tracing::info!(shard = %lease.key, "lease freed by its holder; taking it");
                    orphans.push(lease);
                }
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
            if !self.parents_done_now(&lease).await {
                continue;
            }
            tracing::info!(shard = %lease.key, "free lease left untaken; taking it");
            orphans.push(lease);
        }
        let view = self.view.as_ref();
        self.free_since.retain(|key, _| view.and_then(|v| v.leases.get(key)).is_some_and(|l| l.owner.is_none()));
        orphans
    }

    /// Whether `lease`'s parents are all finished, reading those the view shows unfinished again.
    async fn parents_done_now(&mut self, lease: &Lease) -> bool {
        for parent in &lease.parent_shard_ids {
            let key = LeaseKey::new(lease.key.stream(), parent.as_str());
            let known_done = self
                .view
                .as_ref()
                .and_then(|v| v.leases.get(&key))
                .is_some_and(|row| row.checkpoint == Checkpoint::ShardEnd);
            if known_done {
                continue;
            }
            match self.store.get(&key).await {
                Ok(Some(row)) => {
                    let done = row.checkpoint.is_shard_end();
                    if let Some(view) = self.view.as_mut() {
                        view.leases.insert(key, row);
                    }
                    if !done {
                        return false;
                    }
                }
                // A parent without a row was cleaned up after it finished.
                Ok(None) => {}
                Err(_) => return false,
            }
        }
        let leases: Vec<Lease> = self.view.as_ref().map(|v| v.leases.values().cloned().collect()).unwrap_or_default();
        let mut all = leases;
        if !all.iter().any(|l| l.key == lease.key) {
            all.push(lease.clone());
        }
        active(&all).iter().any(|l| l.key == lease.key)
    }

    /// Takes the discovery term when it is free or this worker saw it expire; creates its row when a
    /// whole read shows none. Notes its loss.
    pub(super) async fn keep_term(&mut self, page: &LeasePage, whole: bool) {
        if let Some(term) = &self.term {
            if !term.lost().is_cancelled() {
                return;
            }
            tracing::info!("discovery term lost: another worker lists the shards");
            self.term = None;
        }
        let key = term_key(DISCOVERY_TERM);
        let row = match page.terms.iter().find(|t| t.key == key) {
            Some(row) => row.clone(),
            None if whole => {
                let new = NewLease {
                    key: key.clone(),
                    checkpoint: Checkpoint::TrimHorizon,
                    parent_shard_ids: vec![],
                    stream_created: None,
                };
                if let Err(e) = self.store.create_if_absent(&new).await {
                    tracing::debug!(error = %e, "discovery term row not created");
                    return;
                }
                match self.store.get(&key).await {
                    Ok(Some(row)) => row,
                    _ => return,
                }
            }
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
                self.term = Some(held);
                self.next_sync = Instant::now();
            }
            Err(LeaseError::HeldByOther { remaining, .. }) => {
                let at = Instant::now() + remaining;
                self.next_expiry = Some(self.next_expiry.map_or(at, |next| next.min(at)));
            }
            Err(e) => tracing::debug!(error = %e, "discovery term not taken"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(shard: &str, owner: Option<&str>, counter: u64) -> Lease {
        Lease {
            key: LeaseKey::new("s", shard),
            owner: owner.map(String::from),
            expiry_ms: None,
            counter,
            checkpoint: Checkpoint::TrimHorizon,
            parent_shard_ids: vec![],
            handoff_to: None,
            stream_created: None,
        }
    }

    #[test]
    fn the_shape_changes_with_the_spread_and_the_group_but_not_with_renewals() {
        let page = |owners: &[Option<&str>], counter: u64, members: &[&str]| LeasePage {
            leases: owners.iter().enumerate().map(|(i, o)| lease(&format!("s{i}"), *o, counter)).collect(),
            members: members.iter().map(|m| Member { owner: (*m).into(), counter, alive: true }).collect(),
            ..LeasePage::default()
        };
        let shape = |page: &LeasePage| {
            let mut view = TableView::default();
            view.merge(page);
            GroupShape::of(&view, "w1")
        };
        let at_rest = shape(&page(&[Some("w1"), Some("w2")], 1, &["w2"]));
        assert_eq!(at_rest, shape(&page(&[Some("w1"), Some("w2")], 7, &["w2"])), "renewals move no share");
        assert_ne!(at_rest, shape(&page(&[Some("w2"), Some("w2")], 1, &["w2"])), "a lease moved");
        assert_ne!(at_rest, shape(&page(&[Some("w1"), None], 1, &["w2"])), "a lease freed");
        assert_ne!(at_rest, shape(&page(&[Some("w1"), Some("w2")], 1, &["w2", "w3"])), "a worker joined");
        assert_ne!(at_rest, shape(&page(&[Some("w1"), Some("w2"), None], 1, &["w2"])), "a shard appeared");
    }

    #[test]
    fn a_partial_read_updates_only_the_rows_it_read() {
        let mut view = TableView::default();
        let whole = LeasePage {
            leases: vec![lease("a", Some("w1"), 1), lease("b", Some("w2"), 1)],
            members: vec![Member { owner: "w1".into(), counter: 1, alive: true }],
            ..LeasePage::default()
        };
        view.merge(&whole);
        let part = LeasePage { leases: vec![lease("b", None, 2)], ..LeasePage::default() };
        view.merge(&part);
        assert_eq!(view.leases[&LeaseKey::new("s", "a")].owner.as_deref(), Some("w1"));
        assert_eq!(view.leases[&LeaseKey::new("s", "b")].owner, None);
        assert_eq!(view.live("w3"), vec!["w1".to_string(), "w3".to_string()]);
        assert_eq!(view.rows(), 3);
    }
}
