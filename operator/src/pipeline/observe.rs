//! Stage 3, observe: the streams' open shard counts (through the cache shared by every consumer) and
//! the lease rows (a Scan of the lease table, at most once per reconcile interval), from which come the
//! spread of leases over workers and the lag.

use std::collections::BTreeMap;
use std::sync::Arc;

use leasehold_crds::{StreamCapacity, StreamConsumer, WorkerLeases};

use crate::context::Context;
use crate::context::lease_rows::LeaseRows;
use crate::context::shards::StreamCount;
use crate::error::{Error, Result};

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

/// The consumer's lease rows, read at most once per reconcile interval ([`LeaseReads`]): `None` without
/// a lease table or when it cannot be read (the spread and the lag are informative, and the table's own
/// condition reports a broken table).
///
/// [`LeaseReads`]: crate::context::lease_rows::LeaseReads
pub async fn lease_rows(consumer: &StreamConsumer, ctx: &Context) -> Option<Arc<LeaseRows>> {
    let table = consumer.spec.lease_table.as_ref()?;
    let clients = ctx.aws.get(&consumer.spec.aws).await;
    let key = crate::context::object_key(consumer);
    ctx.lease_reads.get(&key, clients.dynamodb, &table.name, &ctx.metrics).await
}

/// How many leases each worker holds (open shards only).
pub fn lease_spread(rows: &LeaseRows) -> Vec<WorkerLeases> {
    let mut counts: BTreeMap<String, i32> = BTreeMap::new();
    for owner in rows.leases.iter().filter(|l| !l.checkpoint.is_shard_end()).filter_map(|l| l.owner.as_ref()) {
        *counts.entry(owner.clone()).or_default() += 1;
    }
    counts.into_iter().map(|(owner, leases)| WorkerLeases { owner, leases }).collect()
}
