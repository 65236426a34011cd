//! The controller (kube-rs `Controller`, as in kube-rs/controller-rs): [`reconcile`] runs the
//! [`pipeline`](crate::pipeline) behind a finalizer for the table's deletion policy; [`error_policy`]
//! counts a failure by stage, announces it once, and backs off per object.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::DeleteParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use leasehold_crds::{DeletionPolicy, StreamConsumer};
use tokio_util::sync::CancellationToken;

use crate::FINALIZER;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::pipeline;
use crate::pipeline::build::OWNED_SELECTOR;
use crate::pipeline::stream_consumers::{self, Deregistration};
use crate::pipeline::table::{self, Deletion, Owner};
use crate::readiness::ControllerState;

/// Runs the controller until `shutdown` is cancelled, over every namespace or only `namespace`. The
/// readiness moves to `Running` once the StreamConsumer cache is filled, and to `Stopping` at the end.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>, shutdown: CancellationToken) {
    let client = ctx.client.clone();
    let (consumers, deployments, config_maps) = match &namespace {
        Some(ns) => (
            Api::<StreamConsumer>::namespaced(client.clone(), ns),
            Api::<Deployment>::namespaced(client.clone(), ns),
            Api::<ConfigMap>::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone()), Api::all(client)),
    };
    let controller = Controller::new(consumers, watcher::Config::default().any_semantic())
        .owns(deployments, watcher::Config::default().labels(OWNED_SELECTOR))
        .owns(config_maps, watcher::Config::default().labels(OWNED_SELECTOR));
    let store = controller.store();
    let readiness = ctx.readiness.clone();
    let synced = tokio::spawn(async move {
        // Asked again and again: the store wakes only the last of several waiters (the controller's
        // runner waits too), so a single long wait could sleep forever.
        loop {
            match tokio::time::timeout(Duration::from_millis(200), store.wait_until_ready()).await {
                Ok(Ok(())) => break readiness.set(ControllerState::Running),
                Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
    });
    controller
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile loop");
            }
        })
        .await;
    synced.abort();
    ctx.readiness.stopping();
}

/// The key of an object's failure streak.
fn streak_key(consumer: &StreamConsumer) -> String {
    crate::context::object_key(consumer)
}

/// One reconcile of one StreamConsumer; a success ends its failure streak.
pub async fn reconcile(consumer: Arc<StreamConsumer>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.inc();
    let started = std::time::Instant::now();
    let key = streak_key(&consumer);
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let api = Api::<StreamConsumer>::namespaced(ctx.client.clone(), &namespace);
    // A deleted consumer that registered stream consumers stops its workers first, one step per pass.
    if consumer.meta().deletion_timestamp.is_some()
        && consumer.finalizers().iter().any(|f| f == FINALIZER)
        && !stream_consumers::recorded(&consumer).is_empty()
        && stop_workers(&consumer, &ctx).await? == Workers::Stopping
    {
        ctx.metrics.duration.observe(started.elapsed().as_secs_f64());
        return Ok(Action::requeue(WORKERS_STOP_POLL));
    }
    let result = finalizer(&api, FINALIZER, consumer, |event| async {
        match event {
            Finalized::Apply(consumer) => pipeline::run(&consumer, &ctx).await,
            Finalized::Cleanup(consumer) => cleanup(&consumer, &ctx).await,
        }
    })
    .await
    .map_err(Error::from_finalizer);
    ctx.metrics.duration.observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.failures.succeeded(&key);
    }
    result
}

/// On failure: count it by stage, publish a Warning only for the first failure of a streak or when the
/// failure changed, and retry after the object's backoff (2 s doubling to 5 min, with jitter). An
/// invalid spec waits for a change instead; a stream that is missing or unreadable is looked at again
/// at least every shard poll interval, as a healthy consumer would be.
pub fn error_policy(consumer: Arc<StreamConsumer>, error: &Error, ctx: Arc<Context>) -> Action {
    let kind = error.kind();
    ctx.metrics.failed(kind);
    let retry = ctx.failures.failed(&streak_key(&consumer), &error.to_string());
    let name = consumer.name_any();
    if retry.announce {
        tracing::warn!(consumer = %name, kind, error = %error, "reconcile failed; retrying with backoff");
        let (reason, note) = (error.reason(), error.message());
        let ctx = ctx.clone();
        tokio::spawn(async move { ctx.publish(&consumer, EventType::Warning, reason, note).await });
    } else {
        tracing::debug!(consumer = %name, kind, failures = retry.failures, delay = ?retry.delay, error = %error, "reconcile failed again");
    }
    match error {
        Error::InvalidSpec(_) | Error::TemplateRefused(_) => Action::await_change(),
        Error::StreamNotFound(_) | Error::Stream(_) | Error::ConsumerStreamNotFound(_) | Error::EnsureStream(_) => {
            Action::requeue(retry.delay.min(ctx.shards.interval()))
        }
        _ => Action::requeue(retry.delay),
    }
}

/// The resource is being deleted: deregister the stream consumers it registered, then apply the
/// table's deletion policy.
async fn cleanup(consumer: &StreamConsumer, ctx: &Context) -> Result<Action> {
    // A window consumer's table is seen as its leaseTable, with window.deletionPolicy.
    let windowed = crate::window::with_table(consumer);
    let consumer = windowed.as_ref();
    ctx.metrics.forget_consumer(&pipeline::consumer_labels(consumer));
    ctx.lease_reads.forget(&crate::context::object_key(consumer));
    release_stream_consumers(consumer, ctx).await?;
    let Some(spec) = &consumer.spec.lease_table else { return Ok(Action::await_change()) };
    match spec.deletion_policy.unwrap_or(DeletionPolicy::Retain) {
        DeletionPolicy::Retain => {
            tracing::info!(consumer = %consumer.name_any(), table = spec.name, "deletionPolicy Retain: lease table kept");
        }
        DeletionPolicy::Delete => {
            let clients = ctx.aws.get(&consumer.spec.aws).await;
            match table::delete_if_ours(&clients.dynamodb, &spec.name, &Owner::of(consumer)?).await? {
                Deletion::Deleted => {
                    let note = format!("deleted lease table {}", spec.name);
                    ctx.publish(consumer, EventType::Normal, "TableDeleted", note).await
                }
                Deletion::KeptNotOurs => {
                    let note = format!("lease table {} kept: its tags do not show this resource created it", spec.name);
                    ctx.publish(consumer, EventType::Warning, "TableKept", note).await
                }
                Deletion::Missing => {}
            }
        }
    }
    Ok(Action::await_change())
}

/// How long a deletion waits for the workers to stop before deregistering their stream consumers anyway
/// (a node that is gone may keep its pods Terminating for ever), counted from the Deployment's
/// `deletionTimestamp`.
pub const WORKERS_STOP_WAIT: Duration = Duration::from_secs(60);

/// How soon a deletion looks again at workers that are stopping (a requeue, not a sleep: the reconcile
/// returns at once and the next pass checks).
pub const WORKERS_STOP_POLL: Duration = Duration::from_millis(500);

/// Deregisters every stream consumer whose ARN this resource recorded as registered by it, and no
/// other. The workers were stopped first ([`stop_workers`], before the finalizer's cleanup runs), so
/// that none is subscribed or registers the consumer again.
async fn release_stream_consumers(consumer: &StreamConsumer, ctx: &Context) -> Result<()> {
    let arns = stream_consumers::recorded(consumer);
    if arns.is_empty() {
        if consumer.spec.reader.mode.unwrap_or_default() == leasehold_crds::ReaderMode::FanOut {
            tracing::info!(consumer = %consumer.name_any(), "no stream consumer registered by this resource: none deregistered");
        }
        return Ok(());
    }
    let clients = ctx.aws.get(&consumer.spec.aws).await;
    for arn in arns {
        if stream_consumers::deregister(&clients.kinesis, &arn).await? == Deregistration::Deregistered {
            tracing::info!(consumer = %consumer.name_any(), arn, "stream consumer deregistered");
            let note = format!("deregistered stream consumer {arn}");
            ctx.publish(consumer, EventType::Normal, "StreamConsumerDeregistered", note).await;
        }
    }
    Ok(())
}

/// Where stopping a deleted consumer's workers stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workers {
    /// No Deployment left (or it was given [`WORKERS_STOP_WAIT`] and is left to go on its own).
    Stopped,
    /// Its Deployment is being deleted: look again after [`WORKERS_STOP_POLL`].
    Stopping,
}

/// One step of stopping the workers of a deleted consumer that registered stream consumers, run before
/// the finalizer's cleanup: the Deployment is deleted in the foreground (it goes only once its pods are
/// gone), and each later pass reads it again. Never waits: a pass that finds it still there returns
/// [`Workers::Stopping`] and the reconcile requeues. Past [`WORKERS_STOP_WAIT`] since its
/// `deletionTimestamp`, a Warning says so and the cleanup goes on.
async fn stop_workers(consumer: &StreamConsumer, ctx: &Context) -> Result<Workers> {
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), &namespace);
    let name = crate::pipeline::build::workers_name(consumer);
    let found = deployments.get_opt(&name).await.map_err(|e| Error::WorkersRunning(format!("reading {name}: {e}")))?;
    let Some(deployment) = found else { return Ok(Workers::Stopped) };
    let Some(since) = deployment.metadata.deletion_timestamp else {
        return match deployments.delete(&name, &DeleteParams::foreground()).await {
            Ok(_) => Ok(Workers::Stopping),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Workers::Stopped),
            Err(e) => Err(Error::WorkersRunning(format!("deleting {name}: {e}"))),
        };
    };
    let waited = k8s_openapi::jiff::Timestamp::now().duration_since(since.0);
    if waited.unsigned_abs() < WORKERS_STOP_WAIT || waited.is_negative() {
        return Ok(Workers::Stopping);
    }
    tracing::warn!(consumer = %consumer.name_any(), deployment = name, "workers not stopped in time; deregistering their stream consumers anyway");
    let note = format!(
        "workers ({name}) not stopped after {WORKERS_STOP_WAIT:?}; deregistering their stream consumers anyway"
    );
    ctx.publish(consumer, EventType::Warning, "WorkersStillRunning", note).await;
    Ok(Workers::Stopped)
}

#[cfg(test)]
mod tests;
