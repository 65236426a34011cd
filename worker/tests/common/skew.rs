//! A skewed group's helpers, shared by `tests/load_balance.rs` and `benches/spread.rs`: putting records
//! on chosen shards, who holds what, and how far the busiest worker is from the best achievable.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use leasehold_worker::lease::Lease;

/// Puts `records` (key, data, explicit hash key), retrying failed entries until every one is stored.
pub async fn put_explicit(client: &aws_sdk_kinesis::Client, stream: &str, records: &[(String, Vec<u8>, u128)]) {
    let mut pending: Vec<&(String, Vec<u8>, u128)> = records.iter().collect();
    for _ in 0..50 {
        let entries = pending
            .iter()
            .map(|(key, data, hash)| {
                PutRecordsRequestEntry::builder()
                    .partition_key(key)
                    .explicit_hash_key(hash.to_string())
                    .data(Blob::new(data.clone()))
                    .build()
                    .expect("entry")
            })
            .collect::<Vec<_>>();
        match client.put_records().stream_name(stream).set_records(Some(entries)).send().await {
            Ok(out) => {
                let failed: Vec<_> =
                    out.records.iter().zip(&pending).filter(|(r, _)| r.error_code.is_some()).map(|(_, p)| *p).collect();
                if failed.is_empty() {
                    return;
                }
                pending = failed;
            }
            Err(e) => eprintln!("put_records retry: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("put_records to {stream} kept failing");
}

/// Each worker's shards.
pub fn holders(leases: &[Lease]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for lease in leases {
        if let Some(owner) = &lease.owner {
            out.entry(owner.clone()).or_default().push(lease.key.shard_id().to_string());
        }
    }
    out
}

/// The busiest of `workers` workers' load over the best achievable: max(mean, hottest shard), by
/// `weight` per shard.
pub fn ratio(workers: usize, holders: &BTreeMap<String, Vec<String>>, weight: impl Fn(&str) -> f64) -> f64 {
    let loads: Vec<f64> = holders.values().map(|shards| shards.iter().map(|s| weight(s)).sum()).collect();
    let all: Vec<f64> = holders.values().flatten().map(|s| weight(s)).collect();
    let mean = all.iter().sum::<f64>() / workers as f64;
    let best = mean.max(all.iter().copied().fold(0.0, f64::max));
    if best <= 0.0 { f64::INFINITY } else { loads.iter().copied().fold(0.0, f64::max) / best }
}
