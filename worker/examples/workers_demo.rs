//! `make demo-workers`: a consumer group of three `leasehold-worker` processes sharing a 4-shard stream on the
//! local emulators. Shows who holds which shard, records flowing, a worker killed with SIGKILL and its
//! shards moving, then a graceful shutdown. Needs the worker binary path in LEASEHOLD_WORKER_BIN.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use leasehold_testkit::kinesis::{numbered, put_records};
use leasehold_testkit::process::WorkerProcess;
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, LeaseStore};

fn say(text: &str) {
    println!("\n==> {text}");
}

/// Orders `first..last` for 40 customers, the customer as partition key.
fn orders(first: u64, last: u64) -> Vec<(String, Vec<u8>)> {
    (first..last).flat_map(|n| (0..40).map(move |c| numbered(&format!("customer-{c}"), n))).collect()
}

async fn show_leases(store: &DynamoLeaseStore) {
    match store.list().await {
        Ok(page) => {
            let mut leases = page.leases;
            leases.sort_by(|a, b| a.key.cmp(&b.key));
            println!("    {:<22} {:<8} {:<8} checkpoint", "shard", "owner", "counter");
            for lease in leases {
                let checkpoint = lease.checkpoint.to_string();
                let short = match checkpoint.len() {
                    0..=16 => checkpoint,
                    n => format!("...{}", &checkpoint[n - 12..]),
                };
                let owner = lease.owner.as_deref().unwrap_or("(free)");
                println!("    {:<22} {owner:<8} {:<8} {short}", lease.key.shard_id(), lease.counter);
            }
            let alive: Vec<&str> = page.members.iter().filter(|m| m.alive).map(|m| m.owner.as_str()).collect();
            println!("    live workers (membership rows): {alive:?}");
        }
        Err(e) => println!("    cannot read the lease table: {e}"),
    }
}

fn show_flow(workers: &[&WorkerProcess], since: &mut BTreeMap<String, usize>) {
    for worker in workers {
        let deliveries = worker.deliveries();
        let before = since.insert(worker.owner.clone(), deliveries.len()).unwrap_or(0);
        let mut shards: Vec<String> = deliveries[before..].iter().map(|d| d.shard_id.clone()).collect();
        shards.sort();
        shards.dedup();
        println!("    {:<6} processed {:>5} new records from {shards:?}", worker.owner, deliveries.len() - before);
    }
}

async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while started.elapsed() < limit && !done() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::main]
async fn main() {
    let Some(binary) = std::env::var_os("LEASEHOLD_WORKER_BIN").map(PathBuf::from) else {
        eprintln!("LEASEHOLD_WORKER_BIN must name the worker binary (run `make demo-workers`)");
        std::process::exit(2);
    };
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let kinesis_url = leasehold_testkit::endpoint(leasehold_testkit::Service::Kinesis);
    let dynamodb_url = leasehold_testkit::endpoint(leasehold_testkit::Service::DynamoDb);

    say("Creating a Kinesis stream with 4 shards on kinesalite");
    let stream = leasehold_testkit::create_stream(&kinesis, "orders", 4).await;
    let table = leasehold_testkit::unique_name("orders-leases");
    let config = format!(
        "streams: [{{name: {stream}}}]\n\
         aws: {{region: us-east-1, kinesisEndpoint: '{kinesis_url}', dynamodbEndpoint: '{dynamodb_url}'}}\n\
         leaseTable: {{name: {table}}}\nstartPosition: TRIM_HORIZON\nprocessor: {{stdout: {{}}}}\n\
         lease: {{duration: 4s, renewInterval: 1s, scanInterval: 500ms, shardSyncInterval: 2s}}\n"
    );
    println!("    The worker config is a StreamConsumer spec (lease shortened to 4 s for the demo):\n");
    config.lines().for_each(|line| println!("      {line}"));

    say("Starting three worker processes (leasehold-worker --config demo.yaml): alice, bob, carol");
    let alice = WorkerProcess::spawn(&binary, &config, "alice");
    let bob = WorkerProcess::spawn(&binary, &config, "bob");
    let carol = WorkerProcess::spawn(&binary, &config, "carol");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let viewer = DynamoLeaseStore::new(dynamodb.clone(), table.clone(), LeaseSettings::new("demo-viewer"));
    say("The lease table: one row per shard, each held by exactly one worker");
    show_leases(&viewer).await;

    say("Producing 2,000 orders for 40 customers (partition key = customer)");
    put_records(&kinesis, &stream, &orders(0, 50)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut since = BTreeMap::new();
    show_flow(&[&alice, &bob, &carol], &mut since);
    if let Some(sample) = alice.deliveries().first() {
        println!(
            "    one record as printed by the stdout processor: owner {}, shard {}, key {}, data {:?}",
            sample.owner, sample.shard_id, sample.partition_key, sample.data
        );
    }

    let bob_shards = bob.held_shards();
    say(&format!("kill -9 bob (holding {} shards): no release, no checkpoint", bob_shards.len()));
    println!("    his leases count as expired once their counters stay unchanged for 4 s on the others' clocks");
    bob.signal("KILL");
    put_records(&kinesis, &stream, &orders(50, 60)).await;
    let moved = wait_until(Duration::from_secs(15), || {
        bob_shards.iter().all(|s| alice.held_shards().contains(s) || carol.held_shards().contains(s))
    })
    .await;
    println!("    bob's shards were taken over {:.1} s after the kill", moved.as_secs_f64());
    show_leases(&viewer).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    show_flow(&[&alice, &carol], &mut since);

    say("SIGTERM carol: she finishes in-flight records, checkpoints and releases at once");
    carol.signal("TERM");
    let moved = wait_until(Duration::from_secs(10), || alice.held_shards().len() == 4).await;
    println!("    alice holds all 4 shards {:.2} s after the SIGTERM", moved.as_secs_f64());
    show_leases(&viewer).await;

    let delivered: HashSet<String> =
        [&alice, &bob, &carol].iter().flat_map(|w| w.deliveries()).map(|d| d.data).collect();
    say(&format!(
        "2,400 records written, {} of them processed (at least once, in order per customer)",
        delivered.len()
    ));

    say("Cleaning up");
    alice.signal("TERM");
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop((alice, bob, carol));
    let _ = dynamodb.delete_table().table_name(&table).send().await;
    let _ = kinesis.delete_stream().stream_name(&stream).send().await;
    println!("    stream and table deleted. Done.");
}
