//! What both demos print: narration lines, the orders they produce and the lease table.

use leasehold_testkit::kinesis::numbered;
use leasehold_worker::lease::{DynamoLeaseStore, LeaseStore};

/// One narration step.
pub fn say(text: &str) {
    println!("\n==> {text}");
}

/// Orders `first..last` of 40 customers (partition key = customer).
pub fn orders(first: u64, last: u64) -> Vec<(String, Vec<u8>)> {
    (first..last).flat_map(|n| (0..40).map(move |c| numbered(&format!("customer-{c}"), n))).collect()
}

/// The lease table, a row per shard: owner (the pod) and counter.
pub async fn show_leases(store: &DynamoLeaseStore) {
    let Ok(page) = store.list().await else { return };
    let mut leases = page.leases;
    leases.sort_by(|a, b| a.key.cmp(&b.key));
    println!("    {:<22} {:<36} counter", "shard", "owner (pod)");
    for lease in leases {
        println!(
            "    {:<22} {:<36} {}",
            lease.key.shard_id(),
            lease.owner.as_deref().unwrap_or("(free)"),
            lease.counter
        );
    }
}
