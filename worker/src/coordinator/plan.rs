//! Plan: this worker's moves from what was read. The balance itself is pure (`balance.rs`); here is
//! what the mode adds: manual assignment takes exactly its shards, `segmented` plans over its view
//! and adds its segments' orphans (`segmented/plan.rs`).

use std::collections::HashSet;

use tokio::time::Instant;

use super::Coordinator;
use super::balance::{Moves, View, active, plan};
use super::load_balance::{self, Balance};
use super::mode::{Role, Share};
use super::notices::Peers;
use crate::lease::{Checkpoint, Lease, LeaseKey, LeasePage, Member};

impl Coordinator {
    /// This worker's moves after a read: the balance plan over the rows (with `segmented`, over the
    /// running view, acting only on rows read now, plus the orphans of its segments).
    pub(super) async fn plan(&mut self, page: &LeasePage, whole: bool, now: Instant) -> Moves {
        let timeout = self.settings.handoff_timeout;
        let running_keys: HashSet<LeaseKey> = self.running.keys().cloned().collect();
        self.requested.retain(|key, at| !running_keys.contains(key) && at.elapsed() < timeout);
        let fresh: HashSet<LeaseKey> = page.leases.iter().map(|l| l.key.clone()).collect();
        let segmented = self.role.segmented().is_some();
        let mut moves = if segmented {
            let (leases, members) = self.view_for_plan(&fresh);
            self.plan_over(&leases, &members, &running_keys)
        } else {
            self.plan_over(&page.leases, &page.members, &running_keys)
        };
        tracing::debug!(
            whole,
            target = moves.target,
            running = self.running.len(),
            take = moves.take.len(),
            ask = moves.ask.len(),
            give = moves.give.len(),
            "planned"
        );
        let share = Share { target: moves.target, workers: moves.workers, draining: moves.draining };
        if share != self.share {
            self.share = share;
            tracing::info!(
                target = moves.target,
                workers = moves.workers,
                draining = moves.draining,
                running = self.running.len(),
                "fair share"
            );
        }
        if segmented {
            self.plan_segmented(&mut moves, page, &fresh, whole, now).await;
        }
        moves
    }

    /// The moves over `leases` and `members`, the peers to notify and the handoffs seen noted on the way.
    fn plan_over(&mut self, leases: &[Lease], members: &[Member], running: &HashSet<LeaseKey>) -> Moves {
        let timeout = self.settings.handoff_timeout;
        let me = self.owner().to_string();
        self.handoffs.peers = Peers::from_view(leases, members, &me);
        self.handoffs.observe(leases, members, &me, timeout);
        match &self.role {
            Role::Assigned(assigned) => {
                let take = leases
                    .iter()
                    .filter(|l| assigned.contains(&l.key) && !running.contains(&l.key) && !l.checkpoint.is_shard_end())
                    .cloned()
                    .collect();
                Moves { target: assigned.len(), take, ..Moves::default() }
            }
            Role::Full | Role::Segmented { .. } => {
                let requested: HashSet<LeaseKey> = self.requested.keys().cloned().collect();
                let view = View { me: &me, leases, members, running, requested: &requested };
                match &self.settings.balance {
                    Balance::Count => plan(&view),
                    Balance::Load(tuning) => load_balance::plan(&view, tuning, &mut self.load, Instant::now()),
                }
            }
        }
    }

    /// Whether `lease`'s parents are all finished, reading those not known finished again (with
    /// `segmented`, those its view shows unfinished, keeping what it reads in the view).
    pub(super) async fn parents_done_now(&mut self, lease: &Lease) -> bool {
        for parent in &lease.parent_shard_ids {
            let key = LeaseKey::new(lease.key.stream(), parent.as_str());
            let view = self.role.segmented().and_then(|scan| scan.row(&key));
            if view.is_some_and(|row| row.checkpoint == Checkpoint::ShardEnd) {
                continue;
            }
            match self.store.get(&key).await {
                Ok(Some(row)) => {
                    let done = row.checkpoint.is_shard_end();
                    if let Some(scan) = self.role.segmented_mut() {
                        scan.remember(row);
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
        match self.role.segmented() {
            Some(scan) => scan.is_active(lease),
            None => !active(std::slice::from_ref(lease)).is_empty(),
        }
    }
}
