//! A skewed group's helpers, shared by `tests/load_balance.rs` and `benches/spread.rs`: who holds what,
//! and how far the busiest worker is from the best achievable (records go on chosen shards with the
//! testkit's `put_explicit`).

use leasehold_worker::lease::Lease;
use std::collections::BTreeMap;

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
