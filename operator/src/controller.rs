//! The reconcile loop: observe -> build -> apply -> status, behind a finalizer for the table's
//! deletion policy.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use leasehold_crds::{DeletionPolicy, StreamConsumer, StreamConsumerStatus, WorkerLeases};
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, LeaseStore};
use serde_json::json;
use std::collections::BTreeMap;
use tokio_util::sync::CancellationToken;

use crate::build;
use crate::conditions::{Verdict, Verdicts, conditions};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::shards::StreamCount;
use crate::table::{self, Deletion, Owner, TableState};
use crate::{FIELD_MANAGER, FINALIZER};

/// Requeue while the table is being created.
const TABLE_WAIT: Duration = Duration::from_secs(2);

/// Runs the controller until `shutdown` is cancelled, over every namespace or only `namespace`.
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
    Controller::new(consumers, watcher::Config::default().any_semantic())
        .owns(deployments, watcher::Config::default())
        .owns(config_maps, watcher::Config::default())
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile loop");
            }
        })
        .await;
}

fn owner(consumer: &StreamConsumer) -> Result<Owner> {
    Ok(Owner {
        namespace: consumer.namespace().ok_or(Error::MissingMeta)?,
        name: consumer.name_any(),
        uid: consumer.uid().ok_or(Error::MissingMeta)?,
    })
}

/// One reconcile of one StreamConsumer.
pub async fn reconcile(consumer: Arc<StreamConsumer>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.inc();
    let started = std::time::Instant::now();
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let api = Api::<StreamConsumer>::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, consumer, |event| async {
        match event {
            Finalized::Apply(consumer) => apply(&consumer, &ctx).await,
            Finalized::Cleanup(consumer) => cleanup(&consumer, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics.duration.observe(started.elapsed().as_secs_f64());
    result
}

/// On failure: count it, and retry after a pause (the controller backs off further on repeats).
pub fn error_policy(consumer: Arc<StreamConsumer>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failures.inc();
    tracing::warn!(consumer = %consumer.name_any(), error = %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn publish(ctx: &Context, consumer: &StreamConsumer, type_: EventType, reason: &str, note: String) {
    let event = Event { type_, reason: reason.into(), note: Some(note), action: "Reconcile".into(), secondary: None };
    if let Err(e) = ctx.recorder.publish(&event, &consumer.object_ref(&())).await {
        tracing::debug!(error = %e, "event not published");
    }
}

/// Observe the table and the streams; decide on the table's verdict (creating it when missing).
async fn observe_table(consumer: &StreamConsumer, ctx: &Context) -> Result<(Verdict, bool)> {
    let Some(spec) = &consumer.spec.lease_table else {
        let replicas = build::desired_replicas(&consumer.spec, None);
        let message = if replicas > 1 {
            "no leaseTable: each worker keeps leases in memory and reads every shard on its own"
        } else {
            "no leaseTable: the worker keeps leases in memory"
        };
        return Ok((Verdict::ok("InMemory", message), true));
    };
    let clients = ctx.aws.get(&consumer.spec.aws).await;
    match table::ensure(&clients.dynamodb, spec, &owner(consumer)?).await {
        Ok((state, created)) => {
            if created {
                publish(ctx, consumer, EventType::Normal, "TableCreated", format!("created lease table {}", spec.name))
                    .await;
            }
            Ok(match state {
                TableState::Active => (Verdict::ok("Active", format!("lease table {} is ACTIVE", spec.name)), true),
                TableState::Creating => {
                    (Verdict::failed("TableCreating", format!("lease table {} is being created", spec.name)), false)
                }
                TableState::Other(status) => {
                    (Verdict::failed("TableNotActive", format!("lease table {} is {status}", spec.name)), false)
                }
            })
        }
        Err(e) => {
            publish(ctx, consumer, EventType::Warning, "TableError", e.to_string()).await;
            Ok((Verdict::failed("TableError", e.to_string()), false))
        }
    }
}

/// Open shards over the named streams; a pattern or manual assignment leaves the count unknown.
async fn observe_streams(consumer: &StreamConsumer, ctx: &Context) -> (Verdict, Option<i32>) {
    let spec = &consumer.spec;
    if spec.streams.is_empty() {
        return (Verdict::ok("Found", "streams chosen by pattern or assignment; not counted"), None);
    }
    let clients = ctx.aws.get(&spec.aws).await;
    let endpoint = format!("{:?}/{:?}", spec.aws.region, spec.aws.kinesis_endpoint);
    let mut open = 0;
    let mut missing = Vec::new();
    let mut failures = Vec::new();
    for stream in &spec.streams {
        match ctx.shards.get(&clients.kinesis, &endpoint, &stream.name).await {
            StreamCount::Open(n) => open += n,
            StreamCount::NotFound => missing.push(stream.name.clone()),
            StreamCount::Failed(e) => failures.push(format!("{}: {e}", stream.name)),
        }
    }
    if !missing.is_empty() {
        return (Verdict::failed("StreamNotFound", format!("stream(s) not found: {}", missing.join(", "))), None);
    }
    if !failures.is_empty() {
        return (Verdict::failed("StreamError", failures.join("; ")), None);
    }
    (Verdict::ok("Found", format!("{open} open shard(s)")), Some(open))
}

/// How many leases each worker holds, read from the lease table (empty when there is none or it cannot
/// be read; the table's own condition reports why).
async fn lease_spread(consumer: &StreamConsumer, ctx: &Context) -> Vec<WorkerLeases> {
    let Some(table) = &consumer.spec.lease_table else { return Vec::new() };
    let clients = ctx.aws.get(&consumer.spec.aws).await;
    let reader = DynamoLeaseStore::new(clients.dynamodb, table.name.clone(), LeaseSettings::new(FIELD_MANAGER));
    let Ok(page) = reader.list().await else { return Vec::new() };
    let mut counts: BTreeMap<String, i32> = BTreeMap::new();
    for owner in page.leases.into_iter().filter(|l| !l.checkpoint.is_shard_end()).filter_map(|l| l.owner) {
        *counts.entry(owner).or_default() += 1;
    }
    counts.into_iter().map(|(owner, leases)| WorkerLeases { owner, leases }).collect()
}

async fn apply(consumer: &StreamConsumer, ctx: &Context) -> Result<Action> {
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let previous = consumer.status.clone().unwrap_or_default();
    if let Err(errors) = consumer.spec.validate() {
        let message = errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
        publish(ctx, consumer, EventType::Warning, "InvalidSpec", message.clone()).await;
        let invalid = Verdict::failed("InvalidSpec", message);
        let verdicts =
            Verdicts { spec: invalid.clone(), table: invalid.clone(), stream: invalid.clone(), workers: invalid };
        let replicas = previous.replicas.unwrap_or(0);
        write_status(consumer, ctx, &verdicts, previous.open_shards, replicas, previous.leases.clone()).await?;
        return Ok(Action::await_change());
    }
    let (table_verdict, table_ready) = observe_table(consumer, ctx).await?;
    let (stream_verdict, open_shards) = observe_streams(consumer, ctx).await;
    let open_shards = open_shards.or(previous.open_shards);
    let replicas = build::desired_replicas(&consumer.spec, open_shards);

    // Workers start only once their table can hold leases.
    let workers_verdict = if table_ready {
        let config = build::worker_config(&consumer.spec)?;
        let hash = build::config_hash(&config);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let config_maps = Api::<ConfigMap>::namespaced(ctx.client.clone(), &namespace);
        let config_map = build::config_map(consumer, &config);
        config_maps.patch(&build::workers_name(consumer), &params, &Patch::Apply(&config_map)).await?;
        let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), &namespace);
        let deployment = build::deployment(consumer, replicas, &ctx.settings.worker_image, &hash);
        let applied = deployments.patch(&build::workers_name(consumer), &params, &Patch::Apply(&deployment)).await?;
        if let Some(before) = previous.replicas
            && before != replicas
        {
            let note = format!("workers scaled from {before} to {replicas}");
            publish(ctx, consumer, EventType::Normal, "Scaled", note).await;
        }
        let ready = applied.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        if ready >= replicas {
            Verdict::ok("Ready", format!("{ready}/{replicas} workers ready"))
        } else {
            Verdict::failed("WorkersNotReady", format!("{ready}/{replicas} workers ready"))
        }
    } else {
        Verdict::failed("WaitingForTable", "workers start once the lease table is ACTIVE")
    };
    let verdicts = Verdicts {
        spec: Verdict::ok("Valid", ""),
        table: table_verdict,
        stream: stream_verdict,
        workers: workers_verdict,
    };
    let leases = if table_ready { lease_spread(consumer, ctx).await } else { Vec::new() };
    write_status(consumer, ctx, &verdicts, open_shards, replicas, leases).await?;
    Ok(Action::requeue(if table_ready { ctx.shards.interval() } else { TABLE_WAIT }))
}

async fn write_status(
    consumer: &StreamConsumer,
    ctx: &Context,
    verdicts: &Verdicts,
    open_shards: Option<i32>,
    replicas: i32,
    leases: Vec<WorkerLeases>,
) -> Result<()> {
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let previous = consumer.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let streams = match (&consumer.spec.stream_pattern, consumer.spec.streams.is_empty()) {
        (Some(pattern), _) => Some(format!("/{pattern}/")),
        (None, false) => Some(consumer.spec.streams.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(",")),
        (None, true) => None,
    };
    let status = StreamConsumerStatus {
        conditions: conditions(verdicts, consumer.metadata.generation, previous),
        observed_generation: consumer.metadata.generation,
        streams,
        open_shards,
        replicas: Some(replicas),
        selector: Some(build::selector(consumer)),
        leases,
    };
    let patch = json!({
        "apiVersion": StreamConsumer::api_version(&()),
        "kind": StreamConsumer::kind(&()),
        "status": status,
    });
    let api = Api::<StreamConsumer>::namespaced(ctx.client.clone(), &namespace);
    api.patch_status(&consumer.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    Ok(())
}

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
                    publish(
                        ctx,
                        consumer,
                        EventType::Normal,
                        "TableDeleted",
                        format!("deleted lease table {}", spec.name),
                    )
                    .await
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
