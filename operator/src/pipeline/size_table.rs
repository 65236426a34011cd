//! Stage 4b, size table (after the shards are counted): a PROVISIONED lease table this resource
//! created holds what its group needs, from `leaseTable.readCapacity` / `writeCapacity` or sized from
//! the open shards, workers and lease timings ([`super::table_capacity`]), resized as they change; the
//! `TableCapacity` condition says whether the table's capacity covers the group (false, with a Warning
//! event, when a figure set by hand or a table made elsewhere is too low). Its failures show in the
//! condition and fail nothing else: a table short of capacity still serves, throttled.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use leasehold_crds::{BillingMode, LeaseTableSpec, ResolvedSpec, StreamConsumer};

use super::build;
use super::table::{self, Owner};
use super::table_capacity::{self as capacity, Capacity, Group, Provisioned};
use crate::conditions::Verdict;
use crate::context::Context;

/// The condition type this stage decides.
pub const CONDITION: &str = "TableCapacity";

fn group(ctx: &Context, resolved: &ResolvedSpec, open_shards: i32, workers: i32) -> Group {
    let shards = u32::try_from(open_shards).unwrap_or(0);
    let workers = u32::try_from(workers).unwrap_or(0).max(1);
    Group::of(resolved, shards, workers, ctx.settings.shard_poll_interval)
}

/// The capacity a table for `open_shards` should have: the spec's figures where set, else sized (with
/// headroom) for the workers the shard count gives.
pub fn wanted(
    consumer: &StreamConsumer,
    ctx: &Context,
    resolved: &ResolvedSpec,
    spec: &LeaseTableSpec,
    open_shards: i32,
) -> Capacity {
    let workers = build::desired_replicas(&consumer.spec, Some(open_shards));
    let demand = capacity::demand(&group(ctx, resolved, open_shards, workers));
    capacity::target(spec, Capacity::sized(&demand))
}

/// The last `TableCapacity` verdict in status, kept while the table cannot be read or is not ACTIVE.
fn previous(consumer: &StreamConsumer) -> Option<Verdict> {
    let conditions: &[Condition] = consumer.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions.iter().find(|c| c.type_ == CONDITION).map(|c| Verdict {
        ok: c.status == "True",
        reason: c.reason.clone(),
        message: c.message.clone(),
    })
}

/// Sizes the table of `consumer` for `open_shards` shards and `replicas` workers and returns the
/// `TableCapacity` verdict; `None` without a lease table.
pub async fn size_table(
    consumer: &StreamConsumer,
    ctx: &Context,
    resolved: &ResolvedSpec,
    open_shards: Option<i32>,
    replicas: i32,
) -> Option<Verdict> {
    let spec = consumer.spec.lease_table.as_ref()?;
    let Some(open_shards) = open_shards else { return previous(consumer) };
    let clients = ctx.aws.get(&consumer.spec.aws).await;
    let client = &clients.dynamodb;
    let description = match capacity::describe_active(client, &spec.name).await {
        Ok(Some(description)) => description,
        Ok(None) => return previous(consumer),
        Err(error) => return Some(Verdict::from_error(&error)),
    };
    let Some(current) = Provisioned::of(&description) else {
        return Some(Verdict::ok("OnDemand", format!("lease table {} is on demand: nothing to size", spec.name)));
    };
    let demand = capacity::demand(&group(ctx, resolved, open_shards, replicas));
    let floor = Capacity::floor(&demand);
    let want = capacity::target(spec, Capacity::sized(&demand));
    let explicit = (spec.read_capacity.is_some(), spec.write_capacity.is_some());
    let of_group = format!("{open_shards} open shard(s), {} worker(s)", replicas.max(1));
    let mut holds = current.capacity;
    // Only a table this resource created under `billingMode: PROVISIONED` is resized.
    let mut ours = spec.billing_mode == Some(BillingMode::Provisioned);
    if ours && let Some(next) = capacity::planned(&current, want, explicit, SystemTime::now()) {
        let owner = match Owner::of(consumer) {
            Ok(owner) => owner,
            Err(error) => return Some(Verdict::from_error(&error)),
        };
        let arn = description.table_arn().unwrap_or_default();
        ours = match table::is_ours(client, &spec.name, arn, &owner).await {
            Ok(ours) => ours,
            Err(error) => return Some(Verdict::from_error(&error)),
        };
        if ours {
            if let Err(error) = capacity::update(client, &spec.name, next).await {
                return Some(Verdict::failed("ResizeFailed", format!("{}; it holds {holds}", error.message())));
            }
            let note = format!("lease table {}: {holds} -> {next} ({of_group})", spec.name);
            tracing::info!(consumer = %consumer.name_any(), table = spec.name, %holds, %next, "lease table resized");
            // Each resize names its figures in the action, so the recorder keeps every note.
            let action = format!("Resize to {next}");
            ctx.publish_action(consumer, EventType::Normal, "TableResized", &action, note).await;
            holds = next;
        }
    }
    if holds.covers(&floor) {
        return Some(Verdict::ok(
            "Sized",
            format!("lease table {} holds {holds}; the group needs {floor} ({of_group})", spec.name),
        ));
    }
    let fix = if !ours {
        "the operator resizes only a table this resource created with billingMode: PROVISIONED: raise its capacity"
    } else {
        "raise leaseTable.readCapacity / writeCapacity, or remove them to size the table from the shards"
    };
    let message = format!(
        "lease table {} holds {holds}; the group needs {floor} ({of_group}) and will be throttled: {fix}",
        spec.name
    );
    let verdict = Verdict::failed("UnderProvisioned", message);
    if previous(consumer).is_none_or(|p| p != verdict) {
        ctx.publish(consumer, EventType::Warning, "UnderProvisioned", verdict.message.clone()).await;
    }
    Some(verdict)
}
