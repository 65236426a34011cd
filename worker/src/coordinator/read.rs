//! Read: the lease table read as the mode says, and what a read shows beyond the moves (malformed
//! rows, silent members, the shard sync, leases of ours the table shows lost).

use tokio::time::Instant;

use super::mode::Role;
use super::{Coordinator, Read, clip};
use crate::lease::LeasePage;

impl Coordinator {
    /// Reads the table as the mode says (with `segmented`, the change row first when due), unless an
    /// outage's backoff is still running; a failed read is counted and backed off from.
    pub(super) async fn read(&mut self, now: Instant) -> Option<Read> {
        if !self.outage.ready(now) {
            return None;
        }
        if let Some(scan) = self.role.segmented_mut()
            && now >= scan.next_changes_check
        {
            scan.next_changes_check = now + self.settings.renew_interval;
            self.watch_changes(now).await;
        }
        let read = match &self.role {
            Role::Full | Role::Assigned(_) => self.store.list().await.map(|page| Read { page, whole: true }),
            Role::Segmented { rows_per_segment, .. } => self.read_segmented(now, *rows_per_segment).await,
        };
        match read {
            Ok(read) => {
                self.outage.recovered();
                self.metrics().lease_table_missing.set(0);
                Some(read)
            }
            Err(e) => {
                self.metrics().lease_table_failures.inc();
                self.outage.failed("read", &e, now);
                self.metrics().lease_table_missing.set(i64::from(self.outage.is_missing()));
                // A takeover waiting for an expiry is retried after the backoff, not at once.
                self.next_expiry = None;
                None
            }
        }
    }

    /// Takes in what a read shows beyond the moves: malformed rows (reported once), silent members
    /// (their rows removed), the shard sync when due (on whole reads), and leases of ours that the
    /// table shows lost.
    pub(super) async fn observe(&mut self, page: &LeasePage, whole: bool, now: Instant) {
        for malformed in &page.malformed {
            if self.reported_malformed.insert(malformed.key.clone()) {
                tracing::error!(row = %clip(&malformed.key), reason = %clip(&malformed.reason), "malformed lease row skipped");
            }
        }
        if self.role.is_member() {
            self.remove_silent_members(&page.members).await;
        }
        if whole && self.syncs_shards() && now >= self.next_sync {
            let report = self.shards.sync(self.store.as_ref(), &page.leases).await;
            tracing::debug!(?report, "shard sync");
            self.next_sync = now + self.settings.shard_sync_interval;
            if report.created + report.deleted + report.foreign > 0 {
                // This worker's view lacks the rows it just wrote, as everyone else's does.
                self.role.want_whole_at(now);
                self.announce("shard rows created or removed").await;
            }
        }
        // A row that shows another owner means our lease is gone, whatever the renewer has seen so far;
        // so does a row replaced for a new incarnation of its stream (its owner kept until our next write).
        for lease in &page.leases {
            if let Some(running) = self.running.get(&lease.key) {
                if !lease.is_held_by(self.owner()) {
                    running.held.mark_lost("the table shows another owner");
                } else if lease.stream_created != running.held.stream_created() {
                    running.held.mark_lost("the row was replaced for a new incarnation of its stream");
                }
            }
        }
    }

    /// True when this worker lists the shards and writes their rows: every worker with `scan: full`
    /// and with manual assignment, the discovery term's holder only with `scan: segmented`.
    pub(super) fn syncs_shards(&self) -> bool {
        match &self.role {
            Role::Full | Role::Assigned(_) => true,
            Role::Segmented { scan, .. } => scan.term.as_ref().is_some_and(|term| term.is_valid()),
        }
    }
}
