//! The controller (kube-rs `Controller`, as in kube-rs/controller-rs): [`reconcile`] runs the
//! [`pipeline`](crate::pipeline) behind a finalizer for the table's deletion policy; [`error_policy`]
//! counts a failure by stage, announces it once, and backs off per object.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use leasehold_crds::{DeletionPolicy, StreamConsumer};
use tokio_util::sync::CancellationToken;

use crate::FINALIZER;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::pipeline;
use crate::readiness::ControllerState;
use crate::table::{self, Deletion, Owner};

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
        .owns(deployments, watcher::Config::default())
        .owns(config_maps, watcher::Config::default());
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

/// The key of an object's failure streak: its UID (a recreated object starts afresh).
fn streak_key(consumer: &StreamConsumer) -> String {
    consumer.uid().unwrap_or_else(|| format!("{}/{}", consumer.namespace().unwrap_or_default(), consumer.name_any()))
}

/// The table's owner: the resource's namespace, name and UID.
pub(crate) fn owner(consumer: &StreamConsumer) -> Result<Owner> {
    Ok(Owner {
        namespace: consumer.namespace().ok_or(Error::MissingMeta)?,
        name: consumer.name_any(),
        uid: consumer.uid().ok_or(Error::MissingMeta)?,
    })
}

/// One reconcile of one StreamConsumer; a success ends its failure streak.
pub async fn reconcile(consumer: Arc<StreamConsumer>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.inc();
    let started = std::time::Instant::now();
    let key = streak_key(&consumer);
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let api = Api::<StreamConsumer>::namespaced(ctx.client.clone(), &namespace);
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
        tokio::spawn(async move { publish(&ctx, &consumer, EventType::Warning, reason, note).await });
    } else {
        tracing::debug!(consumer = %name, kind, failures = retry.failures, delay = ?retry.delay, error = %error, "reconcile failed again");
    }
    match error {
        Error::InvalidSpec(_) => Action::await_change(),
        Error::StreamNotFound(_) | Error::Stream(_) => Action::requeue(retry.delay.min(ctx.shards.interval())),
        _ => Action::requeue(retry.delay),
    }
}

/// Publishes an event on `consumer` (best effort: events are informative).
pub(crate) async fn publish(ctx: &Context, consumer: &StreamConsumer, type_: EventType, reason: &str, note: String) {
    let event = Event { type_, reason: reason.into(), note: Some(note), action: "Reconcile".into(), secondary: None };
    if let Err(e) = ctx.recorder.publish(&event, &consumer.object_ref(&())).await {
        tracing::debug!(error = %e, "event not published");
    }
}

/// The resource is being deleted: apply the table's deletion policy.
async fn cleanup(consumer: &StreamConsumer, ctx: &Context) -> Result<Action> {
    let Some(spec) = &consumer.spec.lease_table else { return Ok(Action::await_change()) };
    match spec.deletion_policy.unwrap_or(DeletionPolicy::Retain) {
        DeletionPolicy::Retain => {
            tracing::info!(consumer = %consumer.name_any(), table = spec.name, "deletionPolicy Retain: lease table kept");
        }
        DeletionPolicy::Delete => {
            let clients = ctx.aws.get(&consumer.spec.aws).await;
            match table::delete_if_ours(&clients.dynamodb, &spec.name, &owner(consumer)?).await? {
                Deletion::Deleted => {
                    let note = format!("deleted lease table {}", spec.name);
                    publish(ctx, consumer, EventType::Normal, "TableDeleted", note).await
                }
                Deletion::KeptNotOurs => {
                    let note = format!("lease table {} kept: its tags do not show this resource created it", spec.name);
                    publish(ctx, consumer, EventType::Warning, "TableKept", note).await
                }
                Deletion::Missing => {}
            }
        }
    }
    Ok(Action::await_change())
}
