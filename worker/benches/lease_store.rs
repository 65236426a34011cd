//! Lease store throughput: `DynamoLeaseStore` against a plain aws-sdk `UpdateItem` loop sending the
//! same conditional write, on the same dynalite, interleaved round by round so machine noise hits
//! both alike; and the memory store on its own. Run with `make bench` (needs the emulators).

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use leasehold_worker::lease::{
    Checkpoint, DynamoLeaseStore, Lease, LeaseKey, LeaseSettings, LeaseStore, MemoryLeaseStore, NewLease, ShardLeases,
};

const ROUNDS: usize = 5;
const ROUND: Duration = Duration::from_secs(2);

fn new_lease(i: usize) -> NewLease {
    NewLease {
        key: LeaseKey::new("bench", format!("shardId-{i:012}")),
        checkpoint: Checkpoint::Latest,
        parent_shard_ids: vec![],
        stream_created: None,
    }
}

/// Takes `rows` fresh rows with `store`, returning the held leases.
async fn held_rows(store: &dyn LeaseStore, first: usize, rows: usize) -> Vec<Lease> {
    let mut held = Vec::new();
    for i in first..first + rows {
        store.create_if_absent(&new_lease(i)).await.expect("create");
        let seen = store.get(&new_lease(i).key).await.expect("get").expect("row");
        held.push(store.acquire(&seen).await.expect("acquire"));
    }
    held
}

/// Renews each lease in its own task for `ROUND`; returns operations per second.
async fn store_round(store: &std::sync::Arc<DynamoLeaseStore>, leases: &mut [Lease]) -> f64 {
    let until = Instant::now() + ROUND;
    let tasks: Vec<_> = leases
        .iter()
        .cloned()
        .map(|mut lease| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut ops = 0u64;
                while Instant::now() < until {
                    lease = store.renew(&lease).await.expect("renew");
                    ops += 1;
                }
                (ops, lease)
            })
        })
        .collect();
    let mut total = 0;
    for (slot, task) in leases.iter_mut().zip(tasks) {
        let (ops, lease) = task.await.expect("task");
        total += ops;
        *slot = lease;
    }
    total as f64 / ROUND.as_secs_f64()
}

/// The same conditional renew as `DynamoLeaseStore::renew`, written directly against the SDK.
async fn sdk_renew(client: &Client, table: &str, key: &str, owner: &str, counter: u64) -> u64 {
    let out = client
        .update_item()
        .table_name(table)
        .key("lease_key", AttributeValue::S(key.into()))
        .update_expression("SET lease_expiry = :expiry, lease_counter = lease_counter + :one")
        .condition_expression("lease_owner = :me AND lease_counter = :counter")
        .expression_attribute_values(":me", AttributeValue::S(owner.into()))
        .expression_attribute_values(":counter", AttributeValue::N(counter.to_string()))
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .expression_attribute_values(":expiry", AttributeValue::N("0".into()))
        .return_values(ReturnValue::AllNew)
        .send()
        .await
        .expect("sdk renew");
    let attributes = out.attributes.unwrap_or_default();
    attributes.get("lease_counter").and_then(|n| n.as_n().ok()).and_then(|n| n.parse().ok()).expect("counter")
}

async fn sdk_round(client: &Client, table: &str, owner: &str, leases: &mut [Lease]) -> f64 {
    let until = Instant::now() + ROUND;
    let tasks: Vec<_> = leases
        .iter()
        .map(|lease| {
            let (client, table, owner) = (client.clone(), table.to_string(), owner.to_string());
            let (key, mut counter) = (lease.key.to_string(), lease.counter);
            tokio::spawn(async move {
                let mut ops = 0u64;
                while Instant::now() < until {
                    counter = sdk_renew(&client, &table, &key, &owner, counter).await;
                    ops += 1;
                }
                (ops, counter)
            })
        })
        .collect();
    let mut total = 0;
    for (lease, task) in leases.iter_mut().zip(tasks) {
        let (ops, counter) = task.await.expect("task");
        total += ops;
        lease.counter = counter;
    }
    total as f64 / ROUND.as_secs_f64()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

async fn dynamo_vs_sdk(client: &Client, concurrency: usize) -> (f64, f64) {
    let table = leasehold_testkit::create_lease_table(client, "bench").await;
    let owner = "bench-owner";
    let store = std::sync::Arc::new(DynamoLeaseStore::new(client.clone(), table.clone(), LeaseSettings::new(owner)));
    let mut ours = held_rows(store.as_ref(), 0, concurrency).await;
    let mut theirs = held_rows(store.as_ref(), concurrency, concurrency).await;
    let (mut store_rates, mut sdk_rates) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        store_rates.push(store_round(&store, &mut ours).await);
        sdk_rates.push(sdk_round(client, &table, owner, &mut theirs).await);
    }
    (median(&mut store_rates), median(&mut sdk_rates))
}

async fn memory_ops_per_second() -> f64 {
    let store = MemoryLeaseStore::new(LeaseSettings::new("bench-owner"));
    let mut lease = held_rows(&store, 0, 1).await.remove(0);
    let checkpoint = Checkpoint::Sequence("49590338271490256608559692538361571095921575989136588898".into());
    let started = Instant::now();
    let mut ops = 0u64;
    while started.elapsed() < ROUND {
        for _ in 0..1000 {
            lease = store.renew(&lease).await.expect("renew");
            lease = store.checkpoint(&lease, &checkpoint).await.expect("checkpoint");
            ops += 2;
        }
    }
    ops as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let client = leasehold_testkit::dynamodb_client().await;
    println!("Lease store throughput ({ROUNDS} interleaved rounds of {ROUND:?}; medians)\n");
    println!("| workload | DynamoLeaseStore ops/s | plain aws-sdk UpdateItem ops/s | ratio (target >= 0.9) |");
    println!("|---|---|---|---|");
    for concurrency in [1, 8] {
        let (ours, sdk) = dynamo_vs_sdk(&client, concurrency).await;
        println!("| conditional renew, {concurrency} in flight, dynalite | {ours:.0} | {sdk:.0} | {:.2} |", ours / sdk);
    }
    let memory = memory_ops_per_second().await;
    println!("\n| workload | MemoryLeaseStore ops/s |\n|---|---|\n| renew + checkpoint, 1 task | {memory:.0} |");
}
