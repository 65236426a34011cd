//! Stage 6, status: conditions (computed in [`crate::conditions`]), observed generation, open shards,
//! replicas, selector, lease spread, lag and lag scaling's state, written by server-side apply of the status subresource.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use leasehold_crds::{
    LagScalingStatus, LagStatus, StreamCapacity, StreamConsumer, StreamConsumerStatus, WindowStatus, WorkerLeases,
};
use serde_json::json;

use super::build;
use crate::FIELD_MANAGER;
use crate::conditions::{Verdicts, conditions};
use crate::context::Context;
use crate::error::{Error, Result};

/// What a reconcile found, for the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// One verdict per condition.
    pub verdicts: Verdicts,
    /// Open shards over the named streams, when known.
    pub open_shards: Option<i32>,
    /// Desired workers.
    pub replicas: i32,
    /// Leases per worker.
    pub leases: Vec<WorkerLeases>,
    /// Each named stream's capacity mode and open shards, when known.
    pub capacity: Vec<StreamCapacity>,
    /// The lag as last read.
    pub lag: Option<LagStatus>,
    /// Lag scaling's state, with `workers.autoscaling.lag`.
    pub lag_scaling: Option<LagScalingStatus>,
    /// A window consumer's progress (`spec.window`).
    pub window: Option<WindowStatus>,
}

/// The status `report` makes of `consumer` (pure): transition times carry over from the current status.
pub fn status_of(consumer: &StreamConsumer, report: &Report) -> StreamConsumerStatus {
    let previous = consumer.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let streams = match (&consumer.spec.stream_pattern, consumer.spec.streams.is_empty()) {
        (Some(pattern), _) => Some(format!("/{pattern}/")),
        (None, false) => Some(consumer.spec.streams.iter().map(|s| s.stream_name()).collect::<Vec<_>>().join(",")),
        (None, true) => None,
    };
    let mut conditions = conditions(&report.verdicts, consumer.metadata.generation, previous);
    super::window_status::window_conditions(
        report.window.as_ref(),
        consumer.metadata.generation,
        previous,
        &mut conditions,
    );
    StreamConsumerStatus {
        conditions,
        observed_generation: consumer.metadata.generation,
        streams,
        open_shards: report.open_shards,
        replicas: Some(report.replicas),
        selector: Some(build::selector(consumer)),
        leases: report.leases.clone(),
        capacity: report.capacity.clone(),
        lag: report.lag.clone(),
        lag_scaling: report.lag_scaling.clone(),
        window: report.window.clone(),
    }
}

/// Writes the status of `report`.
pub async fn write_status(consumer: &StreamConsumer, ctx: &Context, report: &Report) -> Result<()> {
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let patch = json!({
        "apiVersion": StreamConsumer::api_version(&()),
        "kind": StreamConsumer::kind(&()),
        "status": status_of(consumer, report),
    });
    let api = Api::<StreamConsumer>::namespaced(ctx.client.clone(), &namespace);
    api.patch_status(&consumer.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(Error::Status)?;
    Ok(())
}
