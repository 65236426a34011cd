//! Shard discovery: which streams to read, their shards, and a lease row for each (see `plan`).

mod plan;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use regex::Regex;
use tokio::time::Instant;

use crate::kinesis::{Kinesis, KinesisError, ShardInfo, StreamIncarnation};
use crate::lease::{Checkpoint, Lease, LeaseKey, LeaseStore, NewLease};
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

impl StreamSelection {
    /// True when rows of `stream` may be this consumer's: a named stream, or one the pattern matches
    /// (never with manual assignment, whose rows are its own).
    pub fn covers(&self, stream: &str) -> bool {
        match self {
            StreamSelection::Named(names) => names.iter().any(|n| n == stream),
            StreamSelection::Pattern(pattern) => pattern.is_match(stream),
            StreamSelection::Assigned(_) => false,
        }
    }
}

/// What this worker can tell of a stream's incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incarnation {
    /// The stream exists, created at this time (epoch ms).
    Known(i64),
    /// The stream does not exist.
    Gone,
    /// It cannot be told now (throttled, no permission, Kinesis unreachable).
    Unknown,
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
    /// Rows of a former incarnation of their stream (deleted and recreated) replaced or deleted.
    pub foreign: usize,
    /// Streams that could not be listed, with why.
    pub failed: Vec<(String, String)>,
}

/// Keeps the lease table's rows in step with the streams' shards.
#[derive(Debug, Clone)]
pub struct ShardSync {
    kinesis: Kinesis,
    selection: StreamSelection,
    root_start: Checkpoint,
    /// Each stream's creation time (epoch ms) as last described, and when.
    incarnations: Arc<Mutex<HashMap<String, (i64, Instant)>>>,
}

impl ShardSync {
    /// Syncs `selection`'s shards; shards without parents start at `root_start`.
    pub fn new(kinesis: Kinesis, selection: StreamSelection, root_start: Checkpoint) -> Self {
        Self { kinesis, selection, root_start, incarnations: Arc::default() }
    }

    /// Describes `stream`, remembering its creation time (forgotten when it cannot be described).
    async fn describe(&self, stream: &str) -> Result<StreamIncarnation, KinesisError> {
        let described = self.kinesis.stream_created(stream).await;
        let mut known = self.incarnations.lock().unwrap_or_else(|p| p.into_inner());
        match &described {
            Ok(state) => {
                known.insert(stream.to_string(), (state.created, Instant::now()));
            }
            // Forgotten on any failure: never judged (or stamped) against a creation time that may be stale.
            Err(_) => {
                known.remove(stream);
            }
        }
        described
    }

    /// `stream`'s incarnation, described again when the one known is older than `max_age`.
    pub async fn incarnation(&self, stream: &str, max_age: Duration) -> Incarnation {
        let cached = {
            let known = self.incarnations.lock().unwrap_or_else(|p| p.into_inner());
            known.get(stream).filter(|(_, at)| at.elapsed() < max_age).map(|(created, _)| *created)
        };
        if let Some(created) = cached {
            return Incarnation::Known(created);
        }
        match self.describe(stream).await {
            Ok(state) => Incarnation::Known(state.created),
            Err(KinesisError::StreamNotFound { .. }) => Incarnation::Gone,
            Err(_) => Incarnation::Unknown,
        }
    }

    /// True when `row` belongs to another incarnation of its stream than the one last described.
    fn is_foreign(&self, row: &Lease) -> bool {
        let known = self.incarnations.lock().unwrap_or_else(|p| p.into_inner());
        row.stream_created.is_some_and(|created| known.get(row.key.stream()).is_some_and(|(now, _)| *now != created))
    }

    /// Plans `listings` over `rows`: rows of a former incarnation of their stream are left out (and
    /// returned), and a stream that has such rows is planned from TRIM_HORIZON (every record of the
    /// new stream was written after the consumer began reading that name).
    fn plan_rows(&self, listings: &[(String, Vec<ShardInfo>)], rows: &[Lease]) -> (SyncPlan, Vec<Lease>) {
        let (foreign, current): (Vec<Lease>, Vec<Lease>) = rows.iter().cloned().partition(|row| self.is_foreign(row));
        let recreated: HashSet<&str> = foreign.iter().map(|row| row.key.stream()).collect();
        let (renewed, same): (Vec<_>, Vec<_>) =
            listings.iter().cloned().partition(|(stream, _)| recreated.contains(stream.as_str()));
        let mut planned = plan(&same, &current, &self.root_start);
        let fresh = plan(&renewed, &current, &Checkpoint::TrimHorizon);
        planned.create.extend(fresh.create);
        planned.delete.extend(fresh.delete);
        (planned, foreign)
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
        let Some(listings) = self.list(&mut report).await else { return report };
        let (planned, foreign) = self.plan_fresh(store, &listings, rows).await;
        let SyncPlan { create, delete } = planned;
        let (mut foreign, held_back) = self.create_rows(store, create, foreign, &mut report).await;
        // Rows of a former incarnation whose shard the new stream does not have.
        foreign.retain(|key, _| !held_back.contains(key));
        for row in foreign.into_values() {
            match store.delete(&row).await {
                Ok(()) => {
                    tracing::info!(shard = %row.key, "row of a former incarnation of the stream removed");
                    report.foreign += 1;
                }
                Err(e) => tracing::debug!(shard = %row.key, error = %e, "former incarnation's row not removed yet"),
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

    /// Every selected stream's shards (described first, so rows are stamped against the stream as
    /// listed); streams that cannot be listed now are left out and reported. `None` when the streams
    /// themselves cannot be listed.
    async fn list(&self, report: &mut SyncReport) -> Option<Vec<(String, Vec<ShardInfo>)>> {
        let streams = match self.streams().await {
            Ok(streams) => streams,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list streams; will retry at the next sync");
                report.failed.push(("*".into(), e.to_string()));
                return None;
            }
        };
        let mut listings: Vec<(String, Vec<ShardInfo>)> = Vec::new();
        for stream in streams {
            match self.describe(&stream).await {
                Ok(state) if state.listable => {}
                Ok(_) => {
                    // Being created (or deleted): its listing is not the stream's shards yet, and would
                    // have the former incarnation's rows deleted rather than replaced.
                    tracing::info!(stream, "stream not active; synced at the next sync");
                    report.failed.push((stream, "stream not active".into()));
                    continue;
                }
                Err(e @ KinesisError::StreamNotFound { .. }) => {
                    tracing::warn!(stream, error = %e, "cannot list shards; will retry at the next sync");
                    report.failed.push((stream, e.to_string()));
                    continue;
                }
                // Synced all the same (new rows unstamped), so a missing kinesis:DescribeStreamSummary
                // permission or a throttled call does not stop the consumer.
                Err(e) => tracing::warn!(stream, error = %e,
                    "cannot describe stream; rows created now carry no stream_created (a recreation goes unnoticed)"),
            }
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
        Some(listings)
    }

    /// The plan over `rows`, made again over a fresh read of the table when it would create a closed
    /// shard's row; with the rows of former incarnations of the listed streams (logged).
    async fn plan_fresh(
        &self,
        store: &dyn LeaseStore,
        listings: &[(String, Vec<ShardInfo>)],
        rows: &[Lease],
    ) -> (SyncPlan, Vec<Lease>) {
        let (mut planned, mut foreign) = self.plan_rows(listings, rows);
        if creates_closed_shard(&planned, listings) {
            // A closed shard gets a row only when nothing in the table says it was read (the first
            // start of its lineage). `rows` is as old as the listing calls; another worker may have read
            // the shard and cleaned it up since, so decide again on a fresh read, just before writing.
            match store.list().await {
                Ok(fresh) => (planned, foreign) = self.plan_rows(listings, &fresh.leases),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the lease table again; rows created at the next sync");
                    planned.create.clear();
                    foreign.clear();
                }
            }
        }
        let listed: HashSet<&str> = listings.iter().map(|(stream, _)| stream.as_str()).collect();
        foreign.retain(|row| listed.contains(row.key.stream()));
        let recreated: HashSet<&str> = foreign.iter().map(|row| row.key.stream()).collect();
        for stream in recreated {
            tracing::warn!(
                stream,
                rows = foreign.iter().filter(|r| r.key.stream() == stream).count(),
                "the stream was deleted and recreated: the rows of its former incarnation are replaced, never \
                 applied; the new stream is read from TRIM_HORIZON"
            );
        }
        (planned, foreign)
    }

    /// Writes the rows to create, stamped with their stream's creation time (a former incarnation's
    /// row replaced in one write); returns the former incarnations' rows not replaced, and the rows
    /// held back (not written, nor any of their descendants: a descendant's row must never exist
    /// without its ancestors', since a closed shard with a row below it counts as finished).
    async fn create_rows(
        &self,
        store: &dyn LeaseStore,
        mut create: Vec<NewLease>,
        foreign: Vec<Lease>,
        report: &mut SyncReport,
    ) -> (HashMap<LeaseKey, Lease>, HashSet<LeaseKey>) {
        let mut foreign: HashMap<LeaseKey, Lease> = foreign.into_iter().map(|row| (row.key.clone(), row)).collect();
        {
            let known = self.incarnations.lock().unwrap_or_else(|p| p.into_inner());
            for row in &mut create {
                row.stream_created = known.get(row.key.stream()).map(|(created, _)| *created);
            }
        }
        // `create` lists parents first, so one pass catches every generation.
        let mut held_back: HashSet<LeaseKey> = HashSet::new();
        for row in create {
            let parent_failed =
                row.parent_shard_ids.iter().any(|p| held_back.contains(&LeaseKey::new(row.key.stream(), p.as_str())));
            if parent_failed {
                held_back.insert(row.key.clone());
                continue;
            }
            let written = match foreign.remove(&row.key) {
                Some(former) => store.replace(&former, &row).await.map(|()| {
                    report.foreign += 1;
                    true
                }),
                None => store.create_if_absent(&row).await,
            };
            match written {
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
        (foreign, held_back)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sync(root_start: Checkpoint) -> ShardSync {
        let config = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
            .build();
        let kinesis = Kinesis::new(aws_sdk_kinesis::Client::from_conf(config));
        ShardSync::new(kinesis, StreamSelection::Named(vec!["s".into()]), root_start)
    }

    fn row(shard: &str, checkpoint: Checkpoint, stream_created: Option<i64>) -> Lease {
        crate::test_rows::row(shard).counter(3).checkpoint(checkpoint).stream_created(stream_created).lease()
    }

    fn open(id: &str) -> ShardInfo {
        ShardInfo { id: id.into(), parents: vec![], closed: false, hash_keys: None }
    }

    #[test]
    fn rows_of_a_former_incarnation_are_left_out_and_the_new_stream_starts_at_trim_horizon() {
        let sync = sync(Checkpoint::Latest);
        sync.incarnations.lock().unwrap().insert("s".into(), (2_000, Instant::now()));
        let listings = vec![("s".to_string(), vec![open("shardId-000000000000"), open("shardId-000000000001")])];
        let rows = vec![
            row("shardId-000000000000", Checkpoint::Sequence("49".into()), Some(1_000)),
            row("shardId-000000000001", Checkpoint::ShardEnd, Some(1_000)),
            row("shardId-000000000002", Checkpoint::Sequence("50".into()), Some(1_000)),
        ];
        let (planned, foreign) = sync.plan_rows(&listings, &rows);
        assert_eq!(foreign.len(), 3, "every row of the former stream is foreign");
        let created: Vec<(String, Checkpoint)> =
            planned.create.iter().map(|n| (n.key.shard_id().to_string(), n.checkpoint.clone())).collect();
        assert_eq!(
            created,
            vec![
                ("shardId-000000000000".to_string(), Checkpoint::TrimHorizon),
                ("shardId-000000000001".to_string(), Checkpoint::TrimHorizon)
            ],
            "the new stream's shards from TRIM_HORIZON, not LATEST and not the old checkpoints"
        );
        assert!(planned.delete.is_empty());
    }

    #[test]
    fn current_and_unstamped_rows_are_kept() {
        let sync = sync(Checkpoint::TrimHorizon);
        sync.incarnations.lock().unwrap().insert("s".into(), (2_000, Instant::now()));
        let listings = vec![("s".to_string(), vec![open("shardId-000000000000"), open("shardId-000000000001")])];
        let rows = vec![
            row("shardId-000000000000", Checkpoint::Sequence("49".into()), Some(2_000)),
            row("shardId-000000000001", Checkpoint::Sequence("50".into()), None),
        ];
        let (planned, foreign) = sync.plan_rows(&listings, &rows);
        assert!(foreign.is_empty());
        assert!(planned.create.is_empty(), "both shards are tracked: {:?}", planned.create);
        // Nothing known of the stream (it could not be described): nothing is judged foreign.
        sync.incarnations.lock().unwrap().clear();
        let stale = vec![row("shardId-000000000000", Checkpoint::Sequence("49".into()), Some(1_000))];
        assert!(sync.plan_rows(&listings, &stale).1.is_empty());
    }
}
