//! `make demo` (lease store stage): three workers share six shards of a DynamoDB lease table on
//! dynalite; one of them crashes and the others take its shards once its leases go silent.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_worker::lease::{
    Checkpoint, DynamoLeaseStore, Lease, LeaseKey, LeaseSettings, LeaseStore, NewLease, unique_owner_id,
};
use tokio_util::sync::CancellationToken;

const SHARDS: usize = 6;
const LEASE: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_millis(500);

/// One worker: renew what it holds, take free rows up to its fair share, and adopt any row whose
/// holder has gone silent for a lease duration (`acquire` refuses live ones without a round trip).
async fn run_worker(store: DynamoLeaseStore, workers: usize, stop: CancellationToken) {
    let mut held: BTreeMap<LeaseKey, Lease> = BTreeMap::new();
    let fair_share = SHARDS.div_ceil(workers);
    while !stop.is_cancelled() {
        for (key, lease) in std::mem::take(&mut held) {
            if let Ok(renewed) = store.renew(&lease).await {
                held.insert(key, renewed);
            }
        }
        if let Ok(page) = store.list().await {
            for lease in page.leases {
                let free = lease.owner.is_none();
                if held.contains_key(&lease.key) || (free && held.len() >= fair_share) {
                    continue;
                }
                if let Ok(taken) = store.acquire(&lease).await {
                    held.insert(taken.key.clone(), taken);
                }
            }
        }
        tokio::select! { _ = stop.cancelled() => {}, _ = tokio::time::sleep(TICK) => {} }
    }
}

async fn show(store: &DynamoLeaseStore, title: &str) {
    println!("\n{title}");
    match store.list().await {
        Ok(page) => {
            for lease in page.leases {
                println!(
                    "  {:<32} owner {:<24} counter {}",
                    lease.key,
                    lease.owner.as_deref().unwrap_or("-"),
                    lease.counter
                );
            }
        }
        Err(e) => println!("  cannot read the table: {e}"),
    }
}

#[tokio::main]
async fn main() {
    let client = leasehold_testkit::dynamodb_client().await;
    let table = leasehold_testkit::create_lease_table(&client, "demo").await;
    println!("Lease table {table} created on dynalite; one row per shard of stream 'orders'.");
    let viewer = DynamoLeaseStore::new(client.clone(), table.clone(), LeaseSettings::new("viewer"));
    for i in 0..SHARDS {
        let key = LeaseKey::new("orders", format!("shardId-{i:012}"));
        let row = NewLease { key, checkpoint: Checkpoint::TrimHorizon, parent_shard_ids: vec![] };
        if let Err(e) = viewer.create_if_absent(&row).await {
            eprintln!("cannot create a lease row: {e}");
            return;
        }
    }
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let owner = unique_owner_id("worker");
        let store =
            DynamoLeaseStore::new(client.clone(), table.clone(), LeaseSettings::new(&owner).with_duration(LEASE));
        let stop = CancellationToken::new();
        tasks.push(tokio::spawn(run_worker(store, 3, stop.clone())));
        stops.push((owner, stop));
    }
    println!("Three workers start; each takes free rows up to its fair share of {}.", SHARDS.div_ceil(3));
    tokio::time::sleep(Duration::from_secs(2)).await;
    show(&viewer, "Who holds what:").await;

    let (crashed, stop) = &stops[0];
    stop.cancel();
    println!("\n{crashed} crashes: it stops renewing and releases nothing.");
    println!(
        "The others wait until its rows' counters stay unchanged for a whole lease ({LEASE:?}) on their own clocks..."
    );
    tokio::time::sleep(LEASE + Duration::from_secs(3)).await;
    show(&viewer, "After the takeover:").await;
    for (_, stop) in &stops {
        stop.cancel();
    }
    for task in tasks {
        let _ = task.await;
    }
    let _ = client.delete_table().table_name(&table).send().await;
    println!("\nDone; table {table} deleted.");
}
