//! Worker runtime benchmarks against kinesalite and dynalite, with the default timing
//! (`leasehold_crds::defaults`: lease 10 s, renew 3 s, scan 500 ms) unless a line says otherwise. Run with `make bench`.
//!
//! Prints markdown for docs/benchmarks.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Producer, config, event_time, records, spawn};
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{WorkerProcess, wait_for};
use leasehold_testkit::proxy::FaultProxy;

const DEFAULT_TIMING: &str = "lease: {duration: 10s, renewInterval: 3s, scanInterval: 500ms, shardSyncInterval: 10s}\n";

/// A config with the default lease timing instead of the tests' fast one.
fn default_config(stream: &str, table: &str, extra: &str) -> String {
    common::config_with_timing(stream, Some(table), DEFAULT_TIMING, extra)
}

fn stats(mut values: Vec<Duration>) -> String {
    values.sort();
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    format!(
        "min {}, median {}, max {} (n = {})",
        secs(values[0]),
        secs(values[values.len() / 2]),
        secs(values[values.len() - 1]),
        values.len()
    )
}

/// Pairs of workers on 2-shard streams; one of each pair is stopped with `signal`; returns how long
/// each of its shards took to be acquired by its partner.
async fn move_times(kinesis: &aws_sdk_kinesis::Client, trials: usize, signal: &str) -> Vec<Duration> {
    let mut pairs = Vec::new();
    for trial in 0..trials {
        let stream = leasehold_testkit::create_stream(kinesis, "bench-move", 2).await;
        let table = leasehold_testkit::unique_name("bench-move");
        let config = default_config(&stream, &table, "startPosition: TRIM_HORIZON\n");
        let pair = [spawn(&config, &format!("move-{trial}-a")), spawn(&config, &format!("move-{trial}-b"))];
        pairs.push(pair);
    }
    for [a, b] in &pairs {
        wait_for("pair balanced", Duration::from_secs(60), || a.held_shards().len() == 1 && b.held_shards().len() == 1);
    }
    let mut times = Vec::new();
    let mut stopped = Vec::new();
    for [a, b] in &pairs {
        // Spread the stops over a renew interval so the trials sample every phase of it.
        tokio::time::sleep(Duration::from_millis(3000 / trials as u64)).await;
        let moving = a.held_shards();
        a.signal(signal);
        stopped.push((Instant::now(), moving, b));
    }
    for (at, moving, b) in stopped {
        for shard in moving {
            wait_for("partner takes over", Duration::from_secs(40), || {
                event_time(b, "lease acquired", &shard).is_some()
            });
            times.push(event_time(b, "lease acquired", &shard).expect("taken").duration_since(at));
        }
    }
    times
}

async fn rebalance(kinesis: &aws_sdk_kinesis::Client, shards: i32, workers: usize) -> Duration {
    let stream = leasehold_testkit::create_stream(kinesis, "bench-rebalance", shards).await;
    let table = leasehold_testkit::unique_name("bench-rebalance");
    let config = default_config(&stream, &table, "startPosition: TRIM_HORIZON\n");
    let first = spawn(&config, "rebalance-00");
    wait_for("first worker holds every shard", Duration::from_secs(120), || {
        first.held_shards().len() == shards as usize
    });
    let started = Instant::now();
    let others: Vec<WorkerProcess> = (1..workers).map(|i| spawn(&config, &format!("rebalance-{i:02}"))).collect();
    let all: Vec<&WorkerProcess> = std::iter::once(&first).chain(others.iter()).collect();
    let share = shards as usize / workers;
    wait_for("balanced", Duration::from_secs(120), || {
        let held: Vec<usize> = all.iter().map(|w| w.held_shards().len()).collect();
        held.iter().sum::<usize>() == shards as usize && held.iter().all(|h| h.abs_diff(share) <= 1)
    });
    started.elapsed()
}

/// Plain aws-sdk loop: one task per shard, TRIM_HORIZON, GetRecords (limit 10000) until `total` records;
/// timed like the worker, from the first record received to the last.
async fn sdk_loop(kinesis: &aws_sdk_kinesis::Client, stream: &str, total: usize) -> Duration {
    let shards = leasehold_testkit::kinesis::open_shards(kinesis, stream).await;
    let first = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let last = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = shards
        .into_iter()
        .map(|(shard, _, _)| {
            let (kinesis, stream, read, first) = (kinesis.clone(), stream.to_string(), read.clone(), first.clone());
            let last = last.clone();
            tokio::spawn(async move {
                let mut iterator = leasehold_testkit::kinesis::trim_horizon(&kinesis, &stream, &shard).await;
                while let Some(current) = iterator {
                    if read.load(std::sync::atomic::Ordering::SeqCst) >= total {
                        break;
                    }
                    let out =
                        kinesis.get_records().shard_iterator(current).limit(10_000).send().await.expect("get records");
                    let n = out.records.len();
                    if n > 0 {
                        first.lock().expect("first").get_or_insert_with(Instant::now);
                    }
                    if read.fetch_add(n, std::sync::atomic::Ordering::SeqCst) + n >= total {
                        last.lock().expect("last").get_or_insert_with(Instant::now);
                    }
                    iterator = out.next_shard_iterator;
                    if n == 0 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("reader");
    }
    let first = first.lock().expect("first").unwrap_or_else(Instant::now);
    let last = last.lock().expect("last").unwrap_or_else(Instant::now);
    last.duration_since(first)
}

/// The worker (one process, DynamoDB leases, stdout processor) reading `total` records; timed from its
/// first delivered record to its last, so process start-up is left out (reported separately).
fn worker_run(stream: &str, total: usize, owner: &str) -> (Duration, Duration) {
    let table = leasehold_testkit::unique_name("bench-rate");
    let config =
        config(stream, Some(&table), "startPosition: TRIM_HORIZON\nreader: {maxRecords: 10000, idleTime: 200ms}\n");
    let spawned = Instant::now();
    let worker = spawn(&config, owner);
    wait_for("every record delivered", Duration::from_secs(300), || worker.delivery_count() >= total);
    let (first, last) = worker.delivery_span().expect("deliveries");
    (last.duration_since(first), first.duration_since(spawned))
}

/// 100k user records of 100 B (1000 keys) on a 4-shard stream: as plain records on one stream and
/// packed 100 per KPL aggregate on another; the worker reads both, interleaved, best of 2 rounds each.
/// Returns the user records/s of (plain, aggregated).
async fn kpl_rates(kinesis: &aws_sdk_kinesis::Client) -> (f64, f64) {
    let total = 100_000;
    let users: Vec<(String, Vec<u8>)> = records(1000, 0, (total / 1000) as u64)
        .into_iter()
        .map(|(k, d)| {
            let mut data = d;
            data.resize(100, b'x');
            (k, data)
        })
        .collect();
    let plain = leasehold_testkit::create_stream(kinesis, "bench-kpl-plain", 4).await;
    put_records(kinesis, &plain, &users).await;
    // As aws-kinesis-agg does: each aggregate under its first user record's key.
    let aggregates: Vec<(String, Vec<u8>)> = users
        .chunks(100)
        .map(|chunk| {
            let packed = leasehold_worker::kpl::aggregate(chunk.iter().map(|(k, d)| (k.as_str(), None, d.as_slice())));
            (chunk[0].0.clone(), packed.to_vec())
        })
        .collect();
    let aggregated = leasehold_testkit::create_stream(kinesis, "bench-kpl-agg", 4).await;
    // 100 aggregates (about 1.2 MB) per PutRecords call: 500 would pass its 5 MB limit.
    for chunk in aggregates.chunks(100) {
        put_records(kinesis, &aggregated, chunk).await;
    }
    let rate = |d: Duration| total as f64 / d.as_secs_f64();
    let (mut best_plain, mut best_aggregated) = (0.0f64, 0.0f64);
    for round in 0..2 {
        let plain_rate = rate(worker_run(&plain, total, &format!("kpl-plain-{round}")).0);
        let aggregated_rate = rate(worker_run(&aggregated, total, &format!("kpl-agg-{round}")).0);
        eprintln!("kpl round {round}: plain {plain_rate:.0}/s, aggregated {aggregated_rate:.0}/s");
        best_plain = best_plain.max(plain_rate);
        best_aggregated = best_aggregated.max(aggregated_rate);
    }
    (best_plain, best_aggregated)
}

async fn dynamodb_requests(shards: i32, seconds: u64, traffic: bool) -> (f64, String) {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "bench-cost", shards).await;
    let table = leasehold_testkit::unique_name("bench-cost");
    let upstream = leasehold_testkit::endpoint(leasehold_testkit::Service::DynamoDb);
    let proxy = FaultProxy::start(&upstream, Arc::new(|_, _| None)).await;
    let config = common::with_endpoint(
        &default_config(&stream, &table, "startPosition: LATEST\n"),
        leasehold_testkit::Service::DynamoDb,
        &proxy.endpoint(),
    );
    let workers = [spawn(&config, "cost-a"), spawn(&config, "cost-b")];
    wait_for("balanced", Duration::from_secs(60), || {
        workers.iter().all(|w| w.held_shards().len() == shards as usize / 2)
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    // One record per shard per second keeps every shard checkpointing.
    let producer =
        traffic.then(|| Producer::start(kinesis.clone(), &stream, 4 * shards as usize, Duration::from_millis(1000)));
    let before = proxy.counts();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let after = proxy.counts();
    if let Some(producer) = producer {
        producer.stop().await;
    }
    let mut by_operation: Vec<(String, u64)> = after
        .iter()
        .map(|(op, n)| (op.clone(), n - before.get(op).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    by_operation.sort();
    let total: u64 = by_operation.iter().map(|(_, n)| n).sum();
    let per_shard_hour = total as f64 * 3600.0 / seconds as f64 / shards as f64;
    let detail = by_operation
        .iter()
        .map(|(op, n)| format!("{op} {:.0}", *n as f64 * 3600.0 / seconds as f64 / shards as f64))
        .collect::<Vec<_>>()
        .join(", ");
    (per_shard_hour, detail)
}

#[tokio::main]
async fn main() {
    let only = std::env::var("LEASEHOLD_BENCH").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only.split(',').any(|o| o == name);
    let kinesis = leasehold_testkit::kinesis_client().await;
    println!("## Worker runtime (default timing: lease 10 s, renew 3 s, scan 500 ms)\n");
    if run("failover") {
        let times = move_times(&kinesis, 10, "KILL").await;
        println!("- crash failover (kill -9 -> partner acquires the shard): {} — target max <= 11 s", stats(times));
    }
    if run("handoff") {
        let times = move_times(&kinesis, 10, "TERM").await;
        println!("- graceful handoff (SIGTERM -> partner acquires the shard): {} — target <= 1 s", stats(times));
    }
    if run("rebalance") {
        let took = rebalance(&kinesis, 100, 10).await;
        println!(
            "- rebalance 1 -> 10 workers on 100 shards (10 +- 1 each): {:.2} s — target <= 20 s",
            took.as_secs_f64()
        );
    }
    if run("throughput") {
        let total = 100_000;
        let stream = leasehold_testkit::create_stream(&kinesis, "bench-rate", 4).await;
        let payload = vec![b'x'; 100];
        let data: Vec<(String, Vec<u8>)> = records(1000, 0, (total / 1000) as u64)
            .into_iter()
            .map(|(k, mut d)| {
                d.extend_from_slice(&payload);
                (k, d)
            })
            .collect();
        put_records(&kinesis, &stream, &data).await;
        let mut sdk = Vec::new();
        let mut ours = Vec::new();
        let mut startup = Vec::new();
        for round in 0..2 {
            sdk.push(sdk_loop(&kinesis, &stream, total).await);
            let (took, start) = worker_run(&stream, total, &format!("rate-{round}"));
            ours.push(took);
            startup.push(start);
        }
        let rate = |d: &Duration| total as f64 / d.as_secs_f64();
        let best_sdk = sdk.iter().map(rate).fold(0.0, f64::max);
        let best_ours = ours.iter().map(rate).fold(0.0, f64::max);
        println!(
            "- records/s over 4 shards, 100k records of ~110 B, GetRecords limit 10000: worker {best_ours:.0}/s (stdout processor, \
             DynamoDB checkpoints), plain aws-sdk GetRecords loop {best_sdk:.0}/s, ratio {:.2} — target >= 0.9 (best of 2 \
             interleaved rounds; worker start-up to first record {})",
            best_ours / best_sdk,
            stats(startup)
        );
    }
    if run("kpl") {
        let (plain, aggregated) = kpl_rates(&kinesis).await;
        println!(
            "- user records/s over 4 shards, 100k user records of 100 B: in KPL aggregates of 100 {aggregated:.0}/s, \
             the same records unaggregated {plain:.0}/s, ratio {:.2} (stdout processor, DynamoDB checkpoints, \
             GetRecords limit 10000; best of 2 interleaved rounds)",
            aggregated / plain
        );
    }
    if run("cost") {
        for traffic in [false, true] {
            let (per_shard_hour, detail) = dynamodb_requests(8, 60, traffic).await;
            let label = if traffic { "1 record/s/shard" } else { "idle" };
            println!(
                "- DynamoDB requests per shard-hour, 2 workers x 4 shards, {label}: {per_shard_hour:.0} ({detail})"
            );
        }
    }
}
