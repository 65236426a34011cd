//! Shard discovery: which streams to read, their shards, and a lease row for each (see `plan`).

mod plan;

use regex::Regex;

use crate::kinesis::{Kinesis, KinesisError, ShardInfo};
use crate::lease::{Checkpoint, Lease, LeaseKey, LeaseStore};
pub use plan::{SyncPlan, parents_done, plan};

/// Which streams a consumer reads.
#[derive(Debug, Clone)]
pub enum StreamSelection {
    /// These streams, by name.
    Named(Vec<String>),
    /// Every stream whose name matches (checked again on every sync, so new streams are picked up).
    Pattern(Regex),
    /// Exactly these shards (manual assignment).
    Assigned(Vec<LeaseKey>),
}

/// What one sync did, for logs and metrics.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// Streams listed.
    pub streams: Vec<String>,
    /// Open shards over all listed streams.
    pub open_shards: usize,
    /// Rows created.
    pub created: usize,
    /// Rows of finished shards deleted.
    pub deleted: usize,
    /// Streams that could not be listed, with why.
    pub failed: Vec<(String, String)>,
}

/// Keeps the lease table's rows in step with the streams' shards.
#[derive(Debug, Clone)]
pub struct ShardSync {
    kinesis: Kinesis,
    selection: StreamSelection,
    root_start: Checkpoint,
}

impl ShardSync {
    /// Syncs `selection`'s shards; shards without parents start at `root_start`.
    pub fn new(kinesis: Kinesis, selection: StreamSelection, root_start: Checkpoint) -> Self {
        Self { kinesis, selection, root_start }
    }

    async fn streams(&self) -> Result<Vec<String>, KinesisError> {
        match &self.selection {
            StreamSelection::Named(names) => Ok(names.clone()),
            StreamSelection::Pattern(pattern) => {
                Ok(self.kinesis.list_streams().await?.into_iter().filter(|name| pattern.is_match(name)).collect())
            }
            StreamSelection::Assigned(keys) => {
                // Each stream once, in the order first assigned, however its shards are interleaved.
                let mut streams: Vec<String> = Vec::new();
                for key in keys {
                    if !streams.iter().any(|s| s == key.stream()) {
                        streams.push(key.stream().to_string());
                    }
                }
                Ok(streams)
            }
        }
    }

    /// Lists every selected stream's shards and writes the planned rows. `rows` is the table as last read.
    pub async fn sync(&self, store: &dyn LeaseStore, rows: &[Lease]) -> SyncReport {
        let mut report = SyncReport::default();
        let streams = match self.streams().await {
            Ok(streams) => streams,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list streams; will retry at the next sync");
                report.failed.push(("*".into(), e.to_string()));
                return report;
            }
        };
        let mut listings: Vec<(String, Vec<ShardInfo>)> = Vec::new();
        for stream in streams {
            match self.kinesis.list_shards(&stream).await {
                Ok(shards) => {
                    let shards = match &self.selection {
                        StreamSelection::Assigned(keys) => shards
                            .into_iter()
                            .filter(|s| keys.contains(&LeaseKey::new(stream.as_str(), s.id.as_str())))
                            .collect(),
                        _ => shards,
                    };
                    report.open_shards += shards.iter().filter(|s| !s.closed).count();
                    report.streams.push(stream.clone());
                    listings.push((stream, shards));
                }
                Err(e) => {
                    tracing::warn!(stream, error = %e, "cannot list shards; will retry at the next sync");
                    report.failed.push((stream, e.to_string()));
                }
            }
        }
        let mut planned = plan(&listings, rows, &self.root_start);
        if creates_closed_shard(&planned, &listings) {
            // A closed shard gets a row only when nothing in the table says it was read (the first
            // start of its lineage). `rows` is as old as the listing calls; another worker may have read
            // the shard and cleaned it up since, so decide again on a fresh read, just before writing.
            match store.list().await {
                Ok(fresh) => planned = plan(&listings, &fresh.leases, &self.root_start),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the lease table again; rows created at the next sync");
                    planned.create.clear();
                }
            }
        }
        let SyncPlan { create, delete } = planned;
        // A descendant's row must never exist without its ancestors' (a closed shard with a row below it
        // counts as finished), so a row that cannot be written holds back its descendants until the
        // next sync. `create` lists parents first, so one pass catches every generation.
        let mut held_back: std::collections::HashSet<LeaseKey> = std::collections::HashSet::new();
        for row in create {
            let parent_failed =
                row.parent_shard_ids.iter().any(|p| held_back.contains(&LeaseKey::new(row.key.stream(), p.as_str())));
            if parent_failed {
                held_back.insert(row.key.clone());
                continue;
            }
            match store.create_if_absent(&row).await {
                Ok(true) => {
                    tracing::info!(shard = %row.key, checkpoint = %row.checkpoint, "lease row created");
                    report.created += 1;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(shard = %row.key, error = %e, "cannot create lease row; will retry");
                    held_back.insert(row.key.clone());
                }
            }
        }
        for row in delete {
            match store.delete(&row).await {
                Ok(()) => {
                    tracing::info!(shard = %row.key, "finished shard's row cleaned up");
                    report.deleted += 1;
                }
                Err(e) => tracing::debug!(shard = %row.key, error = %e, "cleanup skipped"),
            }
        }
        report
    }
}

/// True when `planned` creates a row for a shard that the listing shows closed.
fn creates_closed_shard(planned: &SyncPlan, listings: &[(String, Vec<ShardInfo>)]) -> bool {
    let closed: std::collections::HashSet<LeaseKey> = listings
        .iter()
        .flat_map(|(stream, shards)| {
            shards.iter().filter(|s| s.closed).map(move |s| LeaseKey::new(stream.as_str(), s.id.as_str()))
        })
        .collect();
    planned.create.iter().any(|row| closed.contains(&row.key))
}
