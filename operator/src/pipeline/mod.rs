//! The reconcile of a live StreamConsumer as a pipeline, one stage per module:
//! [`validate`] -> [`ensure_table`] -> [`ensure_streams`] -> [`ensure_consumer`] -> [`observe`] ->
//! [`size_table`] -> [`build`] (pure, no client; with the lag scaling decision of [`lag::scaling`]) ->
//! [`apply`] -> [`status`]. Beside the stages, the helpers they use: [`table`] and [`table_capacity`]
//! (the lease table and its sizing), [`lag`] (lag from the rows, scaling on it), [`stream_consumers`]
//! (fan-out's registered consumers), [`network_policy`] (pure, the workers' NetworkPolicy). The caches
//! every consumer shares (open shard counts, lease rows read at most once per interval) are held by the
//! [`Context`] ([`crate::context::shards`], [`crate::context::lease_rows`]).
//!
//! Each stage fails with its own [`Error`] variants, counted under that stage's kind. The status is
//! written whatever failed (except the status write itself), so a failure shows as a condition; then the
//! first failure in stage order is returned, and the controller's `error_policy` backs off.

pub mod apply;
pub mod build;
pub mod ensure_consumer;
pub mod ensure_streams;
pub mod ensure_table;
pub mod lag;
pub mod network_policy;
pub mod observe;
pub mod size_table;
pub mod status;
pub mod stream_consumers;
pub mod table;
pub mod table_capacity;
pub mod validate;
pub mod window_finish;
pub mod window_status;

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use leasehold_crds::{ResolvedSpec, StreamConsumer};

use crate::conditions::{Verdict, Verdicts};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::metrics::ConsumerLabels;
use lag::reading::LagReading;
use lag::scaling;
use status::{Report, write_status};

/// Requeue while the table or a stream consumer is being created (a wait, not a failure: no backoff).
pub const TABLE_WAIT: Duration = Duration::from_secs(2);

/// The verdict of a stage's outcome: `ok` of its value, or the failure's reason and message.
fn verdict<T>(outcome: &Result<T>, ok: impl FnOnce(&T) -> Verdict) -> Verdict {
    match outcome {
        Ok(value) => ok(value),
        Err(error) => Verdict::from_error(error),
    }
}

/// Runs the pipeline once for `consumer`.
pub async fn run(consumer: &StreamConsumer, ctx: &Context) -> Result<Action> {
    let previous = consumer.status.clone().unwrap_or_default();
    let resolved = match validate::validate(consumer, ctx.settings.restrict_templates) {
        Ok(resolved) => resolved,
        Err(error) => {
            // Nothing is changed for an invalid spec; the last known counts stay in status.
            let report = Report {
                verdicts: Verdicts::all(Verdict::from_error(&error)),
                open_shards: previous.open_shards,
                replicas: previous.replicas.unwrap_or(0),
                leases: previous.leases,
                capacity: previous.capacity,
                lag: previous.lag,
                lag_scaling: previous.lag_scaling,
                window: previous.window,
            };
            write_status(consumer, ctx, &report).await?;
            return Err(error);
        }
    };
    // A window consumer: its own table, seen as leaseTable; once completed, only the finish runs.
    let windowed = crate::window::with_table(consumer);
    let consumer = windowed.as_ref();
    if let Some(finished) = window_finish::after_completion(consumer, ctx, &resolved).await {
        return finished;
    }
    let table = ensure_table::ensure_table(consumer, ctx, &resolved, previous.open_shards).await;
    let table_ready = table.as_ref().is_ok_and(|t| t.ready);
    let streams = ensure_streams::ensure_streams(consumer, ctx).await;
    let streams_ready = streams.as_ref().is_ok_and(|s| s.ready());
    let stream_consumers = ensure_consumer::ensure_consumer(consumer, ctx).await;
    let consumers_ready = stream_consumers.as_ref().is_ok_and(|c| c.ready);
    let shards = observe::capacity(consumer, ctx).await;
    // An unreadable count keeps the last one, so workers are not scaled on a transient error.
    let capacity = shards.as_ref().ok().cloned().flatten();
    let open_shards = capacity.as_ref().map(|c| c.iter().map(|s| s.open_shards).sum()).or(previous.open_shards);
    let capacity = capacity.unwrap_or(previous.capacity);
    let rows = if table_ready { observe::lease_rows(consumer, ctx).await } else { None };
    let leases = rows.as_deref().map(observe::lease_spread).unwrap_or_default();
    let lag = rows.as_deref().map(|r| LagReading::of(&r.leases, r.read_at, resolved.durations.lease));
    match &lag {
        Some(lag) => ctx.metrics.publish_lag(&consumer_labels(consumer), lag),
        // A table taken out of the spec leaves no lag to report; an unreadable one keeps the last.
        None if consumer.spec.lease_table.is_none() => ctx.metrics.forget_consumer(&consumer_labels(consumer)),
        None => {}
    }
    let by_shards = build::desired_replicas(&consumer.spec, open_shards);
    let open_rows = rows.as_deref().map(|r| r.leases.iter().filter(|l| !l.checkpoint.is_shard_end()).count());
    let on_lag = scale_on_lag(consumer, &resolved, lag.as_ref(), by_shards, open_shards, open_rows);
    let window = window_status::observe(consumer, ctx, rows.as_deref()).await;
    let replicas = on_lag.as_ref().map_or(by_shards, |d| d.replicas);
    let replicas = match &window {
        Some(window) if window.completed => {
            window_finish::announce(consumer, ctx, window).await;
            0
        }
        _ => replicas,
    };
    let counted = open_shards.or_else(|| open_rows.and_then(|n| i32::try_from(n).ok()));
    let table_capacity =
        if table_ready { size_table::size_table(consumer, ctx, &resolved, counted, replicas).await } else { None };
    // Workers start only once their table can hold leases and their stream consumers are ACTIVE.
    let workers = if table_ready && consumers_ready && streams_ready {
        match build::desired(consumer, replicas, &resolved, &ctx.settings.worker_image) {
            Ok(desired) => {
                apply::apply(consumer, ctx, &desired, on_lag.as_ref().and_then(|d| d.why.as_deref())).await.map(Some)
            }
            Err(error) => Err(Error::Build(error)),
        }
    } else {
        Ok(None)
    };
    let report = Report {
        verdicts: Verdicts {
            spec: Verdict::ok("Valid", ""),
            table: verdict(&table, |t| t.verdict.clone()),
            stream: stream_verdict(
                &streams,
                verdict(&shards, |count| match count {
                    Some(streams) => Verdict::ok("Found", describe(streams)),
                    None => Verdict::ok("Found", "streams chosen by pattern or assignment; not counted"),
                }),
            ),
            workers: verdict(&workers, |ready| match ready {
                Some(ready) if *ready >= replicas => Verdict::ok("Ready", format!("{ready}/{replicas} workers ready")),
                Some(ready) => Verdict::failed("WorkersNotReady", format!("{ready}/{replicas} workers ready")),
                None if !table_ready => {
                    Verdict::failed("WaitingForTable", "workers start once the lease table is ACTIVE")
                }
                None if !streams_ready => {
                    Verdict::failed("WaitingForStreams", "workers start once the streams to create are ACTIVE")
                }
                None => Verdict::failed("WaitingForConsumer", "workers start once the stream consumers are ACTIVE"),
            }),
            consumer: verdict(&stream_consumers, |c| c.verdict.clone()),
            lag: on_lag.as_ref().map(|d| d.verdict.clone()),
            capacity: table_capacity,
        },
        open_shards,
        replicas,
        leases,
        capacity,
        lag: lag.as_ref().map(LagReading::status).or(previous.lag),
        lag_scaling: on_lag.map(|d| d.state),
        window,
    };
    write_status(consumer, ctx, &report).await?;
    table?;
    streams?;
    stream_consumers?;
    shards?;
    workers?;
    let ready = table_ready && consumers_ready && streams_ready;
    Ok(Action::requeue(if ready { ctx.shards.interval() } else { TABLE_WAIT }))
}

/// The labels of `consumer`'s own series on the operator's `/metrics`.
pub fn consumer_labels(consumer: &StreamConsumer) -> ConsumerLabels {
    ConsumerLabels { namespace: consumer.namespace().unwrap_or_default(), name: consumer.name_any() }
}

/// The lag scaling decision, with `workers.autoscaling.lag` set and the consumer not paused; `None`
/// otherwise (replicas follow the shard-count rule alone, as without lag scaling). Open shards not
/// counted (streams chosen by pattern) are the open rows of the lease table.
fn scale_on_lag(
    consumer: &StreamConsumer,
    resolved: &ResolvedSpec,
    lag: Option<&LagReading>,
    by_shards: i32,
    open_shards: Option<i32>,
    open_rows: Option<usize>,
) -> Option<scaling::Decision> {
    let target = resolved.lag_scaling.as_ref()?;
    let autoscaling = consumer.spec.workers.autoscaling.as_ref()?;
    if consumer.spec.paused == Some(true) {
        return None;
    }
    let previous = consumer.status.as_ref().and_then(|s| s.lag_scaling.clone()).unwrap_or_default();
    let observed = scaling::Observed {
        largest: lag.and_then(LagReading::largest),
        base: by_shards,
        open_shards: open_shards.or_else(|| open_rows.and_then(|n| i32::try_from(n).ok())),
        max_replicas: autoscaling.max_replicas,
        now: Timestamp::now(),
    };
    Some(scaling::decide(target, &previous, &observed))
}

/// The `StreamReady` verdict: the streams to create first (`StreamCreating` while one is not ACTIVE),
/// then the shard counts (`counted`), with `ShapeDiffers` when an existing stream's shape is not the one
/// `createIfMissing` asks for (it is left as it is).
fn stream_verdict(streams: &Result<ensure_streams::StreamsReadiness>, counted: Verdict) -> Verdict {
    match streams {
        Err(error) => Verdict::from_error(error),
        Ok(s) if !s.ready() => Verdict::failed("StreamCreating", format!("waiting for {}", s.pending.join(", "))),
        Ok(s) if !s.differs.is_empty() && counted.ok => {
            Verdict::ok("ShapeDiffers", format!("{}; left as it is: {}", counted.message, s.differs.join("; ")))
        }
        Ok(_) => counted,
    }
}

/// The `StreamReady` message: open shards per stream, with the on-demand ones marked.
fn describe(streams: &[leasehold_crds::StreamCapacity]) -> String {
    let open: i32 = streams.iter().map(|s| s.open_shards).sum();
    let on_demand: Vec<&str> = streams.iter().filter(|s| s.mode == "ON_DEMAND").map(|s| s.stream.as_str()).collect();
    match on_demand.is_empty() {
        true => format!("{open} open shard(s)"),
        false => format!("{open} open shard(s); on demand: {}", on_demand.join(", ")),
    }
}
