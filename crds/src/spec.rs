//! The `StreamConsumer` spec: what to read, where leases live, how many workers, how to process.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::status::StreamConsumerStatus;

/// Schema pattern of every duration field: `10s`, `500ms`, `1m`, `1h30m`, `1.5s`; longer than zero (one
/// number at least has a digit other than 0), as the worker requires.
const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))*([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)(ms|s|m|h)([0-9]+(\.[0-9]+)?(ms|s|m|h))*$";

/// Schema pattern of `startTimestamp`: the RFC 3339 forms the worker reads, in UTC (`Z`, `+00:00` or
/// nothing), `T` or a space between date and time; the worker checks the ranges (month 13, ...).
const TIMESTAMP_PATTERN: &str = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|\+00:00)?$";

/// Schema pattern of one `assignment.shards` entry: `<stream>:<shardId>`.
const ASSIGNED_SHARD_PATTERN: &str = r"^[a-zA-Z0-9_.-]{1,128}:[\s\S]+$";

/// A Kinesis consumer: streams to read, a lease table shared by its workers, and how to process records.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("!(has(self.streams) && size(self.streams) > 0 && has(self.streamPattern))").message("give streams or streamPattern, not both").field_path(".streamPattern"))]
#[x_kube(validation = Rule::new("(has(self.streams) && size(self.streams) > 0) || has(self.streamPattern) || (has(self.assignment) && size(self.assignment.shards) > 0)").message("name at least one stream, or set streamPattern").field_path(".streams"))]
#[x_kube(validation = Rule::new("!has(self.streams) || self.streams.all(a, self.streams.filter(b, (has(b.name) ? b.name : b.arn.split('/')[1]) == (has(a.name) ? a.name : a.arn.split('/')[1])).size() == 1)").message("a stream is named twice (by name or by ARN); lease keys are <stream name>:<shardId>, so read same-named streams of two accounts with two consumers").field_path(".streams"))]
#[x_kube(validation = Rule::new("!has(self.retry) || !has(self.retry.bisect) || !self.retry.bisect || (has(self.processor.http) && has(self.processor.http.batch) && has(self.processor.http.batch.maxRecords) && self.processor.http.batch.maxRecords > 1)").message("retry.bisect needs processor.http.batch.maxRecords above 1 (it splits http batches)").field_path(".retry.bisect"))]
#[x_kube(validation = Rule::new("!has(self.workers) || !has(self.workers.autoscaling) || !has(self.workers.autoscaling.lag) || has(self.leaseTable)").message("workers.autoscaling.lag needs leaseTable: the lag is read from the lease rows").field_path(".workers.autoscaling.lag"))]
#[x_kube(validation = Rule::new("has(self.startTimestamp) == (has(self.startPosition) && self.startPosition == 'AT_TIMESTAMP')").message("startTimestamp is required with, and allowed only with, startPosition AT_TIMESTAMP").field_path(".startTimestamp"))]
#[x_kube(validation = Rule::new("!has(self.window) || (!has(self.startPosition) && !has(self.startTimestamp))").message("a window starts at window.start: leave startPosition and startTimestamp out").field_path(".window"))]
#[x_kube(validation = Rule::new("!has(self.window) || !has(self.assignment)").message("a window reads every shard of its streams: leave assignment out").field_path(".window"))]
#[x_kube(validation = Rule::new("!has(self.window) || !has(self.streamPattern)").message("a window reads named streams: give streams, not streamPattern").field_path(".window"))]
#[x_kube(validation = Rule::new("!has(self.window) || !has(self.leaseTable)").message("a window's lease table is named and created by the operator: leave leaseTable out").field_path(".window"))]
#[x_kube(validation = Rule::new("!has(self.window) || !has(self.reader) || !has(self.reader.mode) || self.reader.mode != 'fanOut'").message("a window is read by polling: leave reader.mode fanOut out").field_path(".window"))]
#[x_kube(validation = Rule::new("!has(self.window) || self.window.end == 'now' || !(self.window.start.endsWith('Z') && self.window.end.endsWith('Z') && self.window.start.contains('T') && self.window.end.contains('T')) || timestamp(self.window.start) < timestamp(self.window.end)").message("window.end must be later than window.start").field_path(".window.end"))]
#[kube(
    group = "leasehold.io",
    version = "v1alpha1",
    kind = "StreamConsumer",
    namespaced,
    status = "StreamConsumerStatus",
    shortname = "scon",
    category = "leasehold",
    printcolumn = r#"{"name":"Streams","type":"string","jsonPath":".status.streams"}"#,
    printcolumn = r#"{"name":"Shards","type":"integer","jsonPath":".status.openShards"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Lag","type":"string","jsonPath":".status.lag.largest"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    scale = r#"{"specReplicasPath":".spec.workers.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.selector"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StreamConsumerSpec {
    /// Streams to read, each by name or by ARN; one subscription per stream. Give this or
    /// `streamPattern`, not both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    // Lease keys are `<stream name>:<shardId>`: a stream named twice (by name, or by ARNs of two
    // accounts) is refused.
    #[schemars(length(max = 100))]
    pub streams: Vec<StreamSpec>,
    /// Regular expression over stream names; matching streams (including ones created later) are read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_pattern: Option<String>,
    /// AWS region and optional endpoints (for emulators or VPC endpoints).
    #[serde(default)]
    pub aws: AwsSpec,
    /// The DynamoDB lease table shared by the workers. Without it a worker keeps leases in memory
    /// (one instance only; empty after a restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_table: Option<LeaseTableSpec>,
    /// How many workers to run.
    #[serde(default)]
    pub workers: WorkersSpec,
    /// Where a shard with no checkpoint starts; children of split or merged shards always start at
    /// their oldest record. Default LATEST.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = field_doc_wins)]
    pub start_position: Option<StartPosition>,
    /// With `startPosition: AT_TIMESTAMP`: the time to start at (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = TIMESTAMP_PATTERN))]
    pub start_timestamp: Option<String>,
    /// Lease timing.
    #[serde(default)]
    pub lease: LeaseTimingSpec,
    /// How shards are read.
    #[serde(default)]
    pub reader: ReaderSpec,
    /// What is done with each record: exactly one of the processor kinds.
    pub processor: ProcessorSpec,
    /// Order guarantee inside a shard: `key` (default), `shard` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = field_doc_wins)]
    pub ordering: Option<Ordering>,
    /// Records processed at once per shard (with `ordering: key` or `none`), 1-10000. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub concurrency: Option<i32>,
    /// What happens when processing a record fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// Only records matching this filter are processed; the others are checkpointed without being
    /// processed, and counted (Lambda's FilterCriteria).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterSpec>,
    /// Stream that processors may emit records to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputSpec>,
    /// Manual assignment: read exactly these shards, with no balancing (Kafka's `assign()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<AssignmentSpec>,
    /// A stable lease owner id (for example the pod name), so a restarted worker retakes its own leases at
    /// once. Default: a fresh id per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    /// Partial pod template for the workers: image, sidecars, resources, service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub template: Option<PodTemplateSpec>,
    /// Scale the workers to zero while true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// A bounded consumer: replay the records that arrived between `window.start` and `window.end`,
    /// with a lease table of its own, then finish (docs/operations.md, "Replay").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<crate::window::WindowSpec>,
}

/// Keeps the doc comment (and so the default it states) of a field whose type is an optional enum:
/// kube's `OptionalEnum` transform hoists the enum's own schema over the field's, and the enum's
/// description would replace the field's in the CRD and in docs/reference/spec.md.
pub(crate) fn field_doc_wins(schema: &mut schemars::Schema) {
    if let Some(any_of) = schema.get_mut("anyOf").and_then(serde_json::Value::as_array_mut) {
        for alternative in any_of.iter_mut().filter_map(serde_json::Value::as_object_mut) {
            alternative.remove("description");
        }
    }
}

fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "description": "Partial PodTemplateSpec merged into the worker pods: image, sidecars, resources, serviceAccountName."
    })
}

/// One stream to read: by name (in the consumer's own account and region), or by ARN (any account:
/// every Kinesis call passes `StreamARN`, with credentials from the standard AWS chain).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.name) != has(self.arn)").message("set exactly one of name, arn"))]
#[x_kube(validation = Rule::new("!has(self.createIfMissing) || has(self.name)").message("createIfMissing needs name: a stream is created in the consumer's own account").field_path(".createIfMissing"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StreamSpec {
    /// The stream's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-zA-Z0-9_.-]{1,128}$"), length(max = 128))]
    pub name: Option<String>,
    /// The stream's ARN, `arn:<partition>:kinesis:<region>:<account>:stream/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = STREAM_ARN_PATTERN), length(max = 256))]
    pub arn: Option<String>,
    /// Create the stream when it does not exist (and wait for it to be ACTIVE before reading): with
    /// `shards: N` (provisioned) or `onDemand: true`. An existing stream is left as it is; Leasehold
    /// never deletes a stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_if_missing: Option<CreateIfMissing>,
}

/// The shape of a stream Leasehold creates when it is missing: exactly one of `shards`, `onDemand`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.shards) != (has(self.onDemand) && self.onDemand)").message("set exactly one of shards, onDemand: true"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateIfMissing {
    /// A provisioned stream with this many shards (1-10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub shards: Option<i32>,
    /// An on-demand stream (capacity managed by Kinesis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand: Option<bool>,
}

/// The form of a stream ARN (the CRD schema and the worker check the same).
pub const STREAM_ARN_PATTERN: &str = r"^arn:aws[a-zA-Z-]*:kinesis:[a-z0-9-]+:[0-9]{12}:stream/[a-zA-Z0-9_.-]{1,128}$";

impl StreamSpec {
    /// A stream given by name.
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: Some(name.into()), arn: None, create_if_missing: None }
    }

    /// The stream's name: `name`, or the last part of `arn` (empty when neither is set).
    pub fn stream_name(&self) -> &str {
        match (&self.name, &self.arn) {
            (Some(name), _) => name,
            (None, Some(arn)) => arn.rsplit_once('/').map(|(_, name)| name).unwrap_or_default(),
            (None, None) => "",
        }
    }
}

/// AWS settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwsSpec {
    /// AWS region; default from the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Kinesis endpoint URL, for emulators or VPC endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinesis_endpoint: Option<String>,
    /// DynamoDB endpoint URL, for emulators or VPC endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamodb_endpoint: Option<String>,
    /// SQS endpoint URL (for `retry.deadLetterQueue`), for emulators or VPC endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqs_endpoint: Option<String>,
    /// S3 endpoint URL (for `retry.deadLetterBucket`), for emulators or VPC endpoints; path-style
    /// addressing is used when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_endpoint: Option<String>,
}

/// The lease table.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("(!has(self.readCapacity) && !has(self.writeCapacity)) || (has(self.billingMode) && self.billingMode == 'PROVISIONED')").message("readCapacity and writeCapacity need billingMode: PROVISIONED").field_path(".billingMode"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseTableSpec {
    /// Table name (3-255 characters of a-z, A-Z, 0-9, `_`, `-`, `.`).
    #[schemars(regex(pattern = r"^[a-zA-Z0-9_.-]{3,255}$"))]
    pub name: String,
    /// Billing mode of a table the operator creates. Default PAY_PER_REQUEST.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = field_doc_wins)]
    pub billing_mode: Option<BillingMode>,
    /// What happens to the table when the resource is deleted. Default Retain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = field_doc_wins)]
    pub deletion_policy: Option<DeletionPolicy>,
    /// With `billingMode: PROVISIONED`: the table's read capacity units (1-40000). Default: sized from
    /// the open shards and the lease timings, and resized on resharding (docs/capacity.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 40000))]
    pub read_capacity: Option<i64>,
    /// With `billingMode: PROVISIONED`: the table's write capacity units (1-40000). Default: sized from
    /// the open shards and the lease timings, and resized on resharding (docs/capacity.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 40000))]
    pub write_capacity: Option<i64>,
}

/// DynamoDB billing mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BillingMode {
    /// On-demand.
    #[serde(rename = "PAY_PER_REQUEST")]
    PayPerRequest,
    /// Provisioned capacity.
    #[serde(rename = "PROVISIONED")]
    Provisioned,
}

/// What to do with the lease table when the resource is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Keep the table.
    Retain,
    /// Delete the table, only if its tags prove this resource created it.
    Delete,
}

/// How many workers run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkersSpec {
    /// Fixed worker count, 0 or more (also driven by the scale subresource when autoscaling is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Follow the open shard count instead of a fixed count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
}

/// Replicas = clamp(ceil(open shards / shardsPerWorker), minReplicas, maxReplicas).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("(has(self.minReplicas) ? self.minReplicas : 1) <= self.maxReplicas").message("minReplicas must not exceed maxReplicas").field_path(".minReplicas"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoscalingSpec {
    /// Open shards per worker (1 or more).
    #[schemars(range(min = 1))]
    pub shards_per_worker: i32,
    /// Fewest workers (0 or more). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_replicas: Option<i32>,
    /// Most workers.
    pub max_replicas: i32,
    /// Scale on lag as well: more workers than the shard-count rule while the largest lag stays above
    /// a target (needs `leaseTable`: the lag is read from the lease rows). Unset: shard count only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<LagScalingSpec>,
}

/// Lag autoscaling: while the largest lag stays above `target`, one more worker every `scaleUpAfter`,
/// up to min(maxReplicas, open shards); once it has stayed under half the target for
/// `scaleDownAfter`, back to the shard-count rule. Durations are written like `30s`, `1m`, `10m`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("(has(self.scaleUpAfter) ? duration(self.scaleUpAfter) : duration('1m')) <= (has(self.scaleDownAfter) ? duration(self.scaleDownAfter) : duration('10m'))").message("scaleDownAfter must not be shorter than scaleUpAfter (workers would be removed faster than they are added)").field_path(".scaleDownAfter"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LagScalingSpec {
    /// The lag to stay under, e.g. `1m`: the age of the oldest unfinished record of the slowest shard.
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub target: String,
    /// How long the lag stays above target before each step of one more worker. Default 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub scale_up_after: Option<String>,
    /// How long the lag stays under half the target before the extra workers go. Default 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub scale_down_after: Option<String>,
}

/// Where a shard with no checkpoint starts.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum StartPosition {
    /// The oldest record still retained.
    #[serde(rename = "TRIM_HORIZON")]
    TrimHorizon,
    /// Only records written after the reader starts.
    #[serde(rename = "LATEST")]
    Latest,
    /// Records at or after `startTimestamp`.
    #[serde(rename = "AT_TIMESTAMP")]
    AtTimestamp,
}

/// Lease timing; durations are written like `10s`, `500ms`, `1m`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("(has(self.renewInterval) ? duration(self.renewInterval) : duration('3s')) < (has(self.duration) ? duration(self.duration) : duration('10s'))").message("renewInterval must be shorter than duration").field_path(".renewInterval"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseTimingSpec {
    /// How long a lease lasts without renewal. Default 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub duration: Option<String>,
    /// How often a holder renews; must be shorter than `duration`. Default 3s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub renew_interval: Option<String>,
    /// How often the worker reads the lease table to take free, expired or requested leases. Default 500ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub scan_interval: Option<String>,
    /// How often the shard list is refreshed (new shards, new streams). Default 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub shard_sync_interval: Option<String>,
    /// How often progress is checkpointed. Default 1s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub checkpoint_interval: Option<String>,
    /// How long a worker may take to finish in-flight records when it gives shards up (handoff,
    /// shutdown). Default 5s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub graceful_timeout: Option<String>,
    /// How the lease table is read: `segmented` (default: the table split into segments, each read
    /// every `scanInterval` by two workers, the whole table rarely, so reads do not grow with the
    /// number of workers) or `full` (every worker reads the whole table every `scanInterval`; reads
    /// grow with workers x shards). See docs/architecture.md, "Reading the lease table at scale".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan: Option<LeaseScan>,
    /// With `scan: segmented`, about how many rows one segment holds (1-1000). Default 80.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub segment_rows: Option<i32>,
    /// How workers share the leases: `count` (default: each worker holds its fair share of the
    /// shards) or `load` (each holds its fair share of the shards' measured load, moved by
    /// cooperative handoff with hysteresis). See docs/worker.md, "Balancing by load".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<LeaseBalance>,
}

/// How workers share the leases. Default `count`: it needs no measure, moves leases only when the
/// group changes, and keeps the shares of a group whose shards carry alike (most streams, and every
/// group upgraded from an older worker, whose rows carry no load); `load` is for skewed streams, where
/// a few shards carry most records (the Java KCL 3.x made load its default and 3.4.3 brought count back
/// as an option after users met reshuffles).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LeaseBalance {
    /// Each worker holds its fair share of the leases' count.
    Count,
    /// Each worker holds its fair share of the shards' measured load (records per second of their
    /// arrival: what each shard asks, even of a holder that falls behind); a worker over the best it
    /// could carry by 10 % for 10 s gives leases to the least loaded, two moves at a time, each
    /// lowering the pair's larger load by 5 % or more, never a lease held for less than three renewals.
    Load,
}

/// How workers read the lease table. Default `segmented`: each worker reads two segments of the table
/// per scan, the whole table rarely, so reads do not grow with the number of workers; `full`: every
/// worker reads the whole table every scan interval.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LeaseScan {
    /// Every worker reads the whole table every scan interval (reads grow with workers x shards).
    Full,
    /// The table is split into segments, each read by two workers every scan interval; whole-table
    /// reads are rare (see docs/architecture.md, "Reading the lease table at scale").
    Segmented,
}

/// How shards are read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReaderSpec {
    /// Records per GetRecords call (1-10000). Default 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_records: Option<i32>,
    /// Pause after a GetRecords call that returned nothing. Default 500ms. Calls per shard never exceed
    /// 5 per second whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub idle_time: Option<String>,
    /// Unpack KPL-aggregated records into their user records, as the Java KCL does. Default true;
    /// false hands every Kinesis record to the processor as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deaggregate: Option<bool>,
    /// `polling` (GetRecords, the default) or `fanOut` (enhanced fan-out: SubscribeToShard through a
    /// registered stream consumer with its own 2 MB/s per shard, records pushed as they arrive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = field_doc_wins)]
    pub mode: Option<ReaderMode>,
    /// With `mode: fanOut`: the registered stream consumer's name (1-128 of a-z, A-Z, 0-9, `_`, `-`,
    /// `.`), registered if absent. Default: `<namespace>.<name>` of the StreamConsumer (the operator
    /// writes it into the workers' configuration); a worker run without the operator defaults to the
    /// lease table's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = CONSUMER_NAME_PATTERN), length(max = 128))]
    pub consumer_name: Option<String>,
    /// With `mode: fanOut`: a subscription that delivers no event for this long is dropped and
    /// replaced (the service sends an event at least every 5 s, records or not). Default 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub subscription_idle_timeout: Option<String>,
}

/// The form of a Kinesis stream consumer name (the CRD schema and the worker check the same).
pub const CONSUMER_NAME_PATTERN: &str = r"^[a-zA-Z0-9_.-]{1,128}$";

/// How a worker reads its shards.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ReaderMode {
    /// GetRecords in a loop, sharing the shard's 2 MB/s and 5 calls/s with every other consumer.
    #[default]
    Polling,
    /// Enhanced fan-out: SubscribeToShard, the records pushed through a registered stream consumer.
    FanOut,
}

/// The record processor: exactly one kind.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("[has(self.stdout), has(self.http), has(self.multilang), has(self.custom)].filter(k, k).size() == 1").message("set exactly one of stdout, http, multilang, custom"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessorSpec {
    /// Print each record as a JSON line on standard output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StdoutProcessor>,
    /// POST each record to a URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpProcessor>,
    /// Run a Java KCL MultiLangDaemon-protocol child process per shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multilang: Option<MultilangProcessor>,
    /// Run the processor built into the workers' image: a worker binary of your own made with
    /// `leasehold_worker::main_with_processor` (set `template` to its image). The stock
    /// `leasehold-worker` image has none and refuses to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomProcessor>,
}

/// The custom processor (no settings: the image brings it).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomProcessor {}

/// The stdout processor (no settings).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StdoutProcessor {}

/// The http processor.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpProcessor {
    /// Where records are POSTed.
    pub url: String,
    /// Per-request timeout. Default 5s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub timeout: Option<String>,
    /// Send records in batches (CloudEvents batched mode) instead of one request per record. Default:
    /// one record per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<HttpBatch>,
}

/// Batching for the http processor: records being processed at once (across the worker's shards) are
/// sent together, one JSON array per request.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpBatch {
    /// Most records per request (1-500; 1 sends one record per request, without batching). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::MAX_HTTP_BATCH))]
    pub max_records: Option<i32>,
    /// How long the first record of a batch waits for more before the batch is sent anyway. Default 5ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_delay: Option<String>,
}

/// The multilang processor.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("size(self.command) == 0 || size(self.command[0]) > 0").message("the program (command[0]) must not be empty").field_path(".command"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MultilangProcessor {
    /// The child's command line: the program, then its arguments.
    #[schemars(length(min = 1))]
    pub command: Vec<String>,
    /// How long the child may take to answer one message before it is restarted. Default 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub timeout: Option<String>,
}

/// Order guarantee inside a shard.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Ordering {
    /// Never two records with the same partition key at once.
    Key,
    /// One record at a time.
    Shard,
    /// No order.
    None,
}

/// Retry policy for failed records.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.onExhausted) || self.onExhausted != 'deadLetter' || has(self.deadLetterStream) || has(self.deadLetterQueue) || has(self.deadLetterBucket)").message("deadLetterStream, deadLetterQueue or deadLetterBucket is required with onExhausted deadLetter").field_path(".deadLetterStream"))]
#[x_kube(validation = Rule::new("!has(self.deadLetterStreamCreateIfMissing) || has(self.deadLetterStream)").message("deadLetterStreamCreateIfMissing needs deadLetterStream").field_path(".deadLetterStreamCreateIfMissing"))]
#[x_kube(validation = Rule::new("!has(self.maxRecordAge) || (has(self.onExhausted) && self.onExhausted != 'block')").message("maxRecordAge needs an onExhausted that gives a record up (requeue, deadLetter or skip)").field_path(".maxRecordAge"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts before `onExhausted` applies (1 or more). Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_attempts: Option<i32>,
    /// First backoff between attempts (doubling). Default 1s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub backoff: Option<String>,
    /// What happens after the last attempt. Default block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = field_doc_wins)]
    pub on_exhausted: Option<OnExhausted>,
    /// With `onExhausted: deadLetter`: the stream failed records go to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_stream: Option<String>,
    /// Create `deadLetterStream` when it does not exist, with this shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_stream_create_if_missing: Option<CreateIfMissing>,
    /// With `onExhausted: deadLetter`: the URL of an SQS queue failed records go to, one message per
    /// record holding the dead-letter JSON document (Lambda's on-failure destination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://\S+/[0-9]+/[a-zA-Z0-9_-]{1,80}(\.fifo)?$"))]
    pub dead_letter_queue: Option<String>,
    /// With `onExhausted: deadLetter`: an S3 bucket failed records go to, one object per record holding
    /// the dead-letter JSON document, under `<prefix><stream>/<shardId>/<sequenceNumber>.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_bucket: Option<DeadLetterBucket>,
    /// A record that fails when it is older than this (by its arrival time in the stream) is not
    /// retried: it goes straight to `onExhausted` (Lambda's MaximumRecordAgeInSeconds). Needs an
    /// `onExhausted` other than `block`. Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_record_age: Option<String>,
    /// With the http processor in batches: a batch failing whole without naming any record (a non-2xx
    /// answer, no answer in time) is sent again in halves, down to single records, so a poison record
    /// stops failing its neighbours (Lambda's BisectBatchOnFunctionError). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bisect: Option<bool>,
}

/// An S3 bucket that receives dead letters.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeadLetterBucket {
    /// The bucket's name.
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"))]
    pub name: String,
    /// Prepended to every object key (for example `dead-letters/`). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// What happens to a record whose attempts are exhausted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnExhausted {
    /// Keep retrying; the shard waits (order kept).
    Block,
    /// Publish a copy at the stream's tail with its attempt count.
    Requeue,
    /// Publish to `retry.deadLetterStream`, `deadLetterQueue` and `deadLetterBucket` (those set) with the
    /// error.
    DeadLetter,
    /// Skip it (counted and logged).
    Skip,
}

/// Records to process, in Lambda's filter-pattern grammar.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FilterSpec {
    /// Patterns over the record seen as `{"partitionKey": "<key>", "data": <its data as JSON>}`; a
    /// record is processed when one of them matches (1-10). Data that is not JSON matches only
    /// patterns that do not look inside `data`. The grammar is in docs/worker.md, "Filtering".
    #[schemars(schema_with = "filter_patterns")]
    pub patterns: Vec<serde_json::Value>,
}

fn filter_patterns(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": 10,
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        "description": "Patterns over the record seen as `{\"partitionKey\": \"<key>\", \"data\": <its data as JSON>}`; a record is processed when one of them matches (1-10). Data that is not JSON matches only patterns that do not look inside `data`. The grammar is in docs/worker.md, \"Filtering\"."
    })
}

/// Where processors emit records.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutputSpec {
    /// The output stream.
    pub stream: String,
    /// Fixed partition key for outputs that carry none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
    /// Create the output stream when it does not exist, with this shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_if_missing: Option<CreateIfMissing>,
}

/// Manual shard assignment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AssignmentSpec {
    /// Shards to read, as `<stream>:<shardId>`, each once.
    #[schemars(inner(regex(pattern = ASSIGNED_SHARD_PATTERN)), extend("x-kubernetes-list-type" = "set"))]
    pub shards: Vec<String>,
}
