//! Window stage, progress (`spec.window`): `status.window` from the window's lease rows (per shard:
//! reading or finished, records handed to the processor as its holder counted them at checkpoints,
//! the last position), and whether the window is complete: every row at `SHARD_END` and every open
//! shard of the streams with a row (the rule the workers stop on, [`WindowProgress`]). Nothing here
//! writes; [`super::window_finish`] acts on completion. See docs/operations.md, "Replay".

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use leasehold_crds::{StreamConsumer, WindowShardProgress, WindowStatus, format_time_ms};
use leasehold_worker::aws::kinesis::{self, KinesisError, StreamRef};
use leasehold_worker::lease::{Lease, LeaseKey};
use leasehold_worker::window::WindowProgress;

use crate::conditions::{Verdict, condition};
use crate::context::Context;
use crate::context::lease_rows::LeaseRows;
use crate::metrics::ConsumerLabels;

/// Shards listed one by one in `status.window.progress` (the totals count them all).
pub const MAX_LISTED: usize = 100;

/// The window's status from its rows (pure). `completed` is left false: it is decided with the open
/// shards ([`observe`]).
pub fn progress(consumer: &StreamConsumer, rows: &[Lease]) -> WindowStatus {
    let window = consumer.spec.window.as_ref();
    let created = consumer.metadata.creation_timestamp.as_ref().map(|t| t.0.as_millisecond());
    let bounds = window.and_then(|w| w.bounds(created));
    let mut shards: Vec<&Lease> = rows.iter().collect();
    shards.sort_by_cached_key(|s| s.key.to_string());
    let counted: Vec<u64> = rows.iter().filter_map(|r| r.window_records).collect();
    WindowStatus {
        start: bounds.map(|b| format_time_ms(b.start_ms)).or_else(|| window.map(|w| w.start.clone())),
        end: bounds.map(|b| format_time_ms(b.end_ms)).or_else(|| window.map(|w| w.end.clone())),
        table: consumer.spec.lease_table.as_ref().map(|t| t.name.clone()),
        finished_shards: count(rows.iter().filter(|r| r.checkpoint.is_shard_end()).count()),
        shards: count(rows.len()),
        records_replayed: (!counted.is_empty()).then(|| counted.iter().map(|&n| to_i64(n)).sum()),
        deletion_policy: window.map(|w| format!("{:?}", w.table_policy())),
        progress: shards
            .into_iter()
            .take(MAX_LISTED)
            .map(|row| WindowShardProgress {
                shard: row.key.to_string(),
                checkpoint: row.checkpoint.attribute(),
                state: if row.checkpoint.is_shard_end() { "finished" } else { "reading" }.into(),
                records: row.window_records.map(to_i64),
                owner: row.owner.clone(),
            })
            .collect(),
        completed: false,
        table_deleted: false,
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The window's status now: `None` without `spec.window`; the previous one while the rows cannot be
/// read. Once every row is finished the streams' open shards are listed (one ListShards per stream,
/// only then) and the window is `completed` when each has a row too. A failed listing is logged and
/// leaves it not completed: completion is never guessed.
pub async fn observe(consumer: &StreamConsumer, ctx: &Context, rows: Option<&LeaseRows>) -> Option<WindowStatus> {
    consumer.spec.window.as_ref()?;
    let previous = consumer.status.as_ref().and_then(|s| s.window.clone());
    let Some(rows) = rows else { return previous };
    let mut status = progress(consumer, &rows.leases);
    if status.shards > 0 && status.finished_shards == status.shards {
        let clients = ctx.aws.get(&consumer.spec.aws).await;
        let streams: Vec<String> = consumer.spec.streams.iter().map(|s| s.stream_name().to_string()).collect();
        match open_shards(&clients.kinesis, &streams).await {
            Ok(open) => status.completed = WindowProgress::of(&open, &rows.leases).completed(),
            Err(error) => {
                tracing::warn!(consumer = %consumer.name_any(), %error, "window: cannot list the open shards")
            }
        }
    }
    publish(ctx, &super::consumer_labels(consumer), &status);
    Some(status)
}

/// The open shards of `streams` as lease keys (ListShards, every page).
async fn open_shards(client: &aws_sdk_kinesis::Client, streams: &[String]) -> Result<Vec<LeaseKey>, KinesisError> {
    let mut open = Vec::new();
    for stream in streams {
        let shards = kinesis::list_shards(client, StreamRef::named(stream)).await?;
        open.extend(shards.into_iter().filter(|s| !s.closed).map(|s| LeaseKey::new(stream.as_str(), s.id)));
    }
    Ok(open)
}

/// The window's gauges on the operator's `/metrics`.
fn publish(ctx: &Context, labels: &ConsumerLabels, status: &WindowStatus) {
    let metrics = &ctx.metrics;
    metrics.window_shards.get_or_create(labels).set(i64::from(status.shards));
    metrics.window_shards_finished.get_or_create(labels).set(i64::from(status.finished_shards));
    metrics.window_records_replayed.get_or_create(labels).set(status.records_replayed.unwrap_or(0));
    metrics.window_completed.get_or_create(labels).set(i64::from(status.completed));
}

/// The `Completed` condition of a window consumer (True, `WindowFinished`, once every shard is
/// finished; False, `WindowReading`, before), and `Ready` rewritten to say so once completed (its
/// workers are then scaled to zero on purpose). A consumer without a window gets neither.
pub fn window_conditions(
    window: Option<&WindowStatus>,
    generation: Option<i64>,
    previous: &[Condition],
    conditions: &mut Vec<Condition>,
) {
    let Some(window) = window else { return };
    let verdict = if window.completed {
        let table = match (window.deletion_policy.as_deref(), window.table_deleted) {
            (_, true) => "its lease table deleted",
            (Some("Retain"), false) => "its lease table kept (deletionPolicy Retain)",
            _ => "its lease table deleted once the workers stopped",
        };
        let message = format!(
            "every shard finished ({}/{}); workers scaled to zero, {table}",
            window.finished_shards, window.shards
        );
        Verdict::ok("WindowFinished", message)
    } else {
        Verdict::failed("WindowReading", format!("{}/{} shards finished", window.finished_shards, window.shards))
    };
    if window.completed
        && let Some(ready) = conditions.iter_mut().find(|c| c.type_ == "Ready")
    {
        *ready = condition("Ready", &Verdict::ok("WindowFinished", verdict.message.clone()), generation, previous);
    }
    conditions.push(condition("Completed", &verdict, generation, previous));
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_crds::StreamConsumerSpec;
    use leasehold_worker::lease::Checkpoint;

    fn consumer() -> StreamConsumer {
        let spec: StreamConsumerSpec = serde_yaml_ng::from_str(
            "streams: [{name: s}]\nprocessor: {stdout: {}}\n\
             window: {start: '2026-12-03T14:00:00Z', end: '2026-12-03T15:00:00Z', deletionPolicy: Retain}\n",
        )
        .expect("spec");
        let mut consumer = StreamConsumer::new("replay", spec);
        consumer.metadata.namespace = Some("shop".into());
        crate::window::with_table(&consumer).into_owned()
    }

    fn row(shard: &str, checkpoint: Checkpoint, records: Option<u64>) -> Lease {
        crate::test_rows::row("s", shard)
            .owner(Some("w-1"))
            .counter(1)
            .window_records(records)
            .checkpoint(checkpoint)
            .lease()
    }

    #[test]
    fn progress_counts_shards_and_records_from_the_rows() {
        let rows = [
            row("shardId-1", Checkpoint::Sequence("42".into()), Some(5)),
            row("shardId-0", Checkpoint::ShardEnd, Some(7)),
            row("shardId-2", Checkpoint::TrimHorizon, None),
        ];
        let status = progress(&consumer(), &rows);
        assert_eq!((status.finished_shards, status.shards, status.records_replayed), (1, 3, Some(12)));
        assert_eq!(status.table.as_deref(), Some("leasehold-window-shop-replay"));
        assert_eq!(status.deletion_policy.as_deref(), Some("Retain"));
        assert_eq!(status.end.as_deref(), Some("2026-12-03T15:00:00.000Z"));
        let listed: Vec<(&str, &str)> = status.progress.iter().map(|p| (p.shard.as_str(), p.state.as_str())).collect();
        assert_eq!(listed, [("s:shardId-0", "finished"), ("s:shardId-1", "reading"), ("s:shardId-2", "reading")]);
        assert_eq!(status.progress[1].checkpoint, "42");
        assert!(!status.completed, "completion is decided with the open shards");
    }

    #[test]
    fn completed_sets_its_condition_and_ready() {
        let mut window = progress(&consumer(), &[row("shardId-0", Checkpoint::ShardEnd, Some(1))]);
        let ready = condition("Ready", &Verdict::ok("Running", ""), Some(1), &[]);
        let mut conditions = vec![ready.clone()];
        window_conditions(Some(&window), Some(1), &[], &mut conditions);
        assert_eq!((conditions[1].type_.as_str(), conditions[1].status.as_str()), ("Completed", "False"));
        assert_eq!(conditions[0].reason, "Running");
        window.completed = true;
        let mut conditions = vec![ready];
        window_conditions(Some(&window), Some(1), &[], &mut conditions);
        assert_eq!((conditions[1].status.as_str(), conditions[1].reason.as_str()), ("True", "WindowFinished"));
        assert_eq!(conditions[0].reason, "WindowFinished");
        assert!(conditions[1].message.contains("kept (deletionPolicy Retain)"), "{}", conditions[1].message);
        let mut none = vec![];
        window_conditions(None, Some(1), &[], &mut none);
        assert!(none.is_empty());
    }
}
