//! Stage 3, observe: the streams' open shard counts (through the cache shared by every consumer) and
//! the spread of leases over workers (a Scan of the lease table).

use std::collections::BTreeMap;

use leasehold_crds::{StreamCapacity, StreamConsumer, WorkerLeases};
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, LeaseStore};

use crate::FIELD_MANAGER;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::shards::StreamCount;

/// Each named stream's capacity mode and open shards: `None` when streams are chosen by pattern or
/// assignment (not counted); a missing or unreadable stream fails the stage.
pub async fn capacity(consumer: &StreamConsumer, ctx: &Context) -> Result<Option<Vec<StreamCapacity>>> {
    let spec = &consumer.spec;
    if spec.streams.is_empty() {
        return Ok(None);
    }
    let clients = ctx.aws.get(&spec.aws).await;
    let endpoint = format!("{:?}/{:?}", spec.aws.region, spec.aws.kinesis_endpoint);
    let mut capacity = Vec::new();
    let mut missing = Vec::new();
    let mut failures = Vec::new();
    for stream in &spec.streams {
        let name = stream.stream_name().to_string();
        match ctx.shards.get(&clients.kinesis, &endpoint, stream).await {
            StreamCount::Open(open_shards, mode) => capacity.push(StreamCapacity { stream: name, mode, open_shards }),
            StreamCount::NotFound => missing.push(name),
            StreamCount::Failed(e) => failures.push(format!("{name}: {e}")),
        }
    }
    if !missing.is_empty() {
        return Err(Error::StreamNotFound(missing));
    }
    if !failures.is_empty() {
        return Err(Error::Stream(failures.join("; ")));
    }
    Ok(Some(capacity))
}

/// How many leases each worker holds, read from the lease table (empty when there is none or it cannot
/// be read: the spread is informative, and the table's own condition reports a broken table).
pub async fn lease_spread(consumer: &StreamConsumer, ctx: &Context) -> Vec<WorkerLeases> {
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
