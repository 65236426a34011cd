//! The `StreamConsumer` status the operator reports.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of a `StreamConsumer`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamConsumerStatus {
    /// `Ready`, `TableReady`, `StreamReady`, `WorkersReady`, `ConsumerReady` (enhanced fan-out).
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
    /// How many leases each worker holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<WorkerLeases>,
    /// Each named stream's capacity mode and open shards (on-demand streams have no shard count of
    /// their own: Kinesis changes it, and autoscaling follows it all the same).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["stream"]))]
    pub capacity: Vec<StreamCapacity>,
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
}
