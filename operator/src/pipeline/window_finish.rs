//! Window stage, after completion (`spec.window`): once [`super::window_status`] found every shard
//! finished, the reconcile that saw it publishes `WindowCompleted` and wants zero workers; every later
//! reconcile runs this stage instead of the pipeline: the Deployment is kept at zero replicas (so the
//! workers, which exit 0 once done, are not started again in a loop: `status.window.completed` is
//! sticky and decides the replicas, whatever a restarted operator counts), and once no worker pod is
//! left, the window's table is deleted under `deletionPolicy: Delete` (kept with `Retain`). The table
//! is deleted only after the pods are gone: a worker started on a missing table would create it and
//! read the window again. See docs/operations.md, "Replay".

use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use leasehold_crds::{DeletionPolicy, ResolvedSpec, StreamConsumer, WindowStatus};

use super::status::{Report, write_status};
use super::table::{self, Deletion, Owner};
use super::{TABLE_WAIT, apply, build};
use crate::conditions::{Verdict, Verdicts};
use crate::context::Context;
use crate::error::{Error, Result};

/// The first reconcile that finds the window complete: announces it (`WindowCompleted`). The caller
/// then wants zero replicas.
pub async fn announce(consumer: &StreamConsumer, ctx: &Context, window: &WindowStatus) {
    let was = consumer.status.as_ref().and_then(|s| s.window.as_ref()).is_some_and(|w| w.completed);
    if window.completed && !was {
        tracing::info!(consumer = %consumer.name_any(), shards = window.shards, "window completed");
        let records = window.records_replayed.map(|n| format!(", {n} records replayed")).unwrap_or_default();
        let note =
            format!("every shard of the window finished ({} shards{records}); workers scaled to zero", window.shards);
        ctx.publish(consumer, EventType::Normal, "WindowCompleted", note).await;
    }
}

/// Runs instead of the pipeline once `status.window.completed`: `None` for any other consumer.
pub async fn after_completion(
    consumer: &StreamConsumer,
    ctx: &Context,
    resolved: &ResolvedSpec,
) -> Option<Result<Action>> {
    let previous = consumer.status.clone().unwrap_or_default();
    let window = previous.window.clone().filter(|w| w.completed && consumer.spec.window.is_some())?;
    Some(finish(consumer, ctx, resolved, previous, window).await)
}

async fn finish(
    consumer: &StreamConsumer,
    ctx: &Context,
    resolved: &ResolvedSpec,
    previous: leasehold_crds::StreamConsumerStatus,
    mut window: WindowStatus,
) -> Result<Action> {
    let desired = build::desired(consumer, 0, resolved, &ctx.settings.worker_image).map_err(Error::Build)?;
    apply::apply(consumer, ctx, &desired, Some("the window is completed")).await?;
    let pods_left = pods_left(consumer, ctx).await?;
    let policy = consumer.spec.window.as_ref().map(|w| w.table_policy()).unwrap_or(DeletionPolicy::Delete);
    let table_name = crate::window::table_name(consumer);
    let mut table_verdict = Verdict::ok("Retained", format!("window completed: lease table {table_name} kept"));
    if policy == DeletionPolicy::Delete && !window.table_deleted {
        table_verdict = Verdict::ok("WindowCompleted", format!("window completed: {pods_left} worker pod(s) left"));
        if pods_left == 0 {
            let clients = ctx.aws.get(&consumer.spec.aws).await;
            match table::delete_if_ours(&clients.dynamodb, &table_name, &Owner::of(consumer)?).await? {
                Deletion::Deleted => {
                    let note = format!("window completed: deleted its lease table {table_name}");
                    ctx.publish(consumer, EventType::Normal, "TableDeleted", note).await;
                    window.table_deleted = true;
                }
                Deletion::Missing => window.table_deleted = true,
                Deletion::KeptNotOurs => {
                    let note = format!("lease table {table_name} kept: its tags do not show this resource created it");
                    ctx.publish(consumer, EventType::Warning, "TableKept", note).await;
                    table_verdict = Verdict::ok("TableKept", "window completed: the table is not this resource's");
                    // Not ours: never retried.
                    window.deletion_policy = Some("Retain".into());
                }
            }
        }
    }
    if window.table_deleted {
        table_verdict = Verdict::ok("Deleted", format!("window completed: lease table {table_name} deleted"));
    }
    let done = Verdict::ok("WindowFinished", "window completed");
    let report = Report {
        verdicts: Verdicts {
            spec: Verdict::ok("Valid", ""),
            table: table_verdict,
            stream: done.clone(),
            workers: Verdict::ok("ScaledToZero", format!("window completed: {pods_left} worker pod(s) left")),
            consumer: done,
            lag: None,
            capacity: None,
        },
        open_shards: previous.open_shards,
        replicas: 0,
        leases: Vec::new(),
        capacity: previous.capacity,
        lag: None,
        lag_scaling: None,
        window: Some(window.clone()),
    };
    write_status(consumer, ctx, &report).await?;
    let settled = pods_left == 0 && (window.table_deleted || window.deletion_policy.as_deref() != Some("Delete"));
    Ok(if settled { Action::await_change() } else { Action::requeue(TABLE_WAIT) })
}

/// Pods the workers' Deployment still reports (`status.replicas`): 0 once every pod is gone.
async fn pods_left(consumer: &StreamConsumer, ctx: &Context) -> Result<i32> {
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let name = build::workers_name(consumer);
    let deployment = Api::<Deployment>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(|e| Error::WorkersRunning(format!("reading {name}: {e}")))?;
    Ok(deployment.and_then(|d| d.status).and_then(|s| s.replicas).unwrap_or(0))
}
