//! The `StreamConsumer` status the operator reports.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of a `StreamConsumer`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamConsumerStatus {
    /// `Ready`, `TableReady`, `StreamReady`, `WorkersReady`, `ConsumerReady` (enhanced fan-out),
    /// `LagScaling` (with `workers.autoscaling.lag`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The streams read, comma-separated (for the printer column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<String>,
    /// Open shards over all streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_shards: Option<i32>,
    /// Worker replicas currently desired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Label selector of the worker pods (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// How many leases each worker holds, and the load they carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<WorkerLeases>,
    /// Each named stream's capacity mode and open shards (on-demand streams have no shard count of
    /// their own: Kinesis changes it, and autoscaling follows it all the same).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["stream"]))]
    pub capacity: Vec<StreamCapacity>,
    /// The lag as last read from the lease rows (absent without a lease table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<LagStatus>,
    /// Where lag autoscaling stands (with `workers.autoscaling.lag`): the state its decisions carry
    /// from one reconcile to the next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_scaling: Option<LagScalingStatus>,
    /// A window consumer's progress (with `spec.window`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<crate::window::WindowStatus>,
}

/// The lag of a consumer's shards as read from its lease rows. Only rows with a live holder count: a
/// row without an owner, or whose lease ran out, carries a lag nobody is updating (`unheldShards`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LagStatus {
    /// The largest lag of a held shard, as a duration (`1m12s`, `0s` when caught up); absent while no
    /// holder has measured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest: Option<String>,
    /// The same in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_ms: Option<i64>,
    /// The shard with the largest lag (`<stream>:<shardId>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowest_shard: Option<String>,
    /// When the lease rows were read (the operator's clock).
    pub read_at: Time,
    /// Open shards whose row has no live holder (no owner, or a lease that ran out as read).
    pub unheld_shards: i32,
    /// Held shards whose holder has not written a lag yet.
    pub unmeasured_shards: i32,
}

/// The state lag autoscaling keeps between reconciles.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LagScalingStatus {
    /// Workers run above the shard-count rule because of lag.
    pub extra_replicas: i32,
    /// Since when the largest lag has stayed above the target (absent when it is not above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above_target_since: Option<Time>,
    /// Since when the largest lag has stayed under half the target (absent when it is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below_half_since: Option<Time>,
    /// When the last worker was added for lag: the next step waits `scaleUpAfter` from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step_at: Option<Time>,
}

/// One stream's capacity as last read (DescribeStreamSummary).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamCapacity {
    /// The stream's name.
    pub stream: String,
    /// `PROVISIONED` or `ON_DEMAND`.
    pub mode: String,
    /// Its open shards.
    pub open_shards: i32,
}

/// Leases held by one worker.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerLeases {
    /// The worker's owner id.
    pub owner: String,
    /// Leases it holds.
    pub leases: i32,
    /// The sum of the loads its holders measured on the leases it holds (each row's `load_records`,
    /// `load_bytes`, `load_busy`, written with renewals and checkpoints); absent until one of them
    /// carries a load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<WorkerLoad>,
}

/// A worker's load: the sum over the leases it holds of what each lease's holder measured.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerLoad {
    /// Kinesis records read per second.
    pub records_per_second: i64,
    /// Bytes of record data per second.
    pub bytes_per_second: i64,
    /// Milliseconds per second the processor spent on the records (summed over records running at
    /// once).
    pub busy_ms_per_second: i64,
}
