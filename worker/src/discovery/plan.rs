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
/// A shard already tracked by the table is one with a row, or a closed shard with a row somewhere
/// among its descendants: rows are created parents first and a row is deleted only at `SHARD_END`
/// once every child has a row, so such a shard had a row, was read to its end and was cleaned up. It
/// never gets a row again, however many generations of resharding and cleanup lie between it and
/// the nearest row (docs/architecture.md, "Resharding", has the argument).
///
/// - Any other shard gets a row. A child of a tracked shard starts at TRIM_HORIZON so nothing written
///   before its reader started is missed. A shard whose parents are all untracked (a stream new to the
///   table, or a child whose parents were trimmed) starts at `root_start`, except that with LATEST a
///   closed one gets no row (nothing will be written to it again).
/// - `create` lists parents before children, so a caller that stops creating a shard's descendants
///   when its own row could not be written keeps the order the argument needs.
/// - A row at SHARD_END, held by nobody, is deleted once every child has a row that was taken at least
///   once (or was itself finished and cleaned up), or once the shard no longer appears in the listing.
pub fn plan(listings: &[(String, Vec<ShardInfo>)], rows: &[Lease], root_start: &Checkpoint) -> SyncPlan {
    let by_key: HashMap<&LeaseKey, &Lease> = rows.iter().map(|row| (&row.key, row)).collect();
    let mut result = SyncPlan::default();
    for (stream, shards) in listings {
        let lineage = Lineage::of(shards);
        let row_of = |shard: &str| by_key.get(&LeaseKey::new(stream.as_str(), shard)).copied();
        // Children before parents: a shard has a row below it if a child has a row or one below it.
        let mut row_below: HashSet<&str> = HashSet::new();
        for shard in lineage.order.iter().rev() {
            if lineage.children_of(&shard.id).iter().any(|kid| row_of(kid).is_some() || row_below.contains(kid)) {
                row_below.insert(shard.id.as_str());
            }
        }
        let tracked = |shard: &str| row_of(shard).is_some() || row_below.contains(shard);
        for shard in &lineage.order {
            if tracked(&shard.id) {
                continue;
            }
            let checkpoint = if shard.parents.iter().any(|parent| tracked(parent)) {
                Checkpoint::TrimHorizon
            } else if shard.closed && *root_start == Checkpoint::Latest {
                continue;
            } else {
                root_start.clone()
            };
            result.create.push(NewLease {
                key: LeaseKey::new(stream.as_str(), shard.id.as_str()),
                checkpoint,
                parent_shard_ids: shard.parents.clone(),
                stream_created: None,
            });
        }
        for row in rows.iter().filter(|row| row.key.stream() == stream) {
            if !row.checkpoint.is_shard_end() || row.owner.is_some() {
                continue;
            }
            let shard = row.key.shard_id();
            let kids = lineage.children_of(shard);
            // A child without a row but with one below it was read and cleaned up already.
            let started = |kid: &str| match row_of(kid) {
                Some(row) => row.counter > 0,
                None => row_below.contains(kid),
            };
            let children_started = !kids.is_empty() && kids.iter().all(|kid| started(kid));
            if children_started || !lineage.listed(shard) {
                result.delete.push(row.clone());
            }
        }
    }
    result
}

/// One stream's listed shards as a family tree.
struct Lineage<'a> {
    /// Every listed shard, parents before children (ties in listing order).
    order: Vec<&'a ShardInfo>,
    children: HashMap<&'a str, Vec<&'a str>>,
    listed: HashSet<&'a str>,
}

impl<'a> Lineage<'a> {
    fn of(shards: &'a [ShardInfo]) -> Self {
        let listed: HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
        let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
        let mut waiting_for: HashMap<&str, usize> = HashMap::new();
        for shard in shards {
            // Parents trimmed from the listing do not hold a shard back.
            for parent in shard.parents.iter().filter(|p| listed.contains(p.as_str())) {
                children.entry(parent.as_str()).or_default().push(shard.id.as_str());
                *waiting_for.entry(shard.id.as_str()).or_default() += 1;
            }
        }
        let by_id: HashMap<&str, &ShardInfo> = shards.iter().map(|s| (s.id.as_str(), s)).collect();
        let mut ready: std::collections::VecDeque<&ShardInfo> =
            shards.iter().filter(|s| !waiting_for.contains_key(s.id.as_str())).collect();
        let mut order = Vec::with_capacity(shards.len());
        let mut placed: HashSet<&str> = HashSet::new();
        while let Some(shard) = ready.pop_front() {
            if !placed.insert(shard.id.as_str()) {
                continue;
            }
            order.push(shard);
            for kid in children.get(shard.id.as_str()).map(Vec::as_slice).unwrap_or_default() {
                if let Some(n) = waiting_for.get_mut(kid) {
                    *n -= 1;
                    if *n == 0 {
                        ready.extend(by_id.get(kid).copied());
                    }
                }
            }
        }
        // Kinesis lineages have no cycles; a listing that did would still have every shard planned.
        order.extend(shards.iter().filter(|s| !placed.contains(s.id.as_str())));
        Self { order, children, listed }
    }

    fn children_of(&self, shard: &str) -> &[&'a str] {
        self.children.get(shard).map(Vec::as_slice).unwrap_or_default()
    }

    fn listed(&self, shard: &str) -> bool {
        self.listed.contains(shard)
    }
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
mod tests;
