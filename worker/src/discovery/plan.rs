//! Deciding, from a shard listing and the table's rows, which rows to create and which to clean up.
//! Pure: unit-tested without any service.

use std::collections::{HashMap, HashSet};

use crate::kinesis::ShardInfo;
use crate::lease::{Checkpoint, Lease, LeaseKey, NewLease};

/// What a shard sync should write.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SyncPlan {
    /// Rows to create for shards without one.
    pub create: Vec<NewLease>,
    /// Rows of finished shards whose children have all started (or whose shard is gone).
    pub delete: Vec<Lease>,
}

/// Plans the rows of the streams listed in `listings` (streams that failed to list are left alone).
///
/// - A shard without a row gets one; a child (a shard with a parent still known) starts at
///   TRIM_HORIZON so nothing written before its reader started is missed; any other shard starts at
///   `root_start`.
/// - A closed shard whose row is gone but whose child has a row was finished and cleaned up: it is
///   not created again (that would read it twice).
/// - A row at SHARD_END, held by nobody, is deleted once every child has a row that was taken at least
///   once, or once the shard no longer appears in the listing.
pub fn plan(listings: &[(String, Vec<ShardInfo>)], rows: &[Lease], root_start: &Checkpoint) -> SyncPlan {
    let by_key: HashMap<&LeaseKey, &Lease> = rows.iter().map(|row| (&row.key, row)).collect();
    let mut result = SyncPlan::default();
    for (stream, shards) in listings {
        let listed: HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
        let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
        for shard in shards {
            for parent in &shard.parents {
                children.entry(parent.as_str()).or_default().push(shard.id.as_str());
            }
        }
        let row_of = |shard: &str| by_key.get(&LeaseKey::new(stream.as_str(), shard)).copied();
        for shard in shards {
            if row_of(&shard.id).is_some() {
                continue;
            }
            let kids = children.get(shard.id.as_str()).map(Vec::as_slice).unwrap_or_default();
            if shard.closed && kids.iter().any(|kid| row_of(kid).is_some()) {
                continue;
            }
            let known_parent = shard.parents.iter().any(|p| listed.contains(p.as_str()) || row_of(p).is_some());
            let checkpoint = if known_parent { Checkpoint::TrimHorizon } else { root_start.clone() };
            result.create.push(NewLease {
                key: LeaseKey::new(stream.as_str(), shard.id.as_str()),
                checkpoint,
                parent_shard_ids: shard.parents.clone(),
            });
        }
        for row in rows.iter().filter(|row| row.key.stream() == stream) {
            if !row.checkpoint.is_shard_end() || row.owner.is_some() {
                continue;
            }
            let shard = row.key.shard_id();
            let kids = children.get(shard).map(Vec::as_slice).unwrap_or_default();
            let children_started =
                !kids.is_empty() && kids.iter().all(|kid| row_of(kid).is_some_and(|r| r.counter > 0));
            if children_started || !listed.contains(shard) {
                result.delete.push(row.clone());
            }
        }
    }
    result
}

/// True when every parent of `lease` has been read to its end (or its row is gone, which happens only
/// after its children started), so `lease` may be read without breaking per-key order.
pub fn parents_done(lease: &Lease, rows_by_key: &HashMap<LeaseKey, &Lease>) -> bool {
    lease.parent_shard_ids.iter().all(|parent| {
        rows_by_key
            .get(&LeaseKey::new(lease.key.stream(), parent.as_str()))
            .is_none_or(|row| row.checkpoint.is_shard_end())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parents: &[&str], closed: bool) -> ShardInfo {
        ShardInfo { id: id.into(), parents: parents.iter().map(|p| p.to_string()).collect(), closed }
    }

    fn row(shard: &str, checkpoint: Checkpoint, counter: u64, parents: &[&str]) -> Lease {
        Lease {
            key: LeaseKey::new("s", shard),
            owner: None,
            expiry_ms: None,
            counter,
            checkpoint,
            parent_shard_ids: parents.iter().map(|p| p.to_string()).collect(),
            handoff_to: None,
        }
    }

    #[test]
    fn new_stream_gets_rows_at_the_start_position_and_children_at_trim_horizon() {
        let listing =
            vec![("s".to_string(), vec![shard("0", &[], true), shard("1", &["0"], false), shard("2", &["0"], false)])];
        let plan = plan(&listing, &[], &Checkpoint::Latest);
        let created: Vec<(String, Checkpoint)> =
            plan.create.iter().map(|n| (n.key.shard_id().to_string(), n.checkpoint.clone())).collect();
        assert_eq!(
            created,
            vec![
                ("0".into(), Checkpoint::Latest),
                ("1".into(), Checkpoint::TrimHorizon),
                ("2".into(), Checkpoint::TrimHorizon)
            ]
        );
        assert_eq!(plan.create[1].parent_shard_ids, vec!["0"]);
    }

    #[test]
    fn a_child_whose_parents_are_long_gone_is_a_root() {
        let listing = vec![("s".to_string(), vec![shard("5", &["1", "2"], false)])];
        assert_eq!(plan(&listing, &[], &Checkpoint::Latest).create[0].checkpoint, Checkpoint::Latest);
    }

    #[test]
    fn existing_rows_are_left_alone_and_finished_parents_are_not_recreated() {
        let listing = vec![("s".to_string(), vec![shard("0", &[], true), shard("1", &["0"], false)])];
        let rows = vec![row("1", Checkpoint::Sequence("5".into()), 3, &["0"])];
        assert_eq!(plan(&listing, &rows, &Checkpoint::Latest), SyncPlan::default());
    }

    #[test]
    fn finished_parents_are_deleted_only_after_every_child_started() {
        let listing =
            vec![("s".to_string(), vec![shard("0", &[], true), shard("1", &["0"], false), shard("2", &["0"], false)])];
        let parent = row("0", Checkpoint::ShardEnd, 9, &[]);
        let started = row("1", Checkpoint::TrimHorizon, 1, &["0"]);
        let waiting = row("2", Checkpoint::TrimHorizon, 0, &["0"]);
        let rows = vec![parent.clone(), started.clone(), waiting];
        assert!(plan(&listing, &rows, &Checkpoint::Latest).delete.is_empty());
        let rows = vec![parent.clone(), started, row("2", Checkpoint::TrimHorizon, 1, &["0"])];
        assert_eq!(plan(&listing, &rows, &Checkpoint::Latest).delete, vec![parent.clone()]);
        // A held parent is never deleted; an unlisted finished shard is.
        let held = Lease { owner: Some("w".into()), ..parent.clone() };
        assert!(plan(&listing, &[held], &Checkpoint::Latest).delete.is_empty());
        assert_eq!(
            plan(&[("s".to_string(), vec![])], std::slice::from_ref(&parent), &Checkpoint::Latest).delete,
            vec![parent]
        );
    }

    #[test]
    fn streams_not_listed_are_not_touched() {
        let rows = vec![row("0", Checkpoint::ShardEnd, 3, &[])];
        assert_eq!(plan(&[], &rows, &Checkpoint::Latest), SyncPlan::default());
    }

    #[test]
    fn children_wait_for_every_parent() {
        let parent_a = row("0", Checkpoint::ShardEnd, 4, &[]);
        let parent_b = row("1", Checkpoint::Sequence("3".into()), 4, &[]);
        let child = row("2", Checkpoint::TrimHorizon, 0, &["0", "1"]);
        let rows = [parent_a.clone(), parent_b, child.clone()];
        let by_key: HashMap<LeaseKey, &Lease> = rows.iter().map(|r| (r.key.clone(), r)).collect();
        assert!(!parents_done(&child, &by_key));
        let done_b = row("1", Checkpoint::ShardEnd, 5, &[]);
        let rows = [parent_a, done_b, child.clone()];
        let by_key: HashMap<LeaseKey, &Lease> = rows.iter().map(|r| (r.key.clone(), r)).collect();
        assert!(parents_done(&child, &by_key));
        assert!(parents_done(&child, &HashMap::new()), "parents cleaned up means done");
    }
}
