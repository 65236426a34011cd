//! Stage 3, observe: the streams' open shard counts (through the cache shared by every consumer) and
//! the lease rows (a Scan of the lease table, at most once per reconcile interval), from which come the
//! spread of leases over workers and the lag.

use std::collections::BTreeMap;
use std::sync::Arc;

use leasehold_crds::{StreamCapacity, StreamConsumer, WorkerLeases, WorkerLoad};
use leasehold_worker::lease::{Lease, ShardLoad};

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

/// How many leases each worker holds (open shards only), and the sum of the loads those leases' rows
/// carry (absent while none carries one).
pub fn lease_spread(rows: &LeaseRows) -> Vec<WorkerLeases> {
    spread(&rows.leases)
}

fn spread(leases: &[Lease]) -> Vec<WorkerLeases> {
    let mut held: BTreeMap<String, (i32, Vec<ShardLoad>)> = BTreeMap::new();
    for lease in leases.iter().filter(|l| !l.checkpoint.is_shard_end()) {
        if let Some(owner) = &lease.owner {
            let (count, loads) = held.entry(owner.clone()).or_default();
            *count += 1;
            loads.extend(lease.load);
        }
    }
    held.into_iter()
        .map(|(owner, (leases, loads))| {
            let load = (!loads.is_empty()).then(|| {
                let sum = ShardLoad::sum(&loads);
                let figure = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                WorkerLoad {
                    records_per_second: figure(sum.records_per_s),
                    bytes_per_second: figure(sum.bytes_per_s),
                    busy_ms_per_second: figure(sum.busy_ms_per_s),
                }
            });
            WorkerLeases { owner, leases, load }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use leasehold_worker::lease::{Checkpoint, LeaseKey};

    use super::*;

    fn row(shard: u32, owner: Option<&str>, load: Option<(u64, u64, u64)>, checkpoint: Checkpoint) -> Lease {
        Lease {
            owner: owner.map(str::to_string),
            load: load.map(|(records_per_s, bytes_per_s, busy_ms_per_s)| ShardLoad {
                records_per_s,
                bytes_per_s,
                busy_ms_per_s,
            }),
            ..Lease::unheld(LeaseKey::new("orders", format!("shardId-{shard}")), checkpoint)
        }
    }

    #[test]
    fn each_worker_shows_its_lease_count_and_the_sum_of_their_loads() {
        let open = Checkpoint::TrimHorizon;
        let leases = [
            row(0, Some("a"), Some((300, 30_000, 600)), open.clone()),
            row(1, Some("a"), Some((100, 10_000, 200)), open.clone()),
            // Not measured yet: counted, adds no load.
            row(2, Some("a"), None, open.clone()),
            row(3, Some("b"), None, open.clone()),
            // Finished and free rows count for nobody.
            row(4, Some("b"), Some((9, 9, 9)), Checkpoint::ShardEnd),
            row(5, None, Some((9, 9, 9)), open.clone()),
        ];
        let load = |records_per_second, bytes_per_second, busy_ms_per_second| WorkerLoad {
            records_per_second,
            bytes_per_second,
            busy_ms_per_second,
        };
        assert_eq!(
            spread(&leases),
            vec![
                WorkerLeases { owner: "a".into(), leases: 3, load: Some(load(400, 40_000, 800)) },
                WorkerLeases { owner: "b".into(), leases: 1, load: None },
            ]
        );
        let json = serde_json::to_value(spread(&leases)).expect("json");
        assert_eq!(
            json,
            serde_json::json!([
                {"owner": "a", "leases": 3, "load": {"recordsPerSecond": 400, "bytesPerSecond": 40000, "busyMsPerSecond": 800}},
                {"owner": "b", "leases": 1},
            ])
        );
    }
}
